"""The controllers a playground needs, the same assertions on the simulated cluster and on real components.

`controllers` is either the simulated cluster's actors (its kubelets and scheduler, Job controller,
garbage collector and Kubeflow operator around a `SimServer`, in a thread of their own) or the `cluster`
backend (real kube-controller-manager, kube-scheduler, kwok and training operator; realkit.py), each with
nine 8-GPU nodes and reached over HTTP the same way. What is asserted is what a user of either sees:
the Job controller's pods and counts (a deleted pod counts towards backoffLimit, an evicted one not),
owner-reference garbage collection (background, foreground, orphan, a PyTorchJob's pods), the scheduler
counting GPUs (never two 8-GPU pods on one 8-GPU node; Pending with the FailedScheduling message), and
pod IPs (distinct, the host IP the node's), and evictions against a budget the disruption controller keeps.
"""

# ruff: noqa: PT018  (compound asserts read as one expectation about one answer)
from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import backends
import pytest
from realkit import NODES

from kcover.sim import actors, collecting, disrupting, jobs
from kcover.sim import server as simserver

T = TypeVar("T")
WAIT = 45.0
MERGE = "application/merge-patch+json"


def _until(probe: Callable[[], T | None], what: str, within: float = WAIT) -> T:
    deadline = time.monotonic() + within
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what}")
        time.sleep(0.05)


