"""The `kcover sim` recovery scenarios (kcover/sim/scenarios.py) on every cluster backend.

The real controller (cache, detectors, engine, Lease; two replicas where leadership matters) runs
against the backend while the harness plays kubelet and Kubeflow operator over HTTP. Each test
injects one scenario's fault through the API and asserts what the API server ends up holding: the
Events kcover posts, the job's pods (deleted and recreated with new uids, or left alone), the
Node's spec. Real time with short timings (lease 2/1.5/0.2 s): looptime cannot drive sockets.
Every wait polls with a timeout; a short settle after recovery looks for duplicate actions.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kcover import metrics as metrics_
from kcover import serving, settings
from kcover.aio import clock as clock_
from kcover.controller import running
from kcover.kube import client as client_
from kcover.kube import projections as proj

Cluster = Any  # tests/backends.py's Cluster
T = TypeVar("T")

WAIT = 20.0
"""Seconds any one awaited step may take."""
SETTLE = 1.0
"""Seconds watched after recovery for actions that must not happen (a duplicate restart)."""
LEASE = {"lease_duration_seconds": 2.0, "renew_deadline_seconds": 1.5, "retry_period_seconds": 0.2}
RESTARTED = "KcoverRestartedWorkload"
SKIPPED = "KcoverRecoverySkipped"
CORDONED = "KcoverCordonedNode"
CONTAINER = "pytorch"
CLAIM, REQUEST = "gpu-claim", "gpu"
JOB_NAME = "training.kubeflow.org/job-name"
OPERATOR_NAME = "training.kubeflow.org/operator-name"


# ------------------------------------------------------------------------------------------------ waiting

async def _until(probe: Callable[[], Awaitable[T | None]], what: str, within: float = WAIT) -> T:
    """Poll `probe` until it returns something truthy; fail the test after `within` seconds."""
    try:
        async with asyncio.timeout(within):
            while True:
                got = await probe()
                if got:
                    return got
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"timed out after {within:g} s waiting for {what}") from None


async def _until_true(predicate: Callable[[], bool], what: str, within: float = WAIT) -> None:
    async def probe() -> bool:
        return predicate()
    await _until(probe, what, within)


# ------------------------------------------------------------------------------------------------ cluster

async def _node(kube: client_.KubeClient, name: str) -> None:
    await kube.request("POST", "/api/v1/nodes", body={
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}}})
    node = await kube.request("GET", f"/api/v1/nodes/{name}")
    resources = {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"}
    node["status"] = {"capacity": resources, "allocatable": resources,
                      "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                      "message": "kubelet is posting ready status"}]}
    await kube.request("PUT", f"/api/v1/nodes/{name}/status", body=node)


def _template(node: str) -> dict[str, Any]:
    """A GPU worker on `node` with a DRA claim, so device health may name `claim:gpu-claim/gpu`."""
    return {"spec": {"nodeName": node, "restartPolicy": "OnFailure",
                     "resourceClaims": [{"name": CLAIM, "resourceClaimTemplateName": "gpu"}],
                     "containers": [{"name": CONTAINER, "image": "trainer",
                                     "resources": {"claims": [{"name": CLAIM, "request": REQUEST}]}}]}}


async def _job(cluster: Cluster, name: str, node: str, *, kind: str = "PyTorchJob",
               opted_in: bool = True, opt_in: str = "true") -> dict[str, Any]:
    """A Kubeflow job with two running workers (a TFJob: one parameter server) on `node`; labelled
    `kcover.io/cascading-recovery=<opt_in>` when `opted_in`."""
    ns = cluster.namespace
    plural, specs, rtype, replicas = (("pytorchjobs", "pytorchReplicaSpecs", "Worker", 2) if kind == "PyTorchJob"
                                      else ("tfjobs", "tfReplicaSpecs", "PS", 1))
    labels = {"kcover.io/cascading-recovery": opt_in} if opted_in else {}
    job: dict[str, Any] = await cluster.client.request(
        "POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/{plural}", body={
            "apiVersion": "kubeflow.org/v1", "kind": kind,
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {specs: {rtype: {"replicas": replicas, "restartPolicy": "OnFailure",
                                     "template": _template(node)}}}})
    await cluster.harness.reconcile_jobs()
    for pod in await _pods(cluster, name, kind):
        await cluster.harness.run_pod(ns, pod["metadata"]["name"])
    return job


async def _pods(cluster: Cluster, job: str, kind: str = "PyTorchJob") -> list[dict[str, Any]]:
    """The job's pods as its operator labels them (kinds told apart by the operator-name label)."""
    selector = f"{JOB_NAME}={job},{OPERATOR_NAME}={kind.lower()}-controller"
    listed = await cluster.client.request("GET", f"/api/v1/namespaces/{cluster.namespace}/pods",
                                          query={"labelSelector": selector})
    return sorted(listed.get("items") or [], key=lambda p: str(p["metadata"]["name"]))


