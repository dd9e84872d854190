"""kubectl, used as a newcomer would, answers the same against `kcover sim --serve` and kube-apiserver.

The real kubectl binary (tests/controlplane/build-cluster.sh caches it; $KCOVER_KUBECTL or PATH also do)
runs against a `kcover sim pod-error --serve` process and against the session's real kube-apiserver:
typed creates that travel as protobuf (`create namespace`, `create configmap`), `create -f` with
client-side validation against the served OpenAPI, the server-side Tables of `get` (pods, nodes,
events, configmaps, jobs, namespaces), `label`, `annotate`, `cordon`/`uncordon`, `logs`, `delete`.
Outside CI a missing kubectl skips with the reason; in CI it fails. A server further than one minor from
the kubectl binary (the matrix's oldest kube-apiserver with the newest kubectl) is outside kubectl's
version skew policy and skipped, saying so.
"""

from __future__ import annotations

import json
import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import backends
import pytest
from conformance_client import minor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "scenarios"))
import recordkit

OBJECTS = """\
apiVersion: v1
kind: ConfigMap
metadata: {{name: cm}}
data: {{a: "1"}}
---
apiVersion: v1
kind: Pod
metadata: {{name: p}}
spec:
  nodeSelector: {{kcover.io/no-such-node: "x"}}
  containers:
  - {{name: c, image: busybox}}
---
apiVersion: batch/v1
kind: Job
metadata: {{name: j}}
spec:
  suspend: true
  template:
    spec:
      restartPolicy: Never
      containers:
      - {{name: c, image: busybox}}
---
apiVersion: v1
kind: Event
metadata: {{name: e1}}
type: Warning
reason: Tested
message: hello from kubectl
firstTimestamp: "2026-01-01T00:00:00Z"
lastTimestamp: "2026-01-01T00:00:00Z"
involvedObject: {{kind: Pod, namespace: {ns}, name: p}}
"""
NODE = """\
apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels: {{node-role.kubernetes.io/gpu: ""}}
"""


def _binary() -> str:
    """$KCOVER_KUBECTL, else the kubectl build-cluster.sh built (the control plane's version), else PATH's."""
    cache = Path(os.environ.get("KCOVER_CACHE", str(Path.home() / ".cache" / "kcover")))
    cached = sorted(cache.glob("cluster/*/kubectl"))
    found = os.environ.get("KCOVER_KUBECTL") or (str(cached[-1]) if cached else recordkit.kubectl())
    if found is None:
        why = "no kubectl binary (tests/controlplane/build-cluster.sh caches one; or set KCOVER_KUBECTL)"
        if backends.in_ci():
            pytest.fail(f"{why}; CI=true requires it")
        pytest.skip(why)
    return found


def _serve_sim(tmp: Path) -> Iterator[str]:
    kubeconfig = tmp / "kubeconfig"
    proc = subprocess.Popen([sys.executable, "-m", "kcover.cli", "sim", "pod-error", "--serve", "--nodes", "2",
                             "--jobs", "1", "--gpus-per-node", "1", "--kubeconfig-out", str(kubeconfig)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        seen = []
        deadline = time.monotonic() + 120
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("serving the simulated cluster"):
                break
            assert time.monotonic() < deadline, "".join(seen)
        assert kubeconfig.is_file(), "".join(seen)
        yield str(kubeconfig)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module", params=[b for b in backends.selected_backends() if b in ("sim", "apiserver")])
def kubectl_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A kubeconfig for `kcover sim --serve` (sim) or the session's kube-apiserver (apiserver)."""
    _binary()
    if request.param == "sim":
        yield from _serve_sim(tmp_path_factory.mktemp("kubectl-sim"))
    else:
        yield request.getfixturevalue("controlplane").kubeconfig_path


class Kubectl:
    def __init__(self, kubeconfig: str, tmp: Path, *, controllers: bool) -> None:
        self.kubeconfig = kubeconfig
        self.tmp = tmp
        self.binary = _binary()
        self.controllers = controllers
        """The cluster runs controllers (the sim's scheduler, Job controller, ...); the bare apiserver does not."""

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        done = self.result(*args, stdin=stdin)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def result(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.binary, "--kubeconfig", self.kubeconfig, *args], input=stdin,
                              capture_output=True, text=True, timeout=90)

    def table(self, *args: str) -> list[list[str]]:
        """`kubectl get` output as rows of cells, cut where the header's columns start."""
        lines = [line for line in self("get", *args).splitlines() if line.strip()]
        starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", lines[0])]
        return [[line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)] for line in lines]


