"""kcover's scenarios end to end on real components (the `cluster` backend, tests/integration/cluster/realkit.py).

The real Kubeflow training operator creates the pods, the real scheduler places them on kwok's GPU
nodes, kwok runs them; kcover runs as processes with the chart's ServiceAccount tokens. Faults come as
a real cluster produces them: a kubelet-like status write (a container that exited with Error and was
restarted, a DRA device turning Unhealthy), an XID from the agent's (fake) NVML, an Event from a health
checker. Each test checks what a user would see: the operator recreated the pods, the scheduler put
them away from a cordoned node, kwok ran them and the job is Running again.

Each scenario prints its timeline (seconds from the fault): detected, acted, recreated, Running.
"""

from __future__ import annotations

import datetime as dt
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from realkit import RELEASE_NS, RealCluster, chart_rbac_without

pytestmark = pytest.mark.parametrize("realcluster", ["cluster"], indirect=True)

T = TypeVar("T")
WAIT = 45.0
RESTARTED = "KcoverRestartedWorkload"
CONTAINER = "pytorch"
OPT_IN = {"kcover.io/cascading-recovery": "true"}


def _until(probe: Callable[[], T | None], what: str, within: float = WAIT) -> T:
    deadline = time.monotonic() + within
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what}")
        time.sleep(0.05)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Timeline:
    def __init__(self, name: str) -> None:
        self.name = name
        self.t0 = time.monotonic()
        self.marks: list[tuple[str, float]] = []

    def mark(self, what: str) -> None:
        self.marks.append((what, time.monotonic() - self.t0))

    def report(self) -> str:
        line = f"timeline {self.name}: fault 0.00 s, " + ", ".join(f"{w} {t:.2f} s" for w, t in self.marks)
        print(line)
        return line


@pytest.fixture
def ns(realcluster: RealCluster) -> Iterator[str]:
    name = "t-" + secrets.token_hex(4)
    realcluster.ok("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    realcluster.stop_all()
    realcluster.request("DELETE", f"/api/v1/namespaces/{name}")
    for where in (RELEASE_NS, "default"):  # the agent's node Events would act again in the next test
        realcluster.request("DELETE", f"/api/v1/namespaces/{where}/events")
    # kcover's ledger outlives the test's controllers, as it outlives a failover: the shared kwok nodes'
    # cooldowns and suspicions (three tests' jobs restarted for faults on one node make it suspect, and a
    # restart there then waits for a verdict no agent of this test gives) would hold the next test back
    _until(lambda: realcluster.request("DELETE", f"/apis/kcover.io/v1alpha1/namespaces/{RELEASE_NS}/ledgerentries")[0]
           < 300, "kcover's LedgerEntries deleted")  # a 429 while the server's storage (re)initializes: again
    for node in _nodes(realcluster):  # un-cordon what a test cordoned, as a person would
        spec, meta = node.get("spec") or {}, node["metadata"]
        # a merge patch (no resourceVersion): kwok's heartbeats must not turn this into a lost 409
        realcluster.ok("PATCH", f"/api/v1/nodes/{meta['name']}", {
            "spec": {"unschedulable": False,
                     "taints": [t for t in spec.get("taints") or [] if not t["key"].startswith("kcover.io/")]},
            "metadata": {"annotations": {k: None for k in meta.get("annotations") or {} if k.startswith("kcover.io/")}}},
            content_type="application/merge-patch+json")
        # the test's agents are gone, their Node conditions (KcoverGPUHealthy=False after an XID) stay: the
        # next test's controller would cordon that node again, and a job that needs every node would not fit
        ours = [c["type"] for c in (node.get("status") or {}).get("conditions") or [] if c["type"].startswith("Kcover")]
        if ours:
            realcluster.ok("PATCH", f"/api/v1/nodes/{meta['name']}/status", {"status": {"conditions": [
                {"type": t, "$patch": "delete"} for t in ours]}}, content_type="application/strategic-merge-patch+json")


def _nodes(rc: RealCluster) -> list[dict[str, Any]]:
    return list(rc.ok("GET", "/api/v1/nodes?labelSelector=type%3Dkwok")["items"])


# ------------------------------------------------------------------------------------------ workloads

def _pytorchjob(rc: RealCluster, ns: str, name: str, *, on: str | None = None, workers: int = 2) -> dict[str, Any]:
    """An opted-in PyTorchJob, Running on kwok; with `on`, its pods require that node (a required node
    affinity: they stay Pending while the scheduler sees it cordoned, and never land elsewhere)."""
    spec: dict[str, Any] = {"containers": [{"name": CONTAINER, "image": "trainer:v1",
                                            "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}
    if on:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [on]}]}]}}}
    job: dict[str, Any] = rc.ok("POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": ns, "labels": OPT_IN},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": workers, "restartPolicy": "OnFailure",
                                                    "template": {"spec": spec}}}}})
    _until(lambda: _running(rc, ns, name, workers), f"PyTorchJob {name} Running on kwok")
    return job


