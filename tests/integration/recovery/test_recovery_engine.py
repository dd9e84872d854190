"""The recovery engine against a real HTTP API server (every selected backend): what the server ends up holding.

The snapshot is the product's own `ClusterCache`, filled offline from the server's objects (listed
through the harness's own client, projected by the reflectors' list path), so the product client's
request counts show only what recovery itself sends; one test runs it live (watching) instead.
Pods are created through the API and set Running through `/status` by the harness (no kubelet runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from typing import Any

import pytest

from kcover import bus as bus_
from kcover import errors, metrics, model, settings
from kcover.kube import caching, client, watching
from kcover.kube import projections as proj
from kcover.recovery import actions, adapters, engine, executing, ledger, policy

KF = "kubeflow.org/v1"
Cluster = Any  # tests/backends.py's Cluster


class Clock:
    def __init__(self) -> None:
        self.moment = dt.datetime.now(dt.UTC)

    def now(self) -> dt.datetime:
        return self.moment

    def monotonic(self) -> float:
        return self.moment.timestamp()


def ref(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True}


async def make_pod(cluster: Cluster, name: str, node: str, labels: dict[str, str],
                   owner: dict[str, Any] | None) -> dict[str, Any]:
    ns = cluster.namespace
    meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels}
    if owner is not None:
        meta["ownerReferences"] = [ref(owner)]
    await cluster.harness.kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body={
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "trainer"}]}})
    return dict(await cluster.harness.run_pod(ns, name))


async def create(cluster: Cluster, path: str, body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = await cluster.harness.kube.request("POST", path, body=body)
    out.setdefault("apiVersion", body.get("apiVersion"))
    out.setdefault("kind", body.get("kind"))
    return out


async def seed(cluster: Cluster, *, operator_labels: bool = True) -> dict[str, Any]:
    ns = cluster.namespace
    for i in range(10):
        await create(cluster, "/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": f"gpu-{i}"},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]} if i == 0 else {},
            "status": {"capacity": {"nvidia.com/gpu": "8"}}})
    pt = await create(cluster, f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", {
        "apiVersion": KF, "kind": "PyTorchJob",
        "metadata": {"name": "train", "namespace": ns, "labels": {proj.OPT_IN_LABEL: "true"}},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 3, "restartPolicy": "OnFailure"}}}})
    tf = await create(cluster, f"/apis/kubeflow.org/v1/namespaces/{ns}/tfjobs", {
        "apiVersion": KF, "kind": "TFJob", "metadata": {"name": "train", "namespace": ns}, "spec": {}})
    try:
        rs: dict[str, Any] | None = await create(cluster, f"/apis/apps/v1/namespaces/{ns}/replicasets", {
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "debug", "namespace": ns},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "debug"}},
                     "template": {"metadata": {"labels": {"app": "debug"}},
                                  "spec": {"containers": [{"name": "c", "image": "trainer"}]}}}})
    except errors.NotFoundError:  # a server without apps/v1
        rs = None

    def kf_labels(op: str) -> dict[str, str]:
        out = {adapters.KUBEFLOW_JOB_NAME: "train"}
        if operator_labels:
            out[adapters.KUBEFLOW_OPERATOR_NAME] = op
        return out

    for i in range(3):
        await make_pod(cluster, f"train-worker-{i}", f"gpu-{i}", kf_labels("pytorchjob-controller"), pt)
    for i in range(2):
        await make_pod(cluster, f"train-chief-{i}", f"gpu-{i}", kf_labels("tfjob-controller"), tf)
    # another workload carrying the same label value (a debug pod copied from the job's template)
    await make_pod(cluster, "train-debug", "gpu-5", {adapters.KUBEFLOW_JOB_NAME: "train"}, rs)
    return {"pt": pt, "tf": tf}


async def items(cluster: Cluster, path: str) -> list[dict[str, Any]]:
    """The objects of a LIST, each with its apiVersion and kind (lists of built-in types omit them)."""
    listed = await cluster.harness.kube.request("GET", path)
    out = listed.get("items") or []
    for item in out:
        item.setdefault("apiVersion", listed.get("apiVersion"))
        item.setdefault("kind", str(listed.get("kind", "")).removesuffix("List"))
    return list(out)


async def cluster_objects(cluster: Cluster) -> list[dict[str, Any]]:
    """What the controller's cache lists: the test namespace's pods and workloads, all nodes and ResourceSlices."""
    ns = cluster.namespace
    out = [*await items(cluster, f"/api/v1/namespaces/{ns}/pods"), *await items(cluster, "/api/v1/nodes")]
    for path in (f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", f"/apis/kubeflow.org/v1/namespaces/{ns}/tfjobs",
                 f"/apis/batch/v1/namespaces/{ns}/jobs", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets",
                 "/apis/resource.k8s.io/v1/resourceslices"):
        with contextlib.suppress(errors.NotFoundError):  # a server without that group
            out += await items(cluster, path)
    return out


async def snapshot(cluster: Cluster) -> caching.ClusterCache:
    """The product's cluster model (a `ClusterCache`), filled through its reflectors' list path."""
    return caching.ClusterCache.offline(await cluster_objects(cluster))


class Rig:
    def __init__(self, cluster: Cluster, clock: Clock, snap: caching.ClusterCache, **overrides: Any) -> None:
        self.cluster = cluster
        self.kube: client.KubeClient = cluster.client
        self.clock = clock
        self.leading = True
        self.recovery = settings.RecoverySettings(**overrides)
        self.metrics = metrics.Metrics()
        self.snap = snap
        self.ledger = ledger.Ledger(self.kube, namespace=cluster.namespace, name="kcover-ledger",
                                    is_leader=lambda: self.leading,
                                    retention_seconds=lambda: self.recovery.restart_window_seconds)
        self.executor = executing.Executor(self.kube, self.snap, self.ledger, recovery=self.recovery,
                                           metrics_=self.metrics, clock=clock, identity="test-replica",
                                           is_leader=lambda: self.leading)
        self.engine = engine.RecoveryEngine(None, self.snap, self.ledger, self.executor, recovery=self.recovery,
                                            clock=clock, is_leader=lambda: self.leading)

    @classmethod
    async def make(cls, cluster: Cluster, clock: Clock, **overrides: Any) -> Rig:
        return cls(cluster, clock, await snapshot(cluster), **overrides)

    async def refresh(self) -> None:
        self.snap.load(await cluster_objects(self.cluster))


async def get(cluster: Cluster, path: str) -> dict[str, Any]:
    return dict(await cluster.harness.kube.request("GET", path))


async def pod_fault(cluster: Cluster, name: str, clock: Clock) -> model.CollectorEvent:
    ns = cluster.namespace
    pod = await get(cluster, f"/api/v1/namespaces/{ns}/pods/{name}")
    return model.CollectorEvent(detector="pod-status", severity=model.Severity.ERROR, reason="ContainerError",
                                message="exit code 1", observed_at=clock.now(),
                                target=model.Target(kind=model.TargetKind.POD, namespace=ns, name=name,
                                                    uid=pod["metadata"]["uid"]))


def node_fault(node: str, clock: Clock, *, recommended: model.Action | None = None) -> model.CollectorEvent:
    return model.CollectorEvent(detector="node-condition", severity=model.Severity.ERROR, reason="XID79",
                                message="GPU has fallen off the bus", observed_at=clock.now(), recommended=recommended,
                                target=model.Target(kind=model.TargetKind.NODE, name=node, node=node))


async def alive(cluster: Cluster) -> set[str]:
    """Pods not deleted and not terminating."""
    return {o["metadata"]["name"] for o in await items(cluster, f"/api/v1/namespaces/{cluster.namespace}/pods")
            if not o["metadata"].get("deletionTimestamp")}


async def events(cluster: Cluster) -> list[dict[str, Any]]:
    """Events in the test's namespace, and Node events (kept in "default")."""
    return [*await items(cluster, f"/api/v1/namespaces/{cluster.namespace}/events"),
            *[e for e in await items(cluster, "/api/v1/namespaces/default/events")
              if e["involvedObject"].get("kind") == "Node"]]


