"""A real Kubernetes around kcover for the `cluster` test backend: control plane, scheduler, kwok, operator.

Stdlib, PyYAML and ``openssl`` (via server.py). On loopback, one per test session:

* etcd + kube-apiserver (server.py's `ControlPlane`, with tokens for the controller-manager and
  scheduler users that the apiserver's bootstrap RBAC already grants);
* kube-controller-manager (every default controller: Job, ReplicaSet, DaemonSet, garbage collector,
  namespace, node lifecycle, ServiceAccount tokens, ...) and kube-scheduler, built from the same
  k8s.io/kubernetes version (tests/controlplane/build-cluster.sh);
* kwok, managing the nodes labelled ``type=kwok`` with its own Stages (pod ready, pod delete, node
  heartbeat, and its chaos stages ``node-not-ready`` and ``pod-container-running-failed``);
* the Kubeflow training operator with its own CRDs (copied from its module source by the build).

    stack = ClusterStack(cp_bin=..., cluster_bin=...)
    stack.start()
    stack.add_gpu_node("kwok-gpu-0")
    stack.kubeconfig_path / stack.cp.request(...)
    stack.stop()

What it does not do: install kcover (tests/integration/cluster does that with helm), or give kwok's
pods containers (they are status only). How it fails: `ClusterError` with the tail of every
component's log. The training operator's webhook server listens on every interface (its port is the
only flag controller-runtime gives it); nothing calls it (no webhook configuration names it).
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import yaml

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build-cluster.sh"
COMPONENTS = ("kube-controller-manager", "kube-scheduler", "kubectl", "kwok", "training-operator")
KWOK_LABEL = "type"
KWOK_VALUE = "kwok"
OPERATOR_NAMESPACE = "kubeflow"
WEBHOOK_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # the operator's, fixed in its code
LONG_RUNNING = "kcover.test/long-running"
"""A label that keeps kwok's pod-complete Stage off a Job's pod (kwok completes Job pods at once)."""


def _server() -> Any:
    name = "kcover_test_controlplane"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / "server.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


server = _server()


# What a kubelet does with a pod being deleted (1.27 on): kill its containers, then set a terminal
# phase, so controllers (the Job controller's podFailurePolicy) see how it ended before it is gone.
# kwok's own pod-delete Stage removes a pod at once; above, it waits for this one. Conditions are
# written back whole (DisruptionTarget kept), whichever patch kwok sends.
POD_TERMINATE = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-terminate
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running', 'Pending']
  next:
    statusTemplate: |
      {{ $now := Now }}
      phase: Failed
      conditions:
      {{ range .status.conditions }}
      - type: {{ .type | Quote }}
      {{ if or (eq .type "Ready") (eq .type "ContainersReady") }}
        status: "False"
        reason: PodCompleted
        lastTransitionTime: {{ $now | Quote }}
      {{ else }}
        status: {{ .status | Quote }}
        reason: {{ or .reason "" | Quote }}
        message: {{ or .message "" | Quote }}
        lastTransitionTime: {{ or .lastTransitionTime $now | Quote }}
      {{ end }}
      {{ end }}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: false
        restartCount: 0
        state:
          terminated:
            exitCode: 137
            reason: Error
            finishedAt: {{ $now | Quote }}
      {{ end }}
"""


class ClusterError(RuntimeError):
    pass


def cache_root() -> Path:
    return Path(os.environ.get("KCOVER_CACHE", str(Path.home() / ".cache" / "kcover")))


def complete(d: Path) -> bool:
    return all((d / c).is_file() for c in COMPONENTS) and any((d / "crds").glob("*.yaml")) \
        and any((d / "stages").glob("*.yaml"))


def cluster_binaries() -> Path | None:
    """The directory holding the built components (KCOVER_CLUSTER_BIN or the cache), building nothing."""
    env = os.environ.get("KCOVER_CLUSTER_BIN")
    if env:
        return Path(env) if complete(Path(env)) else None
    found = sorted(p for p in (cache_root() / "cluster").glob("k8s-*") if complete(p))
    return found[-1] if found else None


def build() -> Path:
    """Run build-cluster.sh (minutes cold, instant warm); the directory it printed."""
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        raise ClusterError(f"build-cluster.sh failed (rc={proc.returncode}):\n{proc.stderr[-6000:]}")
    return Path(lines[-1].strip())


class _ControlPlane(server.ControlPlane):  # type: ignore[misc,name-defined]
    """server.py's control plane plus tokens for the controller-manager's and scheduler's users."""

    USERS: ClassVar[dict[str, str]] = {"kcm": "system:kube-controller-manager", "scheduler": "system:kube-scheduler"}

    def _gen_credentials(self) -> None:
        super()._gen_credentials()
        assert self.tmpdir is not None
        self.user_tokens = {key: os.urandom(16).hex() for key in self.USERS}
        with open(self.tmpdir / "tokens.csv", "a") as f:
            for key, user in self.USERS.items():
                f.write(f"{self.user_tokens[key]},{user},{user}\n")