def _pods(rc: RealCluster, ns: str, job: str) -> list[dict[str, Any]]:
    listed = rc.ok("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=training.kubeflow.org%2Fjob-name%3D{job}")
    return sorted(listed["items"], key=lambda p: str(p["metadata"]["name"]))


def _running(rc: RealCluster, ns: str, job: str, workers: int = 2, old: set[str] = frozenset(),  # type: ignore[assignment]
             avoid: str = "") -> list[dict[str, Any]] | None:
    """The job's pods when the operator says Running and kwok runs every one (new uids, not on `avoid`)."""
    pods = [p for p in _pods(rc, ns, job) if not p["metadata"].get("deletionTimestamp")]
    if len(pods) != workers or {p["metadata"]["uid"] for p in pods} & old:
        return None
    if any(p["status"].get("phase") != "Running" or (avoid and p["spec"].get("nodeName") == avoid) for p in pods):
        return None
    got = rc.ok("GET", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs/{job}")
    conditions = (got.get("status") or {}).get("conditions") or []
    last = conditions[-1] if conditions else {}
    return pods if last.get("type") == "Running" and last.get("status") == "True" else None


def _restart_events(rc: RealCluster, ns: str, uid: str) -> list[dict[str, Any]]:
    items = rc.ok("GET", f"/api/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e.get("reason") == RESTARTED and e["involvedObject"].get("uid") == uid]


def _uids(pods: list[dict[str, Any]]) -> set[str]:
    return {str(p["metadata"]["uid"]) for p in pods}


def _fail_container(rc: RealCluster, pod: dict[str, Any], *, exit_code: int = 1, message: str = "") -> None:
    """What the kubelet writes when a container of a restartPolicy OnFailure pod exits with Error and is restarted."""
    now = _now()
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    rc.ok("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": {"containerStatuses": [{
        "name": CONTAINER, "image": "trainer:v1", "imageID": "", "ready": True, "started": True, "restartCount": 1,
        "state": {"running": {"startedAt": now}},
        "lastState": {"terminated": {"exitCode": exit_code, "reason": "Error", "message": message,
                                     "startedAt": pod["status"].get("startTime", now), "finishedAt": now}}}]}},
        content_type="application/strategic-merge-patch+json")


def _recovered(rc: RealCluster, ns: str, job: dict[str, Any], old: set[str], tl: Timeline, *,
               avoid: str = "") -> list[dict[str, Any]]:
    name, uid = job["metadata"]["name"], job["metadata"]["uid"]
    _until(lambda: _restart_events(rc, ns, uid), f"kcover's {RESTARTED} Event for {name}")
    tl.mark("acted (restart Event)")

    def recreated() -> bool:
        live = [p for p in _pods(rc, ns, name) if not p["metadata"].get("deletionTimestamp")]
        return len(live) == 2 and not (_uids(live) & old)

    _until(recreated, f"the training operator to recreate {name}'s pods")
    tl.mark("recreated by the operator")
    pods = _until(lambda: _running(rc, ns, name, old=old, avoid=avoid), f"{name} Running again on kwok")
    tl.mark("job Running again")
    return pods


def _controller(rc: RealCluster, name: str = "kcover-controller-a", **kw: Any) -> Any:
    proc = rc.start("controller", name, **kw)
    rc.wait_ready(proc)
    _until(lambda: _leader(rc) == name, f"{name} to lead")
    return proc


def _leader(rc: RealCluster) -> str:
    status, lease = rc.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{RELEASE_NS}/leases/kcover-controller")
    return str((lease.get("spec") or {}).get("holderIdentity") or "") if status == 200 else ""


# ------------------------------------------------------------------------------------------ scenarios

def test_pod_error(realcluster: RealCluster, ns: str) -> None:
    rc = realcluster
    job = _pytorchjob(rc, ns, "train")
    spared = _pytorchjob(rc, ns, "spared")
    old, spared_uids = _uids(_pods(rc, ns, "train")), _uids(_pods(rc, ns, "spared"))
    _controller(rc)
    tl = Timeline("pod-error")
    _fail_container(rc, _pods(rc, ns, "train")[1], message="worker group failed (exitcode: 1)")
    _recovered(rc, ns, job, old, tl)
    tl.report()
    time.sleep(1.0)  # room for a duplicate restart
    assert len(_restart_events(rc, ns, job["metadata"]["uid"])) == 1
    assert _uids(_pods(rc, ns, "spared")) == spared_uids
    assert not _restart_events(rc, ns, spared["metadata"]["uid"])


def test_gpu_xid(realcluster: RealCluster, ns: str) -> None:
    rc = realcluster
    job = _pytorchjob(rc, ns, "train")
    pods = _pods(rc, ns, "train")
    sick = pods[0]["spec"]["nodeName"]  # wherever the scheduler put worker-0
    agent = rc.start("agent", f"kcover-agent-{sick}", node=sick)
    rc.wait_ready(agent)
    _controller(rc)
    tl = Timeline("gpu-xid")
    agent.inject("xid 79 0")

    def reported() -> bool:
        node = rc.ok("GET", f"/api/v1/nodes/{sick}")
        return any(c["type"] == "KcoverGPUHealthy" and c["status"] == "False"
                   for c in node["status"].get("conditions") or [])

    _until(reported, "the agent's KcoverGPUHealthy=False condition")
    tl.mark("detected (agent's Node condition)")

    def cordoned() -> bool:
        spec = rc.ok("GET", f"/api/v1/nodes/{sick}").get("spec") or {}
        return bool(spec.get("unschedulable")) and any(t["key"] == "kcover.io/unhealthy" for t in spec.get("taints") or [])

    _until(cordoned, f"kcover to cordon and taint {sick}")
    tl.mark("cordoned")
    moved = _recovered(rc, ns, job, _uids(pods), tl, avoid=sick)
    tl.report()
    assert sick not in {p["spec"]["nodeName"] for p in moved}


def test_dra_unhealthy(realcluster: RealCluster, ns: str) -> None:
    rc = realcluster
    job = _pytorchjob(rc, ns, "train")
    pods = _pods(rc, ns, "train")
    _controller(rc)
    tl = Timeline("dra-unhealthy")
    pod = pods[0]
    # what the kubelet writes from a device plugin's or DRA driver's health report (KEP-4680)
    rc.ok("PATCH", f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}/status", {"status": {"containerStatuses": [{
        "name": CONTAINER, "image": "trainer:v1", "imageID": "", "ready": True, "started": True, "restartCount": 0,
        "state": {"running": {"startedAt": pod["status"]["startTime"]}},
        "allocatedResourcesStatus": [{"name": "nvidia.com/gpu", "resources": [
            {"resourceID": "GPU-fake-0002", "health": "Unhealthy", "message": "XID 79: GPU has fallen off the bus"}]}]}]}},
        content_type="application/strategic-merge-patch+json")
    _recovered(rc, ns, job, _uids(pods), tl)
    tl.report()


