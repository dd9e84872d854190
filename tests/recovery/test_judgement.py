"""Judgement that protects healthy capacity, end to end on virtual time against the simulated cluster.

Built as the controller builds it (`recovering.build`) and fed events as a leader is fed; every assertion is
on what the API server ends up holding (nodes, annotations, DeviceTaintRules, Events, Recoveries) and what
it was asked. What kcover must *not* do (a node write for a job's own crash loop, a second cordon, a trip on
the in-flight bound) is checked as hard as what it must.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
import structlog
from harness import engines
from harness import objects as o

from kcover import kinds, model, validationcodec
from kcover.kube import projections as proj
from kcover.recovery import ledgerentries
from kcover.recovery import steps as st

pytestmark = pytest.mark.looptime

OPT = {proj.OPT_IN_LABEL: "true"}
KF = "kubeflow.org/v1"


def job(name: str, nodes_: list[str]) -> list[o.Obj]:
    """A PyTorchJob with one pod per entry of `nodes_` (worker i on nodes_[i])."""
    pj = o.workload(KF, "PyTorchJob", name, uid=f"{name}-uid", labels=OPT)
    return [pj, *(_member(pj, name, i, node, 0) for i, node in enumerate(nodes_))]


def _member(pj: o.Obj, name: str, i: int, node: str, generation: int) -> o.Obj:
    labels = {kinds.KUBEFLOW_JOB_NAME: name, kinds.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller",
              "training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": str(i)}
    return o.pod(f"{name}-worker-{i}-g{generation}", uid=f"{name}-{i}-g{generation}", node=node, labels=labels,
                 owner=pj)


def recreate(r: engines.Rig, name: str, nodes_: list[str], generation: int) -> None:
    """What the operator does after a restart: every member again, with new uids, on the same nodes."""
    pj = r.store.get("pytorchjobs.kubeflow.org", "ml", name)
    r.create(*(_member(pj, name, i, node, generation) for i, node in enumerate(nodes_)))


def pod_fault(uid: str) -> model.CollectorEvent:
    return model.CollectorEvent(detector="pod-status", severity=model.Severity.ERROR, reason="ContainerError",
                                message="exit 1", target=model.Target(kind=model.TargetKind.POD, namespace="ml",
                                                                      name=uid, uid=uid),
                                observed_at=engines.START)


def xid(node: str, code: int, gpu: int, holders: list[str], *, signal: str) -> model.CollectorEvent:
    """An agent's XID report about a node, as the event watcher publishes it."""
    return model.CollectorEvent(detector="event-watcher", severity=model.Severity.ERROR, reason="RecoveryRequested",
                                message=f"XID {code}", recommended=model.Action.RESTART_WORKLOAD, signal=signal,
                                target=model.Target(kind=model.TargetKind.NODE, name=node, node=node),
                                fault=model.Fault(xid=code, gpu_index=gpu, pods=tuple(f"ml/{p}" for p in holders)),
                                observed_at=engines.START)


def node_fault(node: str) -> model.CollectorEvent:
    return model.CollectorEvent(detector="node-condition", severity=model.Severity.ERROR, reason="XID79",
                                message="GPU fell off the bus", recommended=model.Action.CORDON_NODE,
                                target=model.Target(kind=model.TargetKind.NODE, name=node, node=node),
                                observed_at=engines.START)


def nodes(n: int) -> list[o.Obj]:
    """Nodes where kcover's agent runs (each shows its condition), so a validation asked there is answered."""
    return [o.node(f"n{i}", agent=True) for i in range(n)]


def node_writes(r: engines.Rig) -> dict[str, int]:
    """Every write to a Node or a device: cordons, taints, annotations, conditions, DeviceTaintRules."""
    return {k: v for k, v in r.writes().items() if " nodes" in k or "devicetaintrules" in k}


def cordoned(r: engines.Rig) -> list[str]:
    return sorted(n["metadata"]["name"] for n in r.store.iter_objects("nodes") if n["spec"].get("unschedulable"))


def validation_request(r: engines.Rig, node: str) -> str:
    return (r.store.get("nodes", "", node)["metadata"].get("annotations") or {}).get(validationcodec.VALIDATE_REQUEST, "")


async def answer(r: engines.Rig, node: str, outcome: validationcodec.ValidationOutcome, text: str) -> None:
    """The node's agent answers the open request (the Node condition the agent writes)."""
    request = validation_request(r, node)
    assert request, f"no validation asked of {node}"
    condition = validationcodec.encode_validation_answer(validationcodec.ValidationAnswer(request, outcome, text), "2025-06-01T12:30:00Z")
    r.store.mutate("nodes", "", node, lambda n: n["status"].setdefault("conditions", []).append(condition))
    await r.settle()
    await r.tick()


async def three_jobs_fail_on(r: engines.Rig, node: str) -> None:
    for name in ("a", "b", "c"):
        await r.handle(pod_fault(f"{name}-0-g0"))
        await asyncio.sleep(30)


