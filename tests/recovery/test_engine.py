"""The recovery engine end to end, on virtual time, against the simulated cluster in-process (no socket).

Built as the controller builds it (`recovering.build`), fed events as the controller feeds a leader;
every assertion is on what the API server ends up holding, what it was asked, and what Events say.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import orjson
import pytest
from harness import engines
from harness import objects as o

from kcover import kinds, model
from kcover.kube import projections as proj
from kcover.recovery import controls, ledgerentries, planning
from kcover.recovery import steps as st

pytestmark = pytest.mark.looptime

OPT = {proj.OPT_IN_LABEL: "true"}
KF = "kubeflow.org/v1"


def pytorchjob(name: str = "train", pods: int = 4, *, node: str = "n1") -> list[o.Obj]:
    job = o.workload(KF, "PyTorchJob", name, uid=f"{name}-uid", labels=OPT)
    labels = {kinds.KUBEFLOW_JOB_NAME: name, kinds.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}
    return [job, *(o.pod(f"{name}-worker-{i}", uid=f"{name}-{i}", node=node, labels=labels, owner=job)
                   for i in range(pods))]


def jobset(name: str, pods: int) -> list[o.Obj]:
    js = o.workload("jobset.x-k8s.io/v1alpha2", "JobSet", name, uid=f"{name}-uid", labels=OPT)
    labels = {kinds.JOBSET_NAME: name, kinds.JOBSET_UID: f"{name}-uid"}
    return [js, *(o.pod(f"{name}-w-{i}", uid=f"{name}-{i}", node=f"n{i % 4}", labels=labels,
                        owner=o.owner("batch/v1", "Job", f"{name}-w", "child-uid")) for i in range(pods))]


def failing(pod: o.Obj) -> o.Obj:
    pod["status"]["containerStatuses"] = [{"name": "c", "restartCount": 1, "state": {"terminated": {
        "exitCode": 1, "reason": "Error", "finishedAt": "2025-06-01T12:00:00Z"}}}]
    return pod


def pod_fault(uid: str, *, at: dt.datetime | None = None) -> model.CollectorEvent:
    return model.CollectorEvent(detector="pod-status", severity=model.Severity.ERROR, reason="ContainerError",
                                message="exit 1", target=model.Target(kind=model.TargetKind.POD, namespace="ml",
                                                                      name=uid, uid=uid),
                                observed_at=at or engines.START)


def node_fault(node: str) -> model.CollectorEvent:
    return model.CollectorEvent(detector="node-condition", severity=model.Severity.ERROR, reason="XID79",
                                message="GPU fell off the bus", recommended=model.Action.CORDON_NODE,
                                target=model.Target(kind=model.TargetKind.NODE, name=node, node=node),
                                observed_at=engines.START)


def nodes(n: int) -> list[o.Obj]:
    return [o.node(f"n{i}") for i in range(n)]


def paused_job(failing_pods: int = 1) -> list[o.Obj]:
    """One node, a 4-pod PyTorchJob whose first `failing_pods` workers failed, and kcover paused cluster-wide."""
    objs = pytorchjob()
    for pod in objs[1:1 + failing_pods]:
        failing(pod)
    controls_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "kcover-controls", "namespace": "kcover-system", "annotations": {controls.PAUSED: "true"}}}
    return [*nodes(1), *objs, controls_map]


async def test_a_pod_fault_restarts_its_job_with_one_ledger_write_and_one_delete_per_pod() -> None:
    async with engines.rig([*nodes(2), *pytorchjob()]) as r:
        before = r.pod_uids()
        lists = r.requests.get("LIST pods", 0)
        await r.handle(pod_fault("train-0"))
        assert r.pod_uids() == set(), "every pod of the job is taken away (its operator recreates them)"
        assert before == {f"train-{i}" for i in range(4)}
        writes = r.writes()
        assert writes.get("DELETE pods") == 4
        assert writes.get("CREATE ledgerentries.kcover.io") == 1
        assert r.requests.get("LIST pods", 0) == lists, "a restart lists nothing: its members come from the cache"
        (event,) = r.events("KcoverRestartedWorkload")
        assert event["involvedObject"]["name"] == "train"
        assert "deleted 4 pods" in event["message"]


@pytest.mark.parametrize(("kind", "bound", "removal"), [
    ("jobset", 32, "CREATE pods/eviction"),  # recovery.evict_concurrency's default
    ("pytorchjob", 16, "DELETE pods"),  # recovery.delete_concurrency's default
])
async def test_a_large_job_is_removed_concurrently_within_its_removals_bound(kind: str, bound: int,
                                                                             removal: str) -> None:
    """1,024 pods, 10 ms per request: the removals take 1,024 / bound rounds, not 1,024 and not fewer (an
    eviction, two writes on the server, has twice the deletes' bound)."""
    objs = jobset("big", 1024) if kind == "jobset" else pytorchjob("big", 1024)
    async with engines.rig([*nodes(4), *objs]) as r:
        r.srv.faults.latency_seconds = 0.01
        r.srv.faults.resources = frozenset({"pods"})
        loop = asyncio.get_running_loop()
        started = loop.time()
        await r.leader.handle([pod_fault("big-0")])
        elapsed = loop.time() - started
        assert r.requests.get(removal) == 1024
        assert r.pod_uids() == set()
        assert elapsed < 1024 * 0.01 / (bound / 2), f"removals ran {elapsed:.2f}s: fewer than {bound} at once"
        assert elapsed >= 1024 / bound * 0.01, f"removals ran {elapsed:.2f}s: more than {bound} at once"


async def test_pods_already_terminal_are_left_to_their_job_controller() -> None:
    job = o.workload("batch/v1", "Job", "bj", uid="bj-uid", labels=OPT)
    labels = {kinds.BATCH_JOB_NAME: "bj", kinds.BATCH_CONTROLLER_UID: "bj-uid"}
    failed = failing(o.pod("bj-a", uid="bj-a", node="n0", labels=labels, owner=job, phase="Failed"))
    live = o.pod("bj-b", uid="bj-b", node="n0", labels=labels, owner=job)
    async with engines.rig([*nodes(1), job, failed, live]) as r:
        await r.handle(pod_fault("bj-a"))
        assert r.requests.get("CREATE pods/eviction") == 1, "only the live pod is evicted"
        assert r.store.get("pods", "ml", "bj-a")["metadata"]["uid"] == "bj-a"
        assert "conditions" not in r.store.get("pods", "ml", "bj-a")["status"], "no DisruptionTarget on it"


async def test_five_node_faults_at_once_with_a_limit_of_one_cordon_exactly_one() -> None:
    async with engines.rig(nodes(10), overrides={"recovery": {"max_cordoned_fraction": 0.1}}) as r:
        await r.handle(*(node_fault(f"n{i}") for i in range(5)))
        cordoned = [n["metadata"]["name"] for n in r.store.iter_objects("nodes") if n["spec"].get("unschedulable")]
        assert cordoned == ["n0"]
        refused = [e for e in r.events("KcoverRecoverySkipped") if "BreakerOpen" in e["message"]]
        assert len(refused) == 4


async def test_a_restart_held_while_paused_runs_once_the_pause_is_lifted() -> None:
    paused = paused_job()
    async with engines.rig(paused) as r:
        await r.handle(pod_fault("train-0"))
        assert r.pod_uids() == {f"train-{i}" for i in range(4)}, "nothing restarted while paused"
        (held,) = r.events("KcoverRecoveryHeld")
        assert "Paused" in held["message"]
        await r.tick()
        assert r.pod_uids() == {f"train-{i}" for i in range(4)}, "still paused: still held"
        r.store.mutate("configmaps", "kcover-system", "kcover-controls",
                       lambda cm: cm["metadata"]["annotations"].pop(controls.PAUSED))
        await r.settle()
        await r.tick()
        assert r.pod_uids() == set(), "the held restart ran"
        assert len(r.events("KcoverRestartedWorkload")) == 1
        await r.tick()
        assert len(r.events("KcoverRestartedWorkload")) == 1, "and only once"


async def test_faults_held_on_one_job_share_the_held_restarts_recovery_and_none_stays_held() -> None:
    """A second fault of a job whose restart is held joins that restart: one Recovery (the first fault's)
    says it covers both and follows the restart, so no Recovery is left Held once it ran."""
    paused = paused_job(failing_pods=2)
    async with engines.rig(paused) as r:
        await r.handle(pod_fault("train-0"))
        second = pod_fault("train-1")
        await r.handle(second)
        await r.records()
        (held,) = list(r.store.iter_objects("recoveries.kcover.io"))
        assert held["status"]["phase"] == "Held"
        assert held["spec"]["fault"]["source"] == "Pod ml/train-0"
        assert held["status"]["message"].endswith(f"also for ContainerError from pod-status (fault {second.id})")
        joined = r.events("KcoverRecoveryHeld")[-1]
        assert "one restart covers it and the fault held first (ContainerError from pod-status" in joined["message"]
        r.store.mutate("configmaps", "kcover-system", "kcover-controls",
                       lambda cm: cm["metadata"]["annotations"].pop(controls.PAUSED))
        await r.settle()
        await r.tick()
        assert len(r.events("KcoverRestartedWorkload")) == 1
        await r.records()
        phases = [x["status"]["phase"] for x in r.store.iter_objects("recoveries.kcover.io")]
        assert phases in (["Verifying"], ["Recovered"]), phases


async def test_an_outage_on_the_ledger_write_delays_the_restart_and_loses_nothing() -> None:
    """14 s of 500s on every LedgerEntry request: nothing is recorded, the fault is kept and retried; once
    the server answers again the job is restarted exactly once."""
    async with engines.rig([*nodes(1), *pytorchjob()],
                           overrides={"kube": {"retry_deadline_seconds": 2.0}}) as r:
        r.srv.faults.resources = frozenset({"ledgerentries.kcover.io"})
        r.srv.faults.error_rate = 1.0
        await r.handle(pod_fault("train-0"))
        assert r.pod_uids() == {f"train-{i}" for i in range(4)}
        for _ in range(14):
            await asyncio.sleep(1.0)
            await r.tick()
        r.srv.faults.error_rate = 0.0
        for _ in range(40):
            await asyncio.sleep(1.0)
            await r.tick()
        assert r.pod_uids() == set()
        assert len(r.events("KcoverRestartedWorkload")) == 1
        assert r.requests.get("DELETE pods") == 4


async def test_an_event_a_defect_cannot_plan_is_kept_and_the_batchs_others_are_handled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A defect in planning raised for one event (here: made to, for job a's fault): job b's fault in the same
    batch is still acted on, the engine keeps running, and job a's fault is handled again on a later pass,
    once planning can plan it."""
    real = planning.plan

    def plan(event: model.CollectorEvent, *args: Any, **kwargs: Any) -> list[st.Step]:
        if event.target.uid == "a-0":
            raise RuntimeError("a defect")
        return real(event, *args, **kwargs)

    monkeypatch.setattr(planning, "plan", plan)
    async with engines.rig([*nodes(2), *pytorchjob("a"), *pytorchjob("b", node="n2")]) as r:
        await r.handle(pod_fault("a-0"), pod_fault("b-0"))
        assert r.pod_uids() == {f"a-{i}" for i in range(4)}, "b is restarted, a is not (yet)"
        assert r.leader.inner.counts["errors"] == 1
        assert pod_fault("a-0").key in r.leader.inner.kept
        monkeypatch.setattr(planning, "plan", real)
        await asyncio.sleep(2.0)
        await r.tick()
        assert r.pod_uids() == set()
        assert sorted(e["involvedObject"]["name"] for e in r.events("KcoverRestartedWorkload")) == ["a", "b"]


async def test_a_fault_that_cannot_be_recorded_within_retry_seconds_ends_in_recovery_failed() -> None:
    async with engines.rig([*nodes(1), *pytorchjob()],
                           overrides={"recovery": {"retry_seconds": 20.0}, "kube": {"retry_deadline_seconds": 1.0}}) as r:
        r.srv.faults.resources = frozenset({"ledgerentries.kcover.io"})
        r.srv.faults.error_rate = 1.0
        await r.handle(pod_fault("train-0"))
        for _ in range(40):
            await asyncio.sleep(1.0)
            await r.tick()
        assert r.pod_uids() == {f"train-{i}" for i in range(4)}, "nothing restarted without its ledger write"
        (failed,) = r.events("KcoverRecoveryFailed")
        assert "could not act on ContainerError" in failed["message"]
        assert "nothing recorded (the recovery ledger cannot be read)" in failed["message"]
        assert r.leader.inner.engine_metrics.given_up._value.get() == 1


async def test_an_event_planning_always_fails_on_is_given_up_with_an_event_that_names_the_defect(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def plan(*args: Any, **kwargs: Any) -> list[st.Step]:
        raise RuntimeError("a defect")

    monkeypatch.setattr(planning, "plan", plan)
    async with engines.rig([*nodes(1), *pytorchjob()], overrides={"recovery": {"retry_seconds": 20.0}}) as r:
        await r.handle(pod_fault("train-0"))
        for _ in range(40):
            await asyncio.sleep(1.0)
            await r.tick()
        assert r.pod_uids() == {f"train-{i}" for i in range(4)}
        (failed,) = r.events("KcoverRecoveryFailed")
        assert "planning it raised RuntimeError('a defect'), a defect in kcover" in failed["message"]
        assert "first write" not in failed["message"]
        assert r.leader.inner.engine_metrics.given_up._value.get() == 1
        assert pod_fault("train-0").key not in r.leader.inner.kept


async def test_without_its_ledger_crd_kcover_acts_on_nothing_and_recovers_when_it_returns() -> None:
    async with engines.rig([*nodes(1), *pytorchjob()]) as r:
        r.srv.delete_crd("ledgerentries.kcover.io")
        await r.handle(pod_fault("train-0"))
        assert r.pod_uids() == {f"train-{i}" for i in range(4)}, "no action without the ledger"
        assert r.events("KcoverLedgerUnavailable")
        assert r.metrics.registry.get_sample_value("kcover_ledger_available") == 0
        await r.tick()  # no crash, nothing done
        r.srv.create_crd("ledgerentries.kcover.io")
        for _ in range(5):
            await asyncio.sleep(1.0)
            await r.tick()
        assert r.pod_uids() == set(), "the kept fault is acted on once the CRD is back"
        assert len(r.events("KcoverRestartedWorkload")) == 1
        assert r.metrics.registry.get_sample_value("kcover_ledger_available") == 1


async def test_a_cordons_ledger_check_and_node_read_are_one_round_trip() -> None:
    """With every Node and LedgerEntry request answered 1 s (virtual) late, a cordon on a loaded ledger takes
    three round trips: the served check and the Node read together, the Node's write, the entry's write.
    The check before the read would make it four."""
    async with engines.rig(nodes(2)) as r:
        await r.leader.inner.ledger.ensure_loaded()
        r.srv.faults.resources = frozenset({"nodes", "ledgerentries.kcover.io"})
        r.srv.faults.latency_seconds = 1.0
        before = dict(r.requests)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await r.leader.handle([node_fault("n0")])
        assert loop.time() - started == pytest.approx(3.0, abs=0.05)
        assert r.store.get("nodes", "", "n0")["spec"].get("unschedulable") is True
        sent = {k: r.requests.get(k, 0) - before.get(k, 0)
                for k in ("LIST ledgerentries.kcover.io", "GET nodes", "UPDATE nodes")}
        assert sent == {"LIST ledgerentries.kcover.io": 1, "GET nodes": 1, "UPDATE nodes": 1}


async def test_a_cordon_whose_ledger_crd_went_away_writes_no_node_until_it_is_back_and_then_once() -> None:
    """A loaded ledger whose CRD goes away: the cordon's served check (run beside the read of the Node) fails,
    so the Node is not written; once the CRD is back the kept fault cordons the node, once."""
    async with engines.rig(nodes(2)) as r:
        await r.leader.inner.ledger.ensure_loaded()
        r.srv.delete_crd("ledgerentries.kcover.io")
        await r.handle(node_fault("n0"))
        assert not r.store.get("nodes", "", "n0")["spec"].get("unschedulable"), "no cordon without the ledger"
        assert "UPDATE nodes" not in r.requests
        assert r.events("KcoverLedgerUnavailable")
        r.srv.create_crd("ledgerentries.kcover.io")
        for _ in range(5):
            await asyncio.sleep(1.0)
            await r.tick()
        assert r.store.get("nodes", "", "n0")["spec"].get("unschedulable") is True
        assert r.requests.get("UPDATE nodes") == 1
        assert len(r.events("KcoverCordonedNode")) == 1


async def test_dry_run_changes_nothing_writes_its_own_events_and_honours_its_cooldown() -> None:
    async with engines.rig([*nodes(1), *pytorchjob()], overrides={"recovery": {"dry_run": True}}) as r:
        await r.handle(pod_fault("train-0"))
        await r.handle(pod_fault("train-1"))
        assert r.pod_uids() == {f"train-{i}" for i in range(4)}
        assert not r.events("KcoverRestartedWorkload"), "no real action's reason"
        (dry,) = r.events("KcoverDryRunRestartedWorkload")
        assert dry["message"].startswith("dry run, nothing was changed: restarted PyTorchJob ml/train")
        assert {k for k in r.writes() if not k.startswith(("CREATE events", "CREATE recoveries",
                                                           "PATCH recoveries"))} == set()
        gw = r.leader.gateway
        assert [w.call for w in gw.would].count("delete_pod") == 4


async def test_a_replica_that_is_not_leading_writes_nothing() -> None:
    class Ended:
        def write_seconds_left(self) -> float:
            return 0.0

    async with engines.rig([*nodes(1), *pytorchjob()]) as r:
        from kcover.controller import recovering

        fenced = recovering.build(recovering.EngineDeps(
            settings=r.settings, client=r.kube, cache=r.cache, metrics=r.metrics.__class__(), clock=r.clock,
            is_leader=lambda: False, epoch=lambda: 2, identity="kcover-old", fence=Ended()))
        from kcover import errors

        with pytest.raises(errors.NotLeaderError):
            await fenced.handle([pod_fault("train-0")])
        assert r.writes() == {}
        assert r.pod_uids() == {f"train-{i}" for i in range(4)}


def _breaker(r: engines.Rig) -> ledgerentries.Breaker:
    for obj in r.store.iter_objects("ledgerentries.kcover.io"):
        raw = (obj.get("data") or {}).get(ledgerentries.BREAKER_KEY)
        if raw:
            return ledgerentries.Breaker.decode(orjson.loads(raw))
    return ledgerentries.Breaker()


async def test_the_breaker_latches_holds_restarts_and_is_reset_on_request() -> None:
    objs: list[dict[str, Any]] = [*nodes(4), *pytorchjob(node="n3")]
    failing(objs[5])
    async with engines.rig(objs, overrides={"recovery": {"breaker_latch": True, "max_cordoned_fraction": 0.2,
                                                         "breaker_cooldown_seconds": 5.0}}) as r:
        await r.handle(node_fault("n0"))
        await r.handle(node_fault("n1"))  # 1 of 4 held: past 0.2
        assert _breaker(r).latched
        (latched,) = r.events("KcoverBreakerLatched")
        assert "breaker tripped" in latched["message"]
        assert "recovery.max_cordoned_fraction" in latched["message"]
        await r.handle(pod_fault("train-0"))
        assert r.pod_uids() == {f"train-{i}" for i in range(4)}
        assert any("BreakerLatched" in e["message"] for e in r.events("KcoverRecoveryHeld"))
        r.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": "kcover-controls", "namespace": "kcover-system",
            "annotations": {controls.BREAKER_RESET: "2025-06-01T12:00:10Z"}}})
        await r.settle()
        await r.tick()
        assert not _breaker(r).latched
        assert r.events("KcoverBreakerReset")
        assert r.pod_uids() == {f"train-{i}" for i in range(4)}, "held through the breaker's cooldown"
        await asyncio.sleep(6.0)
        await r.tick()
        assert r.pod_uids() == set(), "the held restart ran after the cooldown"
        await r.tick()
        assert len(r.events("KcoverBreakerReset")) == 1, "one request resets once"


async def test_a_reset_request_on_a_breaker_that_is_not_latched_changes_nothing() -> None:
    async with engines.rig(nodes(2)) as r:
        r.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": "kcover-controls", "namespace": "kcover-system",
            "annotations": {controls.BREAKER_RESET: "2025-06-01T12:00:10Z"}}})
        await r.settle()
        await r.tick()
        assert _breaker(r) == ledgerentries.Breaker()
        assert not r.events("KcoverBreakerReset")
        assert "UPDATE ledgerentries.kcover.io" not in r.requests
        assert "CREATE ledgerentries.kcover.io" not in r.requests
        await r.handle(node_fault("n0"))
        assert r.store.get("nodes", "", "n0")["spec"].get("unschedulable") is True, "no cooldown was started"


async def test_every_outcome_is_typed_and_every_refusal_has_a_code() -> None:
    async with engines.rig([*nodes(1), *pytorchjob()]) as r:
        await r.handle(pod_fault("train-0"), pod_fault("ghost"))
        outcomes = list(r.leader.inner.outcomes)
        assert {type(x) for x in outcomes} <= {st.Done, st.Refused, st.Failed, st.Held}
        refused = [x for x in outcomes if isinstance(x, st.Refused)]
        assert [x.code for x in refused] == [st.Code.TARGET_UNKNOWN]


async def test_a_held_restart_given_up_at_hold_seconds_leaves_its_recovery_failed_not_held() -> None:
    """Paused past `recovery.hold_seconds`: the hold is given up (KcoverRecoveryFailed) and its Recovery
    says so (Failed, HoldExpired) instead of staying Held for good."""
    paused = paused_job()
    async with engines.rig(paused, overrides={"recovery": {"hold_seconds": 30.0}}) as r:
        await r.handle(pod_fault("train-0"))
        await r.records()
        (held,) = list(r.store.iter_objects("recoveries.kcover.io"))
        assert held["status"]["phase"] == "Held"
        await asyncio.sleep(31.0)
        await r.tick()
        await r.records()
        assert len(r.events("KcoverRecoveryFailed")) == 1
        (record,) = list(r.store.iter_objects("recoveries.kcover.io"))
        assert (record["status"]["phase"], record["status"]["cause"]) == ("Failed", "HoldExpired")
        assert "held past recovery.hold_seconds" in record["status"]["message"]
        assert r.pod_uids() == {f"train-{i}" for i in range(4)}, "nothing restarted"


async def test_a_held_restart_whose_job_recovered_by_itself_leaves_its_recovery_recovered_not_held() -> None:
    """Held while paused; meanwhile the faulting pod is replaced by its operator and nothing fails since: the
    hold is dropped without a restart and its Recovery says `Recovered`, cause `RecoveredByItself`."""
    paused = paused_job()
    async with engines.rig(paused) as r:
        await r.handle(pod_fault("train-0"))
        await r.records()
        (held,) = list(r.store.iter_objects("recoveries.kcover.io"))
        assert held["status"]["phase"] == "Held"
        r.store.delete("pods", "ml", paused[2]["metadata"]["name"], grace_seconds=0)
        r.create(o.pod("train-worker-0b", uid="train-0b", node="n1", labels=paused[2]["metadata"]["labels"], owner=paused[1]))
        await r.settle()
        await r.tick()
        await r.records()
        (record,) = list(r.store.iter_objects("recoveries.kcover.io"))
        assert (record["status"]["phase"], record["status"]["cause"]) == ("Recovered", "RecoveredByItself")
        assert "recovered by itself" in record["status"]["message"]
        assert r.events("KcoverRestartedWorkload") == [], "nothing restarted"


async def test_a_node_faulting_again_in_service_within_its_cooldown_is_refused_with_an_event() -> None:
    """kcover cordoned a node and returned it; the node faults again within `recovery.node_cooldown_seconds`.
    It is not cordoned again, and the refusal is not routine: an Event (and a Recovery) on the node says it
    was left in service, where a node kcover still holds cordoned is refused silently."""
    async with engines.rig(nodes(2)) as r:
        await r.handle(node_fault("n0"))
        assert r.store.get("nodes", "", "n0")["spec"].get("unschedulable") is True
        await r.handle(node_fault("n0"))
        assert not r.events("KcoverRecoverySkipped"), "a node kcover holds cordoned: a routine refusal"
        await r.leader.inner.coordinator.run([st.Uncordon(node="n0", cause=node_fault("n0"))])
        await r.settle()
        assert r.store.get("nodes", "", "n0")["spec"].get("unschedulable") is not True
        await asyncio.sleep(60)
        await r.handle(node_fault("n0"))
        assert r.store.get("nodes", "", "n0")["spec"].get("unschedulable") is not True, "within its cooldown"
        [skipped] = r.events("KcoverRecoverySkipped", name="n0")
        assert skipped["type"] == "Warning"
        assert skipped["message"].startswith("NodeCooldown: Node n0 faulted again 6")  # 60 s and the settling
        assert "not cordoned again within recovery.node_cooldown_seconds (300s)" in skipped["message"]
        refused = [x for x in r.leader.inner.outcomes if isinstance(x, st.Refused)]
        assert [x.code for x in refused][-1] is st.Code.NODE_COOLDOWN


async def test_a_node_put_back_in_service_by_a_person_with_kcovers_marks_left_is_cordoned_on_its_next_fault() -> None:
    """`kubectl uncordon` and kcover's taint removed by hand leave kcover's annotations: that is no cordon
    any more, and the node's next fault (past its cooldown) cordons it again instead of being refused as
    already cordoned. With only `kubectl uncordon` (kcover's taint left) the node is still kcover's."""
    key = engines.settings_of().recovery.taint_key
    async with engines.rig(nodes(2), overrides={"recovery": {"node_cooldown_seconds": 60}}) as r:
        await r.handle(node_fault("n0"))
        r.store.mutate("nodes", "", "n0", lambda n: n["spec"].update(unschedulable=False))  # kubectl uncordon
        await r.settle()
        await asyncio.sleep(61)
        await r.handle(node_fault("n0"))
        assert r.store.get("nodes", "", "n0")["spec"].get("unschedulable") is not True, "kcover's taint holds it"
        assert len(r.events("KcoverCordonedNode")) == 1
        r.store.mutate("nodes", "", "n0", lambda n: n["spec"].update(taints=[]))  # and its taint removed
        await r.settle()
        node = r.store.get("nodes", "", "n0")
        assert node["metadata"]["annotations"][proj.CORDONED_BY] == "kcover", "the marks are left"
        await r.handle(node_fault("n0"))
        node = r.store.get("nodes", "", "n0")
        assert node["spec"].get("unschedulable") is True
        assert [t["key"] for t in node["spec"]["taints"]] == [key]
        assert len(r.events("KcoverCordonedNode")) == 2


async def test_a_restart_held_by_a_dead_leader_and_given_up_by_its_successor_leaves_its_recovery_failed() -> None:
    """Held (paused) by one leader, which then goes; its successor gives the hold up at
    `recovery.hold_seconds` and moves the Recovery the first leader wrote (named from the ledger's held
    entry: the workload, the unit, the cause) to Failed, HoldExpired, instead of leaving it Held for good."""
    paused = paused_job()
    async with engines.rig(paused, overrides={"recovery": {"hold_seconds": 30.0}}) as r:
        await r.handle(pod_fault("train-0"))
        await r.records()
        (held,) = list(r.store.iter_objects("recoveries.kcover.io"))
        assert held["status"]["phase"] == "Held"
        assert held["spec"]["decision"]["leader"] == "kcover-test"
        async with r.replica("successor", epoch=2) as successor:
            await asyncio.sleep(31.0)
            await successor.resume()
            await r.settle()
            await successor.recorder.flush()
        (record,) = list(r.store.iter_objects("recoveries.kcover.io"))
        assert record["metadata"]["name"] == held["metadata"]["name"]
        assert (record["status"]["phase"], record["status"]["cause"]) == ("Failed", "HoldExpired")
        assert "held past recovery.hold_seconds" in record["status"]["message"]
        assert r.pod_uids() == {f"train-{i}" for i in range(4)}, "nothing restarted"