def test_event_annotation(realcluster: RealCluster, ns: str) -> None:
    rc = realcluster
    job = _pytorchjob(rc, ns, "train")
    pods = _pods(rc, ns, "train")
    _controller(rc)
    tl = Timeline("event-annotation")
    now = _now()
    target = pods[1]["metadata"]
    rc.ok("POST", f"/api/v1/namespaces/{ns}/events", {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{target['name']}.{secrets.token_hex(6)}", "annotations": {"kcover.io/need-recovery": "true"}},
        "involvedObject": {"kind": "Pod", "apiVersion": "v1", "namespace": ns, "name": target["name"], "uid": target["uid"]},
        "reason": "NCCLAllReduceHang", "message": "all-reduce stalled for 300s on rank 1", "type": "Warning",
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        "source": {"component": "healthcheck.example.com/checker"}})
    _recovered(rc, ns, job, _uids(pods), tl)
    tl.report()


def test_leader_failover(realcluster: RealCluster, ns: str) -> None:
    rc = realcluster
    job = _pytorchjob(rc, ns, "train")
    old = _uids(_pods(rc, ns, "train"))
    leader = _controller(rc, "kcover-controller-a")
    follower = rc.start("controller", "kcover-controller-b")
    rc.wait_ready(follower)
    leader.stop(kill=True)  # SIGKILL: the Lease is not released
    tl = Timeline("leader-failover")
    _fail_container(rc, _pods(rc, ns, "train")[0], message="NCCL error: unhandled system error")
    _recovered(rc, ns, job, old, tl)
    tl.report()
    events = _restart_events(rc, ns, job["metadata"]["uid"])
    assert [e.get("reportingInstance") for e in events] == ["kcover-controller-b"]