async def test_a_job_that_crashes_on_every_start_never_writes_to_a_node() -> None:
    """Restarted until its budget, and past it: no cordon, taint, annotation, condition or device taint."""
    placement = ["n1", "n2"]
    async with engines.rig([*nodes(3), *job("loop", placement)]) as r:
        for generation in range(7):
            await r.handle(pod_fault(f"loop-0-g{generation}"))  # rank 0 fails on every start
            await asyncio.sleep(61)
            recreate(r, "loop", placement, generation + 1)
            await r.settle()
            await r.tick()
        assert len(r.events("KcoverRestartedWorkload")) == 5, "restarted until its budget"
        assert any("BudgetExhausted" in e["message"] for e in r.events("KcoverRecoverySkipped"))
        assert node_writes(r) == {}
        assert not r.events("KcoverNodeSuspect")


async def test_three_different_jobs_failing_on_one_node_make_it_suspect_and_a_failed_validation_cordons_it_once() -> None:
    objs = [*nodes(3), *job("a", ["n1"]), *job("b", ["n1"]), *job("c", ["n1"]), *job("d", ["n1"])]
    async with engines.rig(objs) as r:
        await r.handle(pod_fault("a-0-g0"))
        await r.handle(pod_fault("b-0-g0"))
        assert not validation_request(r, "n1"), "two jobs are not yet evidence"
        await r.handle(pod_fault("c-0-g0"))
        (suspect,) = r.events("KcoverNodeSuspect")
        assert "3 different workloads restarted for faults on Node n1" in suspect["message"]
        assert validation_request(r, "n1")
        assert cordoned(r) == [], "suspect is not cordoned"
        await answer(r, "n1", validationcodec.ValidationOutcome.FAILED, "diag level 1: memory test failed on GPU 2")
        assert cordoned(r) == ["n1"]
        assert len(r.events("KcoverSuspectFailed")) == 1
        (cordon,) = r.events("KcoverCordonedNode")
        assert "suspect, and failed validation" in cordon["message"]
        assert not validation_request(r, "n1"), "the request is taken back"
        await r.handle(pod_fault("d-0-g0"))
        await r.tick()
        assert len(r.events("KcoverCordonedNode")) == 1, "once"
        assert len(r.events("KcoverNodeSuspect")) == 1


async def test_a_suspect_that_passes_validation_stays_schedulable_and_its_recovery_says_why() -> None:
    objs = [*nodes(3), *job("a", ["n1"]), *job("b", ["n1"]), *job("c", ["n1"]), *job("d", ["n1"])]
    async with engines.rig(objs) as r:
        for name in ("a", "b", "c"):
            await r.handle(pod_fault(f"{name}-0-g0"))
        await answer(r, "n1", validationcodec.ValidationOutcome.PASSED, "diag level 1: all tests passed")
        assert cordoned(r) == []
        (passed,) = r.events("KcoverSuspectValidated")
        assert "stays schedulable" in passed["message"]
        await r.records()
        (record,) = [x for x in r.store.iter_objects("recoveries.kcover.io")
                     if x["spec"]["decision"]["action"] == "ValidateNode"]
        assert record["status"]["cause"] == "ValidatedHealthy"
        assert "3 different workloads" in record["status"]["message"]
        assert record["spec"]["target"] == {"kind": "Node", "name": "n1"}
        await r.handle(pod_fault("d-0-g0"))
        assert len(r.events("KcoverNodeSuspect")) == 1, "the evidence before the verdict does not count again"
        assert node_writes(r).keys() <= {"PATCH nodes"}, "only the request's annotations were written"


async def test_a_suspect_whose_validation_cannot_run_is_left_schedulable_without_a_hardware_signal() -> None:
    objs = [*nodes(3), *job("a", ["n1"]), *job("b", ["n1"]), *job("c", ["n1"])]
    async with engines.rig(objs, overrides={"recovery": {"judgement": {"validation_timeout_seconds": 60}}}) as r:
        await three_jobs_fail_on(r, "n1")
        await asyncio.sleep(61)
        await r.tick()
        assert cordoned(r) == []
        (left,) = r.events("KcoverSuspectUnvalidated")
        assert "no answer to validation" in left["message"]


async def test_a_suspect_whose_validation_cannot_run_is_cordoned_with_a_hardware_signal() -> None:
    objs = [*nodes(3), *job("a", ["n1"]), *job("b", ["n1"]), *job("c", ["n1"])]
    async with engines.rig(objs) as r:
        await three_jobs_fail_on(r, "n1")
        r.store.mutate("nodes", "", "n1", lambda n: n["status"].setdefault("conditions", []).append(
            {"type": "KcoverGPUHealthy", "status": "False", "reason": "XID48", "message": "double-bit ECC"}))
        await answer(r, "n1", validationcodec.ValidationOutcome.ERROR, "dcgmi not found")
        assert cordoned(r) == ["n1"]
        assert "KcoverGPUHealthy is False" in r.events("KcoverSuspectFailed")[0]["message"]


