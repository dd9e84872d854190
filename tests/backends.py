"""Cluster backends for kcover's tests: the `cluster` fixture, the session control plane, per-backend counts.

A pytest plugin (loaded from tests/conftest.py). Owns:

* Backend selection. ``KCOVER_TEST_BACKENDS`` is a comma list of ``sim`` (the simulated API server,
  `kcover.sim.server.SimServer`, one per test), ``apiserver`` (etcd + kube-apiserver from
  tests/controlplane/server.py, one per session) and ``k3s`` (a k3s container through testcontainers,
  one per session) and ``cluster`` (real components around the apiserver: scheduler,
  controller-manager, kwok, the Kubeflow training operator, with kcover installed by helm; one per
  session, for tests/integration/cluster only, through its ``realcluster`` fixture) and ``node`` (the
  cluster's components plus a real kubelet with containerd, runc, a CNI bridge and kube-proxy, the
  JobSet controller, and kcover's own images installed by `helm install` as the chart's pods; one per
  session, for tests/integration/node only, through its ``realnode`` fixture; needs root). Unset: sim,
  apiserver, cluster and node, plus k3s when a Docker engine answers.
* ``cluster``: every test requesting it is parametrised over the selected backends (test ids
  ``[sim]``, ``[apiserver]``, ``[k3s]``). A test marked ``@pytest.mark.sim_only("why")`` runs on sim only.
  The `Cluster` gives ``backend``, ``client`` (a `kcover.kube.client.KubeClient`), ``kubeconfig_path``,
  ``namespace`` (fresh per test), ``harness`` (`tests/harness/playing.py`: kubelet and job operator
  played over HTTP), ``request_counts`` (server-side, sim only, else None), ``sim`` (the SimServer
  or None) and ``controlplane`` (the real control plane on ``apiserver``, else None).
* ``controlplane``: the session's one real control plane (also used by tests/conformance and
  tests/chart). Its binaries: ``KCOVER_CONTROLPLANE_BIN``, else the cached build of ``KCOVER_K8S_VERSION``
  (``KCOVER_K8S_VERSION=1.29.6 tests/controlplane/build.sh`` builds it), else the newest cached build.
  The summary line names the server's version.
* A terminal summary line per backend: tests passed, failed and skipped (``cluster`` and
  ``conformance_api`` parameters both count).

How it fails: a backend whose prerequisites are missing is skipped with the reason, except that with
``CI=true`` a missing or failing ``apiserver`` backend fails the tests that need it (never skips).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import glob
import importlib.util
import os
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from kcover import errors
from kcover.kube import client as kubeclient

TESTS = Path(__file__).resolve().parent
CONTROLPLANE_DIR = TESTS / "controlplane"
BACKENDS = ("sim", "apiserver", "k3s", "cluster", "node")
GENERIC = ("sim", "apiserver", "k3s")  # backends the generic `cluster` fixture runs tests on
K3S_IMAGE = "rancher/k3s:v1.33.4-k3s1"
PARAMS = ("cluster", "conformance_api", "realcluster", "realnode", "kubectl_server")  # fixtures whose parameter is a backend name
OUTCOMES = pytest.StashKey[dict[str, tuple[str, str]]]()  # nodeid -> (backend, outcome)
STARTUP = pytest.StashKey[dict[str, float]]()  # backend -> start-up seconds
SERVER = pytest.StashKey[dict[str, str]]()  # backend -> the server's gitVersion
BACKEND_PROPERTY = "kcover_backend"  # a report's user property: the test's backend
SERVERS_PROPERTY = "kcover_servers"  # a report's user property: the servers' start-up seconds and versions
SERIAL_GROUPS = {"integration/cluster": "stacks", "integration/node": "stacks"}
"""Test folders whose stacks share the machine (the training operator's fixed webhook cert directory, the
node's kubelet, containerd and host paths): under pytest-xdist all their tests run in one worker, one after
the other, as without it (`pytest_xdist_make_scheduler`)."""
_config: pytest.Config | None = None  # pytest_runtest_logreport is given no config


def in_ci() -> bool:
    return os.environ.get("CI") == "true"


def docker_answers(timeout: float = 5.0) -> bool:
    try:
        return subprocess.run(["docker", "info"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=timeout, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def controlplane_binaries() -> Path | None:
    """The directory holding kube-apiserver and etcd, without building anything: KCOVER_CONTROLPLANE_BIN, else
    the cached build of KCOVER_K8S_VERSION (tests/controlplane/build.sh's cache), else the newest cached build."""
    env = os.environ.get("KCOVER_CONTROLPLANE_BIN")
    if env:
        return Path(env) if (Path(env) / "kube-apiserver").is_file() and (Path(env) / "etcd").is_file() else None
    cache = os.environ.get("KCOVER_CACHE", str(Path.home() / ".cache" / "kcover"))
    version = os.environ.get("KCOVER_K8S_VERSION", "").strip()
    pattern = f"k8s-{version}-etcd-*" if version else "k8s-*"
    found = [Path(p).parent for p in glob.glob(os.path.join(cache, "controlplane", pattern, "kube-apiserver"))
             if (Path(p).parent / "etcd").is_file()]
    return max(found, key=_build_version) if found else None


def _build_version(bin_dir: Path) -> tuple[int, ...]:
    """`k8s-1.36.3-etcd-3.6.16` -> (1, 36, 3): newest first by number, not by name (1.9 < 1.10)."""
    text = bin_dir.name.removeprefix("k8s-").split("-etcd-")[0]
    return tuple(int(part) if part.isdigit() else -1 for part in text.split("."))


def selected_backends() -> list[str]:
    raw = os.environ.get("KCOVER_TEST_BACKENDS", "").strip()
    if not raw:
        return ["sim", "apiserver", "cluster", "node", *(["k3s"] if docker_answers() else [])]
    chosen = [b.strip() for b in raw.split(",") if b.strip()]
    unknown = sorted(set(chosen) - set(BACKENDS))
    if unknown:
        raise pytest.UsageError(f"KCOVER_TEST_BACKENDS: unknown backend(s) {unknown}; known: {list(BACKENDS)}")
    return chosen


def _controlplane_module() -> Any:
    spec = importlib.util.spec_from_file_location("kcover_test_controlplane", CONTROLPLANE_DIR / "server.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------------ hooks

def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config
    config.addinivalue_line("markers", "sim_only(reason): runs on the sim backend only (uses a sim-only feature)")
    config.stash[OUTCOMES] = {}
    config.stash[STARTUP] = {}
    config.stash[SERVER] = {}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "cluster" not in metafunc.fixturenames:
        return
    defs = metafunc.definition._fixtureinfo.name2fixturedefs.get("cluster") or ()
    if not defs or defs[-1].func is not cluster.__wrapped__:  # type: ignore[attr-defined]
        return  # a directory's own `cluster` fixture (tests/chart) overrides this one
    backends = [b for b in selected_backends() if b in GENERIC]
    if metafunc.definition.get_closest_marker("sim_only") is not None:
        backends = [b for b in backends if b == "sim"]
    if not backends:
        metafunc.parametrize("cluster", [pytest.param("sim", marks=pytest.mark.skip(
            reason="none of the selected backends (KCOVER_TEST_BACKENDS) runs this test"))],
                             indirect=True, ids=["sim"])
        return
    metafunc.parametrize("cluster", backends, indirect=True, ids=backends)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (`-n N`, `--dist load` or `loadgroup`): every test is a unit of its own, except the
    tests of `SERIAL_GROUPS`, one unit per group, sent whole to one worker, the largest first. (Not xdist's
    `xdist_group` marks: pytest 9 derives a test's id from its node, and xdist 3.8's renaming of the ids,
    which those marks work by, no longer takes, so marked tests were spread over the workers.)"""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            for folder, group in SERIAL_GROUPS.items():
                if nodeid.startswith(f"tests/{folder}/"):
                    return group
            return nodeid

    return Units(config, log)


def _backend_of(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    for name in PARAMS:
        value = callspec.params.get(name)
        if isinstance(value, str):  # a fixture parametrised by others holds pytest's NOTSET here
            return value
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Names the test's backend, and what this process knows of each backend's server, on the report: the
    summary is written from reports, which pytest-xdist's workers send to the process that prints it."""
    report = yield
    backend = _backend_of(item)
    if backend is not None:
        report.user_properties.append((BACKEND_PROPERTY, backend))
        report.user_properties.append((SERVERS_PROPERTY, {
            "startup": dict(item.config.stash[STARTUP]), "server": dict(item.config.stash[SERVER])}))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    props = dict(report.user_properties)
    backend = props.get(BACKEND_PROPERTY)
    if not isinstance(backend, str) or _config is None:
        return
    servers = props.get(SERVERS_PROPERTY) or {}
    for name, seconds in (servers.get("startup") or {}).items():  # the slowest start of any worker's server
        _config.stash[STARTUP][name] = max(seconds, _config.stash[STARTUP].get(name, 0.0))
    _config.stash[SERVER].update(servers.get("server") or {})
    _record(_config, report, backend)


def _record(config: pytest.Config, report: pytest.TestReport, backend: str) -> None:
    seen = config.stash[OUTCOMES]
    previous = seen.get(report.nodeid, (backend, ""))[1]
    if report.failed:
        result = "failed"
    elif report.skipped:
        result = "skipped"
    elif report.when == "call":
        result = "passed"
    else:
        return
    rank = {"": 0, "passed": 1, "skipped": 2, "failed": 3}
    if rank[result] > rank[previous]:
        seen[report.nodeid] = (backend, result)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    seen = config.stash[OUTCOMES]
    if not seen:
        return
    terminalreporter.section("cluster backends")
    for backend in sorted({b for b, _ in seen.values()}):
        results = [r for b, r in seen.values() if b == backend]
        counts = {k: results.count(k) for k in ("passed", "failed", "skipped")}
        line = (f"backend {backend}: {len(results)} ran, {counts['passed']} passed, {counts['failed']} failed, "
                f"{counts['skipped']} skipped")
        started = config.stash[STARTUP].get(backend)
        if started is not None:
            line += f" (started in {started:.1f} s)"
        server = config.stash[SERVER].get(backend)
        if server:
            line += f" on kube-apiserver {server}"
        terminalreporter.write_line(line)


# ------------------------------------------------------------------------------------------------ servers

@pytest.fixture(scope="session")
def controlplane(pytestconfig: pytest.Config) -> Iterator[Any]:
    """The session's real control plane (etcd + kube-apiserver with the test CRDs)."""
    bin_dir = controlplane_binaries()
    module = _controlplane_module()
    if bin_dir is None:
        why = ("real kube-apiserver backend: binaries not built (set KCOVER_CONTROLPLANE_BIN or run "
               "tests/controlplane/build.sh)")
        if not in_ci():
            pytest.skip(f"{why}; CI=true makes this a failure")
        try:  # CI: build them (tests/controlplane/build.sh), and fail the run if that fails
            bin_dir = module.find_binaries()
        except module.ControlPlaneError as exc:
            pytest.fail(f"{why}, and building them failed; CI=true requires the apiserver backend:\n{exc}")
    cp = module.ControlPlane(bin_dir=bin_dir)
    try:
        cp.start()
    except module.ControlPlaneError as exc:
        pytest.fail(f"the real kube-apiserver did not start: {exc}")
    pytestconfig.stash[STARTUP]["apiserver"] = cp.startup_seconds
    pytestconfig.stash[SERVER]["apiserver"] = str(cp.version().get("gitVersion") or "")
    try:
        yield cp
    finally:
        cp.stop()


@dataclasses.dataclass
class K3s:
    kubeconfig_path: str


@pytest.fixture(scope="session")
def k3s(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Iterator[K3s]:
    """A k3s server in a container (testcontainers), with the test CRDs installed."""
    if not docker_answers():
        pytest.skip("k3s backend: no Docker engine answers (`docker info` failed)")
    from testcontainers.community.k3s import K3SContainer

    started = time.monotonic()
    with K3SContainer(image=K3S_IMAGE) as container:
        path = tmp_path_factory.mktemp("k3s") / "kubeconfig"
        path.write_text(container.config_yaml())
        asyncio.run(_install_crds(str(path)))
        pytestconfig.stash[STARTUP]["k3s"] = time.monotonic() - started
        yield K3s(str(path))


async def _install_crds(kubeconfig: str, timeout: float = 120.0) -> None:
    import yaml

    async with await kubeclient.connect(kubeconfig) as kube:
        names = []
        for crd_file in sorted((CONTROLPLANE_DIR / "crds").glob("*.yaml")):
            crd = yaml.safe_load(crd_file.read_text())
            with contextlib.suppress(errors.ConflictError):
                await kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd)
            names.append(crd["metadata"]["name"])
        deadline = time.monotonic() + timeout
        for name in names:
            while True:
                crd = await kube.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                if any(c.get("type") == "Established" and c.get("status") == "True"
                       for c in (crd.get("status") or {}).get("conditions") or []):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"CRD {name} not established within {timeout} s")
                await asyncio.sleep(0.2)


# ------------------------------------------------------------------------------------------------ cluster

@dataclasses.dataclass
class Cluster:
    """One test's view of a backend: a client, a fresh namespace and the harness."""

    backend: str
    client: kubeclient.KubeClient
    kubeconfig_path: str
    namespace: str
    harness: Any  # harness.playing.Harness
    configuration: Any  # kubernetes_asyncio Configuration, for more clients
    sim: Any = None  # kcover.sim.server.SimServer on the sim backend
    controlplane: Any = None  # tests/controlplane/server.py's ControlPlane on the apiserver backend (compact())
    namespaces: list[str] = dataclasses.field(default_factory=list)  # created, removed at teardown

    @property
    def request_counts(self) -> dict[str, int] | None:
        """Requests the server served, by "<VERB> <resource>" (sim only; None elsewhere)."""
        return None if self.sim is None else self.sim.request_counts

    def new_client(self) -> kubeclient.KubeClient:
        """Another client for the same server (close it)."""
        return kubeclient.from_configuration(self.configuration)

    async def serves(self, api_version: str, plural: str) -> bool:
        """Whether the server's discovery lists `plural` in `api_version` (`resource.k8s.io/v1`): a test asks
        the server what it serves rather than assuming a Kubernetes version."""
        try:
            listing = await self.harness.kube.request("GET", f"/apis/{api_version}")
        except errors.NotFoundError:
            return False
        return any(r.get("name") == plural for r in listing.get("resources") or [])

    async def server(self) -> str:
        """`apiserver (v1.29.6)`: the backend and the server's gitVersion, for a skip reason."""
        return f"{self.backend} ({(await self.harness.kube.request('GET', '/version')).get('gitVersion', '?')})"

    async def require(self, api_version: str, plural: str) -> None:
        """Skip the test, saying so, unless the server serves `plural` in `api_version`."""
        if not await self.serves(api_version, plural):
            pytest.skip(f"{await self.server()} serves no {api_version} {plural}")

    async def device_health_refused(self) -> str:
        """"" when this server keeps a DRA claim on a pod and an `allocatedResourcesStatus` entry naming it in
        the pod's status (KEP-4680, what dra-health reads), else why not: a probe pod in the test's namespace,
        deleted at once, answers (the field is new in 1.31; the DynamicResourceAllocation gate, off by default
        before 1.34, keeps claims; the ResourceHealthStatus gate, off before 1.36, keeps the field)."""
        kube, ns, name = self.harness.kube, self.namespace, "probe-" + secrets.token_hex(3)
        path = f"/api/v1/namespaces/{ns}/pods"
        pod = await kube.request("POST", path, body={
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"nodeName": "kcover-probe-no-such-node",
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}],
                     "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}]}})
        try:
            if not pod["spec"].get("resourceClaims"):
                return f"{await self.server()} dropped the pod's spec.resourceClaims (DynamicResourceAllocation off)"
            await self.harness.run_pod(ns, name)
            try:
                await self.harness.set_device_health(ns, name, "c", resource_name="claim:gpu",
                                                     resource_id="gpu.example.com/pool/dev-0", health="Healthy")
            except errors.KubeError as exc:
                return f"{await self.server()} refused allocatedResourcesStatus naming a DRA claim: {exc}"
            got = await kube.request("GET", f"{path}/{name}")
            if not any(c.get("allocatedResourcesStatus") for c in got["status"].get("containerStatuses") or []):
                return (f"{await self.server()} dropped allocatedResourcesStatus from the pod's status (no such "
                        "field, or its ResourceHealthStatus gate is off)")
            return ""
        finally:
            with contextlib.suppress(errors.NotFoundError):
                await kube.request("DELETE", f"{path}/{name}", query={"gracePeriodSeconds": 0})

    async def create_namespace(self, name: str) -> str:
        await self.client.request("POST", "/api/v1/namespaces", body={
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        self.namespaces.append(name)
        return name


# Namespaced resources a test may leave behind: a real server without a namespace controller never
# empties a deleted namespace, and cluster-wide watches (the controller's cache) would see them.
CLEANUP = ("/api/v1/namespaces/{ns}/pods", "/api/v1/namespaces/{ns}/events", "/api/v1/namespaces/{ns}/configmaps",
           "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", "/apis/batch/v1/namespaces/{ns}/jobs",
           "/apis/apps/v1/namespaces/{ns}/replicasets",
           *(f"/apis/kubeflow.org/v1/namespaces/{{ns}}/{plural}" for plural in
             ("pytorchjobs", "tfjobs", "mpijobs", "xgboostjobs", "paddlejobs", "jaxjobs")))


async def _cleanup(kube: kubeclient.KubeClient, namespaces: list[str], nodes_before: set[str]) -> None:
    for ns in [*namespaces, "default"]:
        for template in CLEANUP if ns != "default" else ("/api/v1/namespaces/{ns}/events",):
            with contextlib.suppress(errors.NotFoundError):
                await kube.request("DELETE", template.format(ns=ns), query={"gracePeriodSeconds": 0})
    nodes = await kube.request("GET", "/api/v1/nodes")
    for node in nodes.get("items") or []:
        if node["metadata"]["name"] not in nodes_before:
            with contextlib.suppress(errors.NotFoundError):
                await kube.request("DELETE", f"/api/v1/nodes/{node['metadata']['name']}")
    for ns in namespaces:
        with contextlib.suppress(errors.NotFoundError):
            await kube.request("DELETE", f"/api/v1/namespaces/{ns}")


@pytest.fixture
async def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Cluster]:
    from harness import playing
    from kubernetes_asyncio import client as k8s_client
    from kubernetes_asyncio import config as k8s_config

    backend = str(request.param)
    namespace = "t-" + secrets.token_hex(4)
    async with contextlib.AsyncExitStack() as stack:
        sim = controlplane = None
        if backend == "sim":
            from kcover.sim import server as simserver

            sim = await stack.enter_async_context(simserver.SimServer())
            kubeconfig = str(sim.write_kubeconfig(tmp_path / "kubeconfig"))
            configuration = sim.kube_configuration()
        else:
            if backend == "apiserver":
                controlplane = request.getfixturevalue("controlplane")
                kubeconfig = controlplane.kubeconfig_path
            else:
                kubeconfig = request.getfixturevalue("k3s").kubeconfig_path
            configuration = k8s_client.Configuration()
            await k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        kube = kubeclient.from_configuration(configuration)
        stack.push_async_callback(kube.close)
        played = kubeclient.from_configuration(configuration)  # its own client: tests count the product's requests
        stack.push_async_callback(played.close)
        nodes_before = {n["metadata"]["name"] for n in (await played.request("GET", "/api/v1/nodes"))["items"]}
        made = Cluster(backend=backend, client=kube, kubeconfig_path=kubeconfig, namespace=namespace,
                       harness=playing.Harness(played, namespace=namespace), configuration=configuration, sim=sim,
                       controlplane=controlplane)
        await made.create_namespace(namespace)
        kube.request_counts.clear()
        try:
            yield made
        finally:
            if sim is None:
                await _cleanup(played, made.namespaces, nodes_before)