def writes(counts: dict[str, int]) -> int:
    return sum(v for k, v in counts.items() if k.split()[0] in ("CREATE", "UPDATE", "DELETE", "DELETECOLLECTION", "PATCH"))


async def test_pod_error_restarts_exactly_that_job_by_uid_preconditioned_deletes(cluster: Cluster) -> None:
    """A Kubeflow job's pods carry no uid label: kcover deletes the pods it verified, one by one, each
    with its uid as precondition (a pod created meanwhile with the job's labels is never deleted)."""
    kube = cluster.client
    await seed(cluster)
    clock = Clock()
    rig = await Rig.make(cluster, clock)
    await rig.ledger.load()
    kube.request_counts.clear()

    results = await rig.engine.handle_event(await pod_fault(cluster, "train-worker-1", clock))

    assert [r.outcome for r in results] == [executing.Outcome.DONE]
    assert results[0].deleted == 3
    assert await alive(cluster) == {"train-chief-0", "train-chief-1", "train-debug"}
    counts = dict(kube.request_counts)
    assert counts.get("DELETE pods") == 3
    assert "DELETECOLLECTION pods" not in counts
    assert not any(k.startswith("LIST") for k in counts), counts
    assert writes(counts) == 5, counts  # ledger, three pods, Event
    (event,) = await events(cluster)
    assert event["reason"] == "KcoverRestartedWorkload"
    assert event["involvedObject"]["kind"] == "PyTorchJob"
    assert event["reportingComponent"] == "kcover.io/controller"  # core/v1 name of reportingController
    assert event["reportingInstance"] == "test-replica"
    assert "ContainerError" in event["message"]
    assert "deleted 3 pods" in event["message"]
    cm = await get(cluster, f"/api/v1/namespaces/{cluster.namespace}/configmaps/kcover-ledger")
    job = await get(cluster, f"/apis/kubeflow.org/v1/namespaces/{cluster.namespace}/pytorchjobs/train")
    assert list(cm["data"]) == [f"w.{job['metadata']['uid']}"]
    assert rig.metrics.actions.labels(action="restart_workload", result="done")._value.get() == 1


