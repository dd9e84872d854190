"""Judgement that protects healthy capacity, against a real HTTP API server (every selected backend).

The same behaviours run on virtual time against the simulated cluster in tests/recovery/test_judgement.py;
these pin them against the real kube-apiserver's semantics, asserting what the server ends up holding and
what the product's client asked of it: a job that crashes on every start is restarted until its budget and
no node is written to; three different jobs failing on one node make it suspect, and a failed validation
cordons it once; XID 13 twice by one job on one GPU asks a validation and cordons nothing; with that rule
aside, XID 13 repeated by one job cordons nothing, and the same XID across two jobs makes the node suspect. Each test makes its own nodes (cluster-scoped, shared on a real server), named for
it, and builds the engine's cache from what the server holds (`enginekit`), with a clock the test moves.
"""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any

from enginekit import KF, Clock, Cluster, Rig, create, events, get, make_pod, pod_fault

from kcover import codec, kinds, model, validationcodec
from kcover.kube import projections as proj
from kcover.recovery import steps as st


async def _nodes(cluster: Cluster, count: int, *, agent: bool = False) -> list[str]:
    """`count` GPU nodes; `agent`: each shows kcover's agent condition, as where an agent runs to answer a
    validation (a restart for a fault on a suspect node waits for the verdict only there)."""
    tag = secrets.token_hex(3)
    names = [f"judge-{tag}-{i}" for i in range(count)]
    status: dict[str, Any] = {"capacity": {"nvidia.com/gpu": "8"}}
    if agent:
        status["conditions"] = [{"type": codec.AGENT_CONDITION_TYPE, "status": "True", "reason": "GPUsHealthy",
                                 "message": "8 GPUs healthy", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                                 "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    for name in names:
        await create(cluster, "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                                                "status": status})
    return names


async def _job(cluster: Cluster, name: str) -> dict[str, Any]:
    ns = cluster.namespace
    return await create(cluster, f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", {
        "apiVersion": KF, "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": ns, "labels": {proj.OPT_IN_LABEL: "true"}},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "restartPolicy": "OnFailure"}}}})


async def _member(cluster: Cluster, job: dict[str, Any], node: str, generation: int) -> str:
    """The job's one worker of `generation`, on `node` (what its operator makes after each restart)."""
    name = f"{job['metadata']['name']}-worker-0-g{generation}"
    labels = {kinds.KUBEFLOW_JOB_NAME: job["metadata"]["name"], kinds.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}
    await make_pod(cluster, name, node, labels, job)
    return name


def _xid(cluster: Cluster, node: str, code: int, gpu: int, holder: str, clock: Clock, *,
         signal: str) -> model.CollectorEvent:
    """An agent's XID report about `node`, as the event watcher publishes it."""
    return model.CollectorEvent(detector="event-watcher", severity=model.Severity.ERROR, reason="RecoveryRequested",
                                message=f"XID {code}", recommended=model.Action.RESTART_WORKLOAD, signal=signal,
                                target=model.Target(kind=model.TargetKind.NODE, name=node, node=node),
                                fault=model.Fault(xid=code, gpu_index=gpu, pods=(f"{cluster.namespace}/{holder}",)),
                                observed_at=clock.now())


def _node_writes(rig: Rig) -> dict[str, int]:
    """What the product's client wrote to Nodes or devices: cordons, taints, annotations, DeviceTaintRules."""
    return {k: v for k, v in rig.kube.request_counts.items()
            if k.split()[0] in ("CREATE", "UPDATE", "PATCH", "DELETE", "DELETECOLLECTION")
            and (" nodes" in k or "devicetaintrules" in k)}


async def _node(cluster: Cluster, name: str) -> dict[str, Any]:
    return await get(cluster, f"/api/v1/nodes/{name}")


async def _reasons(cluster: Cluster, reason: str, name: str = "") -> list[dict[str, Any]]:
    return [e for e in await events(cluster) if e.get("reason") == reason
            and (not name or e["involvedObject"].get("name") == name)]