async def fail_again(r: engines.Rig, name: str, gpu: int, generation: int) -> None:
    """Job `name`'s only rank, on n1, raises XID 13 on GPU `gpu`; the operator recreates it 61 s later."""
    await r.handle(xid("n1", 13, gpu, [f"{name}-worker-0-g{generation}"], signal=f"{name}-e{generation}"))
    await asyncio.sleep(61)
    recreate(r, name, ["n1"], generation + 1)
    await r.settle()


def pods_deleted(r: engines.Rig) -> int:
    return r.writes().get("DELETE pods", 0)


async def test_xid13_twice_by_one_job_on_one_gpu_asks_one_validation_and_a_pass_cordons_nothing() -> None:
    """A rank's own bug and a faulty GPU look alike by place (the rank comes back to its GPU): the second
    restart for an application XID on the same GPU asks the node to validate, waits for the verdict, and only
    that decides; a restart the verdict answered is no evidence again."""
    async with engines.rig([*nodes(2), *job("a", ["n1"])]) as r:
        await fail_again(r, "a", 3, 0)
        assert not validation_request(r, "n1"), "one restart is no evidence"
        assert node_writes(r) == {}
        (restarted,) = r.events("KcoverRestartedWorkload")
        assert "deleted 1 pod (" in restarted["message"]
        await r.handle(xid("n1", 13, 3, ["a-worker-0-g1"], signal="a-e1"))
        (suspect,) = r.events("KcoverNodeSuspect")
        assert ("one workload restarted 2 times within 21600s for faults only on GPU gpu3 of Node n1 "
                "(recovery.judgement.device_restarts 2)") in suspect["message"]
        assert validation_request(r, "n1")
        (held,) = r.events("KcoverRecoveryHeld")
        assert "AwaitingVerdict" in held["message"]
        assert "Node n1 is suspect" in held["message"]
        await r.tick()
        assert len(r.events("KcoverRestartedWorkload")) == 1, "held while the validation runs"
        await answer(r, "n1", validationcodec.ValidationOutcome.PASSED, "diag level 1: all tests passed")
        await r.tick()
        assert len(r.events("KcoverRestartedWorkload")) == 2, "restarted in place after the pass"
        assert cordoned(r) == []
        await asyncio.sleep(61)
        recreate(r, "a", ["n1"], 2)
        await r.settle()
        await fail_again(r, "a", 3, 2)
        assert len(r.events("KcoverRestartedWorkload")) == 3, "the restart after the pass counted once, not twice"
        assert len(r.events("KcoverNodeSuspect")) == 1
        await fail_again(r, "a", 3, 3)
        assert len(r.events("KcoverNodeSuspect")) == 2, "the evidence before the verdict does not count again"
        assert cordoned(r) == []
        assert node_writes(r).keys() <= {"PATCH nodes"}, "only the requests' annotations were written"


async def test_xid13_twice_on_one_gpu_whose_validation_fails_cordons_the_node_before_the_restart() -> None:
    """The second restart waits for the verdict: the node is cordoned first, so the operator's new pod cannot
    land on the faulty GPU for one more failure."""
    async with engines.rig([*nodes(2), *job("a", ["n1"])]) as r:
        await fail_again(r, "a", 3, 0)
        before = pods_deleted(r)
        await r.handle(xid("n1", 13, 3, ["a-worker-0-g1"], signal="a-e1"))
        await r.tick()
        assert pods_deleted(r) == before, "held for the verdict"
        await answer(r, "n1", validationcodec.ValidationOutcome.FAILED, "diag level 1: memory test failed on GPU 3")
        assert cordoned(r) == ["n1"]
        assert pods_deleted(r) == before, "the cordon comes first"
        await r.tick()
        assert pods_deleted(r) == before + 1, "then the held restart, onto other nodes"
        assert len(r.events("KcoverCordonedNode")) == 1
        assert len(r.events("KcoverRestartedWorkload")) == 2


async def test_the_ranks_exit_beside_the_xid_in_one_batch_waits_for_the_same_verdict() -> None:
    """The agent's XID and the kubelet's report of the rank's exit arrive together: the exit names no GPU, so
    it is no evidence by itself, but its restart is for a fault on the node the XID's plan makes suspect."""
    async with engines.rig([*nodes(2), *job("a", ["n1"])]) as r:
        await fail_again(r, "a", 3, 0)
        before = pods_deleted(r)
        await r.handle(xid("n1", 13, 3, ["a-worker-0-g1"], signal="a-e1"), pod_fault("a-0-g1"))
        await r.tick()
        assert pods_deleted(r) == before, "neither restart ran before the verdict"
        assert len(r.events("KcoverNodeSuspect")) == 1
        await answer(r, "n1", validationcodec.ValidationOutcome.FAILED, "diag level 1: memory test failed on GPU 3")
        await r.tick()
        assert cordoned(r) == ["n1"]
        assert pods_deleted(r) == before + 1, "one restart, after the cordon"


