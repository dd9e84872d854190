"""The recovery engine against a real HTTP API server (every selected backend): what the server ends up holding.

The engine is built as the controller builds it (`recovering.build`: gateway, ledger, coordinator, hooks)
over the backend's client. The snapshot is the product's own `ClusterCache`, filled offline from the
server's objects (listed through the harness's own client, projected by the reflectors' list path), so
the product client's request counts show only what recovery itself sends; one test runs it live
(watching) instead. Pods are created through the API and set Running through `/status` by the harness
(no kubelet runs). The same behaviours run on virtual time in tests/recovery/test_engine.py; these pin
them against the real kube-apiserver's semantics (preconditions, 409s, evictions, byte limits).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from enginekit import (
    KF,
    Clock,
    Cluster,
    Rig,
    alive,
    create,
    done,
    events,
    get,
    ledger_data,
    make_pod,
    node_fault,
    pod_fault,
    seed,
    writes,
)

from kcover import errors, kinds, model
from kcover.kube import caching, watching
from kcover.kube import projections as proj
from kcover.recovery import planinputs, planning
from kcover.recovery import steps as st


async def test_pod_error_restarts_exactly_that_job_by_uid_preconditioned_deletes(cluster: Cluster) -> None:
    """A Kubeflow job's pods carry no uid label: kcover deletes the pods it verified, one by one, each
    with its uid as precondition (a pod created meanwhile with the job's labels is never deleted)."""
    kube = cluster.client
    await seed(cluster)
    clock = Clock()
    rig = await Rig.make(cluster, clock)
    await rig.ledger.load()
    kube.request_counts.clear()

    outcomes = await rig.handle(await pod_fault(cluster, "train-worker-1", clock))

    assert done(outcomes) == ["restart_workload:done"]
    assert isinstance(outcomes[0], st.Done)
    assert outcomes[0].removed == 3
    assert await alive(cluster) == {"train-chief-0", "train-chief-1", "train-debug"}
    counts = {k: v for k, v in kube.request_counts.items() if "recoveries" not in k}
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
    job = await get(cluster, f"/apis/kubeflow.org/v1/namespaces/{cluster.namespace}/pytorchjobs/train")
    assert list(await ledger_data(cluster)) == [f"w.{job['metadata']['uid']}"]
    assert rig.metrics.actions.labels(action="restart_workload", result="done")._value.get() == 1


async def test_a_restart_saves_the_logs_of_the_faulting_pod_not_of_every_pod_it_takes_away(cluster: Cluster) -> None:
    """`recovery.save_logs.scope: faulted` (the default): the save before the removal reads the faulting pod
    and the pods whose containers ended with an error, so a large job's restart does not wait on a log read
    per pod."""
    await seed(cluster)
    clock = Clock()
    given: list[list[str]] = []

    async def record(workload: Any, pods: Any) -> None:
        given.append(sorted(p.name for p in pods))

    rig = await Rig.make(cluster, clock, save_logs=record)
    outcomes = await rig.handle(await pod_fault(cluster, "train-worker-1", clock))
    assert done(outcomes) == ["restart_workload:done"]
    assert outcomes[0].removed == 3
    assert given == [["train-worker-1"]]


async def test_without_operator_labels_same_named_tfjob_is_spared_by_uid_checked_deletes(
        cluster: Cluster) -> None:
    kube = cluster.client
    await seed(cluster, operator_labels=False)
    clock = Clock()
    rig = await Rig.make(cluster, clock)
    assert done(await rig.handle(await pod_fault(cluster, "train-worker-0", clock))) == ["restart_workload:done"]
    assert await alive(cluster) == {"train-chief-0", "train-chief-1", "train-debug"}
    assert "DELETECOLLECTION pods" not in kube.request_counts
    assert kube.request_counts["DELETE pods"] == 3


async def test_repeated_event_within_cooldown_is_held_not_restarted_again(cluster: Cluster) -> None:
    kube = cluster.client
    await seed(cluster)
    clock = Clock()
    rig = await Rig.make(cluster, clock)
    await rig.handle(await pod_fault(cluster, "train-worker-1", clock))
    # the operator recreates the pods
    pt = await get(cluster, f"/apis/kubeflow.org/v1/namespaces/{cluster.namespace}/pytorchjobs/train")
    for i in range(3):
        await make_pod(cluster, f"train-worker-{i}-b", f"gpu-{i}",
                       {kinds.KUBEFLOW_JOB_NAME: "train", kinds.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}, pt)
    await rig.refresh()
    clock.moment += dt.timedelta(seconds=20)
    kube.request_counts.clear()
    outcomes = await rig.handle(await pod_fault(cluster, "train-worker-1-b", clock))
    assert done(outcomes) == ["hold:Cooldown"]
    assert {k for k in kube.request_counts if writes({k: 1})} <= {"UPDATE ledgerentries", "CREATE events",
                                                                   "CREATE recoveries", "PATCH recoveries"}
    assert kube.request_counts.get("DELETE pods", 0) == 0
    assert {"train-worker-0-b", "train-worker-1-b", "train-worker-2-b"} <= await alive(cluster)


async def test_new_leader_honours_the_old_leaders_cooldown(cluster: Cluster) -> None:
    await seed(cluster)
    clock = Clock()
    old, new = await Rig.make(cluster, clock), await Rig.make(cluster, clock)
    await new.ledger.load()  # the follower read the ledger before the old leader wrote it
    await old.handle(await pod_fault(cluster, "train-worker-1", clock))
    pt = await get(cluster, f"/apis/kubeflow.org/v1/namespaces/{cluster.namespace}/pytorchjobs/train")
    await make_pod(cluster, "train-worker-9", "gpu-3",
                   {kinds.KUBEFLOW_JOB_NAME: "train", kinds.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}, pt)
    await new.refresh()
    new.leader._loaded_epoch = 1  # same term: the follower plans with what it read, the write's 409 corrects it
    outcomes = await new.handle(await pod_fault(cluster, "train-worker-9", clock))
    assert done(outcomes) == ["restart_workload:Cooldown"]  # 409 on the ledger entry, re-read, cooldown
    assert "train-worker-9" in await alive(cluster)
    assert new.ledger.conflicts == 1


async def test_budget_exhaustion_skips_and_says_why(cluster: Cluster) -> None:
    await seed(cluster)
    clock = Clock()
    # no cooldown, so the test's clock need not run ahead of the server's (a pod created after a restart
    # is a new failure, not one the restart removed)
    rig = await Rig.make(cluster, clock, max_restarts_per_window=2, workload_cooldown_seconds=0)
    pt = await get(cluster, f"/apis/kubeflow.org/v1/namespaces/{cluster.namespace}/pytorchjobs/train")
    outcomes = []
    for round_ in range(3):
        name = f"train-r{round_}"
        await make_pod(cluster, name, "gpu-1",
                       {kinds.KUBEFLOW_JOB_NAME: "train", kinds.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}, pt)
        await rig.refresh()
        outcomes += done(await rig.handle(await pod_fault(cluster, name, clock)))
    assert outcomes == ["restart_workload:done", "restart_workload:done", "refuse:BudgetExhausted"]
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
    outcomes = await rig.handle(node_fault("gpu-0", clock, recommended=model.Action.CORDON_NODE))
    assert done(outcomes) == ["cordon_node:done", "call_person:done"]
    node = (await get(cluster, "/api/v1/nodes/gpu-0"))
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [*before, {"key": "kcover.io/unhealthy", "value": "XID79", "effect": "NoSchedule"}]
    ann = node["metadata"]["annotations"]
    assert ann["kcover.io/cordoned-by"] == "kcover"
    assert "XID79" in ann["kcover.io/cordon-reason"]
    assert ann["kcover.io/cordoned-at"].endswith("Z")
    cordoned = [e for e in await events(cluster) if e["reason"] == "KcoverCordonedNode"]
    assert len(cordoned) == 1
    assert cordoned[0]["metadata"]["namespace"] == "default"
    assert await alive(cluster) >= {"train-worker-0", "train-chief-0"}  # cordon only


async def test_cordon_and_restart_and_uncordon(cluster: Cluster) -> None:
    await seed(cluster)
    clock = Clock()
    rig = await Rig.make(cluster, clock, uncordon_enabled=True)
    outcomes = await rig.handle(node_fault("gpu-2", clock))
    assert [type(o.step).__name__ for o in outcomes] == ["Cordon", "Restart", "CallPerson"]
    assert "train-worker-2" not in await alive(cluster)
    assert "train-chief-0" in await alive(cluster)
    await rig.refresh()
    clock.moment += dt.timedelta(seconds=120)
    cleared = model.CollectorEvent(detector="node-condition", severity=model.Severity.INFO, reason="XID79Cleared",
                                   target=model.Target(kind=model.TargetKind.NODE, name="gpu-2", node="gpu-2"),
                                   observed_at=clock.now(), cleared=True)
    assert done(await rig.handle(cleared)) == ["uncordon_node:done"]
    node = (await get(cluster, "/api/v1/nodes/gpu-2"))
    assert not node["spec"].get("unschedulable")
    assert not [t for t in node["spec"].get("taints") or [] if t["key"].startswith("kcover.io/")]
    assert "kcover.io/cordoned-by" not in (node["metadata"].get("annotations") or {})


async def test_dry_run_writes_only_events_and_recoveries(cluster: Cluster) -> None:
    kube = cluster.client
    await seed(cluster)
    clock = Clock()
    rig = await Rig.make(cluster, clock, dry_run=True)
    await rig.handle(await pod_fault(cluster, "train-worker-1", clock))
    await rig.handle(node_fault("gpu-3", clock))
    await rig.leader.recorder.flush()
    written = {k for k in kube.request_counts if writes({k: 1})}
    assert written == {"CREATE events", "CREATE recoveries"}  # each Recovery's status in its create
    assert len(await alive(cluster)) == 6
    assert not (await get(cluster, "/api/v1/nodes/gpu-3"))["spec"].get("unschedulable")
    reasons = {e["reason"] for e in await events(cluster)}
    assert {"KcoverDryRunRestartedWorkload", "KcoverDryRunCordonedNode"} <= reasons
    assert not reasons & {"KcoverRestartedWorkload", "KcoverCordonedNode"}


async def test_follower_writes_nothing(cluster: Cluster) -> None:
    kube = cluster.client
    await seed(cluster)
    clock = Clock()
    rig = await Rig.make(cluster, clock)
    rig.leading = False
    with pytest.raises(errors.NotLeaderError):
        await rig.handle(await pod_fault(cluster, "train-worker-1", clock))
    assert len(await alive(cluster)) == 6
    assert writes(dict(kube.request_counts)) == 0


async def test_batch_job_restart_evicts_by_controller_uid(cluster: Cluster) -> None:
    await seed(cluster)
    ns = cluster.namespace
    job = await create(cluster, f"/apis/batch/v1/namespaces/{ns}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "bj", "namespace": ns, "labels": {proj.OPT_IN_LABEL: "true"}},
        "spec": {"backoffLimit": 6, "template": {"spec": {"restartPolicy": "Never",
                                                          "containers": [{"name": "c", "image": "trainer"}]}}}})
    uid = job["metadata"]["uid"]
    await make_pod(cluster, "bj-a", "gpu-4", {kinds.BATCH_JOB_NAME: "bj", kinds.BATCH_CONTROLLER_UID: uid}, job)
    # a pod of a deleted-and-recreated Job of the same name (different uid) must survive
    await make_pod(cluster, "bj-old", "gpu-4", {kinds.BATCH_JOB_NAME: "bj", kinds.BATCH_CONTROLLER_UID: "old-uid"}, None)
    clock = Clock()
    rig = await Rig.make(cluster, clock)
    outcomes = await rig.handle(await pod_fault(cluster, "bj-a", clock))
    assert done(outcomes) == ["restart_workload:done"]
    assert isinstance(outcomes[0], st.Done)
    assert outcomes[0].removed == 1
    assert rig.kube.request_counts["CREATE pods/eviction"] == 1
    assert "bj-old" in await alive(cluster)
    assert "bj-a" not in await alive(cluster)