@pytest.fixture
def kubectl(kubectl_server: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Kubectl, str]]:
    run = Kubectl(kubectl_server, tmp_path, controllers=request.node.callspec.params["kubectl_server"] == "sim")
    versions = json.loads(run("version", "-o", "json"))
    client, server = versions["clientVersion"]["gitVersion"], versions["serverVersion"]["gitVersion"]
    if minor(client)[0] != minor(server)[0] or abs(minor(client)[1] - minor(server)[1]) > 1:
        pytest.skip(f"kubectl {client} supports servers within one minor of it; this one is {server}")
    ns = "kubectl-" + secrets.token_hex(3)
    assert run("create", "namespace", ns) == f"namespace/{ns} created\n"  # typed client: a protobuf body
    yield run, ns
    subprocess.run([run.binary, "--kubeconfig", kubectl_server, "delete", "namespace", ns, "--wait=false"],
                   capture_output=True, timeout=60, check=False)


def test_create_get_and_delete(kubectl: tuple[Kubectl, str]) -> None:
    run, ns = kubectl
    (run.tmp / "objects.yaml").write_text(OBJECTS.format(ns=ns))
    created = run("create", "-f", str(run.tmp / "objects.yaml"), "-n", ns)  # validated against /openapi/v3
    assert created.splitlines() == ["configmap/cm created", "pod/p created", "job.batch/j created", "event/e1 created"]
    assert run("create", "configmap", "cm2", "--from-literal=b=2", "-n", ns) == "configmap/cm2 created\n"
    pods = run.table("pods", "-n", ns)
    assert pods[0] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert pods[1][:4] == ["p", "0/1", "Pending", "0"]
    wide = run.table("pods", "-n", ns, "-o", "wide")
    assert wide[0] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE", "NOMINATED NODE", "READINESS GATES"]
    assert wide[1][5:] == ["<none>", "<none>", "<none>", "<none>"]
    configmaps = run.table("configmaps", "-n", ns)
    assert [r[:2] for r in configmaps] == [["NAME", "DATA"], ["cm", "1"], ["cm2", "1"]]
    assert configmaps[0][2] == "AGE"
    jobs = run.table("jobs", "-n", ns)
    assert jobs[0] == ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]
    # a Job controller marks the suspended Job; without one it reads as Running
    assert jobs[1][:4] == ["j", "Suspended" if run.controllers else "Running", "0/1", ""]
    events = run.table("events", "-n", ns)
    assert events[0] == ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    tested = [e for e in events[1:] if e[2] == "Tested"]
    assert [e[1:] for e in tested] == [["Warning", "Tested", "pod/p", "hello from kubectl"]]
    assert re.fullmatch(r"\d+d", tested[0][0])
    unschedulable = [e[1:4] for e in events[1:] if e[2] == "FailedScheduling"]
    assert unschedulable == ([["Warning", "FailedScheduling", "pod/p"]] if run.controllers else [])
    assert run.table("namespace", ns)[1][:2] == [ns, "Active"]
    assert run("logs", "p", "-n", ns) == ""  # not scheduled: no kubelet to ask
    # kubectl 1.35+ names the namespace
    assert re.fullmatch(f'configmap "cm2" deleted( from {ns} namespace)?\n', run("delete", "configmap", "cm2", "-n", ns))
    assert re.fullmatch(f'pod "p" deleted( from {ns} namespace)?\n', run("delete", "pod", "p", "-n", ns))
    assert run("get", "configmaps,pods", "-n", ns, "-o", "name").split() == ["configmap/cm"]


def test_label_annotate_cordon(kubectl: tuple[Kubectl, str]) -> None:
    run, ns = kubectl
    assert run("create", "configmap", "cm", "--from-literal=a=1", "-n", ns) == "configmap/cm created\n"
    assert run("label", "configmap", "cm", "-n", ns, "team=a") == "configmap/cm labeled\n"
    assert run("annotate", "configmap", "cm", "-n", ns, "note=x") == "configmap/cm annotated\n"
    assert run("get", "configmap", "-n", ns, "-l", "team=a", "-o", "name") == "configmap/cm\n"
    assert run("get", "configmap", "cm", "-n", ns, "-o", "jsonpath={.metadata.annotations.note}") == "x"
    node = ns + "-node"
    (run.tmp / "node.yaml").write_text(NODE.format(name=node))
    assert run("create", "-f", str(run.tmp / "node.yaml")) == f"node/{node} created\n"
    try:
        nodes = run.table("nodes", node)
        assert nodes[0] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
        assert nodes[1][:3] == [node, "Unknown", "gpu"]
        assert run("cordon", node) == f"node/{node} cordoned\n"
        assert run.table("nodes", node)[1][:3] == [node, "Unknown,SchedulingDisabled", "gpu"]
        assert run("uncordon", node) == f"node/{node} uncordoned\n"
        assert run.table("nodes", node)[1][1] == "Unknown"
    finally:
        assert run("delete", "node", node) == f'node "{node}" deleted\n'


