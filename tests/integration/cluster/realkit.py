"""The `cluster` backend's session: real components, the chart installed with helm, kcover as processes.

`realcluster` (session, parameter ``cluster`` so the per-backend summary counts its tests) starts
tests/controlplane/cluster.py's stack (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
kwok, the Kubeflow training operator), registers nine kwok GPU nodes (an eight-node job and a spare)
and `helm install`s helm/kcover into ``kcover-system``, with `preflight.enabled` where the
kcover-preflight plugin is installed. kcover itself runs as local `kcover controller` / `kcover agent`
processes configured as the chart configures its pods: the chart's ConfigMap as ``--config``, the env
of the chart's Deployment or DaemonSet (field references resolved), and a bearer token of the chart's
own ServiceAccount obtained through the TokenRequest API, so every request kcover makes is authorized
by the chart's RBAC and nothing else. A node's hostPath (the preflight reports' directory) is a
directory per node under the session's workdir (`RealCluster.host_path`).

Selected by ``KCOVER_TEST_BACKENDS`` containing ``cluster`` (the default includes it). Missing binaries
skip with the reason, except with ``CI=true``, where they are built (tests/controlplane/build-cluster.sh,
build-helm.sh) and a failure fails the tests.
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import importlib.util
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import backends
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "helm" / "kcover"
RELEASE, RELEASE_NS = "kcover", "kcover-system"
KUBE_VERSION = "1.36.3"  # helm built from its module assumes v1.20 unless told (the chart needs >=1.29)
NODES = tuple(f"kwok-gpu-{i}" for i in range(9))
PREFLIGHT = importlib.util.find_spec("kcover_preflight") is not None
"""The chart's `preflight.enabled` needs the plugin in kcover's processes (an unknown detector fails them)."""
LEASE = {"lease_duration_seconds": 6, "renew_deadline_seconds": 4, "retry_period_seconds": 0.5}
"""Short for tests, but long enough that a loaded CI machine (load 10 on 2 cores) does not lose the Lease
mid-restart (3 s did: the restart Event was then refused as not leading)."""
VALUES: dict[str, Any] = {
    # kwok runs the chart's pods without pulling: any registry will do (the chart has no default)
    "image": {"registry": "localhost"},
    # test timings; everything else is the chart's default
    "config": {
        "lease": LEASE,
        # one session's tests cordon several of these 9 nodes and restart many jobs within the hour: the
        # shipped fleet breaker rightly calls that a storm, so its limits are lifted here
        "recovery": {"max_cordoned_fraction": 1.0, "max_cordoned_nodes": len(NODES), "max_cordons_per_window": 1000,
                     "max_cordons_per_window_fraction": 1.0, "max_restarted_workloads_per_window": 1000,
                     "workload_cooldown_seconds": 2,
                     # a real kube-apiserver proxies pods/log to a kubelet; kwok nodes have none reachable
                     "save_logs": {"enabled": False}},
        "kube": {"workload_kinds": ["jobs.batch", "pytorchjobs.kubeflow.org", "tfjobs.kubeflow.org"]},
        "agent": {"min_write_interval_seconds": 0, "condition_hold_seconds": 0.5, "event_dedupe_seconds": 0},
        "bus": {"drain_timeout_seconds": 0.5},
    },
    "detectors": {"node-condition": {"config": {"min_duration_seconds": 0, "tick_seconds": 0.2}},
                  "dra-health": {"config": {"tick_seconds": 0.2}},
                  "nvml": {"config": {"wait_timeout_ms": 100, "health_interval_seconds": 0.2}},
                  "dcgm": {"enabled": False},
                  **({"preflight": {"config": {"sweep_seconds": 0.5}},
                      "preflight-collector": {"config": {"retry_seconds": 0.2}}} if PREFLIGHT else {})},
    "preflight": {"enabled": PREFLIGHT},
}


def _load(name: str, path: Path) -> Any:
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


stack_ = _load("kcover_test_cluster", backends.CONTROLPLANE_DIR / "cluster.py")


def helm_binary() -> str | None:
    env = os.environ.get("KCOVER_HELM_BIN")
    if env and os.access(env, os.X_OK):
        return env
    found = sorted(glob.glob(str(stack_.cache_root() / "helm-*" / "helm")))
    return found[-1] if found else None


def _build_helm() -> str:
    proc = subprocess.run(["bash", str(backends.CONTROLPLANE_DIR / "build-helm.sh")], capture_output=True,
                          text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"build-helm.sh failed:\n{proc.stderr[-4000:]}")
    return lines[-1].strip()


# ------------------------------------------------------------------------------------------ kcover

@dataclasses.dataclass
class Kcover:
    """One `kcover controller` or `kcover agent` process."""

    role: str
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    fault_file: Path | None = None
    port: int = 0
    """The port its HTTP server bound: it is started with `--port=0` and says which in its log
    (`http_server_started`), so no port picked here can be taken by another process before it binds."""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def bound_port(self) -> int:
        if not self.port:
            started = [r for r in self.logs() if r.get("event") == "http_server_started"]
            if started:
                self.port = int(started[0]["port"])
        return self.port

    def ready(self) -> bool:
        port = self.bound_port()
        if not port:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def logs(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self, kill: bool = False) -> None:
        if self.popen.poll() is None:
            if kill:
                self.popen.kill()
            else:
                self.popen.terminate()
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)

    def inject(self, line: str) -> None:
        """Append one fault line to the agent's fake NVML (`kcover agent --fake-nvml`)."""
        assert self.fault_file is not None
        with self.fault_file.open("a") as f:
            f.write(line + "\n")