def test_rbac_without_pod_delete_fails_the_restart(realcluster: RealCluster, ns: str, tmp_path: Path) -> None:
    """The chart's RBAC really is what kcover runs with: a copy without `delete` on pods breaks a restart.

    (A Kubeflow v1 job's pods carry no uid label: kcover verifies each member and deletes them one by one
    with uid preconditions, so `delete`, not `deletecollection`, is the verb this restart needs.)"""
    rc = realcluster
    sa = "kcover-controller-norbac"
    rc.ok("POST", f"/api/v1/namespaces/{RELEASE_NS}/serviceaccounts",
          {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}})
    made = []
    for obj in chart_rbac_without(rc.helm, tmp_path, kind="ClusterRole", component="controller",
                                  resource="pods", verb="delete"):
        obj["metadata"]["name"] += "-norbac"
        if obj["kind"].endswith("Binding"):
            obj["roleRef"]["name"] += "-norbac"
            obj["subjects"] = [{"kind": "ServiceAccount", "name": sa, "namespace": RELEASE_NS}]
        group = "/apis/rbac.authorization.k8s.io/v1"
        path = (f"{group}/{obj['kind'].lower()}s" if obj["kind"].startswith("Cluster")
                else f"{group}/namespaces/{obj['metadata']['namespace']}/{obj['kind'].lower()}s")
        rc.ok("POST", path, obj)
        made.append(f"{path}/{obj['metadata']['name']}")
    try:
        kubeconfig = rc.stack.kubeconfig("kcover-norbac", rc.token(sa))
        job = _pytorchjob(rc, ns, "train")
        old = _uids(_pods(rc, ns, "train"))
        proc = _controller(rc, kubeconfig=kubeconfig)
        _fail_container(rc, _pods(rc, ns, "train")[1])
        _until(lambda: any(r.get("event") == "restart_attempt_failed" and "forbidden" in str(r).lower()
                           for r in proc.logs()), "the restart to be forbidden", within=30)
        assert _uids(_pods(rc, ns, "train")) == old, "no pod of the job was deleted"
        assert not _restart_events(rc, ns, job["metadata"]["uid"])
    finally:
        rc.stop_all()
        for path in made:
            rc.request("DELETE", path)
        rc.request("DELETE", f"/api/v1/namespaces/{RELEASE_NS}/serviceaccounts/{sa}")


# ------------------------------------------------------------------------------------------ batch/v1 Job