def _reader(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    """`proc`'s stdout lines, as they come, from a thread (a pipe's buffered reads defeat select)."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _lines(lines: queue.Queue[str], count: int, seconds: float = 30) -> list[str]:
    """The next `count` lines, or fewer when `seconds` pass."""
    out: list[str] = []
    deadline = time.monotonic() + seconds
    while len(out) < count:
        try:
            out.append(lines.get(timeout=max(0.01, deadline - time.monotonic())))
        except queue.Empty:
            break
    return out


def test_get_watch_prints_the_servers_columns(kubectl: tuple[Kubectl, str]) -> None:
    """`kubectl get -w` asks the watch for Tables: its rows keep the server's columns (DATA for a ConfigMap)."""
    run, ns = kubectl
    run("create", "configmap", "watched", "--from-literal=a=1", "-n", ns)
    proc = subprocess.Popen([run.binary, "--kubeconfig", run.kubeconfig, "get", "configmaps", "watched", "-n", ns,
                             "-w"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = _reader(proc)
    try:
        first = _lines(lines, 2)
        assert first[0].split() == ["NAME", "DATA", "AGE"]
        assert first[1].split()[:2] == ["watched", "1"]
        run("patch", "configmap", "watched", "-n", ns, "--type=merge", "-p", '{"data":{"b":"2"}}')
        changed = _lines(lines, 1)
        assert [line.split()[:2] for line in changed] == [["watched", "2"]]
    finally:
        proc.kill()
        proc.wait()


CONFIG = """\
apiVersion: v1
kind: ConfigMap
metadata: {{name: applied}}
data: {{a: "{a}"}}
"""


def test_apply_server_side_owns_fields_and_reports_conflicts(kubectl: tuple[Kubectl, str]) -> None:
    run, ns = kubectl
    config = run.tmp / "applied.yaml"
    config.write_text(CONFIG.format(a=1))
    assert run("apply", "--server-side", "-f", str(config), "-n", ns) == "configmap/applied serverside-applied\n"
    config.write_text(CONFIG.format(a=2))
    assert run("apply", "--server-side", "-f", str(config), "-n", ns) == "configmap/applied serverside-applied\n"
    assert run("get", "configmap", "applied", "-n", ns, "-o", "jsonpath={.data.a}") == "2"
    config.write_text(CONFIG.format(a=3))
    other = run.result("apply", "--server-side", "--field-manager=other", "-f", str(config), "-n", ns)
    assert other.returncode != 0
    assert 'Apply failed with 1 conflict: conflict with "kubectl": .data.a' in other.stderr
    forced = run("apply", "--server-side", "--field-manager=other", "--force-conflicts", "-f", str(config), "-n", ns)
    assert forced == "configmap/applied serverside-applied\n"
    managers = run("get", "configmap", "applied", "-n", ns, "--show-managed-fields",
                   "-o", "jsonpath={.metadata.managedFields[*].manager}")
    assert managers.split() == ["other"]  # kubectl lost its only field


DAEMONSET = """\
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec: {containers: [{name: agent, image: kcover-agent}]}
"""
NODE_PODS = """\
apiVersion: v1
kind: Pod
metadata:
  name: agent-on-node
  labels: {{app: agent}}
  ownerReferences: [{{apiVersion: apps/v1, kind: DaemonSet, name: agent, uid: "{uid}", controller: true}}]
spec:
  nodeName: {node}
  containers: [{{name: agent, image: kcover-agent}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: bare}}
spec:
  nodeName: {node}
  containers: [{{name: c, image: busybox}}]
"""


def test_drain_ignores_daemonset_pods_and_evicts_the_rest(kubectl: tuple[Kubectl, str]) -> None:
    run, ns = kubectl
    node = ns + "-drained"
    (run.tmp / "node.yaml").write_text(NODE.format(name=node))
    run("create", "-f", str(run.tmp / "node.yaml"))
    try:
        (run.tmp / "ds.yaml").write_text(DAEMONSET)
        run("create", "-f", str(run.tmp / "ds.yaml"), "-n", ns)
        uid = run("get", "daemonset", "agent", "-n", ns, "-o", "jsonpath={.metadata.uid}")
        (run.tmp / "pods.yaml").write_text(NODE_PODS.format(uid=uid, node=node))
        run("create", "-f", str(run.tmp / "pods.yaml"), "-n", ns)
        refused = run.result("drain", node, "--force", "--grace-period=0", "--timeout=60s")
        assert refused.returncode != 0
        assert f"cannot delete DaemonSet-managed Pods (use --ignore-daemonsets to ignore): {ns}/agent-on-node" \
            in refused.stderr
        drained = run.result("drain", node, "--ignore-daemonsets", "--force", "--grace-period=0", "--timeout=60s")
        assert drained.returncode == 0, drained.stderr
        assert f"ignoring DaemonSet-managed Pods: {ns}/agent-on-node" in drained.stderr
        assert drained.stdout.splitlines() == [f"node/{node} already cordoned", f"evicting pod {ns}/bare",
                                               "pod/bare evicted", f"node/{node} drained"]
        assert run("get", "pods", "-n", ns, "-o", "name").split() == ["pod/agent-on-node"]
        assert run.table("nodes", node)[1][1].endswith("SchedulingDisabled")
    finally:
        run.result("delete", "node", node)