def _uids(pods: list[dict[str, Any]]) -> set[str]:
    return {str(p["metadata"]["uid"]) for p in pods}


async def _recreated(cluster: Cluster, job: str, old: set[str], count: int = 2) -> list[dict[str, Any]]:
    """Wait until the job has `count` live pods, none of them one of `old`."""
    async def probe() -> list[dict[str, Any]] | None:
        pods = await _pods(cluster, job)
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        fresh = len(pods) == count == len(live) and not (_uids(live) & old)
        return live if fresh else None
    return await _until(probe, f"PyTorchJob {job} to come back with new pods")


async def _events(cluster: Cluster, namespace: str | None = None) -> list[dict[str, Any]]:
    listed = await cluster.client.request("GET", f"/api/v1/namespaces/{namespace or cluster.namespace}/events")
    return list(listed.get("items") or [])


def _about(events: list[dict[str, Any]], reason: str, uid: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("reason") == reason and e["involvedObject"].get("uid") == uid]


async def _until_event(cluster: Cluster, reason: str, uid: str, what: str) -> list[dict[str, Any]]:
    async def probe() -> list[dict[str, Any]]:
        return _about(await _events(cluster), reason, uid)
    return await _until(probe, what)


def _deletecollections(cluster: Cluster) -> int | None:
    """DeleteCollections of pods the server served (sim only: a real server does not count them). A
    Kubeflow job's pods carry no uid label, so its restarts delete pod by pod (uid preconditions): none."""
    counts = cluster.request_counts
    return None if counts is None else int(counts.get("DELETECOLLECTION pods", 0))


async def _post_event(cluster: Cluster, namespace: str, involved: dict[str, Any], *, reason: str, message: str,
                      reporter: str) -> None:
    """A core/v1 Event annotated kcover.io/need-recovery, as an external health checker posts it."""
    now = clock_.rfc3339(clock_.utcnow())
    await cluster.client.request("POST", f"/api/v1/namespaces/{namespace}/events", body={
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{involved['name']}.{secrets.token_hex(6)}", "namespace": namespace,
                     "annotations": {"kcover.io/need-recovery": "true"}},
        "involvedObject": involved, "reason": reason, "message": message, "type": "Warning",
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        "source": {"component": reporter}, "reportingComponent": reporter, "reportingInstance": "checker-0"})


# ------------------------------------------------------------------------------------------------ controller

def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`base` with `extra` deep-merged over it (dicts merged key by key, anything else replaced)."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _settings(cluster: Cluster, identity: str, tmp_path: Path, *, extra: dict[str, Any] | None = None,
              **recovery: Any) -> settings.Settings:
    ns = cluster.namespace
    # a real kube-apiserver proxies pods/log to a kubelet, and none runs there
    save_logs = ({"directory": str(tmp_path / "logs"), "timeout_seconds": 2.0} if cluster.sim is not None
                 else {"enabled": False})
    return settings.Settings.model_validate(_merged({
        "recovery": {"ledger_namespace": ns, "max_cordoned_fraction": 1.0, "namespaces_deny": [],
                     "save_logs": save_logs, **recovery},
        "lease": {"namespace": ns, "identity": identity, **LEASE},
        "kube": {"workload_kinds": ["pytorchjobs.kubeflow.org", "tfjobs.kubeflow.org"], "gc_freeze_after_sync": False},
        "bus": {"drain_timeout_seconds": 0.5},
        "detectors": {"entries": {"nvml": {"enabled": False}, "dcgm": {"enabled": False},
                                  "node-condition": {"config": {"min_duration_seconds": 0.0, "tick_seconds": 0.2}},
                                  "dra-health": {"config": {"tick_seconds": 0.2}}}},
    }, extra or {}))


@dataclasses.dataclass
class Replica:
    identity: str
    kube: client_.KubeClient
    metrics: metrics_.Metrics
    controller: running.Controller
    task: asyncio.Task[None]
    stop: asyncio.Event
    killed: bool = False

    def ready(self) -> bool:
        states = self.controller.supervisor.health()
        return self.controller.cache.synced and bool(states) and all(s == "running" for s in states.values())

    def kill(self) -> None:
        """As SIGKILL would: its tasks end and its Lease is NOT released."""
        assert self.controller.elector is not None
        self.controller.elector.release_on_exit = False
        self.killed = True
        self.task.cancel()


