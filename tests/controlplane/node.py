"""The `node` test backend's cluster: the `cluster` backend's stack plus a real node and the JobSet controller.

Stdlib, PyYAML, grpcio and ``openssl``. One per test session, on this machine as root:

* cluster.py's stack (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok, the Kubeflow
  training operator), its API server advertised at the CNI bridge's gateway (10.244.0.1, forwarded to
  its loopback port by socat) with a serving certificate for that address and the `kubernetes`
  Service's (10.96.0.1), the ServiceAccount admission plugin on (pods get tokens), the Node authorizer
  and NodeRestriction, and a client certificate to reach kubelets with (logs, exec);
* containerd (Debian's, its own config, socket and state under /run/kcover-node; its image store under
  the cache so images are imported once) with runc, a runtime handler `nvidia` that is runc (the
  chart's `runtimeClassName: nvidia` works unchanged), the pod sandbox image kcover-pause, and the CNI
  bridge network (nodehost.py);
* a real kubelet (node `kcover-node-0`, labelled `nvidia.com/gpu.present=true`) with a serving
  certificate from the test CA and webhook authentication and authorization, and kube-proxy in iptables
  mode (the `kubernetes` Service reaches the API server from pods);
* the JobSet controller with its CRD and its webhooks (served on loopback, registered by URL);
* kwok GPU nodes beside the real one (tainted, so only pods that tolerate them go there).

    stack = NodeStack(cp_bin=..., cluster_bin=..., node_bin=..., images={name: archive})
    stack.start()  ...  stack.stop()

What it does not do: install kcover (tests/integration/node does that with helm). How it fails:
`ClusterError` with every component's log tail; `stop()` always leaves the machine as it was
(nodehost.cleanup), and a start first undoes what a killed run left.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, ClassVar

import yaml

HERE = Path(__file__).resolve().parent


def _load(name: str, path: Path) -> Any:
    """A sibling module under the name every loader of it uses (tests/integration/*/ load them so too)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


cluster_ = _load("kcover_test_cluster", HERE / "cluster.py")
nodehost = _load("kcover_test_nodehost", HERE / "nodehost.py")
server = cluster_.server
NODE_NAME = "kcover-node-0"
NODE_LABELS = {"nvidia.com/gpu.present": "true", "kcover.test/node": "real"}
KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
KUBELET_PORT = 10250  # on the bridge address only
COMPONENTS = ("kubelet", "kube-proxy", "jobset-controller", "kcover-pause")


def complete(d: Path) -> bool:
    return all((d / c).is_file() for c in COMPONENTS) and any((d / "crds").glob("*.yaml")) \
        and (d / "webhooks" / "manifests.yaml").is_file()


def node_binaries() -> Path | None:
    env = os.environ.get("KCOVER_NODE_BIN")
    if env:
        return Path(env) if complete(Path(env)) else None
    found = sorted(p for p in (cluster_.cache_root() / "node").glob("k8s-*") if complete(p))
    return found[-1] if found else None


def build() -> Path:
    proc = subprocess.run(["bash", str(HERE / "build-node.sh")], capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        raise cluster_.ClusterError(f"build-node.sh failed (rc={proc.returncode}):\n{proc.stderr[-6000:]}")
    return Path(lines[-1].strip())


def _openssl(*args: str) -> None:
    nodehost.run(["openssl", *args])


class _NodeControlPlane(cluster_._ControlPlane):  # type: ignore[misc,name-defined]
    """The control plane with a CA, a serving certificate for the bridge and Service addresses, and users
    for the kubelet and kube-proxy."""

    USERS: ClassVar[dict[str, str]] = {**cluster_._ControlPlane.USERS, "proxy": "system:kube-proxy"}

    def _gen_credentials(self) -> None:
        super()._gen_credentials()  # tokens, the ServiceAccount keys; its self-signed serving pair is replaced
        d = self.tmpdir
        assert d is not None
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "3650", "-keyout",
                 str(d / "ca.key"), "-out", str(d / "ca.crt"), "-subj", "/CN=kcover-test-ca",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        sans = ("IP:127.0.0.1,IP:10.244.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
                "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local")
        self.sign(d / "serving", "/CN=kube-apiserver", sans)
        self.sign(d / "kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", "", client=True)
        self.sign(d / "kubelet", f"/CN={NODE_NAME}", f"IP:{nodehost.GATEWAY},IP:127.0.0.1,DNS:{NODE_NAME}")
        self.ca_path = str(d / "ca.crt")
        ctx = ssl.create_default_context(cafile=self.ca_path)
        ctx.check_hostname = False
        self._ssl = ctx
        # later flags win: the gateway is the advertised address, pods get ServiceAccount tokens again
        # (server.py turns the plugin off for a server without a controller-manager), nodes are authorized
        # as nodes, and the API server reaches kubelets (logs, exec) with a client certificate
        self.extra_apiserver_args += [
            f"--advertise-address={nodehost.GATEWAY}", "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction", "--disable-admission-plugins=",
            "--kubelet-preferred-address-types=InternalIP", f"--kubelet-certificate-authority={d / 'ca.crt'}",
            f"--kubelet-client-certificate={d / 'kubelet-client.crt'}",
            f"--kubelet-client-key={d / 'kubelet-client.key'}"]
        self.node_token = os.urandom(16).hex()
        with open(d / "tokens.csv", "a") as f:
            f.write(f'{self.node_token},system:node:{NODE_NAME},system:node:{NODE_NAME},"system:nodes"\n')

    def sign(self, stem: Path, subject: str, sans: str, *, client: bool = False) -> None:
        """`stem`.key and `stem`.crt signed by the test CA."""
        assert self.tmpdir is not None
        ext = self.tmpdir / f"{stem.name}.ext"
        lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
                 f"extendedKeyUsage={'clientAuth' if client else 'serverAuth'}"]
        if sans:
            lines.append(f"subjectAltName={sans}")
        ext.write_text("\n".join(lines) + "\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{stem}.key", "-out", f"{stem}.csr",
                 "-subj", subject)
        _openssl("x509", "-req", "-in", f"{stem}.csr", "-CA", str(self.tmpdir / "ca.crt"), "-CAkey",
                 str(self.tmpdir / "ca.key"), "-CAcreateserial", "-days", "3650", "-sha256", "-extfile", str(ext),
                 "-out", f"{stem}.crt")


class NodeStack(cluster_.ClusterStack):  # type: ignore[misc,name-defined]
    """cluster.py's stack with a real node. After `start()`: ``node_name``, ``containerd_address``,
    ``kubelet_root`` and what ClusterStack has; ``timings`` has the node's steps."""

    def __init__(self, *, cp_bin: Path, cluster_bin: Path, node_bin: Path, images: dict[str, Path],
                 kwok_nodes: int = 2) -> None:
        super().__init__(cp_bin=cp_bin, cluster_bin=cluster_bin)
        self.node_bin = node_bin
        self.images = dict(images)
        self.kwok_nodes = [f"kwok-gpu-{i}" for i in range(kwok_nodes)]
        self.node_name = NODE_NAME
        self.kubelet_root = nodehost.KUBELET_ROOT
        self.containerd_root = cluster_.cache_root() / "node-containerd"
        self.containerd_address = nodehost.STATE / "containerd" / "containerd.sock"
        self.imported: dict[str, str] = {}
        self._sysctls: nodehost.Sysctls | None = None
        self._netns_before: set[str] = set()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> NodeStack:
        missing = nodehost.missing_prerequisites()
        if missing:
            raise cluster_.ClusterError("this machine cannot run a node: " + "; ".join(missing))
        t0 = time.monotonic()
        nodehost.cleanup(containerd_root=self.containerd_root, kube_proxy=self.node_bin / "kube-proxy")
        self._sysctls = nodehost.Sysctls()
        self._netns_before = nodehost.netns_now()
        try:
            nodehost.make_bridge()
            for path in (nodehost.KUBELET_ROOT, nodehost.STATE):
                if not path.exists() or (path / nodehost.MARKER).exists() or not any(path.iterdir()):
                    nodehost.mark(path)
            nodehost.own_absent()
            nodehost.CONF.mkdir()
            self.timings["host"] = time.monotonic() - t0
            super().start()  # the control plane, the controllers, kwok, the training operator
            step = time.monotonic()
            self._start_forward()
            self._start_containerd()
            self.timings["containerd+images"] = time.monotonic() - step
            step = time.monotonic()
            self._start_kubelet()
            self._start_kube_proxy()
            self._start_jobset()
            self._admin("POST", "/apis/node.k8s.io/v1/runtimeclasses", {
                "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
                "handler": "nvidia"})
            for name in self.kwok_nodes:
                self.add_gpu_node(name, taints=[KWOK_TAINT])
            for name in self.kwok_nodes:
                self.wait_node_ready(name)
            self.timings["node ready"] = time.monotonic() - step
        except BaseException as exc:
            tail = self.log_tail()
            self.stop()
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise cluster_.ClusterError(f"the node did not start: {exc}\n{tail}") from exc
        self.startup_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        for proc in reversed(self._procs):  # jobset, kube-proxy, kubelet, containerd, socat, ... (newest first)
            if proc.name == "containerd":  # the kubelet has stopped: nothing recreates the sandboxes
                self._remove_pods()
            try:
                proc.stop()
            except Exception:
                pass
        self._procs = []
        if self.cp is not None:
            self.cp.stop()
            self.cp = None
        nodehost.cleanup(containerd_root=self.containerd_root, kube_proxy=self.node_bin / "kube-proxy",
                         netns_before=self._netns_before)
        if self._sysctls is not None:
            self._sysctls.restore()
            self._sysctls = None

    def _remove_pods(self) -> None:
        try:
            nodehost.remove_sandboxes(self.containerd_address)
        except Exception as exc:
            nodehost.log(f"removing the pod sandboxes failed: {exc}")

    def _control_plane(self) -> Any:
        return _NodeControlPlane(bin_dir=self.cp_bin, crd_dir=self._crds())

    # ------------------------------------------------------------------ components
    def _start_forward(self) -> None:
        """The API server's port on the gateway address, for the `kubernetes` Service's endpoint."""
        port = self.cp.url.rsplit(":", 1)[1]
        self._spawn("socat", ["socat", f"TCP-LISTEN:{port},bind={nodehost.GATEWAY},reuseaddr,fork",
                              f"TCP:127.0.0.1:{port}"])

    def _start_containerd(self) -> None:
        assert self._dir is not None
        state = nodehost.STATE / "containerd"
        cni_conf = nodehost.STATE / "cni" / "net.d"
        nodehost.cni_config(cni_conf, nodehost.STATE / "cni" / "ipam")
        runtime = {"runtime_type": "io.containerd.runc.v2",
                   "options": {"SystemdCgroup": False, "BinaryName": "/usr/bin/runc"}}
        config = {
            "version": 2, "root": str(self.containerd_root), "state": str(state),
            "grpc": {"address": str(self.containerd_address)},
            "disabled_plugins": ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                                 "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
                                 "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp"],
            "plugins": {"io.containerd.grpc.v1.cri": {
                "sandbox_image": nodehost.PAUSE_IMAGE,
                # no process may lower its oom_score_adj without CAP_SYS_RESOURCE (the sandbox asks for -998)
                "restrict_oom_score_adj": True,
                "enable_selinux": False,
                "containerd": {"snapshotter": "overlayfs", "default_runtime_name": "runc",
                               "runtimes": {"runc": runtime, "nvidia": runtime}},
                "cni": {"bin_dir": str(nodehost.CNI_BIN), "conf_dir": str(cni_conf), "max_conf_num": 1}}}}
        path = nodehost.CONF / "containerd.toml"
        path.write_text(_toml(config))
        self.containerd_root.mkdir(parents=True, exist_ok=True)
        proc = self._spawn("containerd", ["containerd", "--config", str(path), "--log-level", "warn"])
        deadline = time.monotonic() + 30
        while not self.containerd_address.exists() or not _cri_ok(nodehost.run(
                ["ctr", "--address", str(self.containerd_address), "plugins", "ls"], check=False)):
            if not proc.alive() or time.monotonic() > deadline:
                raise cluster_.ClusterError(f"containerd did not start:\n{proc.tail(40)}")
            time.sleep(0.2)
        archives = {**self.images, nodehost.PAUSE_IMAGE: nodehost.pause_archive(
            self.node_bin / "kcover-pause", self.containerd_root / "kcover-pause.tar")}
        self.imported = nodehost.import_images(self.containerd_address, archives,
                                               self.containerd_root / "kcover-imported.json")

    def _start_kubelet(self) -> None:
        assert self._dir is not None
        d = self._dir
        kubeconfig = self.kubeconfig("kubelet", self.cp.node_token)
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": nodehost.GATEWAY, "port": KUBELET_PORT, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": server._free_port(),
            "containerRuntimeEndpoint": f"unix://{self.containerd_address}",
            "cgroupDriver": "cgroupfs", "failCgroupV1": False, "failSwapOn": False,
            "tlsCertFile": str(d / "kubelet.crt"), "tlsPrivateKeyFile": str(d / "kubelet.key"),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(d / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "clusterDomain": "cluster.local", "resolvConf": "/etc/resolv.conf",
            # pods see a ConfigMap's new content within seconds (the chart's config reload), not a minute
            "syncFrequency": "5s", "nodeStatusUpdateFrequency": "4s",
            # this machine's disk is shared: never evict or collect images over it
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False, "maxPods": 110, "staticPodPath": "",
            "protectKernelDefaults": False, "makeIPTablesUtilChains": False,
        }
        path = nodehost.CONF / "kubelet.yaml"
        path.write_text(json.dumps(config, indent=2))
        labels = ",".join(f"{k}={v}" for k, v in NODE_LABELS.items())
        self._spawn("kubelet", [
            str(self.node_bin / "kubelet"), f"--config={path}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={nodehost.KUBELET_ROOT}", f"--hostname-override={NODE_NAME}",
            f"--node-ip={nodehost.GATEWAY}", f"--node-labels={labels}", "--v=1"])
        self.wait_node_ready(NODE_NAME, timeout=90)

    def _start_kube_proxy(self) -> None:
        assert self._dir is not None
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": self.kubeconfig("kube-proxy", self.cp.user_tokens["proxy"])},
            "mode": "iptables", "clusterCIDR": nodehost.CLUSTER_CIDR, "hostnameOverride": NODE_NAME,
            "bindAddress": nodehost.GATEWAY, "healthzBindAddress": f"127.0.0.1:{server._free_port()}",
            "metricsBindAddress": f"127.0.0.1:{server._free_port()}",
            "nodePortAddresses": [f"{nodehost.GATEWAY}/32"],
            "conntrack": {"maxPerCore": 0},  # leave the machine's conntrack table size alone
            "iptables": {"localhostNodePorts": False}}
        path = nodehost.CONF / "kube-proxy.yaml"
        path.write_text(json.dumps(config, indent=2))
        proc = self._spawn("kube-proxy", [str(self.node_bin / "kube-proxy"), f"--config={path}", "--v=1"])
        deadline = time.monotonic() + 60
        while f"{nodehost.SERVICE_IP}/32" not in nodehost.run(["iptables-save", "-t", "nat"], check=False):
            if not proc.alive() or time.monotonic() > deadline:
                raise cluster_.ClusterError(f"kube-proxy wrote no rule for the kubernetes Service:\n{proc.tail(40)}")
            time.sleep(0.2)

    def _start_jobset(self) -> None:
        """The JobSet controller, its CRD, and its webhooks (defaulting and validation of JobSets and of their
        pods) served on loopback with a certificate from the test CA and registered by URL."""
        self.cp.apply_crds([self._crd_named_first(p) for p in sorted((self.node_bin / "crds").glob("*.yaml"))])
        certs = nodehost.CONF / "jobset-certs"
        certs.mkdir()
        self.cp.sign(certs / "tls", "/CN=jobset-webhook", "IP:127.0.0.1")
        port, probe = server._free_port(), server._free_port()
        config = {"apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
                  "leaderElection": {"leaderElect": False}, "internalCertManagement": {"enable": False},
                  "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(certs)},
                  "health": {"healthProbeBindAddress": f"127.0.0.1:{probe}"}}
        path = nodehost.CONF / "jobset.yaml"
        path.write_text(json.dumps(config))
        env = {**os.environ, "KUBECONFIG": self.cp.kubeconfig_path}
        proc = self._spawn("jobset-controller", [str(self.node_bin / "jobset-controller"), f"--config={path}",
                                                 "--metrics-bind-address=0", "--zap-log-level=info"], env=env)
        ca = base64.b64encode(Path(self.cp.ca_path).read_bytes()).decode()
        for doc in self._webhooks(port, ca):
            kind = doc["kind"].lower() + "s"
            self._admin("POST", f"/apis/admissionregistration.k8s.io/v1/{kind}", doc)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{probe}/readyz", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if not proc.alive() or time.monotonic() > deadline:
                raise cluster_.ClusterError(f"the JobSet controller is not ready:\n{proc.tail(40)}")
            time.sleep(0.2)

    def _webhooks(self, port: int, ca: str) -> list[dict[str, Any]]:
        """JobSet's webhook configurations (config/components/webhook), with the patches its kustomization
        applies (the pod webhooks see only JobSet pods), pointing at the controller by URL."""
        docs = [d for d in yaml.safe_load_all((self.node_bin / "webhooks" / "manifests.yaml").read_text()) if d]
        patches = {}  # JSON 6902 `replace /webhooks/N` operations: the webhook, whole
        for name in ("mutating-patch.yaml", "validating-patch.yaml"):
            for op in yaml.safe_load((self.node_bin / "webhooks" / name).read_text()) or []:
                if op.get("op") == "replace" and str(op.get("path", "")).startswith("/webhooks/"):
                    patches[op["value"]["name"]] = op["value"]
        for doc in docs:
            doc["metadata"] = {"name": f"jobset-{doc['metadata']['name']}"}
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
                for key, value in patches.get(hook["name"], {}).items():
                    if key not in ("name", "clientConfig"):
                        hook[key] = value
        return docs

    def _crd_named_first(self, path: Path) -> Path:
        assert self._dir is not None
        crd = yaml.safe_load(path.read_text())
        crd["metadata"] = {"name": crd["metadata"]["name"], **crd["metadata"]}
        out = self._dir / path.name
        out.write_text(yaml.safe_dump(crd, sort_keys=False))
        return out



def _cri_ok(plugins: str) -> bool:
    """`ctr plugins ls` lists the CRI plugin as loaded (TYPE ID PLATFORMS STATUS)."""
    return any(line.split()[:2] == ["io.containerd.grpc.v1", "cri"] and line.split()[-1] == "ok"
               for line in plugins.splitlines() if line.strip())


def _toml(config: dict[str, Any], prefix: str = "") -> str:
    """The small TOML subset containerd's config needs: tables of strings, numbers, booleans and string lists."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return str(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(str(v))
    lines = [f"{k} = {value(v)}" for k, v in config.items() if not isinstance(v, dict)]
    out = ""
    if lines:
        out += (f"[{prefix}]\n" if prefix else "") + "\n".join(lines) + "\n\n"
    for k, v in config.items():
        if isinstance(v, dict):
            key = json.dumps(k) if "." in k else k
            out += _toml(v, f"{prefix}.{key}" if prefix else key)
    return out