async def test_a_restart_held_for_a_passed_verdict_runs_once_and_asks_nothing_again() -> None:
    """With `device_restarts` 1 every such XID asks a validation; the restart the pass released is the
    verdict's answer, not new evidence, so it neither asks again nor waits again."""
    async with engines.rig([*nodes(2), *job("a", ["n1"])], overrides={"recovery": {"judgement": {
            "device_restarts": 1}}}) as r:
        await r.handle(xid("n1", 13, 3, ["a-worker-0-g0"], signal="a-e0"))
        assert len(r.events("KcoverNodeSuspect")) == 1
        assert not r.events("KcoverRestartedWorkload")
        await answer(r, "n1", validationcodec.ValidationOutcome.PASSED, "diag level 1: all tests passed")
        for _ in range(5):
            await r.tick()
            await asyncio.sleep(5)
        assert len(r.events("KcoverRestartedWorkload")) == 1
        assert len(r.events("KcoverNodeSuspect")) == 1, "the released restart asks no second validation"
        assert len(r.events("KcoverRecoveryHeld")) == 1
        assert cordoned(r) == []


async def test_a_restart_held_for_a_verdict_that_does_not_come_runs_after_the_wait() -> None:
    async with engines.rig([*nodes(2), *job("a", ["n1"])], overrides={"recovery": {"judgement": {
            "verdict_wait_seconds": 60}}}) as r:
        await fail_again(r, "a", 3, 0)
        before = pods_deleted(r)
        await r.handle(xid("n1", 13, 3, ["a-worker-0-g1"], signal="a-e1"))
        await asyncio.sleep(50)
        await r.tick()
        assert pods_deleted(r) == before
        await asyncio.sleep(11)
        await r.tick()
        assert pods_deleted(r) == before + 1, "restarted in place: no answer within verdict_wait_seconds"
        assert cordoned(r) == []
        assert validation_request(r, "n1"), "the validation is still asked; its answer decides the node later"


async def test_a_restart_on_a_node_without_kcovers_agent_waits_for_no_verdict() -> None:
    """No agent condition on the Node: no agent runs there to answer a validation, so the restart runs now
    (the validation is still asked, for an agent that starts later)."""
    async with engines.rig([o.node("n0"), o.node("n1"), *job("a", ["n1"])]) as r:
        await fail_again(r, "a", 3, 0)
        before = pods_deleted(r)
        await r.handle(xid("n1", 13, 3, ["a-worker-0-g1"], signal="a-e1"))
        assert validation_request(r, "n1")
        assert pods_deleted(r) == before + 1
        assert not r.events("KcoverRecoveryHeld")


async def test_with_no_verdict_wait_the_restart_runs_beside_the_validation() -> None:
    async with engines.rig([*nodes(2), *job("a", ["n1"])], overrides={"recovery": {"judgement": {
            "verdict_wait_seconds": 0}}}) as r:
        await fail_again(r, "a", 3, 0)
        await r.handle(xid("n1", 13, 3, ["a-worker-0-g1"], signal="a-e1"))
        assert validation_request(r, "n1")
        assert len(r.events("KcoverRestartedWorkload")) == 2
        assert not r.events("KcoverRecoveryHeld")


async def test_xid94_once_asks_a_validation_before_its_restart_and_a_pass_cordons_nothing() -> None:
    """XID 94 (a contained ECC error) blames the device but only restarts; no job's own bug raises it, so its
    first already asks the node to validate (`hardware_xid_restarts` 1), the restart waits for the verdict,
    and a pass moves nothing."""
    async with engines.rig([*nodes(2), *job("a", ["n1"])]) as r:
        await r.handle(xid("n1", 94, 3, ["a-worker-0-g0"], signal="e0"))
        assert not r.events("KcoverRestartedWorkload"), "the first waits for the verdict"
        (waiting,) = r.events("KcoverRecoveryHeld")
        assert "AwaitingVerdict" in waiting["message"]
        (suspect,) = r.events("KcoverNodeSuspect")
        assert ("one workload restarted once within 21600s for a hardware XID on GPU gpu3 of Node n1 "
                "(recovery.judgement.hardware_xid_restarts 1)") in suspect["message"]
        assert cordoned(r) == []
        await answer(r, "n1", validationcodec.ValidationOutcome.PASSED, "diag level 1: all tests passed")
        await r.tick()
        assert len(r.events("KcoverRestartedWorkload")) == 1, "restarted in place after the pass"
        assert cordoned(r) == []
        assert node_writes(r).keys() <= {"PATCH nodes"}