async def test_without_operator_labels_same_named_tfjob_is_spared_by_uid_checked_deletes(
        cluster: Cluster) -> None:
    kube = cluster.client
    await seed(cluster, operator_labels=False)
    clock = Clock()
    rig = await Rig.make(cluster, clock)
    results = await rig.engine.handle_event(await pod_fault(cluster, "train-worker-0", clock))
    assert results[0].outcome is executing.Outcome.DONE
    assert await alive(cluster) == {"train-chief-0", "train-chief-1", "train-debug"}
    assert "DELETECOLLECTION pods" not in kube.request_counts
    assert kube.request_counts["DELETE pods"] == 3


async def test_repeated_event_within_cooldown_does_not_restart_again(cluster: Cluster) -> None:
    kube = cluster.client
    await seed(cluster)
    clock = Clock()
    rig = await Rig.make(cluster, clock)
    await rig.engine.handle_event(await pod_fault(cluster, "train-worker-1", clock))
    # the operator recreates the pods
    pt = await get(cluster, f"/apis/kubeflow.org/v1/namespaces/{cluster.namespace}/pytorchjobs/train")
    for i in range(3):
        await make_pod(cluster, f"train-worker-{i}-b", f"gpu-{i}",
                 {adapters.KUBEFLOW_JOB_NAME: "train", adapters.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}, pt)
    await rig.refresh()
    clock.moment += dt.timedelta(seconds=20)
    kube.request_counts.clear()
    results = await rig.engine.handle_event(await pod_fault(cluster, "train-worker-1-b", clock))
    assert [r.outcome for r in results] == [executing.Outcome.SKIPPED]
    assert writes(dict(kube.request_counts)) == 0
    assert {"train-worker-0-b", "train-worker-1-b", "train-worker-2-b"} <= await alive(cluster)


async def test_new_leader_honours_the_old_leaders_cooldown(cluster: Cluster) -> None:
    await seed(cluster)
    clock = Clock()
    old, new = await Rig.make(cluster, clock), await Rig.make(cluster, clock)
    await new.ledger.load()  # the follower read the ledger before the old leader wrote it
    await old.engine.handle_event(await pod_fault(cluster, "train-worker-1", clock))
    pt = await get(cluster, f"/apis/kubeflow.org/v1/namespaces/{cluster.namespace}/pytorchjobs/train")
    await make_pod(cluster, "train-worker-9", "gpu-3",
             {adapters.KUBEFLOW_JOB_NAME: "train", adapters.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}, pt)
    await new.refresh()
    results = await new.engine.handle_event(await pod_fault(cluster, "train-worker-9", clock))
    assert [r.outcome for r in results] == [executing.Outcome.SKIPPED]  # 409 on the ledger, re-read, cooldown
    assert "train-worker-9" in await alive(cluster)
    assert new.ledger.conflicts == 1


