"""The `node` backend's session: a real kubelet, kcover's own images, and the chart installed as a user does.

`realnode` (session, parameter ``node`` so the per-backend summary counts its tests) starts
tests/controlplane/node.py's stack (the `cluster` backend's control plane and controllers, containerd,
runc, a real kubelet with a CNI bridge and kube-proxy, the JobSet controller, two kwok GPU nodes),
imports kcover's images built by scripts/build-images (tarballs cached under
~/.cache/kcover/images by a hash of their inputs), runs the test device plugin (fake `nvidia.com/gpu`
devices the real kubelet allocates), and runs

    helm install kcover helm/kcover --namespace kcover-system --create-namespace --set image.registry=localhost \
        --values <the agent's fake NVML file>

so kcover runs as the chart's pods with in-cluster config. The one value beyond the registry gives the
agent a fake NVML (`kcover agent --fake-nvml`) whose fault file a test appends to by `kubectl exec`:
there is no GPU driver here. Everything else is the chart's and kcover's defaults.

Selected by ``KCOVER_TEST_BACKENDS`` containing ``node`` (the default includes it). Missing
prerequisites (root, the Debian packages of tests/controlplane/node-prereqs.sh, binaries, images) skip
with the reason, except with ``CI=true``, where binaries and images are built and a failure fails the tests.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import backends
import pytest
from deviceplugin import DevicePlugin

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "helm" / "kcover"
RELEASE, RELEASE_NS = "kcover", "kcover-system"
FAKE_NVML = "/tmp/kcover-fake-nvml"  # in the agent pod's /tmp emptyDir
VALUES: dict[str, Any] = {"agent": {"extraArgs": [f"--fake-nvml={FAKE_NVML}"]}}
OPT_IN = {"kcover.io/cascading-recovery": "true"}
T = TypeVar("T")


def _load(name: str, path: Path) -> Any:
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


node_ = _load("kcover_test_node", backends.CONTROLPLANE_DIR / "node.py")
cluster_ = node_.cluster_
nodehost = node_.nodehost
CTL = nodehost.STATE / "ctl"  # a hostPath the test workloads read their fault trigger from


def until(probe: Callable[[], T | None], what: str, within: float = 90.0, every: float = 0.1) -> T:
    deadline = time.monotonic() + within
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what}")
        time.sleep(every)


@dataclasses.dataclass
class RealNode:
    stack: Any
    helm: str
    kubectl: str
    workdir: Path
    images: dict[str, Path]
    workload_image: str
    plugin: DevicePlugin
    backend: str = "node"

    @property
    def kubeconfig_path(self) -> str:
        return str(self.stack.kubeconfig_path)

    @property
    def node(self) -> str:
        return str(self.stack.node_name)

    # ------------------------------------------------------------------ API
    def request(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return self.stack.cp.request(method, path, body, **kw)  # type: ignore[no-any-return]

    def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        status, got = self.request(method, path, body, **kw)
        assert status < 300, f"{method} {path}: HTTP {status}: {got!r}"
        return got

    def pods(self, namespace: str, selector: str = "", *, live: bool = True) -> list[dict[str, Any]]:
        query = f"?labelSelector={selector}" if selector else ""
        items = self.ok("GET", f"/api/v1/namespaces/{namespace}/pods{query}")["items"]
        out = [p for p in items if not live or not p["metadata"].get("deletionTimestamp")]
        return sorted(out, key=lambda p: str(p["metadata"]["name"]))

    def log(self, namespace: str, pod: str, container: str = "", *, previous: bool = False,
            timestamps: bool = False) -> str:
        """A container's log as the kubelet serves it (through the API server)."""
        query = "&".join(q for q in (f"container={container}" if container else "",
                                      "previous=true" if previous else "",
                                      "timestamps=true" if timestamps else "") if q)
        status, body = self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}/log" + (f"?{query}" if query else ""),
                                    raw=True, accept="*/*")
        assert status == 200, f"log of {namespace}/{pod}: HTTP {status}: {body[:300]!r}"
        return bytes(body).decode(errors="replace")

    def json_log(self, namespace: str, pod: str) -> list[dict[str, Any]]:
        out = []
        for line in self.log(namespace, pod).splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def events(self, namespace: str, reason: str = "", uid: str = "") -> list[dict[str, Any]]:
        items = self.ok("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
        return [e for e in items if (not reason or e.get("reason") == reason)
                and (not uid or e["involvedObject"].get("uid") == uid)]

    def namespace(self, name: str) -> str:
        self.ok("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        return name

    # ------------------------------------------------------------------ tools
    def _env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": self.kubeconfig_path, "HELM_CACHE_HOME": str(self.workdir / "helm-cache"),
                "HELM_CONFIG_HOME": str(self.workdir / "helm-config"), "HELM_DATA_HOME": str(self.workdir / "helm-data")}

    def run_helm(self, *args: str, values: dict[str, Any] | None = None, check: bool = True,
                 timeout: float = 180) -> subprocess.CompletedProcess[str]:
        argv = [self.helm, *args] + (["--values", "-"] if values is not None else [])
        proc = subprocess.run(argv, input=json.dumps(values) if values is not None else None, capture_output=True,
                              text=True, env=self._env(), check=False, timeout=timeout)
        if check:
            assert proc.returncode == 0, f"{' '.join(argv)} failed:\n{proc.stdout}\n{proc.stderr}"
        return proc

    def install(self, values: dict[str, Any] | None = None) -> None:
        """`helm install` as docs/install.md says, with locally built images: the registry is `localhost`."""
        self.run_helm("install", RELEASE, str(CHART), "--namespace", RELEASE_NS, "--create-namespace",
                      "--set", "image.registry=localhost", values={**VALUES, **(values or {})})
        self.wait_ready()

    def upgrade(self, values: dict[str, Any], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run_helm("upgrade", RELEASE, str(CHART), "--namespace", RELEASE_NS,
                             "--set", "image.registry=localhost", values={**VALUES, **values}, check=check)

    def uninstall(self) -> None:
        self.run_helm("uninstall", RELEASE, "--namespace", RELEASE_NS, "--wait", "--timeout", "120s")

    def kubectl_run(self, *args: str, timeout: float = 60, check: bool = True) -> str:
        proc = subprocess.run([self.kubectl, *args], capture_output=True, text=True, env=self._env(), check=False,
                              timeout=timeout)
        if check:
            assert proc.returncode == 0, f"kubectl {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    def exec(self, namespace: str, pod: str, *argv: str) -> str:
        """`kubectl exec`: through the API server to the real kubelet's streaming server."""
        return self.kubectl_run("exec", "-n", namespace, pod, "--", *argv)

    # ------------------------------------------------------------------ kcover
    def controllers(self) -> list[dict[str, Any]]:
        return self.pods(RELEASE_NS, "app.kubernetes.io%2Fcomponent%3Dcontroller")

    def agent(self) -> dict[str, Any]:
        """The agent pod on the real node."""
        pods = [p for p in self.pods(RELEASE_NS, "app.kubernetes.io%2Fcomponent%3Dagent")
                if p["spec"].get("nodeName") == self.node]
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        return pods[0]

    def leader(self) -> str:
        status, lease = self.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{RELEASE_NS}/leases/"
                                            "kcover-controller")
        return str((lease.get("spec") or {}).get("holderIdentity") or "") if status == 200 else ""

    def ready_pods(self) -> tuple[list[str], str] | None:
        """(controller pods Ready, the real node's agent pod) once both controllers and that agent are Ready
        and one controller leads."""
        def ready(p: dict[str, Any]) -> bool:
            return any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
        controllers = [p for p in self.controllers() if ready(p)]
        agents = [p for p in self.pods(RELEASE_NS, "app.kubernetes.io%2Fcomponent%3Dagent")
                  if p["spec"].get("nodeName") == self.node and ready(p)]
        names = [p["metadata"]["name"] for p in controllers]
        if len(controllers) == 2 and agents and self.leader() in names:
            return names, agents[0]["metadata"]["name"]
        return None

    def wait_ready(self, within: float = 180.0) -> tuple[list[str], str]:
        return until(self.ready_pods, "both controller replicas and the node's agent Ready, one leading", within)

    def inject(self, line: str) -> None:
        """Append one fault line to the real node's agent's fake NVML (nvml/scripted.py's grammar)."""
        self.exec(RELEASE_NS, self.agent()["metadata"]["name"], "python3", "-c",
                  f"open({FAKE_NVML!r}, 'a').write({line + chr(10)!r})")


def _images(workdir: Path) -> dict[str, Path]:
    """kcover's images (and the base the test workloads run on) as archives, from scripts/build-images."""
    manifest = os.environ.get("KCOVER_IMAGES_MANIFEST")
    if not manifest:
        manifest = str(workdir / "images.json")
        cache = cluster_.cache_root() / "images"
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "build-images"), "--cache", str(cache),
                               "--manifest", manifest], capture_output=True, text=True, check=False, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"scripts/build-images failed:\n{proc.stderr[-4000:]}")
    return {name: Path(path) for name, path in json.loads(Path(manifest).read_text()).items()}