def _past(minutes: float) -> Clock:
    """A clock `minutes` behind the server's: moved on by the test, it stays behind the creation times the
    server gives the pods it makes meanwhile (a restart is judged against its faulting pod's creation)."""
    clock = Clock()
    clock.moment -= dt.timedelta(minutes=minutes)
    return clock


def _later(clock: Clock, seconds: float) -> None:
    clock.moment += dt.timedelta(seconds=seconds)


async def test_a_job_that_crashes_on_every_start_is_restarted_to_its_budget_and_no_node_is_written(
        cluster: Cluster) -> None:
    node, other = await _nodes(cluster, 2)
    job = await _job(cluster, "loop")
    before = {n: (await _node(cluster, n))["metadata"]["resourceVersion"] for n in (node, other)}
    clock = _past(10)
    pod = await _member(cluster, job, node, 0)
    rig = await Rig.make(cluster, clock)
    for generation in range(7):
        await rig.handle(await pod_fault(cluster, pod, clock))  # the worker fails on every start
        _later(clock, 61)
        pod = await _member(cluster, job, node, generation + 1)
        await rig.refresh()
        await rig.leader.resume()
    outcomes = list(rig.engine.outcomes)
    restarted = await _reasons(cluster, "KcoverRestartedWorkload", "loop")
    assert len(restarted) == 5, "restarted until its budget (recovery.max_restarts_per_window)"
    assert any(isinstance(o, st.Refused | st.Held) and o.code is st.Code.BUDGET_EXHAUSTED for o in outcomes)
    assert _node_writes(rig) == {}, "a job's own crash loop writes to no node"
    after = {n: (await _node(cluster, n))["metadata"]["resourceVersion"] for n in (node, other)}
    assert after == before, "the server holds both nodes as they were"
    assert not await _reasons(cluster, "KcoverNodeSuspect")


async def test_three_jobs_failing_on_one_node_make_it_suspect_and_a_failed_validation_cordons_it_once(
        cluster: Cluster) -> None:
    node, _ = await _nodes(cluster, 2)
    jobs = [await _job(cluster, name) for name in ("a", "b", "c", "d")]
    pods = [await _member(cluster, job, node, 0) for job in jobs]
    clock = Clock()
    rig = await Rig.make(cluster, clock)
    await rig.handle(await pod_fault(cluster, pods[0], clock))
    await rig.handle(await pod_fault(cluster, pods[1], clock))
    annotations = (await _node(cluster, node))["metadata"].get("annotations") or {}
    assert validationcodec.VALIDATE_REQUEST not in annotations, "two jobs are not yet evidence"
    await rig.handle(await pod_fault(cluster, pods[2], clock))
    (suspect,) = await _reasons(cluster, "KcoverNodeSuspect", node)
    assert f"3 different workloads restarted for faults on Node {node}" in suspect["message"]
    held = await _node(cluster, node)
    request = (held["metadata"].get("annotations") or {}).get(validationcodec.VALIDATE_REQUEST, "")
    assert request, "a validation was asked of the node's agent"
    assert not held["spec"].get("unschedulable"), "suspect is not cordoned"

    # the node's agent answers: its condition, written through the Node's status as the agent writes it
    condition = validationcodec.encode_validation_answer(
        validationcodec.ValidationAnswer(request, validationcodec.ValidationOutcome.FAILED, "diag level 1: memory test failed on GPU 2"),
        clock.now().strftime("%Y-%m-%dT%H:%M:%SZ"))
    await cluster.harness.kube.request("PATCH", f"/api/v1/nodes/{node}/status",
                                       body={"status": {"conditions": [condition]}},
                                       content_type="application/strategic-merge-patch+json")
    await rig.refresh()
    await rig.leader.resume()
    assert (await _node(cluster, node))["spec"].get("unschedulable") is True
    assert len(await _reasons(cluster, "KcoverSuspectFailed", node)) == 1
    (cordon,) = await _reasons(cluster, "KcoverCordonedNode", node)
    assert "suspect, and failed validation" in cordon["message"]
    annotations = (await _node(cluster, node))["metadata"].get("annotations") or {}
    assert validationcodec.VALIDATE_REQUEST not in annotations, "the request is taken back"
    await rig.refresh()
    await rig.handle(await pod_fault(cluster, pods[3], clock))
    await rig.leader.resume()
    assert len(await _reasons(cluster, "KcoverCordonedNode", node)) == 1, "cordoned once"
    assert len(await _reasons(cluster, "KcoverNodeSuspect", node)) == 1