def _batch_job(rc: RealCluster, ns: str, name: str, *, backoff_limit: int = 1) -> dict[str, Any]:
    """Two long-running pods; podFailurePolicy ignores disruptions (the DisruptionTarget condition)."""
    job: dict[str, Any] = rc.ok("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": OPT_IN},
        "spec": {"parallelism": 2, "completions": 2, "backoffLimit": backoff_limit,
                 "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]},
                 "template": {"metadata": {"labels": {**OPT_IN, "kcover.test/long-running": "true"}},
                              "spec": {"restartPolicy": "Never", "containers": [
                                  {"name": "trainer", "image": "trainer:v1",
                                   "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})

    def running() -> bool:
        pods = _job_pods(rc, ns, name)
        return len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods)

    _until(running, f"Job {name}'s two pods Running on kwok")
    return job


def _job_pods(rc: RealCluster, ns: str, name: str) -> list[dict[str, Any]]:
    listed = rc.ok("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=batch.kubernetes.io%2Fjob-name%3D{name}")
    return [p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")]


def _job_status(rc: RealCluster, ns: str, name: str) -> dict[str, Any]:
    return dict(rc.ok("GET", f"/apis/batch/v1/namespaces/{ns}/jobs/{name}").get("status") or {})


def test_job_controller_counts_a_deleted_pod_but_not_an_evicted_one(realcluster: RealCluster, ns: str) -> None:
    """The Job controller's real behaviour, which decides how kcover restarts a batch/v1 Job.

    A pod deleted (as a plain DELETE does) ends Failed without the DisruptionTarget condition: it counts
    towards backoffLimit. A pod evicted through the Eviction API gets DisruptionTarget first, so the
    podFailurePolicy rule `Ignore` on it keeps it out of the count."""
    rc = realcluster
    _batch_job(rc, ns, "deleted")
    victim = _job_pods(rc, ns, "deleted")[0]["metadata"]
    rc.ok("DELETE", f"/api/v1/namespaces/{ns}/pods/{victim['name']}")
    _until(lambda: _job_status(rc, ns, "deleted").get("failed") == 1, "the deleted pod counted as failed")

    _batch_job(rc, ns, "evicted")
    victim = _job_pods(rc, ns, "evicted")[0]["metadata"]
    rc.ok("POST", f"/api/v1/namespaces/{ns}/pods/{victim['name']}/eviction", {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": victim["name"], "namespace": ns}})
    _until(lambda: len(_job_pods(rc, ns, "evicted")) == 2 and victim["uid"] not in {
        p["metadata"]["uid"] for p in _job_pods(rc, ns, "evicted")}, "the Job controller to replace the evicted pod")
    time.sleep(1.0)
    assert not _job_status(rc, ns, "evicted").get("failed"), _job_status(rc, ns, "evicted")


def test_batch_job_restarted_by_kcover_keeps_its_backoff_limit(realcluster: RealCluster, ns: str) -> None:
    """kcover evicts a batch/v1 Job's pods: the Job comes back without spending its backoffLimit (1)."""
    rc = realcluster
    job = _batch_job(rc, ns, "train")
    pods = _job_pods(rc, ns, "train")
    _controller(rc)
    now, target = _now(), pods[0]["metadata"]
    rc.ok("POST", f"/api/v1/namespaces/{ns}/events", {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{target['name']}.{secrets.token_hex(6)}", "annotations": {"kcover.io/need-recovery": "true"}},
        "involvedObject": {"kind": "Pod", "apiVersion": "v1", "namespace": ns, "name": target["name"], "uid": target["uid"]},
        "reason": "NCCLTimeout", "message": "collective timed out", "type": "Warning",
        "firstTimestamp": now, "lastTimestamp": now, "count": 1, "source": {"component": "healthcheck.example.com/checker"}})
    _until(lambda: _restart_events(rc, ns, job["metadata"]["uid"]), "kcover's restart Event for the Job")

    def back() -> bool:
        live = _job_pods(rc, ns, "train")
        return len(live) == 2 and not (_uids(live) & _uids(pods)) and all(
            p["status"].get("phase") == "Running" for p in live)

    _until(back, "the Job controller to replace both pods, Running")
    time.sleep(1.0)
    status = _job_status(rc, ns, "train")
    assert not status.get("failed"), status
    assert not any(c["type"] == "Failed" and c["status"] == "True" for c in status.get("conditions") or []), status