@contextlib.asynccontextmanager
async def _controllers(cluster: Cluster, tmp_path: Path, identities: tuple[str, ...] = ("a",), *,
                       extra: dict[str, Any] | None = None, **recovery: Any) -> AsyncIterator[list[Replica]]:
    """Controller replicas, each with its own client and metrics; yields once one leads and all are ready.
    `recovery` are `recovery.*` settings; `extra` other settings, deep-merged over the test defaults."""
    replicas: list[Replica] = []
    try:
        for identity in identities:
            kube = cluster.new_client()
            mets = metrics_.Metrics()
            ctl = running.Controller(_settings(cluster, identity, tmp_path, extra=extra, **recovery), client=kube,
                                     metrics=mets,
                                     health=serving.Health())
            stop = asyncio.Event()
            task = asyncio.create_task(ctl.run(stop), name=f"controller:{identity}")
            replicas.append(Replica(identity, kube, mets, ctl, task, stop))
        await _until_true(lambda: any(r.controller.is_leader() for r in replicas) and all(r.ready() for r in replicas),
                          "a leader and every replica's cache and detectors")
        await asyncio.sleep(0.3)  # the detectors subscribe to the cache right after it synced
        yield replicas
    finally:
        for replica in replicas:
            replica.stop.set()
        if replicas:
            await asyncio.wait([r.task for r in replicas], timeout=10.0)
        for replica in replicas:
            await replica.kube.close()
        for replica in replicas:
            if not replica.killed:
                replica.task.result()  # a crash of the controller fails the test


def _leader(replicas: list[Replica]) -> Replica:
    return next(r for r in replicas if not r.killed and r.controller.is_leader())


# ------------------------------------------------------------------------------------------------ scenarios

async def test_pod_error_restarts_its_job_once_and_nothing_else(cluster: Cluster, tmp_path: Path) -> None:
    node = f"scn-{secrets.token_hex(3)}"
    await _node(cluster.client, node)
    train = await _job(cluster, "train", node)
    spared = await _job(cluster, "spared", node)
    namesake = await _job(cluster, "train", node, kind="TFJob")  # same name, another kind
    old, spared_pods, tf_pods = _uids(await _pods(cluster, "train")), await _pods(cluster, "spared"), \
        await _pods(cluster, "train", "TFJob")
    assert len(old) == 2
    assert len(tf_pods) == 1
    async with cluster.harness.playing(), _controllers(cluster, tmp_path):
        await cluster.harness.fail_container(cluster.namespace, "train-worker-1", CONTAINER,
                                             message="worker group failed (exitcode: 1)")
        await _until_event(cluster, RESTARTED, train["metadata"]["uid"], "a restart Event for PyTorchJob train")
        await _recreated(cluster, "train", old)
        await asyncio.sleep(SETTLE)  # room for a duplicate restart to show
        events = await _events(cluster)
        assert len(_about(events, RESTARTED, train["metadata"]["uid"])) == 1
        assert await _recreated(cluster, "train", old)
    acted_on = {e["involvedObject"].get("uid") for e in events if e.get("reason", "").startswith("Kcover")}
    assert acted_on == {train["metadata"]["uid"]}
    assert spared["metadata"]["uid"] not in acted_on
    assert namesake["metadata"]["uid"] not in acted_on
    for before, after in ((spared_pods, await _pods(cluster, "spared")),
                          (tf_pods, await _pods(cluster, "train", "TFJob"))):
        assert _uids(after) == _uids(before)
        assert all(not p["metadata"].get("deletionTimestamp") for p in after)
    assert _deletecollections(cluster) in (None, 0)