def _binaries() -> tuple[Path | None, Path | None, Path | None, str | None]:
    realkit_helm = sorted((cluster_.cache_root()).glob("helm-*/helm"))
    helm = os.environ.get("KCOVER_HELM_BIN") or (str(realkit_helm[-1]) if realkit_helm else None)
    return backends.controlplane_binaries(), cluster_.cluster_binaries(), node_.node_binaries(), helm


@pytest.fixture(scope="session")
def realnode(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    if "node" not in backends.selected_backends():
        pytest.skip("node backend not selected (KCOVER_TEST_BACKENDS)")
    missing = nodehost.missing_prerequisites()
    if missing:
        why = "node backend: " + "; ".join(missing)
        if backends.in_ci():
            pytest.fail(why + " (CI=true requires the node backend)")
        pytest.skip(why)
    cp_bin, cluster_bin, node_bin, helm = _binaries()
    if None in (cp_bin, cluster_bin, node_bin, helm):
        if not backends.in_ci():
            pytest.skip("node backend: binaries not built (tests/controlplane/build.sh, build-cluster.sh, "
                        "build-node.sh, build-helm.sh); CI=true builds them and makes a failure fatal")
        try:
            cp_bin = cp_bin or Path(backends._controlplane_module().find_binaries())
            cluster_bin = cluster_bin or cluster_.build()
            node_bin = node_bin or node_.build()
            helm = helm or subprocess.run(["bash", str(backends.CONTROLPLANE_DIR / "build-helm.sh")], capture_output=True,
                                          text=True, check=True).stdout.split()[-1]
        except Exception as exc:
            pytest.fail(f"node backend: building the components failed; CI=true requires them:\n{exc}")
    workdir = tmp_path_factory.mktemp("realnode")
    started = time.monotonic()
    try:
        images = _images(workdir)
    except Exception as exc:
        if backends.in_ci():
            pytest.fail(f"node backend: {exc}")
        pytest.skip(f"node backend: {exc}")
    base = [name for name in images if "python-base" in name]
    stack = node_.NodeStack(cp_bin=cp_bin, cluster_bin=cluster_bin, node_bin=node_bin, images=images)
    try:
        stack.start()
    except cluster_.ClusterError as exc:
        pytest.fail(str(exc))
    plugin = DevicePlugin(nodehost.KUBELET_ROOT / "device-plugins")
    try:
        plugin.start()
        CTL.mkdir(parents=True, exist_ok=True)
        rn = RealNode(stack=stack, helm=str(helm), kubectl=str(cluster_bin / "kubectl"), workdir=workdir, images=images,
                      workload_image=base[0], plugin=plugin)

        def gpus() -> bool:
            node = rn.ok("GET", f"/api/v1/nodes/{rn.node}")
            return node["status"].get("allocatable", {}).get("nvidia.com/gpu") == str(len(plugin.devices))
        until(gpus, "the kubelet to advertise the device plugin's GPUs", within=60)
        rn.install()
        request.config.stash[backends.STARTUP]["node"] = time.monotonic() - started
        print(f"node backend: started in {time.monotonic() - started:.1f} s {stack.timings} images {stack.imported}")
        yield rn
    finally:
        plugin.stop()
        stack.stop()