class SimControllers:
    """A SimServer with the simulated cluster's controllers, on a loop in its own thread; `request` like
    realkit.RealCluster's."""

    def __init__(self) -> None:
        self.backend = "sim"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-controllers", daemon=True)
        self._stop: asyncio.Event | None = None
        self.srv: simserver.SimServer | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with simserver.SimServer(seed=3) as srv:
            self.srv = srv
            for i, node in enumerate(NODES):  # as realkit registers its kwok nodes, Ready
                resources = {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"}
                srv.store.create("nodes", {"metadata": {"name": node, "labels": {
                    "type": "kwok", "kubernetes.io/hostname": node, "nvidia.com/gpu.present": "true"}},
                    "spec": {}, "status": {"capacity": resources, "allocatable": resources,
                                           "addresses": [{"type": "InternalIP", "address": f"10.255.0.{i + 1}"}],
                                           "conditions": [{"type": "Ready", "status": "True"}]}})
            roles = [actors.Kubelets(srv, start_delay=0.02, finish_delay=0.1), actors.KubeflowOperators(srv, interval=0.05),
                     jobs.JobController(srv), collecting.GarbageCollector(srv), disrupting.DisruptionController(srv)]
            async with asyncio.TaskGroup() as tg:
                for role in roles:
                    tg.create_task(role.run(self._stop))
                self._ready.set()
                await self._stop.wait()

    def start(self) -> SimControllers:
        self._thread.start()
        assert self._ready.wait(30), "the simulated controllers did not start"
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def request(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json") -> tuple[int, Any]:
        assert self.srv is not None
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.srv.url + path, data=data, method=method,
                                     headers={"Content-Type": content_type, "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}")

    def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        code, got = self.request(method, path, body, **kw)
        assert code < 300, f"{method} {path}: HTTP {code}: {got!r}"
        return got


@pytest.fixture(scope="module", params=[b for b in ("sim", "cluster") if b in backends.selected_backends()])
def controllers(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "sim":
        sim = SimControllers().start()
        try:
            yield sim
        finally:
            sim.stop()
    else:
        yield request.getfixturevalue("realcluster")


@pytest.fixture
def ns(controllers: Any) -> Iterator[str]:
    name = "c-" + secrets.token_hex(4)
    controllers.ok("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    controllers.request("DELETE", f"/api/v1/namespaces/{name}")


# ------------------------------------------------------------------------------------------ the Job controller

def _batch_job(c: Any, ns: str, name: str) -> None:
    c.ok("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"parallelism": 2, "completions": 2, "backoffLimit": 1,
                 "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]},
                 "template": {"metadata": {"labels": {"kcover.test/long-running": "true"}},
                              "spec": {"restartPolicy": "Never", "containers": [
                                  {"name": "trainer", "image": "trainer:v1",
                                   "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
    _until(lambda: len(pods := _job_pods(c, ns, name)) == 2 and all(p["status"].get("phase") == "Running" for p in pods),
           f"Job {name}'s two pods Running")


def _job_pods(c: Any, ns: str, name: str) -> list[dict[str, Any]]:
    listed = c.ok("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=batch.kubernetes.io%2Fjob-name%3D{name}")
    return [p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")]


def _job_status(c: Any, ns: str, name: str) -> dict[str, Any]:
    return dict(c.ok("GET", f"/apis/batch/v1/namespaces/{ns}/jobs/{name}").get("status") or {})


def test_a_job_gets_its_pods_and_counts_a_deleted_one_but_not_an_evicted_one(controllers: Any, ns: str) -> None:
    c = controllers
    _batch_job(c, ns, "deleted")
    job = c.ok("GET", f"/apis/batch/v1/namespaces/{ns}/jobs/deleted")
    pods = _job_pods(c, ns, "deleted")
    for pod in pods:
        meta = pod["metadata"]
        assert meta["name"].startswith("deleted-") and "batch.kubernetes.io/job-tracking" in meta["finalizers"]
        assert meta["labels"]["batch.kubernetes.io/controller-uid"] == job["metadata"]["uid"]
        assert [(r["kind"], r["uid"], r["controller"]) for r in meta["ownerReferences"]] == [
            ("Job", job["metadata"]["uid"], True)]
    _until(lambda: _job_status(c, ns, "deleted").get("active") == 2 and _job_status(c, ns, "deleted").get("ready") == 2,
           "status.active and ready 2")
    c.ok("DELETE", f"/api/v1/namespaces/{ns}/pods/{pods[0]['metadata']['name']}")
    _until(lambda: _job_status(c, ns, "deleted").get("failed") == 1, "the deleted pod counted as failed")
    _until(lambda: len(_job_pods(c, ns, "deleted")) == 2, "a replacement for the deleted pod")

    _batch_job(c, ns, "evicted")
    victim = _job_pods(c, ns, "evicted")[0]["metadata"]
    c.ok("POST", f"/api/v1/namespaces/{ns}/pods/{victim['name']}/eviction", {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": victim["name"], "namespace": ns}})
    _until(lambda: len(live := _job_pods(c, ns, "evicted")) == 2 and victim["uid"] not in {
        p["metadata"]["uid"] for p in live}, "the Job controller to replace the evicted pod")
    time.sleep(1.0)  # a count that should not come
    assert not _job_status(c, ns, "evicted").get("failed"), _job_status(c, ns, "evicted")


def test_a_job_past_its_backoff_limit_fails_and_its_pods_go(controllers: Any, ns: str) -> None:
    c = controllers
    _batch_job(c, ns, "doomed")
    for _ in range(2):  # backoffLimit 1: the second counted failure fails the Job
        victim = _job_pods(c, ns, "doomed")[0]["metadata"]
        c.ok("DELETE", f"/api/v1/namespaces/{ns}/pods/{victim['name']}")
        _until(lambda v=victim: v["uid"] not in {p["metadata"]["uid"] for p in _job_pods(c, ns, "doomed")},
               "the deleted pod gone")
    def failed_status() -> dict[str, Any] | None:
        st = _job_status(c, ns, "doomed")
        return st if any(x["type"] == "Failed" and x["status"] == "True" for x in st.get("conditions") or []) else None

    st = _until(failed_status, "the Job to fail")
    failed = next(x for x in st["conditions"] if x["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded" and failed["message"] == "Job has reached the specified backoff limit"
    assert any(x["type"] == "FailureTarget" for x in st["conditions"])
    _until(lambda: not _job_pods(c, ns, "doomed"), "the failed Job's pods deleted")


# ------------------------------------------------------------------------------------------ garbage collection

def _cm(c: Any, ns: str, name: str, owner: dict[str, Any] | None = None, *, block: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": owner["metadata"]["name"],
                                    "uid": owner["metadata"]["uid"], "blockOwnerDeletion": block}]
    return dict(c.ok("POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": meta, "data": {"k": "v"}}))


def _gone(c: Any, path: str) -> bool:
    return bool(c.request("GET", path)[0] == 404)


def test_background_deletion_collects_dependents(controllers: Any, ns: str) -> None:
    c = controllers
    owner = _cm(c, ns, "owner")
    _cm(c, ns, "dependent", owner)
    c.ok("DELETE", f"/api/v1/namespaces/{ns}/configmaps/owner", {"propagationPolicy": "Background"})
    _until(lambda: _gone(c, f"/api/v1/namespaces/{ns}/configmaps/dependent"), "the dependent collected")


def test_foreground_deletion_waits_for_blocking_dependents(controllers: Any, ns: str) -> None:
    c = controllers
    owner = _cm(c, ns, "owner")
    _cm(c, ns, "held", owner, block=True)
    c.ok("PATCH", f"/api/v1/namespaces/{ns}/configmaps/held", {"metadata": {"finalizers": ["example.com/hold"]}},
         content_type=MERGE)
    c.ok("DELETE", f"/api/v1/namespaces/{ns}/configmaps/owner", {"propagationPolicy": "Foreground"})
    def deleting() -> dict[str, Any] | None:
        got = dict(c.ok("GET", f"/api/v1/namespaces/{ns}/configmaps/held"))
        return got if got["metadata"].get("deletionTimestamp") else None

    held = _until(deleting, "the dependent to be deleted")
    assert held["metadata"]["finalizers"] == ["example.com/hold"]
    time.sleep(1.0)
    owner_now = c.ok("GET", f"/api/v1/namespaces/{ns}/configmaps/owner")  # held back by its blocking dependent
    assert owner_now["metadata"]["finalizers"] == ["foregroundDeletion"]
    c.ok("PATCH", f"/api/v1/namespaces/{ns}/configmaps/held", {"metadata": {"finalizers": None}}, content_type=MERGE)
    _until(lambda: _gone(c, f"/api/v1/namespaces/{ns}/configmaps/owner"), "the owner gone once its dependent went")


def test_orphan_deletion_keeps_dependents_without_the_reference(controllers: Any, ns: str) -> None:
    c = controllers
    owner = _cm(c, ns, "owner")
    other = _cm(c, ns, "other-owner")
    dependent = c.ok("POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "kept", "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]},
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "other-owner", "uid": other["metadata"]["uid"]}]}})
    c.ok("DELETE", f"/api/v1/namespaces/{ns}/configmaps/owner", {"propagationPolicy": "Orphan"})
    _until(lambda: _gone(c, f"/api/v1/namespaces/{ns}/configmaps/owner"), "the owner gone")
    kept = c.ok("GET", f"/api/v1/namespaces/{ns}/configmaps/kept")
    assert kept["metadata"]["uid"] == dependent["metadata"]["uid"]
    assert [r["name"] for r in kept["metadata"]["ownerReferences"]] == ["other-owner"]


def test_deleting_a_pytorchjob_deletes_its_pods(controllers: Any, ns: str) -> None:
    c = controllers
    c.ok("POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "train"},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "restartPolicy": "OnFailure", "template": {
            "spec": {"containers": [{"name": "pytorch", "image": "trainer:v1"}]}}}}}})
    selector = "labelSelector=training.kubeflow.org%2Fjob-name%3Dtrain"
    _until(lambda: len(c.ok("GET", f"/api/v1/namespaces/{ns}/pods?{selector}")["items"]) == 2, "the job's pods")
    c.ok("DELETE", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs/train", {"propagationPolicy": "Background"})
    _until(lambda: not c.ok("GET", f"/api/v1/namespaces/{ns}/pods?{selector}")["items"], "the job's pods collected")


# ------------------------------------------------------------------------------------------ scheduling, addresses

def _pod(c: Any, ns: str, name: str, gpus: int, node: str = "") -> None:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "trainer:v1",
                                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
                            "tolerations": [{"operator": "Exists"}]}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    c.ok("POST", f"/api/v1/namespaces/{ns}/pods", {"metadata": {"name": name}, "spec": spec})


def _get(c: Any, ns: str, name: str) -> dict[str, Any]:
    return dict(c.ok("GET", f"/api/v1/namespaces/{ns}/pods/{name}"))


def _unschedulable(pod: dict[str, Any]) -> dict[str, Any] | None:
    return next((x for x in (pod.get("status") or {}).get("conditions") or []
                 if x["type"] == "PodScheduled" and x["status"] == "False"), None)


def _free_node(c: Any) -> str:
    pods = c.ok("GET", "/api/v1/pods")["items"]
    busy = {p["spec"].get("nodeName") for p in pods if any(
        "nvidia.com/gpu" in (x.get("resources") or {}).get("limits", {}) for x in p["spec"]["containers"])}
    nodes = c.ok("GET", "/api/v1/nodes?labelSelector=type%3Dkwok")["items"]
    return next(n["metadata"]["name"] for n in nodes if n["metadata"]["name"] not in busy
                and not (n.get("spec") or {}).get("unschedulable"))


def test_the_scheduler_never_overcommits_gpus(controllers: Any, ns: str) -> None:
    c = controllers
    node = _free_node(c)
    _pod(c, ns, "first", 8, node)
    _until(lambda: _get(c, ns, "first")["spec"].get("nodeName") == node, "the first 8-GPU pod bound")
    _pod(c, ns, "second", 8, node)
    cond = _until(lambda: _unschedulable(_get(c, ns, "second")), "the second pod unschedulable")
    assert not _get(c, ns, "second")["spec"].get("nodeName")
    assert cond["reason"] == "Unschedulable"
    n = len(NODES)
    assert cond["message"].startswith(f"0/{n} nodes are available: 1 Insufficient nvidia.com/gpu, ")
    assert cond["message"].endswith(f"preemption: 0/{n} nodes are available: 1 No preemption victims found for "
                                    f"incoming pod, {n - 1} Preemption is not helpful for scheduling.")
    events = _until(lambda: [e for e in c.ok("GET", f"/api/v1/namespaces/{ns}/events")["items"]
                             if e["involvedObject"]["name"] == "second" and e["reason"] == "FailedScheduling"],
                    "a FailedScheduling Event")
    assert events[0]["type"] == "Warning" and events[0]["message"] == cond["message"]
    c.ok("DELETE", f"/api/v1/namespaces/{ns}/pods/first", {"gracePeriodSeconds": 0})
    _until(lambda: _get(c, ns, "second")["spec"].get("nodeName") == node, "the second pod bound once the first went")


def test_a_pod_larger_than_any_node_is_pending_with_the_schedulers_message(controllers: Any, ns: str) -> None:
    c = controllers
    _pod(c, ns, "huge", 9)
    cond = _until(lambda: _unschedulable(_get(c, ns, "huge")), "the pod unschedulable")
    nodes = c.ok("GET", "/api/v1/nodes")["items"]
    cordoned = sum(1 for x in nodes if (x.get("spec") or {}).get("unschedulable"))
    reasons = [f"{len(nodes) - cordoned} Insufficient nvidia.com/gpu"] + (
        [f"{cordoned} node(s) were unschedulable"] if cordoned else [])
    assert cond["message"] == (f"0/{len(nodes)} nodes are available: {', '.join(sorted(reasons))}. "
                               f"no new claims to deallocate, preemption: 0/{len(nodes)} nodes are available: "
                               f"{len(nodes)} Preemption is not helpful for scheduling.")


def test_pods_get_distinct_ips_and_their_nodes_host_ip(controllers: Any, ns: str) -> None:
    c = controllers
    for i in range(3):
        _pod(c, ns, f"p{i}", 0)
    def addressed() -> list[dict[str, Any]] | None:
        pods = [_get(c, ns, f"p{i}") for i in range(3)]
        return pods if all(p["status"].get("podIP") for p in pods) else None

    pods = _until(addressed, "three pods with IPs")
    assert len({p["status"]["podIP"] for p in pods}) == 3
    for pod in pods:
        st = pod["status"]
        assert st["hostIP"] and st["hostIPs"] == [{"ip": st["hostIP"]}]
        assert st["podIPs"] == [{"ip": st["podIP"]}]
        node = c.ok("GET", f"/api/v1/nodes/{pod['spec']['nodeName']}")
        internal = [a["address"] for a in node["status"].get("addresses") or [] if a["type"] == "InternalIP"]
        if internal:  # kwok's nodes report no addresses (kwok gives every pod its --node-ip)
            assert st["hostIP"] == internal[0]
    if controllers.backend == "sim":  # nodes with addresses of their own: host IPs differ by node
        assert len({p["status"]["hostIP"] for p in pods}) == len({p["spec"]["nodeName"] for p in pods})


def test_evictions_honour_a_budget_the_disruption_controller_keeps(controllers: Any, ns: str) -> None:
    c = controllers
    for i in range(2):
        c.ok("POST", f"/api/v1/namespaces/{ns}/pods", {"metadata": {"name": f"w{i}", "labels": {"app": "w"}},
                                                       "spec": {"containers": [{"name": "c", "image": "t"}],
                                                                "tolerations": [{"operator": "Exists"}]}})
    _until(lambda: all(any(x["type"] == "Ready" and x["status"] == "True" for x in _get(c, ns, f"w{i}")["status"].get(
        "conditions") or []) for i in range(2)), "both pods Ready")
    c.ok("POST", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", {
        "metadata": {"name": "keep-one"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "w"}}}})

    def processed() -> dict[str, Any] | None:
        st = c.ok("GET", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/keep-one").get("status") or {}
        return st if st.get("observedGeneration") == 1 and st.get("disruptionsAllowed") == 1 else None

    st = _until(processed, "the budget processed")
    assert (st["currentHealthy"], st["desiredHealthy"], st["expectedPods"]) == (2, 1, 2)

    def evict(name: str) -> tuple[int, Any]:
        return c.request("POST", f"/api/v1/namespaces/{ns}/pods/{name}/eviction", {
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns}})

    assert evict("w0")[0] == 201
    code, body = evict("w1")
    assert code == 429 and body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"][0]["reason"] == "DisruptionBudget"