class ClusterStack:
    """The session's real cluster. Attributes after `start()`: ``cp`` (the control plane: ``url``,
    ``kubeconfig_path``, ``request()``), ``kubeconfig_path`` (admin), ``bin_dir``, ``startup_seconds``
    and ``timings`` (seconds per step)."""

    def __init__(self, *, cp_bin: Path, cluster_bin: Path, node_monitor_grace_seconds: int = 8,
                 watch_cache: bool = False, kcm_args: tuple[str, ...] = (), node_lease_seconds: int = 40,
                 kwok_options: dict[str, Any] | None = None) -> None:
        """`watch_cache`: the API server caches pods and ConfigMaps too, as a production one does (see
        server.py); `kcm_args`: more kube-controller-manager flags; `node_lease_seconds`: kwok's node Lease
        duration (it renews each a quarter of that apart: at 2,000 nodes and 40 s, 200 Lease writes a second,
        which left kwok running about 2 pods a second on two loaded cores); `kwok_options`: kwok's
        KwokConfiguration `options` (the fleet bench lifts its client's QPS limit; given, every parallelism
        option must be too: kwok takes no default for one left out)."""
        self.cp_bin = cp_bin
        self.bin_dir = cluster_bin
        self.grace = node_monitor_grace_seconds
        self.watch_cache = watch_cache
        self.kcm_args = tuple(kcm_args)
        self.node_lease_seconds = node_lease_seconds
        self.kwok_options = dict(kwok_options or {})
        self.cp: Any = None
        self.kubeconfig_path = ""
        self.startup_seconds = 0.0
        self.timings: dict[str, float] = {}
        self._procs: list[Any] = []
        self._dir: Path | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> ClusterStack:
        t0 = time.monotonic()
        try:
            self.cp = self._control_plane()
            self.cp.start()
            self.timings["etcd+apiserver+crds"] = time.monotonic() - t0
            self.kubeconfig_path = self.cp.kubeconfig_path
            self._dir = Path(self.cp.tmpdir)
            step = time.monotonic()
            self._start_kcm()
            self._start_scheduler()
            self._start_kwok()
            self._start_operator()
            self._wait_ready()
            self.timings["components ready"] = time.monotonic() - step
        except BaseException as exc:
            tail = self.log_tail()
            self.stop()
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise ClusterError(f"the cluster did not start: {exc}\n{tail}") from exc
        self.startup_seconds = time.monotonic() - t0
        return self

    def _control_plane(self) -> Any:
        """The control plane to start (the `node` backend's adds a node's credentials and addresses)."""
        return _ControlPlane(bin_dir=self.cp_bin, crd_dir=self._crds(), watch_cache=self.watch_cache)

    def _crds(self) -> Path:
        """The operator's CRDs as server.py's `apply_crds` reads them (`metadata.name` first)."""
        out = Path(tempfile.mkdtemp(prefix="kcover-crds-"))
        for path in sorted((self.bin_dir / "crds").glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            crd["metadata"] = {"name": crd["metadata"]["name"], **crd["metadata"]}
            (out / path.name).write_text(yaml.safe_dump(crd, sort_keys=False))
        return out

    def stop(self) -> None:
        for proc in reversed(self._procs):
            try:
                proc.stop()
            except Exception:
                pass
        self._procs = []
        if self.cp is not None:
            self.cp.stop()

    def stop_component(self, name: str) -> bool:
        """Stop one running component (`training-operator`, ...) for the rest of the stack's life; False when
        none of that name runs."""
        found = [p for p in self._procs if p.name == name]
        for proc in found:
            proc.stop()
            self._procs.remove(proc)
        return bool(found)

    def log_tail(self, n: int = 40) -> str:
        out = [self.cp.log_tail(n)] if self.cp is not None else []
        for p in self._procs:
            state = "running" if p.alive() else f"exited rc={p.popen.returncode}"
            out.append(f"----- {p.name} ({state}) -----\n{p.tail(n)}")
        return "\n".join(out)

    # ------------------------------------------------------------------ components
    def kubeconfig(self, name: str, token: str) -> str:
        """A kubeconfig for this server with a bearer token; returns its path."""
        assert self._dir is not None
        cfg = json.loads(Path(self.cp.kubeconfig_path).read_text())
        cfg["users"] = [{"name": name, "user": {"token": token}}]
        cfg["contexts"][0]["context"]["user"] = name
        path = self._dir / f"kubeconfig-{name}"
        path.write_text(json.dumps(cfg))
        return str(path)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Any:
        assert self._dir is not None
        proc = server._Proc(name, argv, self._dir / f"{name}.log") if env is None else _EnvProc(
            name, argv, self._dir / f"{name}.log", env)
        self._procs.append(proc)
        return proc

    def _start_kcm(self) -> None:
        assert self._dir is not None
        kc = self.kubeconfig("kcm", self.cp.user_tokens["kcm"])
        self._spawn("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"), f"--kubeconfig={kc}",
            "--bind-address=127.0.0.1", f"--secure-port={server._free_port()}",
            f"--cert-dir={self._dir / 'kcm-certs'}",
            f"--service-account-private-key-file={self._dir / 'sa.key'}",
            f"--root-ca-file={self.cp.ca_path}", "--use-service-account-credentials=true",
            "--leader-elect=false", "--controllers=*",
            f"--node-monitor-grace-period={self.grace}s", "--node-monitor-period=1s",
            "--concurrent-job-syncs=5", *self._dra_gates(), *self.kcm_args, "--v=1"])

    def _dra_gates(self) -> list[str]:
        """DeviceTaintRules (KEP-5055, beta and off by default in 1.36) for the scheduler, which keeps tainted
        devices out of new claims, and the controller-manager, whose device taint eviction controller
        acts on NoExecute; the apiserver serves them (server.py's gates and runtime-config)."""
        return ["--feature-gates=DRADeviceTaintRules=true"] if self.cp.feature_gates.get("DRADeviceTaintRules") else []

    def _start_scheduler(self) -> None:
        assert self._dir is not None
        kc = self.kubeconfig("scheduler", self.cp.user_tokens["scheduler"])
        self._spawn("kube-scheduler", [
            str(self.bin_dir / "kube-scheduler"), f"--kubeconfig={kc}", "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={server._free_port()}",
            f"--cert-dir={self._dir / 'scheduler-certs'}", *self._dra_gates(), "--v=1"])

    def _start_kwok(self) -> None:
        assert self._dir is not None
        docs = []
        for path in sorted((self.bin_dir / "stages").glob("*.yaml")):
            stage = yaml.safe_load(path.read_text())
            if stage["metadata"]["name"] == "pod-complete":  # a Job's pod labelled long-running never completes
                stage["spec"]["selector"]["matchExpressions"].append(
                    {"key": f'.metadata.labels["{LONG_RUNNING}"]', "operator": "DoesNotExist"})
            if stage["metadata"]["name"] == "pod-delete":  # after the kubelet's termination, as a kubelet does
                stage["spec"]["selector"]["matchExpressions"].append(
                    {"key": ".status.phase", "operator": "NotIn", "values": ["Running", "Pending"]})
            docs.append(yaml.safe_dump(stage))
        docs.append(POD_TERMINATE)
        if self.kwok_options:
            docs.append(yaml.safe_dump({"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
                                        "options": self.kwok_options}))
        config = self._dir / "kwok.yaml"
        config.write_text("\n---\n".join(docs))
        self._spawn("kwok", [
            str(self.bin_dir / "kwok"), f"--kubeconfig={self.cp.kubeconfig_path}", f"--config={config}",
            f"--manage-nodes-with-label-selector={KWOK_LABEL}={KWOK_VALUE}", "--manage-all-nodes=false",
            "--cidr=10.0.0.1/16", "--node-ip=10.255.0.1", f"--node-lease-duration-seconds={self.node_lease_seconds}",
            f"--server-address=127.0.0.1:{server._free_port()}"])

    def _start_operator(self) -> None:
        assert self._dir is not None
        # The operator's cert rotator needs its Secret and a webhook configuration to exist (its
        # manifests ship both); with no webhooks in it, the apiserver never calls the operator.
        self._admin("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": OPERATOR_NAMESPACE}})
        self._admin("POST", f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/secrets", {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "training-operator-webhook-cert"}})
        self._admin("POST", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "validator.training-operator.kubeflow.org"}, "webhooks": []})
        self.operator_probe = f"127.0.0.1:{server._free_port()}"
        env = {**os.environ, "KUBECONFIG": self.cp.kubeconfig_path, "MY_POD_NAMESPACE": OPERATOR_NAMESPACE}
        self._spawn("training-operator", [
            str(self.bin_dir / "training-operator"), "--metrics-bind-address=0",
            f"--health-probe-bind-address={self.operator_probe}", f"--webhook-server-port={server._free_port()}",
            "--leader-elect=false", "--enable-scheme=pytorchjob", "--enable-scheme=tfjob",
            "--controller-threads=4", "--zap-log-level=info"], env=env)

    def _admin(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201, 409)) -> Any:
        status, got = self.cp.request(method, path, body)
        if status not in ok:
            raise ClusterError(f"{method} {path}: HTTP {status}: {got!r}")
        return got

    def _wait_ready(self, timeout: float = float(os.environ.get("KCOVER_CLUSTER_READY_TIMEOUT", "90"))) -> None:
        deadline = time.monotonic() + timeout
        waiting = {"default ServiceAccount (controller-manager)", "training operator workers"}
        operator = next(p for p in self._procs if p.name == "training-operator")
        while waiting:
            for p in self._procs:
                if not p.alive():
                    raise ClusterError(f"{p.name} exited rc={p.popen.returncode}")
            if "default ServiceAccount (controller-manager)" in waiting:
                status, _ = self.cp.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")
                if status == 200:
                    waiting.discard("default ServiceAccount (controller-manager)")
            # readyz also waits for the webhook server, which nothing here calls: its workers are what matter
            if "training operator workers" in waiting and 'Starting workers' in operator.tail(400) \
                    and "pytorchjob-controller" in operator.tail(400):
                waiting.discard("training operator workers")
            if "training operator workers" in waiting:
                self._mount_webhook_secret()
            if time.monotonic() > deadline:
                raise ClusterError(f"not ready within {timeout:g} s: {sorted(waiting)}")
            time.sleep(0.2)

    def _mount_webhook_secret(self) -> None:
        """What the kubelet's Secret volume does for the operator's pod: its cert rotator fills the Secret
        and then waits for the files in its (fixed) cert directory before starting any controller."""
        status, secret = self.cp.request("GET", f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/secrets/"
                                                "training-operator-webhook-cert")
        data = (secret.get("data") or {}) if status == 200 else {}
        if not all(k in data for k in ("tls.crt", "tls.key", "ca.crt")):
            return
        WEBHOOK_CERT_DIR.mkdir(parents=True, exist_ok=True)
        for key, value in data.items():
            (WEBHOOK_CERT_DIR / key).write_bytes(base64.b64decode(value))

    # ------------------------------------------------------------------ nodes
    def add_gpu_node(self, name: str, gpus: int = 8, labels: dict[str, str] | None = None,
                     taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
        """A kwok-managed GPU node, registered as a kubelet registers itself (status in the create)."""
        resources = {"nvidia.com/gpu": str(gpus), "cpu": "64", "memory": "512Gi", "pods": "110"}
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {KWOK_LABEL: KWOK_VALUE, "kubernetes.io/hostname": name,
                                                      "kubernetes.io/os": "linux",
                                                      "nvidia.com/gpu.present": "true", **(labels or {})},
                             "annotations": {"kwok.x-k8s.io/node": "fake"}},
                "spec": {"taints": taints or []},
                "status": {"capacity": resources, "allocatable": resources}}
        got: dict[str, Any] = self._admin("POST", "/api/v1/nodes", node, ok=(201,))
        return got

    def wait_node_ready(self, name: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, node = self.cp.request("GET", f"/api/v1/nodes/{name}")
            if status == 200 and any(c.get("type") == "Ready" and c.get("status") == "True"
                                     for c in (node.get("status") or {}).get("conditions") or []):
                return
            time.sleep(0.2)
        raise ClusterError(f"node {name} not Ready within {timeout:g} s (kwok)\n{self.log_tail(20)}")


class _EnvProc(server._Proc):  # type: ignore[misc,name-defined]
    """server.py's `_Proc` with its own environment."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 -- lives as long as the process it logs
        self.popen = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True, env=env)


def main() -> int:
    """Start the stack, add a node, report timings (``--hold`` keeps it up)."""
    t0 = time.monotonic()
    cp_bin = Path(server.find_binaries())
    bin_dir = cluster_binaries() or build()
    built = time.monotonic() - t0
    stack = ClusterStack(cp_bin=cp_bin, cluster_bin=bin_dir).start()
    try:
        t1 = time.monotonic()
        stack.add_gpu_node("kwok-gpu-0")
        stack.wait_node_ready("kwok-gpu-0")
        print(f"binaries:   {bin_dir} ({built:.1f}s to find/build)")
        print(f"kubeconfig: {stack.kubeconfig_path}")
        print(f"startup:    {stack.startup_seconds:.2f}s {stack.timings}")
        print(f"node ready: {time.monotonic() - t1:.2f}s")
        if "--hold" in sys.argv:
            print("holding; Ctrl-C to stop", flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
    finally:
        stack.stop()
    return 0


if __name__ == "__main__":
    shutil.which("openssl") or sys.exit("openssl is required")
    sys.exit(main())
