"""The recovery engine against the simulated API server: what the server ends up holding.

The snapshot is built from the server's objects (as the cache would project them), so the client's
request counts show only what recovery itself sends.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kcover import bus as bus_
from kcover import errors, metrics, model, settings
from kcover.kube import caching, client, watching
from kcover.recovery import adapters, engine, executing, ledger, snapshots, views

simserver = pytest.importorskip("kcover.sim.server")

NS = "ml"
LEDGER_NS = "kcover-system"
KF = "kubeflow.org/v1"


class Clock:
    def __init__(self) -> None:
        self.moment = dt.datetime.now(dt.UTC)

    def now(self) -> dt.datetime:
        return self.moment

    def monotonic(self) -> float:
        return self.moment.timestamp()


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[Any, client.KubeClient]]:
    async with simserver.SimServer() as srv:
        kube = client.from_configuration(srv.kube_configuration())
        try:
            yield srv, kube
        finally:
            await kube.close()


def ref(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True}


def make_pod(srv: Any, name: str, node: str, labels: dict[str, str], owner: dict[str, Any] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "labels": labels}
    if owner is not None:
        meta["ownerReferences"] = [ref(owner)]
    return dict(srv.store.create("pods", {"metadata": meta, "spec": {"nodeName": node, "containers": [{"name": "c"}]},
                                          "status": {"phase": "Running"}}))


def seed(srv: Any, *, operator_labels: bool = True) -> dict[str, Any]:
    for ns in (NS, LEDGER_NS):
        if not srv.store.namespace_exists(ns):
            srv.store.create("namespaces", {"metadata": {"name": ns}})
    for i in range(10):
        srv.store.create("nodes", {"metadata": {"name": f"gpu-{i}"},
                                   "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present",
                                                        "effect": "NoSchedule"}]} if i == 0 else {},
                                   "status": {"capacity": {"nvidia.com/gpu": "8"}}})
    pt = srv.store.create("pytorchjobs.kubeflow.org", {
        "apiVersion": KF, "kind": "PyTorchJob",
        "metadata": {"name": "train", "namespace": NS, "labels": {views.OPT_IN_LABEL: "true"}},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 3, "restartPolicy": "OnFailure"}}}})
    tf = srv.store.create("tfjobs.kubeflow.org", {"apiVersion": KF, "kind": "TFJob",
                                                  "metadata": {"name": "train", "namespace": NS}, "spec": {}})
    rs = srv.store.create("replicasets.apps", {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                               "metadata": {"name": "debug", "namespace": NS}, "spec": {}}) \
        if _has(srv, "replicasets.apps") else None

    def kf_labels(op: str) -> dict[str, str]:
        out = {adapters.KUBEFLOW_JOB_NAME: "train"}
        if operator_labels:
            out[adapters.KUBEFLOW_OPERATOR_NAME] = op
        return out

    for i in range(3):
        make_pod(srv, f"train-worker-{i}", f"gpu-{i}", kf_labels("pytorchjob-controller"), pt)
    for i in range(2):
        make_pod(srv, f"train-chief-{i}", f"gpu-{i}", kf_labels("tfjob-controller"), tf)
    # another workload carrying the same label value (a debug pod copied from the job's template)
    make_pod(srv, "train-debug", "gpu-5", {adapters.KUBEFLOW_JOB_NAME: "train"}, rs)
    return {"pt": pt, "tf": tf}


def _has(srv: Any, key: str) -> bool:
    try:
        srv.store.table(key)
    except Exception:
        return False
    return True


def snapshot(srv: Any) -> views.MemorySnapshot:
    workloads = []
    for key in ("pytorchjobs.kubeflow.org", "tfjobs.kubeflow.org", "jobs.batch"):
        workloads += [adapters.workload_view(e.obj()) for e in srv.store.list(key).entries]
    return views.MemorySnapshot(pods=[views.pod_view(e.obj()) for e in srv.store.list("pods").entries],
                                nodes=[views.node_view(e.obj()) for e in srv.store.list("nodes").entries],
                                workloads=workloads)


class Rig:
    def __init__(self, srv: Any, kube: client.KubeClient, clock: Clock, **overrides: Any) -> None:
        self.srv = srv
        self.kube = kube
        self.clock = clock
        self.leading = True
        self.recovery = settings.RecoverySettings(**overrides)
        self.metrics = metrics.Metrics()
        self.snap = snapshot(srv)
        self.ledger = ledger.Ledger(kube, namespace=LEDGER_NS, name="kcover-ledger", is_leader=lambda: self.leading,
                                    retention_seconds=lambda: self.recovery.restart_window_seconds)
        self.executor = executing.Executor(kube, self.snap, self.ledger, recovery=self.recovery,
                                           metrics_=self.metrics, clock=clock, identity="test-replica",
                                           is_leader=lambda: self.leading)
        self.engine = engine.RecoveryEngine(None, self.snap, self.ledger, self.executor, recovery=self.recovery,
                                            clock=clock, is_leader=lambda: self.leading)

    def refresh(self) -> None:
        fresh = snapshot(self.srv)
        self.snap.pods, self.snap.nodes, self.snap.workloads = fresh.pods, fresh.nodes, fresh.workloads


def pod_fault(srv: Any, name: str, clock: Clock) -> model.CollectorEvent:
    pod = srv.store.get("pods", NS, name)
    return model.CollectorEvent(detector="pod-status", severity=model.Severity.ERROR, reason="ContainerError",
                                message="exit code 1", observed_at=clock.now(),
                                target=model.Target(kind=model.TargetKind.POD, namespace=NS, name=name,
                                                    uid=pod["metadata"]["uid"]))


def node_fault(node: str, clock: Clock, **attrs: Any) -> model.CollectorEvent:
    return model.CollectorEvent(detector="node-condition", severity=model.Severity.ERROR, reason="XID79",
                                message="GPU has fallen off the bus", observed_at=clock.now(), attributes=attrs,
                                target=model.Target(kind=model.TargetKind.NODE, name=node, node=node))


def alive(srv: Any) -> set[str]:
    """Pods not deleted and not terminating."""
    return {e.obj()["metadata"]["name"] for e in srv.store.list("pods").entries
            if not e.obj()["metadata"].get("deletionTimestamp")}


def events(srv: Any) -> list[dict[str, Any]]:
    return [e.obj() for e in srv.store.list("events").entries]


def writes(counts: dict[str, int]) -> int:
    return sum(v for k, v in counts.items() if k.split()[0] in ("CREATE", "UPDATE", "DELETE", "DELETECOLLECTION", "PATCH"))


async def test_pod_error_restarts_exactly_that_job_in_one_delete_collection(cluster: tuple[Any, client.KubeClient]) -> None:
    srv, kube = cluster
    seed(srv)
    clock = Clock()
    rig = Rig(srv, kube, clock)
    await rig.ledger.load()
    kube.request_counts.clear()

    results = await rig.engine.handle_event(pod_fault(srv, "train-worker-1", clock))

    assert [r.outcome for r in results] == [executing.Outcome.DONE]
    assert results[0].deleted == 3
    assert alive(srv) == {"train-chief-0", "train-chief-1", "train-debug"}
    counts = dict(kube.request_counts)
    assert counts.get("DELETECOLLECTION pods") == 1
    assert not any(k.startswith("LIST") for k in counts), counts
    assert writes(counts) <= 3, counts
    (event,) = events(srv)
    assert event["reason"] == "KcoverRestartedWorkload"
    assert event["involvedObject"]["kind"] == "PyTorchJob"
    assert event["reportingComponent"] == "kcover.io/controller"  # core/v1 name of reportingController
    assert event["reportingInstance"] == "test-replica"
    assert "ContainerError" in event["message"]
    assert "deleted 3 pods" in event["message"]
    cm = srv.store.get("configmaps", LEDGER_NS, "kcover-ledger")
    assert list(cm["data"]) == [f"w.{seed_uid(srv, 'pytorchjobs.kubeflow.org')}"]
    assert rig.metrics.actions.labels(action="restart_workload", result="done")._value.get() == 1


def seed_uid(srv: Any, key: str) -> str:
    return str(srv.store.get(key, NS, "train")["metadata"]["uid"])


async def test_without_operator_labels_same_named_tfjob_is_spared_by_uid_checked_deletes(
        cluster: tuple[Any, client.KubeClient]) -> None:
    srv, kube = cluster
    seed(srv, operator_labels=False)
    clock = Clock()
    rig = Rig(srv, kube, clock)
    results = await rig.engine.handle_event(pod_fault(srv, "train-worker-0", clock))
    assert results[0].outcome is executing.Outcome.DONE
    assert alive(srv) == {"train-chief-0", "train-chief-1", "train-debug"}
    assert "DELETECOLLECTION pods" not in kube.request_counts
    assert kube.request_counts["DELETE pods"] == 3


async def test_repeated_event_within_cooldown_does_not_restart_again(cluster: tuple[Any, client.KubeClient]) -> None:
    srv, kube = cluster
    seed(srv)
    clock = Clock()
    rig = Rig(srv, kube, clock)
    await rig.engine.handle_event(pod_fault(srv, "train-worker-1", clock))
    # the operator recreates the pods
    pt = srv.store.get("pytorchjobs.kubeflow.org", NS, "train")
    for i in range(3):
        make_pod(srv, f"train-worker-{i}-b", f"gpu-{i}",
                 {adapters.KUBEFLOW_JOB_NAME: "train", adapters.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}, pt)
    rig.refresh()
    clock.moment += dt.timedelta(seconds=20)
    kube.request_counts.clear()
    results = await rig.engine.handle_event(pod_fault(srv, "train-worker-1-b", clock))
    assert [r.outcome for r in results] == [executing.Outcome.SKIPPED]
    assert writes(dict(kube.request_counts)) == 0
    assert {"train-worker-0-b", "train-worker-1-b", "train-worker-2-b"} <= alive(srv)


async def test_new_leader_honours_the_old_leaders_cooldown(cluster: tuple[Any, client.KubeClient]) -> None:
    srv, kube = cluster
    seed(srv)
    clock = Clock()
    old, new = Rig(srv, kube, clock), Rig(srv, kube, clock)
    await new.ledger.load()  # the follower read the ledger before the old leader wrote it
    await old.engine.handle_event(pod_fault(srv, "train-worker-1", clock))
    pt = srv.store.get("pytorchjobs.kubeflow.org", NS, "train")
    make_pod(srv, "train-worker-9", "gpu-3",
             {adapters.KUBEFLOW_JOB_NAME: "train", adapters.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}, pt)
    new.refresh()
    results = await new.engine.handle_event(pod_fault(srv, "train-worker-9", clock))
    assert [r.outcome for r in results] == [executing.Outcome.SKIPPED]  # 409 on the ledger, re-read, cooldown
    assert "train-worker-9" in alive(srv)
    assert new.ledger.conflicts == 1


async def test_budget_exhaustion_skips_and_says_why(cluster: tuple[Any, client.KubeClient]) -> None:
    srv, kube = cluster
    seed(srv)
    clock = Clock()
    rig = Rig(srv, kube, clock, max_restarts_per_window=2, workload_cooldown_seconds=10)
    pt = srv.store.get("pytorchjobs.kubeflow.org", NS, "train")
    outcomes = []
    for round_ in range(3):
        name = f"train-r{round_}"
        make_pod(srv, name, "gpu-1",
                 {adapters.KUBEFLOW_JOB_NAME: "train", adapters.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}, pt)
        rig.refresh()
        outcomes += [r.outcome for r in await rig.engine.handle_event(pod_fault(srv, name, clock))]
        clock.moment += dt.timedelta(seconds=30)
    assert outcomes == [executing.Outcome.DONE, executing.Outcome.DONE, executing.Outcome.SKIPPED]
    assert "train-r2" in alive(srv)
    skipped = [e for e in events(srv) if e["reason"] == "KcoverRecoverySkipped"]
    assert len(skipped) == 1
    assert "BudgetExhausted" in skipped[0]["message"]
    assert "2 times" in skipped[0]["message"]
    assert skipped[0]["involvedObject"]["uid"] == pt["metadata"]["uid"]


async def test_cordon_writes_taint_and_annotations_and_keeps_other_taints(
        cluster: tuple[Any, client.KubeClient]) -> None:
    srv, kube = cluster
    seed(srv)
    clock = Clock()
    rig = Rig(srv, kube, clock)
    results = await rig.engine.handle_event(node_fault("gpu-0", clock, recommended_action="cordon-node"))
    assert [r.outcome for r in results] == [executing.Outcome.DONE]
    node = srv.store.get("nodes", "", "gpu-0")
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        {"key": "kcover.io/unhealthy", "value": "XID79", "effect": "NoSchedule"}]
    ann = node["metadata"]["annotations"]
    assert ann["kcover.io/cordoned-by"] == "kcover"
    assert "XID79" in ann["kcover.io/cordon-reason"]
    assert ann["kcover.io/cordoned-at"].endswith("Z")
    (event,) = events(srv)
    assert event["reason"] == "KcoverCordonedNode"
    assert event["metadata"]["namespace"] == "default"
    assert event["involvedObject"]["uid"] == node["metadata"]["uid"]
    assert alive(srv) >= {"train-worker-0", "train-chief-0"}  # cordon only


async def test_cordon_and_restart_and_uncordon(cluster: tuple[Any, client.KubeClient]) -> None:
    srv, kube = cluster
    seed(srv)
    clock = Clock()
    rig = Rig(srv, kube, clock, uncordon_enabled=True, uncordon_hold_seconds=60)
    results = await rig.engine.handle_event(node_fault("gpu-2", clock))
    assert [type(r.action).__name__ for r in results] == ["CordonNode", "RestartWorkload"]
    assert "train-worker-2" not in alive(srv)
    assert "train-chief-0" in alive(srv)
    rig.refresh()
    clock.moment += dt.timedelta(seconds=120)
    cleared = model.CollectorEvent(detector="node-condition", severity=model.Severity.INFO, reason="XID79Cleared",
                                   target=model.Target(kind=model.TargetKind.NODE, name="gpu-2", node="gpu-2"),
                                   observed_at=clock.now(), attributes={"fault_cleared": True})
    results = await rig.engine.handle_event(cleared)
    assert [r.outcome for r in results] == [executing.Outcome.DONE]
    node = srv.store.get("nodes", "", "gpu-2")
    assert not node["spec"].get("unschedulable")
    assert not node["spec"].get("taints")
    assert "kcover.io/cordoned-by" not in (node["metadata"].get("annotations") or {})


async def test_dry_run_writes_only_events(cluster: tuple[Any, client.KubeClient]) -> None:
    srv, kube = cluster
    seed(srv)
    clock = Clock()
    rig = Rig(srv, kube, clock, dry_run=True)
    await rig.engine.handle_event(pod_fault(srv, "train-worker-1", clock))
    await rig.engine.handle_event(node_fault("gpu-3", clock))
    written = {k for k in kube.request_counts if writes({k: 1})}
    assert written == {"CREATE events"}
    assert len(alive(srv)) == 6
    assert not srv.store.get("nodes", "", "gpu-3")["spec"].get("unschedulable")
    assert {e["action"] for e in events(srv)} == {"DryRunRestart", "DryRunCordon"}
    assert rig.metrics.actions.labels(action="restart_workload", result="dry_run")._value.get() == 1


async def test_follower_writes_nothing(cluster: tuple[Any, client.KubeClient]) -> None:
    srv, kube = cluster
    seed(srv)
    clock = Clock()
    rig = Rig(srv, kube, clock)
    rig.leading = False
    with pytest.raises(errors.NotLeaderError):
        await rig.engine.handle_event(pod_fault(srv, "train-worker-1", clock))
    await rig.engine.handle([pod_fault(srv, "train-worker-1", clock)])
    assert rig.engine.counts["not_leader"] == 1
    assert len(alive(srv)) == 6
    assert writes(dict(kube.request_counts)) == 0


async def test_batch_job_restart_selects_by_controller_uid(cluster: tuple[Any, client.KubeClient]) -> None:
    srv, kube = cluster
    seed(srv)
    job = srv.store.create("jobs.batch", {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        "name": "bj", "namespace": NS, "labels": {views.OPT_IN_LABEL: "true"}}, "spec": {"backoffLimit": 6}})
    uid = job["metadata"]["uid"]
    make_pod(srv, "bj-a", "gpu-4", {adapters.BATCH_JOB_NAME: "bj", adapters.BATCH_CONTROLLER_UID: uid}, job)
    # a pod of a deleted-and-recreated Job of the same name (different uid) must survive
    make_pod(srv, "bj-old", "gpu-4", {adapters.BATCH_JOB_NAME: "bj", adapters.BATCH_CONTROLLER_UID: "old-uid"}, None)
    clock = Clock()
    rig = Rig(srv, kube, clock)
    results = await rig.engine.handle_event(pod_fault(srv, "bj-a", clock))
    assert results[0].outcome is executing.Outcome.DONE
    assert results[0].deleted == 1
    assert "bj-old" in alive(srv)
    assert "bj-a" not in alive(srv)


async def test_with_the_controller_cache_as_snapshot(cluster: tuple[Any, client.KubeClient]) -> None:
    """The product wiring: `CacheSnapshot` over a running `ClusterCache` (which keeps fewer labels)."""
    srv, kube = cluster
    seed(srv)
    cache_client = client.from_configuration(srv.kube_configuration())
    cache = caching.ClusterCache(cache_client, options=watching.ReflectorOptions(
        page_size=100, backoff_initial_seconds=0.05, backoff_max_seconds=0.2, missing_retry_seconds=1.0))
    stop = asyncio.Event()
    clock = Clock()
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(cache.run(stop), name="cache")
            try:
                await asyncio.wait_for(cache.wait_synced(), 10)
                rig = Rig(srv, kube, clock)
                snap = snapshots.CacheSnapshot(cache)
                rig.executor = executing.Executor(kube, snap, rig.ledger, recovery=rig.recovery, metrics_=rig.metrics,
                                                  clock=clock, identity="test-replica", is_leader=lambda: True)
                rig.engine = engine.RecoveryEngine(None, snap, rig.ledger, rig.executor, recovery=rig.recovery,
                                                   clock=clock, is_leader=lambda: True)
                results = await rig.engine.handle_event(pod_fault(srv, "train-worker-1", clock))
            finally:
                stop.set()
    finally:
        await cache_client.close()
    assert [r.outcome for r in results] == [executing.Outcome.DONE]
    assert alive(srv) == {"train-chief-0", "train-chief-1", "train-debug"}


async def test_engine_runs_from_a_bus_subscription(cluster: tuple[Any, client.KubeClient]) -> None:
    srv, kube = cluster
    seed(srv)
    clock = Clock()
    rig = Rig(srv, kube, clock)
    bus = bus_.Bus(dedupe_window_seconds=0)
    rig.engine = engine.RecoveryEngine(bus.subscribe("recovery"), rig.snap, rig.ledger, rig.executor,
                                       recovery=rig.recovery, clock=clock, is_leader=lambda: True)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(rig.engine.run(stop), name="engine")
        for _ in range(3):
            await bus.publish(pod_fault(srv, "train-worker-0", clock))
        for _ in range(200):
            if rig.engine.counts["events"] == 3:
                break
            await asyncio.sleep(0.01)
        stop.set()
    # one batch, handled concurrently: all three plan a restart; the ledger lets one through
    assert rig.engine.counts["restart_workload:done"] == 1
    assert rig.engine.counts["restart_workload:skipped"] == 2
    assert kube.request_counts["DELETECOLLECTION pods"] == 1
    assert dict(kube.request_counts) == {"GET configmaps": 1, "CREATE configmaps": 1, "DELETECOLLECTION pods": 1,
                                         "CREATE events": 1}