async def test_budget_exhaustion_skips_and_says_why(cluster: Cluster) -> None:
    await seed(cluster)
    clock = Clock()
    rig = await Rig.make(cluster, clock, max_restarts_per_window=2, workload_cooldown_seconds=10)
    pt = await get(cluster, f"/apis/kubeflow.org/v1/namespaces/{cluster.namespace}/pytorchjobs/train")
    outcomes = []
    for round_ in range(3):
        name = f"train-r{round_}"
        await make_pod(cluster, name, "gpu-1",
                 {adapters.KUBEFLOW_JOB_NAME: "train", adapters.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}, pt)
        await rig.refresh()
        outcomes += [r.outcome for r in await rig.engine.handle_event(await pod_fault(cluster, name, clock))]
        clock.moment += dt.timedelta(seconds=30)
    assert outcomes == [executing.Outcome.DONE, executing.Outcome.DONE, executing.Outcome.SKIPPED]
    assert "train-r2" in await alive(cluster)
    skipped = [e for e in await events(cluster) if e["reason"] == "KcoverRecoverySkipped"]
    assert len(skipped) == 1
    assert "BudgetExhausted" in skipped[0]["message"]
    assert "2 times" in skipped[0]["message"]
    assert skipped[0]["involvedObject"]["uid"] == pt["metadata"]["uid"]


async def test_cordon_writes_taint_and_annotations_and_keeps_other_taints(
        cluster: Cluster) -> None:
    await seed(cluster)
    clock = Clock()
    rig = await Rig.make(cluster, clock)
    # a real kube-apiserver's TaintNodesByCondition admission adds node.kubernetes.io/not-ready on create
    before = (await get(cluster, "/api/v1/nodes/gpu-0"))["spec"]["taints"]
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in before
    results = await rig.engine.handle_event(node_fault("gpu-0", clock, recommended=model.Action.CORDON_NODE))
    assert [r.outcome for r in results] == [executing.Outcome.DONE]
    node = (await get(cluster, "/api/v1/nodes/gpu-0"))
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [*before, {"key": "kcover.io/unhealthy", "value": "XID79", "effect": "NoSchedule"}]
    ann = node["metadata"]["annotations"]
    assert ann["kcover.io/cordoned-by"] == "kcover"
    assert "XID79" in ann["kcover.io/cordon-reason"]
    assert ann["kcover.io/cordoned-at"].endswith("Z")
    (event,) = await events(cluster)
    assert event["reason"] == "KcoverCordonedNode"
    assert event["metadata"]["namespace"] == "default"
    assert event["involvedObject"]["uid"] == node["metadata"]["uid"]
    assert await alive(cluster) >= {"train-worker-0", "train-chief-0"}  # cordon only


async def test_cordon_and_restart_and_uncordon(cluster: Cluster) -> None:
    await seed(cluster)
    clock = Clock()
    rig = await Rig.make(cluster, clock, uncordon_enabled=True)
    results = await rig.engine.handle_event(node_fault("gpu-2", clock))
    assert [type(r.action).__name__ for r in results] == ["CordonNode", "RestartWorkload"]
    assert "train-worker-2" not in await alive(cluster)
    assert "train-chief-0" in await alive(cluster)
    await rig.refresh()
    clock.moment += dt.timedelta(seconds=120)
    cleared = model.CollectorEvent(detector="node-condition", severity=model.Severity.INFO, reason="XID79Cleared",
                                   target=model.Target(kind=model.TargetKind.NODE, name="gpu-2", node="gpu-2"),
                                   observed_at=clock.now(), cleared=True)
    results = await rig.engine.handle_event(cleared)
    assert [r.outcome for r in results] == [executing.Outcome.DONE]
    node = (await get(cluster, "/api/v1/nodes/gpu-2"))
    assert not node["spec"].get("unschedulable")
    assert not [t for t in node["spec"].get("taints") or [] if t["key"].startswith("kcover.io/")]
    assert "kcover.io/cordoned-by" not in (node["metadata"].get("annotations") or {})