async def test_xid94_once_whose_validation_fails_cordons_the_node_before_the_restart() -> None:
    async with engines.rig([*nodes(2), *job("a", ["n1"])]) as r:
        await r.handle(xid("n1", 94, 3, ["a-worker-0-g0"], signal="e0"))
        assert not r.events("KcoverRestartedWorkload")
        await answer(r, "n1", validationcodec.ValidationOutcome.FAILED, "diag level 1: memory test failed on GPU 3")
        await r.tick()
        assert cordoned(r) == ["n1"]
        assert len(r.events("KcoverRestartedWorkload")) == 1, "restarted once, off the cordoned node"
        assert len(r.events("KcoverCordonedNode")) == 1


async def test_xid94_with_hardware_xid_restarts_2_asks_only_at_its_second_on_one_gpu() -> None:
    """The setting at 2: the first XID 94 restarts at once and asks nothing; the second on the same GPU asks."""
    async with engines.rig([*nodes(2), *job("a", ["n1"])], overrides={"recovery": {"judgement": {
            "hardware_xid_restarts": 2}}}) as r:
        await r.handle(xid("n1", 94, 3, ["a-worker-0-g0"], signal="e0"))
        assert len(r.events("KcoverRestartedWorkload")) == 1
        assert not validation_request(r, "n1"), "one XID 94 is no evidence at 2"
        await asyncio.sleep(1200)  # 20 min apart: two in the hour, short of the escalation's three
        recreate(r, "a", ["n1"], 1)
        await r.settle()
        await r.handle(xid("n1", 94, 3, ["a-worker-0-g1"], signal="e1"))
        assert len(r.events("KcoverRestartedWorkload")) == 1, "the second waits for the verdict"
        (suspect,) = r.events("KcoverNodeSuspect")
        assert "restarted 2 times within 21600s for a hardware XID on GPU gpu3 of Node n1 " \
               "(recovery.judgement.hardware_xid_restarts 2)" in suspect["message"]
        assert cordoned(r) == []


async def test_an_application_xid_once_asks_nothing() -> None:
    """XID 13 is an application's (NVIDIA: a solo one is CHECK_APP): its first restarts at once, no validation."""
    async with engines.rig([*nodes(2), *job("a", ["n1"])]) as r:
        await r.handle(xid("n1", 13, 3, ["a-worker-0-g0"], signal="e0"))
        assert len(r.events("KcoverRestartedWorkload")) == 1
        assert not validation_request(r, "n1")
        assert not r.events("KcoverNodeSuspect")
        assert node_writes(r) == {}


async def test_a_large_jobs_restarts_for_faults_on_other_nodes_leave_the_evidence_against_one_gpu_whole() -> None:
    """A large job is restarted for faults all over the fleet; those elsewhere say nothing about n1's GPU 3."""
    placement = ["n1", "n2"]
    async with engines.rig([*nodes(3), *job("big", placement)]) as r:
        causes = (xid("n1", 13, 3, ["big-worker-0-g0"], signal="e0"), pod_fault("big-1-g1"),
                  xid("n1", 13, 3, ["big-worker-0-g2"], signal="e2"))
        for generation, cause in enumerate(causes):
            await r.handle(cause)
            await asyncio.sleep(61)
            recreate(r, "big", placement, generation + 1)
            await r.settle()
        assert len(r.events("KcoverRestartedWorkload")) == 2, "the third waits for the verdict on n1"
        (suspect,) = r.events("KcoverNodeSuspect")
        assert "restarted 2 times within 21600s for faults only on GPU gpu3 of Node n1" in suspect["message"]
        assert validation_request(r, "n1")
        assert not validation_request(r, "n2")
        assert cordoned(r) == []


async def test_xid48_twice_on_one_gpu_is_isolated_by_its_own_step_and_asks_no_validation() -> None:
    """An XID that isolates (48: cordon the node and restart) cordons once, and its repeat on the node it
    cordoned asks no validation (the node is unschedulable; the planning table in test_device_isolation.py
    pins that such an XID is no evidence where its node stays schedulable)."""
    async with engines.rig([*nodes(2), *job("a", ["n1"])]) as r:
        for generation in range(2):
            event = xid("n1", 48, 3, [f"a-worker-0-g{generation}"], signal=f"e{generation}")
            await r.handle(event.model_copy(update={"recommended": model.Action.CORDON_NODE_AND_RESTART}))
            await asyncio.sleep(61)
            recreate(r, "a", ["n1"], generation + 1)
            await r.settle()
        assert cordoned(r) == ["n1"]
        assert len(r.events("KcoverCordonedNode")) == 1
        assert not r.events("KcoverNodeSuspect")
        assert not validation_request(r, "n1")


async def test_xid13_by_one_job_on_different_gpus_makes_nothing_suspect() -> None:
    async with engines.rig([*nodes(2), *job("a", ["n1"])]) as r:
        for generation, gpu in enumerate((3, 5, 3, 5)):
            await fail_again(r, "a", gpu, generation)
        assert len(r.events("KcoverRestartedWorkload")) == 4
        assert not r.events("KcoverNodeSuspect")
        assert not validation_request(r, "n1")
        assert node_writes(r) == {}