async def test_with_the_controller_cache_as_snapshot(cluster: Cluster) -> None:
    """The product wiring: a running (watching) `ClusterCache` as the snapshot."""
    await seed(cluster)
    cache_client = cluster.new_client()
    cache = caching.ClusterCache(cache_client, options=watching.ReflectorOptions(
        page_size=100, backoff_initial_seconds=0.05, backoff_max_seconds=0.2, missing_retry_seconds=1.0),
        controls=(cluster.namespace, "kcover-controls"))
    stop = asyncio.Event()
    clock = Clock()
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(cache.run(stop), name="cache")
            try:
                await asyncio.wait_for(cache.wait_synced(), 10)
                rig = Rig(cluster, clock, cache)
                outcomes = await rig.handle(await pod_fault(cluster, "train-worker-1", clock))
            finally:
                stop.set()
    finally:
        await cache_client.close()
    assert done(outcomes) == ["restart_workload:done"]
    assert await alive(cluster) == {"train-chief-0", "train-chief-1", "train-debug"}


async def test_max_concurrent_restarts_bounds_restarts_in_flight_only_and_applies_on_reload(cluster: Cluster) -> None:
    """One restart may be in flight: a second job's restart is held (Throttled, never latching the breaker) while a cordon still
    proceeds; after a reload to two, the second job restarts while the first is still in flight."""
    await seed(cluster)
    ns = cluster.namespace
    other = await create(cluster, f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", {
        "apiVersion": KF, "kind": "PyTorchJob",
        "metadata": {"name": "other", "namespace": ns, "labels": {proj.OPT_IN_LABEL: "true"}},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "restartPolicy": "OnFailure"}}}})
    await make_pod(cluster, "other-worker-0", "gpu-6", {kinds.KUBEFLOW_JOB_NAME: "other",
                                                         kinds.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"},
                   other)
    clock = Clock()
    gate = asyncio.Event()
    saving: list[str] = []

    async def held_save_logs(workload: Any, pods: Any) -> None:  # keeps a restart in flight until the gate opens
        saving.append(workload.name)
        await gate.wait()

    rig = await Rig.make(cluster, clock, max_concurrent_restarts=1, save_logs=held_save_logs)
    first = asyncio.create_task(rig.handle(await pod_fault(cluster, "train-worker-0", clock)))
    for _ in range(200):
        if saving:
            break
        await asyncio.sleep(0.01)
    assert saving == ["train"]
    assert rig.engine.in_flight_restarts == 1

    outcomes = await asyncio.wait_for(rig.handle(await pod_fault(cluster, "other-worker-0", clock)), 5)
    assert done(outcomes) == ["hold:Throttled"]
    # a node fault on a node without pods: the cordon is not held back by the restart in flight
    await asyncio.wait_for(rig.handle(node_fault("gpu-8", clock)), 5)
    assert (await get(cluster, "/api/v1/nodes/gpu-8"))["spec"]["unschedulable"] is True

    new = rig.settings.recovery.model_copy(update={"max_concurrent_restarts": 2})
    rig.leader.reconfigure(new)
    second = asyncio.create_task(rig.handle(await pod_fault(cluster, "other-worker-0", clock)))
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
    job's selector: the uid-preconditioned deletes remove exactly the job's planned pods, never the newcomer."""
    await seed(cluster)
    clock = Clock()
    rig = await Rig.make(cluster, clock)
    await rig.ledger.load()
    fault = await pod_fault(cluster, "train-worker-1", clock)
    [planned] = [s for s in planning.plan(fault, rig.snap, planinputs.History(ledger=rig.ledger), rig.settings.recovery,
                                          clock.now()) if isinstance(s, st.Restart)]
    assert not planned.selector.uid_bearing
    labels = {kinds.KUBEFLOW_JOB_NAME: "train", kinds.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}
    await make_pod(cluster, "intruder", "gpu-7", labels, None)  # in flight: after the plan, before the delete
    await rig.refresh()  # even a cache that already sees it does not widen the planned restart
    [outcome, *_] = await rig.engine.coordinator.run([planned])
    assert isinstance(outcome, st.Done)
    assert outcome.removed == 3
    assert await alive(cluster) == {"train-chief-0", "train-chief-1", "train-debug", "intruder"}


@pytest.mark.parametrize("pods", [2, 8])
async def test_what_a_restart_costs_in_requests_by_kind(cluster: Cluster, pods: int) -> None:
    """Requests one restart sends, counted by the product's client: a batch/v1 Job's pods are evicted one by
    one (its Job controller would count deletes towards backoffLimit), a Kubeflow job's deleted with uid
    preconditions; neither lists anything. Both add one ledger write and one Event."""
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
        await make_pod(cluster, f"kf-worker-{i}", "gpu-c", {kinds.KUBEFLOW_JOB_NAME: "kf",
                                                           kinds.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}, pt)
        await make_pod(cluster, f"bj-{i}", "gpu-c", {kinds.BATCH_JOB_NAME: "bj",
                                                    kinds.BATCH_CONTROLLER_UID: job["metadata"]["uid"]}, job)
    clock = Clock()
    rig = await Rig.make(cluster, clock)
    await rig.ledger.load()
    cost: dict[str, dict[str, int]] = {}
    for name, pod in (("evictions", "bj-0"), ("uid-preconditioned deletes", "kf-worker-0")):
        rig.kube.request_counts.clear()
        outcomes = await rig.handle(await pod_fault(cluster, pod, clock))
        assert isinstance(outcomes[0], st.Done)
        assert outcomes[0].removed == pods
        cost[name] = {k: v for k, v in rig.kube.request_counts.items() if "recoveries" not in k}
    assert cost["evictions"] == {"CREATE ledgerentries": 1, "CREATE pods/eviction": pods, "CREATE events": 1}
    assert cost["uid-preconditioned deletes"] == {"CREATE ledgerentries": 1, "DELETE pods": pods, "CREATE events": 1}


async def test_an_audit_event_with_multibyte_text_is_written(cluster: Cluster) -> None:
    """600 CJK characters are 1,800 bytes: the Event is cut to 1,024 bytes on a character boundary and the
    server (a real kube-apiserver counts bytes) accepts it."""
    await seed(cluster)
    clock = Clock()
    rig = await Rig.make(cluster, clock)
    about = st.ObjectRef("PyTorchJob", KF, "train", cluster.namespace, "")
    await rig.engine.coordinator.run([st.Emit(about, "Kcover故障" * 30, "重启" * 80, "显存故障" * 150)])
    [event] = [e for e in await events(cluster) if e["involvedObject"].get("name") == "train"]
    assert len(event["message"].encode()) <= 1024
    assert event["message"].startswith("显存故障")
    assert event["message"].endswith("...")
    assert len(event["reason"].encode()) <= 128
    assert len(event["action"].encode()) <= 128