async def test_dry_run_writes_only_events(cluster: Cluster) -> None:
    kube = cluster.client
    await seed(cluster)
    clock = Clock()
    rig = await Rig.make(cluster, clock, dry_run=True)
    await rig.engine.handle_event(await pod_fault(cluster, "train-worker-1", clock))
    await rig.engine.handle_event(node_fault("gpu-3", clock))
    written = {k for k in kube.request_counts if writes({k: 1})}
    assert written == {"CREATE events"}
    assert len(await alive(cluster)) == 6
    assert not (await get(cluster, "/api/v1/nodes/gpu-3"))["spec"].get("unschedulable")
    assert {e["action"] for e in await events(cluster)} == {"DryRunRestart", "DryRunCordon"}
    assert rig.metrics.actions.labels(action="restart_workload", result="dry_run")._value.get() == 1


async def test_follower_writes_nothing(cluster: Cluster) -> None:
    kube = cluster.client
    await seed(cluster)
    clock = Clock()
    rig = await Rig.make(cluster, clock)
    rig.leading = False
    with pytest.raises(errors.NotLeaderError):
        await rig.engine.handle_event(await pod_fault(cluster, "train-worker-1", clock))
    await rig.engine.handle([await pod_fault(cluster, "train-worker-1", clock)])
    assert rig.engine.counts["not_leader"] == 1
    assert len(await alive(cluster)) == 6
    assert writes(dict(kube.request_counts)) == 0


async def test_batch_job_restart_selects_by_controller_uid(cluster: Cluster) -> None:
    await seed(cluster)
    ns = cluster.namespace
    job = await create(cluster, f"/apis/batch/v1/namespaces/{ns}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "bj", "namespace": ns, "labels": {proj.OPT_IN_LABEL: "true"}},
        "spec": {"backoffLimit": 6, "template": {"spec": {"restartPolicy": "Never",
                                                          "containers": [{"name": "c", "image": "trainer"}]}}}})
    uid = job["metadata"]["uid"]
    await make_pod(cluster, "bj-a", "gpu-4", {adapters.BATCH_JOB_NAME: "bj", adapters.BATCH_CONTROLLER_UID: uid}, job)
    # a pod of a deleted-and-recreated Job of the same name (different uid) must survive
    await make_pod(cluster, "bj-old", "gpu-4", {adapters.BATCH_JOB_NAME: "bj", adapters.BATCH_CONTROLLER_UID: "old-uid"}, None)
    clock = Clock()
    rig = await Rig.make(cluster, clock)
    results = await rig.engine.handle_event(await pod_fault(cluster, "bj-a", clock))
    assert results[0].outcome is executing.Outcome.DONE
    assert results[0].deleted == 1
    assert "bj-old" in await alive(cluster)
    assert "bj-a" not in await alive(cluster)


async def test_with_the_controller_cache_as_snapshot(cluster: Cluster) -> None:
    """The product wiring: a running (watching) `ClusterCache` as the snapshot."""
    kube = cluster.client
    await seed(cluster)
    cache_client = cluster.new_client()
    cache = caching.ClusterCache(cache_client, options=watching.ReflectorOptions(
        page_size=100, backoff_initial_seconds=0.05, backoff_max_seconds=0.2, missing_retry_seconds=1.0))
    stop = asyncio.Event()
    clock = Clock()
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(cache.run(stop), name="cache")
            try:
                await asyncio.wait_for(cache.wait_synced(), 10)
                rig = await Rig.make(cluster, clock)
                snap = cache
                rig.executor = executing.Executor(kube, snap, rig.ledger, recovery=rig.recovery, metrics_=rig.metrics,
                                                  clock=clock, identity="test-replica", is_leader=lambda: True)
                rig.engine = engine.RecoveryEngine(None, snap, rig.ledger, rig.executor, recovery=rig.recovery,
                                                   clock=clock, is_leader=lambda: True)
                results = await rig.engine.handle_event(await pod_fault(cluster, "train-worker-1", clock))
            finally:
                stop.set()
    finally:
        await cache_client.close()
    assert [r.outcome for r in results] == [executing.Outcome.DONE]
    assert await alive(cluster) == {"train-chief-0", "train-chief-1", "train-debug"}