async def test_xid13_repeated_by_one_job_on_one_gpu_cordons_nothing_and_across_jobs_makes_it_suspect() -> None:
    objs = [*nodes(2), *job("a", ["n1"]), *job("b", ["n1"])]
    overrides = {"recovery": {"judgement": {"device_restarts": 99}}}  # the one-workload rule out of the way
    async with engines.rig(objs, overrides=overrides) as r:
        for generation in range(3):
            await fail_again(r, "a", 3, generation)
        assert len(r.events("KcoverRestartedWorkload")) == 3
        assert cordoned(r) == []
        assert not validation_request(r, "n1")
        assert node_writes(r) == {}
        await r.handle(xid("n1", 13, 3, ["b-worker-0-g0"], signal="e-b"))
        (suspect,) = r.events("KcoverNodeSuspect")
        assert "2 different workloads restarted for faults on GPU gpu3 of Node n1" in suspect["message"]
        assert cordoned(r) == []


async def test_a_hundred_node_faults_on_a_thousand_gpu_nodes_cordon_at_most_the_window_cap_and_latch() -> None:
    async with engines.rig(nodes(1000)) as r:
        for batch in range(10):
            await r.handle(*(node_fault(f"n{batch * 10 + i}") for i in range(10)))
            await asyncio.sleep(6)
        assert len(cordoned(r)) == 10, "the smaller of 10 per window and 1% of 1,000"
        latched = r.leader.ledger.breaker()
        assert latched.latched
        assert "recovery.max_cordons_per_window" in latched.reason
        (event,) = r.events("KcoverBreakerLatched")
        assert "kcover breaker reset" in event["message"]
        await r.handle(node_fault("n999"))
        assert len(cordoned(r)) == 10


async def test_after_a_reset_of_the_latched_breaker_the_window_starts_again_and_the_next_fault_is_acted_on() -> None:
    from kcover.recovery import controls
    async with engines.rig(nodes(1000), overrides={"recovery": {"breaker_cooldown_seconds": 60.0}}) as r:
        for batch in range(3):
            await r.handle(*(node_fault(f"n{batch * 10 + i}") for i in range(10)))
            await asyncio.sleep(6)
        assert len(cordoned(r)) == 10
        assert r.leader.ledger.breaker().latched
        r.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": "kcover-controls", "namespace": "kcover-system",
            "annotations": {controls.BREAKER_RESET: "2025-06-01T12:00:10Z"}}})
        await r.settle()
        await r.tick()
        assert not r.leader.ledger.breaker().latched
        await asyncio.sleep(61)  # past the cooldown, well within the hour's window of the ten cordons
        await r.handle(node_fault("n500"))
        assert "n500" in cordoned(r), "the ten cordons the person's reset accounted for are not counted again"
        assert not r.leader.ledger.breaker().latched
        assert len(r.events("KcoverBreakerLatched")) == 1


async def test_restarts_past_the_in_flight_bound_are_throttled_and_never_trip_the_breaker() -> None:
    objs: list[Any] = [*nodes(3)]
    for i in range(3):
        objs += job(f"j{i}", [f"n{i}"])  # each on its own node: no node is suspect, nothing awaits a verdict
    async with engines.rig(objs, overrides={"recovery": {"max_concurrent_restarts": 1}}) as r:
        await r.handle(*(pod_fault(f"j{i}-0-g0") for i in range(3)))
        held = [x for x in r.leader.inner.outcomes if isinstance(x, st.Held)]
        assert {x.code for x in held} == {st.Code.THROTTLED}
        assert not r.leader.ledger.breaker().latched
        await r.tick()
        await r.tick()
        assert len(r.events("KcoverRestartedWorkload")) == 3, "the held restarts ran as slots freed"


async def test_restarts_of_many_different_workloads_within_the_window_trip_the_breaker() -> None:
    objs: list[Any] = [*nodes(4)]
    for i in range(4):
        objs += job(f"j{i}", [f"n{i}"])  # each on its own node: no node is suspect, nothing awaits a verdict
    async with engines.rig(objs, overrides={"recovery": {"max_restarted_workloads_per_window": 3}}) as r:
        for i in range(4):
            await r.handle(pod_fault(f"j{i}-0-g0"))
        assert len(r.events("KcoverRestartedWorkload")) == 3
        breaker = r.leader.ledger.breaker()
        assert breaker.latched
        assert "3 different workloads restarted" in breaker.reason