async def test_a_namespace_labelled_to_opt_in_has_its_unlabelled_job_restarted_and_a_job_saying_false_spared(
        cluster: Cluster, tmp_path: Path) -> None:
    """`kcover.io/cascading-recovery=true` on the Namespace opts in every workload in it; a workload labelled
    `false` stays out. Before the Namespace is labelled, the same fault on the unlabelled job is passed over."""
    node = f"scn-{secrets.token_hex(3)}"
    await _node(cluster.client, node)
    train = await _job(cluster, "train", node, opted_in=False)
    kept = await _job(cluster, "kept", node, opt_in="false")
    old, kept_pods = _uids(await _pods(cluster, "train")), await _pods(cluster, "kept")
    ns_path = f"/api/v1/namespaces/{cluster.namespace}"
    async with cluster.harness.playing(), _controllers(cluster, tmp_path):
        await cluster.harness.fail_container(cluster.namespace, "train-worker-1", CONTAINER, message="exit 1")
        await asyncio.sleep(3 * SETTLE)  # not opted in yet: nothing happens
        assert _about(await _events(cluster), RESTARTED, train["metadata"]["uid"]) == []
        assert _uids(await _pods(cluster, "train")) == old
        await cluster.client.request("PATCH", ns_path, body={"metadata": {"labels": {proj.OPT_IN_LABEL: "true"}}},
                                     content_type=client_.MERGE_PATCH)
        # the failed worker is still failed: a fresh failure on each job, now that the Namespace opts in
        await cluster.harness.run_pod(cluster.namespace, "train-worker-1")
        await cluster.harness.fail_container(cluster.namespace, "train-worker-1", CONTAINER, message="exit 1")
        await cluster.harness.fail_container(cluster.namespace, "kept-worker-1", CONTAINER, message="exit 1")
        await _until_event(cluster, RESTARTED, train["metadata"]["uid"], "a restart Event for the unlabelled job")
        await _recreated(cluster, "train", old)
        await asyncio.sleep(SETTLE)
        events = await _events(cluster)
    assert len(_about(events, RESTARTED, train["metadata"]["uid"])) == 1
    acted_on = {e["involvedObject"].get("uid") for e in events if e.get("reason", "").startswith("Kcover")}
    assert kept["metadata"]["uid"] not in acted_on
    assert _uids(await _pods(cluster, "kept")) == _uids(kept_pods)


async def test_dra_unhealthy_device_restarts_its_job(cluster: Cluster, tmp_path: Path) -> None:
    if why := await cluster.device_health_refused():
        pytest.skip(why)
    node = f"scn-{secrets.token_hex(3)}"
    await _node(cluster.client, node)
    train = await _job(cluster, "train", node)
    old = _uids(await _pods(cluster, "train"))
    async with cluster.harness.playing(), _controllers(cluster, tmp_path):
        await cluster.harness.set_device_health(cluster.namespace, "train-worker-1", CONTAINER,
                                                resource_name=f"claim:{CLAIM}/{REQUEST}",
                                                resource_id=f"gpu.nvidia.com/{node}/gpu-2", health="Unhealthy",
                                                message="XID 79: GPU has fallen off the bus")
        await _until_event(cluster, RESTARTED, train["metadata"]["uid"], "a restart Event for PyTorchJob train")
        await _recreated(cluster, "train", old)
        await asyncio.sleep(SETTLE)
        assert len(_about(await _events(cluster), RESTARTED, train["metadata"]["uid"])) == 1
    assert _deletecollections(cluster) in (None, 0)


async def test_event_annotation_on_a_pod_restarts_its_job(cluster: Cluster, tmp_path: Path) -> None:
    node = f"scn-{secrets.token_hex(3)}"
    await _node(cluster.client, node)
    train = await _job(cluster, "train", node)
    pods = await _pods(cluster, "train")
    old = _uids(pods)
    ns = cluster.namespace
    async with cluster.harness.playing(), _controllers(cluster, tmp_path):
        await _post_event(cluster, ns, {"kind": "Pod", "apiVersion": "v1", "namespace": ns,
                                        "name": pods[1]["metadata"]["name"], "uid": pods[1]["metadata"]["uid"]},
                          reason="NCCLAllReduceHang", message="all-reduce stalled for 300s on rank 1",
                          reporter="healthcheck.example.com/checker")
        await _until_event(cluster, RESTARTED, train["metadata"]["uid"], "a restart Event for PyTorchJob train")
        await _recreated(cluster, "train", old)
        await asyncio.sleep(SETTLE)
        assert len(_about(await _events(cluster), RESTARTED, train["metadata"]["uid"])) == 1
    assert _deletecollections(cluster) in (None, 0)