async def test_engine_runs_from_a_bus_subscription(cluster: Cluster) -> None:
    kube = cluster.client
    await seed(cluster)
    clock = Clock()
    rig = await Rig.make(cluster, clock)
    bus = bus_.Bus(dedupe_window_seconds=0)
    rig.engine = engine.RecoveryEngine(bus.subscribe("recovery"), rig.snap, rig.ledger, rig.executor,
                                       recovery=rig.recovery, clock=clock, is_leader=lambda: True)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        fault = await pod_fault(cluster, "train-worker-0", clock)
        tg.create_task(rig.engine.run(stop), name="engine")
        for _ in range(3):
            await bus.publish(fault)
        for _ in range(200):
            if rig.engine.counts["events"] == 3:
                break
            await asyncio.sleep(0.01)
        stop.set()
    # the first restarts the job; the others see that restart (in flight or in the ledger) and cool down
    assert rig.engine.counts["restart_workload:done"] == 1
    assert rig.engine.counts["skip:Cooldown"] == 2
    assert dict(kube.request_counts) == {"GET configmaps": 1, "CREATE configmaps": 1, "DELETE pods": 3,
                                         "CREATE events": 1}


async def test_max_concurrent_restarts_bounds_restarts_in_flight_only_and_applies_on_reload(cluster: Cluster) -> None:
    """One restart may be in flight: a second job's restart is refused (BreakerOpen) while a cordon still
    proceeds; after a reload to two, the second job restarts while the first is still in flight."""
    await seed(cluster)
    ns = cluster.namespace
    other = await create(cluster, f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", {
        "apiVersion": KF, "kind": "PyTorchJob",
        "metadata": {"name": "other", "namespace": ns, "labels": {proj.OPT_IN_LABEL: "true"}},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "restartPolicy": "OnFailure"}}}})
    await make_pod(cluster, "other-worker-0", "gpu-6", {adapters.KUBEFLOW_JOB_NAME: "other",
                                                         adapters.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"},
                   other)
    clock = Clock()
    rig = await Rig.make(cluster, clock, max_concurrent_restarts=1)
    gate = asyncio.Event()
    saving: list[str] = []

    async def held_save_logs(workload: Any, pods: Any) -> None:  # keeps a restart in flight until the gate opens
        saving.append(workload.name)
        await gate.wait()

    rig.executor = executing.Executor(rig.kube, rig.snap, rig.ledger, recovery=rig.recovery, metrics_=rig.metrics,
                                      clock=clock, identity="test-replica", is_leader=lambda: True,
                                      save_logs=held_save_logs)
    rig.engine = engine.RecoveryEngine(None, rig.snap, rig.ledger, rig.executor, recovery=rig.recovery,
                                       clock=clock, is_leader=lambda: True)
    # each event goes through handle(), as the controller hands batches
    first = asyncio.create_task(rig.engine.handle([await pod_fault(cluster, "train-worker-0", clock)]))
    for _ in range(200):
        if saving:
            break
        await asyncio.sleep(0.01)
    assert saving == ["train"]
    assert rig.engine.in_flight_restarts == 1

    await asyncio.wait_for(rig.engine.handle([await pod_fault(cluster, "other-worker-0", clock)]), 5)
    assert [(r.outcome, getattr(r.action, "code", None)) for r in rig.engine.results] == [
        (executing.Outcome.SKIPPED, actions.SkipCode.BREAKER_OPEN)]
    # a node fault on a node without pods: the cordon is not held back by the restart in flight
    await asyncio.wait_for(rig.engine.handle([node_fault("gpu-8", clock)]), 5)
    assert (await get(cluster, "/api/v1/nodes/gpu-8"))["spec"]["unschedulable"] is True

    rig.engine.reconfigure(rig.recovery.model_copy(update={"max_concurrent_restarts": 2}))
    second = asyncio.create_task(rig.engine.handle([await pod_fault(cluster, "other-worker-0", clock)]))
    for _ in range(200):
        if len(saving) == 2:
            break
        await asyncio.sleep(0.01)
    assert saving == ["train", "other"]
    assert rig.engine.in_flight_restarts == 2
    gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert rig.engine.counts["restart_workload:done"] == 2
    assert rig.engine.in_flight_restarts == 0
    assert await alive(cluster) >= {"train-chief-0", "train-chief-1"}
    assert not await alive(cluster) & {"train-worker-0", "other-worker-0"}


async def test_a_pod_created_with_the_jobs_labels_during_a_restart_is_not_deleted(cluster: Cluster) -> None:
    """The restart is planned, then (while it is in flight) someone creates a pod carrying every label of the
    job's selector: the uid-preconditioned deletes remove exactly the job's verified pods, never the newcomer."""
    await seed(cluster)
    clock = Clock()
    rig = await Rig.make(cluster, clock)
    await rig.ledger.load()
    fault = await pod_fault(cluster, "train-worker-1", clock)
    [planned] = [a for a in policy.plan(fault, rig.snap, rig.ledger.history(), rig.recovery, clock.now())
                 if isinstance(a, actions.RestartWorkload)]
    assert planned.selector.pods is not None
    assert not planned.selector.uid_bearing
    labels = {adapters.KUBEFLOW_JOB_NAME: "train", adapters.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}
    await make_pod(cluster, "intruder", "gpu-7", labels, None)  # in flight: after the plan, before the delete
    await rig.refresh()  # even a cache that already sees it does not widen the planned restart
    result = await rig.executor.execute(planned)
    assert result.outcome is executing.Outcome.DONE
    assert result.deleted == 3
    assert await alive(cluster) == {"train-chief-0", "train-chief-1", "train-debug", "intruder"}


@pytest.mark.parametrize("pods", [2, 8])
async def test_what_a_restart_costs_in_requests_by_delete_choice(cluster: Cluster, pods: int) -> None:
    """Requests one restart sends, counted by the product's client: a batch/v1 Job's pods are listed by
    their controller-uid label and evicted one by one (its Job controller would count deletes towards
    backoffLimit); a Kubeflow job's, one uid-preconditioned DELETE per pod with no LIST. Both add one
    ledger write and one Event."""
    ns = cluster.namespace
    await create(cluster, "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-c"},
                                            "status": {"capacity": {"nvidia.com/gpu": "8"}}})
    pt = await create(cluster, f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", {
        "apiVersion": KF, "kind": "PyTorchJob",
        "metadata": {"name": "kf", "namespace": ns, "labels": {proj.OPT_IN_LABEL: "true"}},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": pods, "restartPolicy": "OnFailure"}}}})
    job = await create(cluster, f"/apis/batch/v1/namespaces/{ns}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "bj", "namespace": ns, "labels": {proj.OPT_IN_LABEL: "true"}},
        "spec": {"backoffLimit": 6, "template": {"spec": {"restartPolicy": "Never",
                                                          "containers": [{"name": "c", "image": "trainer"}]}}}})
    for i in range(pods):
        await make_pod(cluster, f"kf-worker-{i}", "gpu-c", {adapters.KUBEFLOW_JOB_NAME: "kf",
                                                           adapters.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}, pt)
        await make_pod(cluster, f"bj-{i}", "gpu-c", {adapters.BATCH_JOB_NAME: "bj",
                                                    adapters.BATCH_CONTROLLER_UID: job["metadata"]["uid"]}, job)
    clock = Clock()
    rig = await Rig.make(cluster, clock)
    await rig.ledger.load()
    cost: dict[str, dict[str, int]] = {}
    for name, pod in (("uid-label evictions", "bj-0"), ("uid-preconditioned deletes", "kf-worker-0")):
        rig.kube.request_counts.clear()
        [result] = await rig.engine.handle_event(await pod_fault(cluster, pod, clock))
        assert result.outcome is executing.Outcome.DONE
        assert result.deleted == pods
        cost[name] = dict(rig.kube.request_counts)
    assert cost["uid-label evictions"] == {"CREATE configmaps": 1, "LIST pods": 1, "CREATE pods/eviction": pods,
                                           "CREATE events": 1}
    assert cost["uid-preconditioned deletes"] == {"UPDATE configmaps": 1, "DELETE pods": pods, "CREATE events": 1}


async def test_an_audit_event_with_multibyte_text_is_written(cluster: Cluster) -> None:
    """600 CJK characters are 1,800 bytes: the Event is cut to 1,024 bytes on a character boundary and the
    server (a real kube-apiserver counts bytes) accepts it."""
    await seed(cluster)
    clock = Clock()
    rig = await Rig.make(cluster, clock)
    about = actions.ObjectRef("PyTorchJob", KF, "train", cluster.namespace, "")
    await rig.executor.emit(about, reason="Kcover故障" * 30, action="重启" * 80, message="显存故障" * 150, warning=True)
    [event] = [e for e in await events(cluster) if e["involvedObject"].get("name") == "train"]
    assert len(event["message"].encode()) <= 1024
    assert event["message"].startswith("显存故障")
    assert event["message"].endswith("...")
    assert len(event["reason"].encode()) <= 128
    assert len(event["action"].encode()) <= 128