async def test_record_only_classes_and_rules_decide_and_record_without_acting() -> None:
    objs = [*nodes(2), *job("a", ["n1"])]
    overrides = {"recovery": {"record_only": ["cordon"],
                              "rules": [{"detector": "pod-status", "action": "restart-workload", "mode": "record"}]}}
    async with engines.rig(objs, overrides=overrides) as r:
        await r.handle(node_fault("n0"))
        await r.handle(pod_fault("a-0-g0"))
        assert cordoned(r) == []
        assert r.pod_uids() == {"a-0-g0"}
        (cordon,) = r.events("KcoverRecordOnlyCordonedNode")
        assert cordon["message"].startswith("record only, nothing was changed (recovery.record_only: cordon): ")
        (restart,) = r.events("KcoverRecordOnlyRestartedWorkload")
        assert "recovery.rules[0] mode: record" in restart["message"]
        assert not r.events("KcoverCordonedNode")
        assert not r.events("KcoverRestartedWorkload")
        assert node_writes(r) == {}
        assert not r.requests.get("DELETE pods")
        await r.records()
        phases = sorted(x["status"]["phase"] for x in r.store.iter_objects("recoveries.kcover.io"))
        assert phases == ["RecordOnly", "RecordOnly"]
        assert r.metrics.registry.get_sample_value("kcover_actions_total",
                                                   {"action": "cordon_node", "result": "record_only"}) == 1


async def test_the_evidence_window_is_the_ledgers_own_record_of_where_faults_were() -> None:
    """A new leader judges with what the ledger holds: two restarts recorded by a predecessor and one more
    make the node suspect."""
    objs = [*nodes(3), *job("a", ["n1"]), *job("b", ["n1"]), *job("c", ["n1"])]
    async with engines.rig(objs) as r:
        await r.handle(pod_fault("a-0-g0"))
        await r.handle(pod_fault("b-0-g0"))
        async with r.replica("kcover-successor") as successor:
            await successor.handle([pod_fault("c-0-g0")])
            await r.settle()
        assert len(r.events("KcoverNodeSuspect")) == 1
        failures = r.leader.ledger.failures_at("n1", 0.0)
        assert sorted(f.key for f in failures) == ["w.a-uid", "w.b-uid"]
        assert all(f.rank == "replica-type=worker,replica-index=0" for f in failures)


def write_answer(r: engines.Rig, node: str, outcome: validationcodec.ValidationOutcome, text: str) -> None:
    """The node's agent answers the open request; no leader's pass reads it yet."""
    request = validation_request(r, node)
    assert request, f"no validation asked of {node}"
    condition = validationcodec.encode_validation_answer(validationcodec.ValidationAnswer(request, outcome, text),
                                                         "2025-06-01T12:30:00Z")
    r.store.mutate("nodes", "", node, lambda n: n["status"].setdefault("conditions", []).append(condition))


async def test_a_successor_reads_the_answer_its_predecessor_asked_for_and_cordons_before_the_held_restart() -> None:
    """The leader that asked a suspect's validation goes before the answer comes: its successor holds no
    open request in memory, but the ledger holds the suspicion with the request's id. It reads the failed
    answer, cordons the node, and only then runs the restart that waited for the verdict. Before, the
    successor never read the answer: the restart ran in place after `verdict_wait_seconds`, onto the
    faulty GPU, and the node stayed in service."""
    async with engines.rig([*nodes(2), *job("a", ["n1"])]) as r:
        await fail_again(r, "a", 3, 0)
        before = pods_deleted(r)
        await r.handle(xid("n1", 13, 3, ["a-worker-0-g1"], signal="a-e1"))
        assert validation_request(r, "n1")
        write_answer(r, "n1", validationcodec.ValidationOutcome.FAILED, "diag level 1: memory test failed on GPU 3")
        async with r.replica("successor", epoch=2) as successor:
            await successor.resume()
            await r.settle()
            assert cordoned(r) == ["n1"], "the successor read the answer to the request it did not ask"
            assert pods_deleted(r) == before, "the cordon comes first"
            await successor.resume()
            await r.settle()
            assert pods_deleted(r) == before + 1, "then the held restart, onto other nodes"
            await successor.resume()
            await r.settle()
        assert len(r.events("KcoverCordonedNode")) == 1
        assert len(r.events("KcoverSuspectFailed")) == 1, "one verdict"
        assert not validation_request(r, "n1"), "the request is taken back"


async def test_a_verdict_whose_cordon_failed_is_not_recorded_and_is_read_again_on_the_next_pass() -> None:
    """A failed validation whose cordon the API server refuses: the verdict is not written to the ledger
    (the suspicion stays pending), so the next pass reads the answer again and cordons. Before, the verdict
    was recorded first: the node stayed in service, judged faulty, and the held restart ran onto it."""
    async with engines.rig([*nodes(2), *job("a", ["n1"])]) as r:
        await fail_again(r, "a", 3, 0)
        before = pods_deleted(r)
        await r.handle(xid("n1", 13, 3, ["a-worker-0-g1"], signal="a-e1"))
        write_answer(r, "n1", validationcodec.ValidationOutcome.FAILED, "diag level 1: memory test failed on GPU 3")
        await r.settle()
        r.srv.faults.resources, r.srv.faults.error_rate = frozenset({"nodes"}), 1.0
        await r.tick()
        await r.tick()
        assert cordoned(r) == []
        assert pods_deleted(r) == before, "the held restart still waits: no verdict was recorded"
        r.srv.faults.reset()
        await r.tick()
        assert cordoned(r) == ["n1"]
        await r.tick()
        assert pods_deleted(r) == before + 1, "then the held restart"
        assert len(r.events("KcoverCordonedNode")) == 1