async def test_xid13_twice_by_one_job_on_one_gpu_asks_a_validation_and_cordons_nothing(cluster: Cluster) -> None:
    node, _ = await _nodes(cluster, 2, agent=True)
    a = await _job(cluster, "a")
    pod = await _member(cluster, a, node, 0)
    clock = _past(5)
    rig = await Rig.make(cluster, clock)
    await rig.handle(_xid(cluster, node, 13, 3, pod, clock, signal="e0"))
    _later(clock, 61)
    pod = await _member(cluster, a, node, 1)
    await rig.refresh()
    held = await _node(cluster, node)
    assert validationcodec.VALIDATE_REQUEST not in (held["metadata"].get("annotations") or {}), "one restart is no evidence"
    await rig.handle(_xid(cluster, node, 13, 3, pod, clock, signal="e1"))  # again on GPU 3, after its restart
    assert len(await _reasons(cluster, "KcoverRestartedWorkload", "a")) == 1, "the second waits for the verdict"
    (waiting,) = await _reasons(cluster, "KcoverRecoveryHeld", "a")
    assert "AwaitingVerdict" in waiting["message"]
    (suspect,) = await _reasons(cluster, "KcoverNodeSuspect", node)
    assert f"one workload restarted 2 times within 21600s for faults only on GPU gpu3 of Node {node}" \
        in suspect["message"]
    held = await _node(cluster, node)
    assert (held["metadata"].get("annotations") or {}).get(validationcodec.VALIDATE_REQUEST), "validation asked"
    assert not held["spec"].get("unschedulable"), "suspect, not cordoned"
    assert _node_writes(rig).keys() <= {"PATCH nodes"}, "only the request's annotations were written"


async def test_xid13_repeated_by_one_job_cordons_nothing_and_across_two_jobs_makes_the_node_suspect(
        cluster: Cluster) -> None:
    node, _ = await _nodes(cluster, 2)
    a, b = await _job(cluster, "a"), await _job(cluster, "b")
    pod = await _member(cluster, a, node, 0)
    other = await _member(cluster, b, node, 0)
    clock = _past(5)
    rig = await Rig.make(cluster, clock, judgement={"device_restarts": 99})  # the one-workload rule aside
    for generation in range(3):  # job a's own XID 13 on GPU 3, after each of its restarts
        await rig.handle(_xid(cluster, node, 13, 3, pod, clock, signal=f"e{generation}"))
        _later(clock, 61)
        pod = await _member(cluster, a, node, generation + 1)
        await rig.refresh()
    assert len(await _reasons(cluster, "KcoverRestartedWorkload", "a")) == 3
    held = await _node(cluster, node)
    assert not held["spec"].get("unschedulable")
    assert validationcodec.VALIDATE_REQUEST not in (held["metadata"].get("annotations") or {})
    assert _node_writes(rig) == {}, "one job's XID 13: an application error, no node write"

    await rig.handle(_xid(cluster, node, 13, 3, other, clock, signal="e-b"))  # the same GPU, another job
    (suspect,) = await _reasons(cluster, "KcoverNodeSuspect", node)
    assert f"2 different workloads restarted for faults on GPU gpu3 of Node {node}" in suspect["message"]
    held = await _node(cluster, node)
    assert (held["metadata"].get("annotations") or {}).get(validationcodec.VALIDATE_REQUEST), "validation asked"
    assert not held["spec"].get("unschedulable"), "suspect, not cordoned"