async def test_restart_storm_stops_at_the_budget_and_says_why(cluster: Cluster, tmp_path: Path) -> None:
    budget = 2
    node = f"scn-{secrets.token_hex(3)}"
    await _node(cluster.client, node)
    train = await _job(cluster, "train", node)
    uid, ns = train["metadata"]["uid"], cluster.namespace
    pods = await _pods(cluster, "train")
    async with cluster.harness.playing(), _controllers(cluster, tmp_path, max_restarts_per_window=budget,
                                                       workload_cooldown_seconds=0.5):
        for attempt in range(1, budget + 1):  # every start fails; each failure is restarted
            await cluster.harness.fail_container(ns, "train-worker-1", CONTAINER,
                                                 message="RuntimeError: CUDA out of memory")
            await _until(functools.partial(_restarts, cluster, uid, attempt), f"restart {attempt} of PyTorchJob train")
            pods = await _recreated(cluster, "train", _uids(pods))
            for pod in pods:
                await cluster.harness.run_pod(ns, pod["metadata"]["name"])
            await asyncio.sleep(1.0)  # past the 0.5 s cooldown: only the budget may stop kcover now
        await cluster.harness.fail_container(ns, "train-worker-1", CONTAINER, message="RuntimeError: CUDA out of memory")
        skipped = await _until_event(cluster, SKIPPED, uid, "a KcoverRecoverySkipped Event for PyTorchJob train")
        await asyncio.sleep(SETTLE)
        events = await _events(cluster)
        left = await _pods(cluster, "train")
    assert len(_about(events, RESTARTED, uid)) == budget
    assert any("budget exhausted" in e.get("message", "") for e in skipped), [e.get("message") for e in skipped]
    assert _uids(left) == _uids(pods)  # the last generation is left in place
    assert all(not p["metadata"].get("deletionTimestamp") for p in left)
    assert _deletecollections(cluster) in (None, 0)


async def _restarts(cluster: Cluster, uid: str, at_least: int) -> bool:
    return len(_about(await _events(cluster), RESTARTED, uid)) >= at_least


async def test_leader_failover_successor_restarts_once(cluster: Cluster, tmp_path: Path) -> None:
    node = f"scn-{secrets.token_hex(3)}"
    await _node(cluster.client, node)
    train = await _job(cluster, "train", node)
    uid = train["metadata"]["uid"]
    old = _uids(await _pods(cluster, "train"))
    async with cluster.harness.playing(), _controllers(cluster, tmp_path, ("a", "b")) as replicas:
        leader = _leader(replicas)
        successor = next(r for r in replicas if r is not leader)
        # The leader dies without releasing its Lease, and the fault lands before the successor can
        # take over: nobody leads when it happens, so only the successor can act on it, once, after
        # the Lease expires (killing the leader after the fault would race its own restart).
        leader.kill()
        killed_at = time.monotonic()
        await asyncio.wait([leader.task])
        await cluster.harness.fail_container(cluster.namespace, "train-worker-1", CONTAINER,
                                             message="worker group failed (exitcode: 1)")
        restarted = await _until_event(cluster, RESTARTED, uid, "the successor's restart Event")
        took = time.monotonic() - killed_at
        await _recreated(cluster, "train", old)
        await asyncio.sleep(SETTLE)
        events = await _events(cluster)
        assert successor.controller.is_leader()
    limit = LEASE["lease_duration_seconds"] + LEASE["retry_period_seconds"] + 3.0  # slack: detection, HTTP
    assert took < limit, f"the successor restarted the job {took:.1f} s after the kill (limit {limit:g} s)"
    assert [e.get("reportingInstance") for e in restarted] == [successor.identity]
    assert len(_about(events, RESTARTED, uid)) == 1
    assert _deletecollections(cluster) in (None, 0)


async def test_forged_node_event_is_refused_and_counted(cluster: Cluster, tmp_path: Path) -> None:
    node = f"scn-{secrets.token_hex(3)}"
    await _node(cluster.client, node)
    node_uid = (await cluster.client.request("GET", f"/api/v1/nodes/{node}"))["metadata"]["uid"]
    async with _controllers(cluster, tmp_path) as replicas:
        mets = _leader(replicas).metrics

        def refused() -> float:
            got = mets.registry.get_sample_value("kcover_events_rejected_total", {"reason": "namespace_not_allowed"})
            return got or 0.0

        await _post_event(cluster, "default", {"kind": "Node", "apiVersion": "v1", "name": node, "uid": node_uid},
                          reason="GPUFailure", message="all GPUs failed, cordon now",
                          reporter="kcover.io/agent")  # the agent's name, from a namespace not kcover's
        await _until_true(lambda: refused() >= 1, "the event watcher to refuse the Event")
        await asyncio.sleep(SETTLE)  # room for a wrongful cordon to show
        spec = (await cluster.client.request("GET", f"/api/v1/nodes/{node}")).get("spec") or {}
        acted = [e for e in await _events(cluster, "default")
                 if e.get("reason") in (CORDONED, RESTARTED) and e["involvedObject"].get("name") == node]
    assert not spec.get("unschedulable")
    assert "kcover.io/unhealthy" not in {t.get("key") for t in spec.get("taints") or []}
    assert acted == []
    assert refused() == 1.0