@dataclasses.dataclass
class RealCluster:
    stack: Any
    helm: str
    workdir: Path
    kubeconfigs: dict[str, str]  # role -> kubeconfig with the chart ServiceAccount's token
    config_dir: Path
    env: dict[str, list[dict[str, Any]]]  # role -> the chart's container env
    backend: str = "cluster"
    processes: list[Kcover] = dataclasses.field(default_factory=list)

    @property
    def kubeconfig_path(self) -> str:
        return str(self.stack.kubeconfig_path)

    def request(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return self.stack.cp.request(method, path, body, **kw)  # type: ignore[no-any-return]

    def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        status, got = self.request(method, path, body, **kw)
        assert status < 300, f"{method} {path}: HTTP {status}: {got!r}"
        return got

    def _env(self, role: str, *, pod: str, node: str) -> dict[str, str]:
        out = {k: v for k, v in os.environ.items() if not k.startswith("KCOVER_")}
        fields = {"metadata.name": pod, "metadata.namespace": RELEASE_NS, "spec.nodeName": node}
        for item in self.env[role]:
            value = item.get("value")
            if value is None:
                value = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
            out[item["name"]] = self._local(str(value))
        return out

    def _local(self, value: str) -> str:
        """Paths inside the chart's pods, mapped to this process's files."""
        if value.startswith("/etc/kcover/"):
            return str(self.config_dir / value.removeprefix("/etc/kcover/"))
        if value.startswith("/var/lib/kcover/"):
            return str(self.workdir / value.removeprefix("/var/lib/kcover/"))
        return value

    def host_path(self, node: str, path: str) -> Path:
        """A node's file system path (a hostPath the chart mounts), as this machine holds it for `node`."""
        return self.workdir / "nodes" / node / path.lstrip("/")

    def _host_paths(self, node: str) -> list[str]:
        """The chart's preflight-collector settings with its report directory (a hostPath) on `node`.

        (A `--set` of a detector's `config` replaces the whole config, so all of it goes.)"""
        chart = yaml.safe_load((self.config_dir / "config.yaml").read_text()) or {}
        collector = ((chart.get("detectors") or {}).get("entries") or {}).get("preflight-collector")
        if collector is None:
            return []
        config = dict(collector.get("config") or {})
        config["report_dir"] = str(self.host_path(node, str(config.get("report_dir") or "/var/lib/kcover/preflight")))
        return ["--set", f"detectors.entries.preflight-collector.config={json.dumps(config)}"]

    def start(self, role: str, name: str, *, node: str = "", kubeconfig: str | None = None,
              extra: tuple[str, ...] = ()) -> Kcover:
        run = f"{name}-{len(self.processes)}-{secrets.token_hex(3)}"  # a name started again gets files of its own
        log_path = self.workdir / f"{role}-{run}.log"
        argv = [sys.executable, "-m", "kcover.cli", role, f"--config={self.config_dir / 'config.yaml'}",
                f"--kubeconfig={kubeconfig or self.kubeconfigs[role]}", "--port=0",
                "--set", "server.host=127.0.0.1"]
        fault_file = None
        if role == "agent":
            fault_file = self.workdir / f"nvml-{run}"
            argv += [f"--node-name={node}", f"--fake-nvml={fault_file}", *self._host_paths(node)]
        argv += extra
        log = log_path.open("wb")
        popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=self._env(role, pod=name, node=node), start_new_session=True)
        log.close()
        proc = Kcover(role, name, popen, log_path, fault_file)
        self.processes.append(proc)
        return proc

    def wait_ready(self, *procs: Kcover, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        for proc in procs:
            while not proc.ready():
                if not proc.alive() or time.monotonic() > deadline:
                    raise AssertionError(f"kcover {proc.role} {proc.name} not ready:\n{proc.tail()}")
                time.sleep(0.1)

    def stop_all(self) -> None:
        for proc in self.processes:
            proc.stop()
        self.processes.clear()

    def token(self, service_account: str, seconds: int = 3600) -> str:
        got = self.ok("POST", f"/api/v1/namespaces/{RELEASE_NS}/serviceaccounts/{service_account}/token", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": seconds}})
        return str(got["status"]["token"])


def _install(stack: Any, helm: str, workdir: Path, *, release_values: dict[str, Any]) -> tuple[
        dict[str, str], dict[str, list[dict[str, Any]]]]:
    env = {**os.environ, "HELM_CACHE_HOME": str(workdir / "helm-cache"), "HELM_CONFIG_HOME": str(workdir / "helm-config"),
           "HELM_DATA_HOME": str(workdir / "helm-data")}
    proc = subprocess.run([helm, "install", RELEASE, str(CHART), "--namespace", RELEASE_NS, "--create-namespace",
                           "--kubeconfig", stack.kubeconfig_path, "--values", "-", "--timeout", "60s"],
                          input=json.dumps(release_values), capture_output=True, text=True, env=env, check=False,
                          timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"helm install failed:\n{proc.stdout}\n{proc.stderr}")
    _, cm = stack.cp.request("GET", f"/api/v1/namespaces/{RELEASE_NS}/configmaps")
    config = next(c for c in cm["items"] if "config.yaml" in (c.get("data") or {}))
    accounts: dict[str, str] = {}
    containers: dict[str, list[dict[str, Any]]] = {}
    for role, path in (("controller", "deployments"), ("agent", "daemonsets")):
        _, listed = stack.cp.request("GET", f"/apis/apps/v1/namespaces/{RELEASE_NS}/{path}")
        obj = next(o for o in listed["items"] if o["metadata"]["labels"].get("app.kubernetes.io/component") == role)
        spec = obj["spec"]["template"]["spec"]
        accounts[role] = spec["serviceAccountName"]
        containers[role] = spec["containers"][0].get("env") or []
    return accounts, {"config": [config], **containers}


def _wait_agents(stack: Any, timeout: float = 240.0) -> None:
    """The chart's agent DaemonSet runs a (kwok) pod on every GPU node: the controller trusts a node's
    Events only from a node that has one."""
    deadline = time.monotonic() + timeout
    while True:
        _, listed = stack.cp.request("GET", f"/apis/apps/v1/namespaces/{RELEASE_NS}/daemonsets")
        status = listed["items"][0].get("status") or {} if listed.get("items") else {}
        if status.get("numberReady") == len(NODES) == status.get("desiredNumberScheduled"):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the agent DaemonSet is not ready on every node: {status}\n{stack.log_tail(20)}")
        time.sleep(0.2)


@pytest.fixture(scope="session")
def realcluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    if "cluster" not in backends.selected_backends():
        pytest.skip("cluster backend not selected (KCOVER_TEST_BACKENDS)")
    cp_bin, bin_dir, helm = backends.controlplane_binaries(), stack_.cluster_binaries(), helm_binary()
    if cp_bin is None or bin_dir is None or helm is None:
        missing = [n for n, v in (("kube-apiserver/etcd", cp_bin), ("cluster components", bin_dir), ("helm", helm))
                   if v is None]
        if not backends.in_ci():
            pytest.skip(f"cluster backend: {', '.join(missing)} not built (tests/controlplane/build-cluster.sh, "
                        "build.sh, build-helm.sh); CI=true builds them and makes a failure fatal")
        try:
            cp_bin = cp_bin or Path(backends._controlplane_module().find_binaries())
            bin_dir = bin_dir or stack_.build()
            helm = helm or _build_helm()
        except Exception as exc:
            pytest.fail(f"cluster backend: building the components failed; CI=true requires them:\n{exc}")
    stack = stack_.ClusterStack(cp_bin=cp_bin, cluster_bin=bin_dir)
    try:
        stack.start()
    except stack_.ClusterError as exc:
        pytest.fail(str(exc))
    started = time.monotonic()
    workdir = tmp_path_factory.mktemp("realcluster")
    try:
        for node in NODES:
            stack.add_gpu_node(node)
        for node in NODES:
            stack.wait_node_ready(node)
        # the RuntimeClass a GPU cluster has (the GPU operator creates it); the agent DaemonSet names it
        stack.cp.request("POST", "/apis/node.k8s.io/v1/runtimeclasses", {
            "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"})
        accounts, objs = _install(stack, helm, workdir, release_values=VALUES)
        _wait_agents(stack)
        config_dir = workdir / "etc-kcover"
        config_dir.mkdir()
        for key, text in objs.pop("config")[0]["data"].items():
            (config_dir / key).write_text(text)
        cluster = RealCluster(stack=stack, helm=helm, workdir=workdir, kubeconfigs={}, config_dir=config_dir,
                              env=objs)
        for role, account in accounts.items():
            cluster.kubeconfigs[role] = stack.kubeconfig(f"kcover-{role}", cluster.token(account))
        request.config.stash[backends.STARTUP]["cluster"] = stack.startup_seconds + (time.monotonic() - started)
        yield cluster
        cluster.stop_all()
    finally:
        stack.stop()


def chart_rbac_without(helm: str, workdir: Path, *, kind: str, component: str, resource: str, verb: str) -> list[
        dict[str, Any]]:
    """The chart's RBAC objects for `component`, rendered, with `verb` taken off `resource` (a copy)."""
    proc = subprocess.run([helm, "template", RELEASE, str(CHART), "--namespace", RELEASE_NS, "--values", "-",
                           "--kube-version", KUBE_VERSION],
                          input=json.dumps(VALUES), capture_output=True, text=True, check=True, timeout=120,
                          env={**os.environ, "HELM_CACHE_HOME": str(workdir / "hc"),
                               "HELM_CONFIG_HOME": str(workdir / "hcfg"), "HELM_DATA_HOME": str(workdir / "hd")})
    out = []
    for doc in yaml.safe_load_all(proc.stdout):
        if not doc or doc["kind"] not in ("ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"):
            continue
        if doc["metadata"].get("labels", {}).get("app.kubernetes.io/component") != component:
            continue
        doc = copy.deepcopy(doc)
        if doc["kind"] == kind:
            for rule in doc["rules"]:
                if resource in rule.get("resources", []) and verb in rule["verbs"]:
                    rule["verbs"] = [v for v in rule["verbs"] if v != verb]
        out.append(doc)
    return out