def test_a_suspicion_keeps_its_requests_id_and_one_written_without_it_still_reads() -> None:
    """The node's entry names the validation asked with its suspicion, so any leader can read the answer;
    an entry written before it was kept reads with none (its deadline alone ends it)."""
    entry = ledgerentries.Node(suspect_at=100.0, suspicion="3 different workloads", request="902b6dc646e9")
    again = ledgerentries.Node.decode(orjson.loads(orjson.dumps(entry.encode())))
    assert (again.suspect_at, again.suspicion, again.request) == (100.0, "3 different workloads", "902b6dc646e9")
    older = ledgerentries.Node.decode({k: v for k, v in entry.encode().items() if k != "q"})
    assert (older.suspect_at, older.request) == (100.0, "")
    assert older.pending_suspicion()
    for forged in ("a" * 33, "0xdead", "902b\n", 12, ["902b"], "kcover.io/x"):
        assert ledgerentries.Node.decode({**entry.encode(), "q": forged}).request == "", forged


async def test_a_suspicion_dated_in_the_future_is_not_adopted_and_said_once() -> None:
    """A LedgerEntry is kcover's own, but its content is checked: a suspicion dated past the replicas' clock
    skew could never be settled (its verdict is dated before it), so no validation is asked for it."""
    forged = ledgerentries.Node(suspect_at=engines.START.timestamp() + 3600, suspicion="forged",
                                request="902b6dc646e9")
    entry = ledgerentries.entry_body("kcover-ledger", "kcover-system", "n.n1", forged, {})
    async with engines.rig([*nodes(2), *job("a", ["n1"]), dict(entry)]) as r:
        with structlog.testing.capture_logs() as logged:
            for _ in range(3):
                await r.tick()
        assert not validation_request(r, "n1")
        said = [e for e in logged if e["event"] == "validation_not_adopted"]
        assert len(said) == 1
        assert "in the future" in said[0]["error"]


async def test_a_suspicion_recorded_whose_request_never_reached_the_node_is_asked_again_on_the_next_pass() -> None:
    """The ledger took the suspicion and its request's id, then the request's write to the Node failed (or
    its leader went between the two): the next pass asks the node again with the same id, and its answer
    decides. Before, nothing asked again: the restart waited `verdict_wait_seconds` for an answer that could
    not come, and a faulty node stayed in service."""
    async with engines.rig([*nodes(2), *job("a", ["n1"])]) as r:
        await fail_again(r, "a", 3, 0)
        before = pods_deleted(r)
        r.srv.faults.resources, r.srv.faults.error_rate = frozenset({"nodes"}), 1.0
        await r.handle(xid("n1", 13, 3, ["a-worker-0-g1"], signal="a-e1"))
        assert not validation_request(r, "n1"), "the request's write failed"
        r.srv.faults.reset()
        await r.tick()
        asked = validation_request(r, "n1")
        (raw,) = [x["data"]["n.n1"] for x in r.store.iter_objects("ledgerentries.kcover.io") if "n.n1" in x["data"]]
        assert asked == orjson.loads(raw)["q"], "asked with the id the ledger holds"
        await answer(r, "n1", validationcodec.ValidationOutcome.FAILED, "diag level 1: memory test failed on GPU 3")
        assert cordoned(r) == ["n1"]
        assert pods_deleted(r) == before
        await r.tick()
        assert pods_deleted(r) == before + 1, "then the held restart"


async def test_two_passes_at_once_read_each_answer_once() -> None:
    """The term's first pass and the periodic one may start together (a Lease won while the periodic timer
    fires): each validation's answer is read once and judged once, and neither pass fails. Before, the
    second pass took a request the first had already taken back (a KeyError out of the pass, which ended
    the whole controller when it was the term's first)."""
    objs = [*nodes(3), *job("a", ["n1"]), *job("b", ["n1"]), *job("c", ["n1"]),
            *job("d", ["n2"]), *job("e", ["n2"]), *job("f", ["n2"])]
    async with engines.rig(objs) as r:
        for name in ("a", "b", "c", "d", "e", "f"):
            await r.handle(pod_fault(f"{name}-0-g0"))
        assert validation_request(r, "n1")
        assert validation_request(r, "n2")
        write_answer(r, "n1", validationcodec.ValidationOutcome.FAILED, "diag level 1: memory test failed on GPU 2")
        write_answer(r, "n2", validationcodec.ValidationOutcome.PASSED, "diag level 1: all tests passed")
        await r.settle()
        await asyncio.gather(r.leader.resume(), r.leader.resume())
        await r.settle()
        assert cordoned(r) == ["n1"]
        assert len(r.events("KcoverSuspectFailed")) == 1
        assert len(r.events("KcoverSuspectValidated")) == 1
        assert len(r.events("KcoverCordonedNode")) == 1
