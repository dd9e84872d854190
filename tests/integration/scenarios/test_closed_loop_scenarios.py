"""The closed-loop scenarios (kcover/sim/loopscenarios.py) and the escalation ladder on every cluster backend.

A restart that stalls is reported Stalled with the scheduler's message and a person is called
(`restart-stalled`); paused targets are skipped with Events until the pause is lifted (`pause`); a
repaired node returns to service after its validation and the hold while a person's cordons stay
(`node-repaired`); the breaker latches until reset and cools down (`breaker-latch`); a cordon drains
as configured, honouring a PodDisruptionBudget, and asks for remediation; a job failing again and again on
one node never writes to it, and three different jobs failing there make it suspect, validated by its
agent, cordoned only if the validation fails. The real controller runs against the backend; the harness
plays the kubelet, the operator, the disruption controller (PDB status) and the agent's validation loop
(with a fake `dcgmi` printing real output). On kube-apiserver nodes are shared between tests, so the
breaker counts only the test's own GPU nodes (`kube.gpu_resources`, a resource name unique to the test).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import test_recovery_scenarios as base

from kcover import errors, settings
from kcover.agent import validating
from kcover.kube import gateway
from kcover.recovery import controls, ledger, ledgerentries

Cluster = Any
STALLED = "KcoverRecoveryStalled"
ESCALATED = "KcoverEscalated"
HELD = "KcoverRecoveryHeld"
VERIFIED = "KcoverRecoveryVerified"
MESSAGE = "0/3 nodes are available: 3 node(s) were unschedulable."


def _unschedulable(pod: dict[str, Any]) -> dict[str, Any] | None:
    status = dict(pod.get("status") or {})
    status["phase"] = "Pending"
    status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                             "message": MESSAGE, "lastTransitionTime": base.clock_.rfc3339(base.clock_.utcnow())}]
    return status


async def test_restart_stalled_is_reported_with_the_schedulers_message(cluster: Cluster, tmp_path: Path) -> None:
    node = f"scn-{secrets.token_hex(3)}"
    await base._node(cluster.client, node)
    train = await base._job(cluster, "train", node)
    uid, ns = train["metadata"]["uid"], cluster.namespace
    old = base._uids(await base._pods(cluster, "train"))
    async with cluster.harness.playing(), base._controllers(cluster, tmp_path, verify={"deadline_seconds": 2.0},
                                                            resume_interval_seconds=0.3) as replicas:
        await cluster.harness.fail_container(ns, "train-worker-1", base.CONTAINER, message="worker group failed")
        await base._until_event(cluster, base.RESTARTED, uid, "a restart Event for PyTorchJob train")
        for pod in await base._recreated(cluster, "train", old):  # the scheduler cannot place them
            await cluster.harness.set_status(ns, pod["metadata"]["name"], _unschedulable)
        stalled = await base._until_event(cluster, STALLED, uid, "a KcoverRecoveryStalled Event")
        person = await base._until_event(cluster, ESCALATED, uid, "a KcoverEscalated Event")
        counted = base._leader(replicas).metrics.registry.get_sample_value(
            "kcover_recovery_stalled_total", {"cause": "Unschedulable"})
    assert "Stalled: Unschedulable" in stalled[0]["message"]
    assert MESSAGE in stalled[0]["message"]
    assert "a person must look" in person[0]["message"]
    assert counted == 1.0


async def test_a_restart_that_runs_again_is_verified(cluster: Cluster, tmp_path: Path) -> None:
    node = f"scn-{secrets.token_hex(3)}"
    await base._node(cluster.client, node)
    train = await base._job(cluster, "train", node)
    uid, ns = train["metadata"]["uid"], cluster.namespace
    old = base._uids(await base._pods(cluster, "train"))
    async with cluster.harness.playing(), base._controllers(cluster, tmp_path, resume_interval_seconds=0.3) as replicas:
        await cluster.harness.fail_container(ns, "train-worker-1", base.CONTAINER, message="worker group failed")
        await base._until_event(cluster, base.RESTARTED, uid, "a restart Event for PyTorchJob train")
        for pod in await base._recreated(cluster, "train", old):
            await cluster.harness.run_pod(ns, pod["metadata"]["name"])
        verified = await base._until_event(cluster, VERIFIED, uid, "a KcoverRecoveryVerified Event")
        registry = base._leader(replicas).metrics.registry
        count = registry.get_sample_value("kcover_recovery_mttr_seconds_count")
    assert "runs again" in verified[0]["message"]
    assert count == 1.0


async def test_paused_workload_namespace_and_global_are_held_until_lifted(cluster: Cluster, tmp_path: Path) -> None:
    """A pause (on the workload, its namespace, or every target) holds the restart, says so in a
    KcoverRecoveryHeld Event, and restarts nothing while it lasts; lifted, the held restart runs once by
    itself (a refused restart is not forgotten: the pod's container may never fail again)."""
    node = f"scn-{secrets.token_hex(3)}"
    await base._node(cluster.client, node)
    train = await base._job(cluster, "train", node)
    uid, ns = train["metadata"]["uid"], cluster.namespace
    kube = cluster.client
    job_path = f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs/train"
    await kube.request("POST", f"/api/v1/namespaces/{ns}/configmaps",
                       body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kcover-controls"}})
    scopes = [(job_path, "PyTorchJob"), (f"/api/v1/namespaces/{ns}", f"namespace {ns}"),
              (f"/api/v1/namespaces/{ns}/configmaps/kcover-controls", "every target")]
    async with cluster.harness.playing(), base._controllers(cluster, tmp_path, workload_cooldown_seconds=0.5):
        for attempt, (path, scope) in enumerate(scopes, start=1):
            await _annotate(kube, path, "true")
            await asyncio.sleep(0.5)  # the cache sees the annotation
            old = base._uids(await base._pods(cluster, "train"))
            await cluster.harness.fail_container(ns, "train-worker-1", base.CONTAINER, message=f"failure {attempt}")

            async def held(scope: str = scope, attempt: int = attempt) -> bool:
                events = base._about(await base._events(cluster), HELD, uid)
                return len([e for e in events if "Paused" in e["message"] and scope in e["message"]]) >= 1 \
                    and len([e for e in events if "Paused" in e["message"]]) >= attempt
            await base._until(held, f"a Paused hold ({scope})")
            await asyncio.sleep(base.SETTLE)
            assert len(base._about(await base._events(cluster), base.RESTARTED, uid)) == attempt - 1, scope
            await _annotate(kube, path, None)

            async def restarted(attempt: int = attempt) -> bool:
                return len(base._about(await base._events(cluster), base.RESTARTED, uid)) >= attempt
            await base._until(restarted, f"the held restart once the pause ({scope}) was lifted")
            for pod in await base._recreated(cluster, "train", old):
                await cluster.harness.run_pod(ns, pod["metadata"]["name"])
            await asyncio.sleep(1.0)  # past the 0.5 s workload cooldown
        assert len(base._about(await base._events(cluster), base.RESTARTED, uid)) == len(scopes)


async def _annotate(kube: Any, path: str, value: str | None) -> None:
    await kube.request("PATCH", path, body={"metadata": {"annotations": {controls.PAUSED: value}}},
                       content_type="application/merge-patch+json")


# ------------------------------------------------------------------------------------------------ nodes

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "dcgmi-diag"
DIAG_PASS = FIXTURES / "ramble-r3-pass-dcgm3.3.9-h200x8-table.txt"
DIAG_FAIL = FIXTURES / "nccl-tests-264-r3-fail-cuda-init-dcgm3.3.8-h100x8-table.txt"
UNCORDONED = "KcoverUncordonedNode"
HANDED_OVER = "KcoverCordonHandedOver"
VALIDATION = "KcoverValidation"
LATCHED = "KcoverBreakerLatched"
TAINT = "kcover.io/unhealthy"


def _gpu_resource() -> str:
    """A GPU resource name only this test's nodes have: the breaker counts only them (kube.gpu_resources)."""
    return f"gpu-{secrets.token_hex(3)}.kcover-test.io/gpu"


async def _gpu_node(cluster: Cluster, resource: str, *, name: str = "") -> str:
    name = name or f"scn-{secrets.token_hex(3)}"
    kube = cluster.client
    await kube.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    node = await kube.request("GET", f"/api/v1/nodes/{name}")
    resources = {resource: "8", "cpu": "64", "memory": "512Gi", "pods": "110"}
    node["status"] = {"capacity": resources, "allocatable": resources,
                      "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                      "message": "kubelet is posting ready status"}]}
    await kube.request("PUT", f"/api/v1/nodes/{name}/status", body=node)
    return name


async def _gpu_condition(cluster: Cluster, node: str, healthy: bool) -> None:
    """What kcover's agent writes: KcoverGPUHealthy False on a fault, True once it cleared."""
    now = base.clock_.rfc3339(base.clock_.utcnow())
    cond = {"type": "KcoverGPUHealthy", "status": "True" if healthy else "False",
            "reason": "GPUHealthy" if healthy else "XID79", "message": "" if healthy else "XID 79 on GPU 0",
            "lastTransitionTime": now, "lastHeartbeatTime": now}
    await cluster.client.request("PATCH", f"/api/v1/nodes/{node}/status", body={"status": {"conditions": [cond]}},
                                 content_type="application/strategic-merge-patch+json")


async def _patch_node(cluster: Cluster, node: str, body: dict[str, Any]) -> None:
    await cluster.client.request("PATCH", f"/api/v1/nodes/{node}", body=body,
                                 content_type="application/merge-patch+json")


async def _node_obj(cluster: Cluster, node: str) -> dict[str, Any]:
    return dict(await cluster.client.request("GET", f"/api/v1/nodes/{node}"))


async def _node_events(cluster: Cluster, node: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in await base._events(cluster, "default")
            if e.get("reason") == reason and e["involvedObject"].get("name") == node]


async def _until_node_event(cluster: Cluster, node: str, reason: str, action: str = "",
                            within: float = base.WAIT) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        return next((e for e in await _node_events(cluster, node, reason)
                     if not action or e.get("action") == action), None)
    return await base._until(probe, f"a {reason} {action} Event on Node {node}", within)


@contextlib.asynccontextmanager
async def _agent_validators(cluster: Cluster, tmp_path: Path, nodes: list[str], fixture: Path,
                            exit_code: int = 0) -> AsyncIterator[None]:
    """kcover's agent validation loop for each node, with a fake `dcgmi` printing a real diag output."""
    script = tmp_path / "dcgmi"
    script.write_text(f"#!/bin/sh\ncat {fixture}\nexit {exit_code}\n")
    script.chmod(0o755)
    config = settings.AgentValidationSettings(enabled=True, dcgmi_path=str(script), timeout_seconds=10.0)
    stop = asyncio.Event()
    clients = [cluster.new_client() for _ in nodes]
    tasks = [asyncio.create_task(validating.Validator(kube, node, config).run(stop), name=f"validator:{node}")
             for kube, node in zip(clients, nodes, strict=True)]
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait(tasks, timeout=10.0)
        for kube in clients:
            await kube.close()
        for task in tasks:
            task.result()


def _node_settings(resource: str, **more: Any) -> dict[str, Any]:
    return base._merged({"kube": {"gpu_resources": [resource]},
                         "detectors": {"entries": {"node-condition": {"config": {"recovered_hold_seconds": 1.0}}}}},
                        more)


async def test_node_repaired_returns_after_validation_and_leaves_a_persons_cordons(cluster: Cluster,
                                                                                   tmp_path: Path) -> None:
    gpu = _gpu_resource()
    repaired, kept, bystander = [await _gpu_node(cluster, gpu) for _ in range(3)]
    await _patch_node(cluster, bystander, {"spec": {"unschedulable": True}})  # a person's cordon (maintenance)
    # Two cordons within the hour on a three-node fleet trip the breaker's window limit (at least one
    # node, else 1% of the GPU nodes): this test is about the return, so the window allows both.
    recovery = {"uncordon_enabled": True, "resume_interval_seconds": 0.3, "max_cordons_per_window_fraction": 1.0,
                "return_validation": {"enabled": True, "diag_level": 3, "timeout_seconds": 15.0},
                "escalation": {"remediation_enabled": True}}
    async with _agent_validators(cluster, tmp_path, [repaired, kept], DIAG_PASS), \
            base._controllers(cluster, tmp_path, extra=_node_settings(gpu), **recovery):
        for node in (repaired, kept):
            await _gpu_condition(cluster, node, healthy=False)
            await _until_node_event(cluster, node, base.CORDONED)
        await _patch_node(cluster, kept, {"metadata": {"annotations": {"kcover.io/keep-cordoned": "true"}}})
        await asyncio.sleep(0.5)
        for node in (repaired, kept):
            await _gpu_condition(cluster, node, healthy=True)
        cleared_at = base.clock_.parse_time(next(  # second precision, as the hold counts it
            c["lastTransitionTime"] for c in (await _node_obj(cluster, repaired))["status"]["conditions"]
            if c["type"] == "KcoverGPUHealthy"))
        passed = await _until_node_event(cluster, repaired, VALIDATION, "ValidationPassed")
        back = await _until_node_event(cluster, repaired, UNCORDONED)
        handed = await _until_node_event(cluster, kept, HANDED_OVER)
        asked = await _until_node_event(cluster, repaired, VALIDATION, "RequestValidation")
        await asyncio.sleep(base.SETTLE)
        nodes = {n: await _node_obj(cluster, n) for n in (repaired, kept, bystander)}
        bystander_events = [e for r in (base.CORDONED, UNCORDONED, HANDED_OVER, VALIDATION)
                            for e in await _node_events(cluster, bystander, r)]
    spec, annotations = nodes[repaired]["spec"], nodes[repaired]["metadata"].get("annotations") or {}
    assert not spec.get("unschedulable")
    assert TAINT not in {t.get("key") for t in spec.get("taints") or []}
    assert not [k for k in annotations if k.startswith(("kcover.io/cordon", "kcover.io/validate"))], annotations
    assert "dcgmi diag -r 3" in asked["message"]
    assert "every test passed" in passed["message"]
    answered = next(c for c in nodes[repaired]["status"]["conditions"] if c["type"] == "KcoverGPUValidated")
    assert answered["status"] == "True"
    assert REMEDIATION_LABEL not in (nodes[repaired]["metadata"].get("labels") or {})  # the request taken back
    remediation = next(c for c in nodes[repaired]["status"]["conditions"] if c["type"] == "KcoverRemediationRequested")
    assert remediation["status"] == "False"
    assert base.clock_.parse_time(back["eventTime"]) >= cleared_at + datetime.timedelta(seconds=1.0)  # the hold
    assert nodes[kept]["spec"]["unschedulable"] is True  # the person's cordon stays
    assert TAINT not in {t.get("key") for t in nodes[kept]["spec"].get("taints") or []}
    assert "keep-cordoned" in handed["message"]
    assert nodes[bystander]["spec"]["unschedulable"] is True
    assert bystander_events == []


async def test_a_failed_validation_keeps_the_node_cordoned_and_escalates(cluster: Cluster, tmp_path: Path) -> None:
    gpu = _gpu_resource()
    node = await _gpu_node(cluster, gpu)
    recovery = {"uncordon_enabled": True, "resume_interval_seconds": 0.3,
                "return_validation": {"enabled": True, "timeout_seconds": 15.0}}
    async with _agent_validators(cluster, tmp_path, [node], DIAG_FAIL, exit_code=226), \
            base._controllers(cluster, tmp_path, extra=_node_settings(gpu), **recovery):
        await _gpu_condition(cluster, node, healthy=False)
        await _until_node_event(cluster, node, base.CORDONED)
        await _gpu_condition(cluster, node, healthy=True)
        failed = await _until_node_event(cluster, node, VALIDATION, "ValidationFailed")

        async def escalated_again() -> bool:
            return len([e for e in await _node_events(cluster, node, ESCALATED) if e.get("action") == "Person"]) >= 2
        await base._until(escalated_again, "the node ladder climbed again")
        await asyncio.sleep(base.SETTLE)
        obj = await _node_obj(cluster, node)
        uncordoned = await _node_events(cluster, node, UNCORDONED)
    assert "GPU Memory" in failed["message"]
    assert obj["spec"]["unschedulable"] is True
    assert TAINT in {t.get("key") for t in obj["spec"].get("taints") or []}
    assert uncordoned == []


async def test_no_validation_answer_leaves_the_node_cordoned_with_an_event(cluster: Cluster, tmp_path: Path) -> None:
    gpu = _gpu_resource()
    node = await _gpu_node(cluster, gpu)
    recovery = {"uncordon_enabled": True, "resume_interval_seconds": 0.3,
                "return_validation": {"enabled": True, "timeout_seconds": 1.0}}
    async with base._controllers(cluster, tmp_path, extra=_node_settings(gpu), **recovery):  # no agent answers
        await _gpu_condition(cluster, node, healthy=False)
        await _until_node_event(cluster, node, base.CORDONED)
        await _gpu_condition(cluster, node, healthy=True)
        timed_out = await _until_node_event(cluster, node, VALIDATION, "ValidationTimedOut")
        obj = await _node_obj(cluster, node)
    assert "no answer" in timed_out["message"]
    assert obj["spec"]["unschedulable"] is True
    assert "kcover.io/validate-request" not in (obj["metadata"].get("annotations") or {})


async def test_breaker_latches_until_reset_then_cools_down(cluster: Cluster, tmp_path: Path) -> None:
    gpu = _gpu_resource()
    first, second = await _gpu_node(cluster, gpu), await _gpu_node(cluster, gpu)
    plain = f"scn-{secrets.token_hex(3)}"
    await base._node(cluster.client, plain)  # the job's node: not one of the GPU nodes counted
    train = await base._job(cluster, "train", plain)
    uid, ns = train["metadata"]["uid"], cluster.namespace
    cooldown = 6.0  # long enough that the fault sent into it is judged inside it, even on a loaded machine
    recovery = {"breaker_latch": True, "breaker_cooldown_seconds": cooldown, "max_cordoned_fraction": 0.5,
                "workload_cooldown_seconds": 0.5, "resume_interval_seconds": 0.3}
    gw = gateway.Http(cluster.client)
    book = ledger.Ledger(gw, namespace=ns, name="kcover-ledger", retention_seconds=lambda: 3600.0)

    async def breaker() -> ledgerentries.Breaker:
        await book.load()
        return book.breaker()

    async def held(code: str) -> list[dict[str, Any]] | None:
        return [e for e in base._about(await base._events(cluster), HELD, uid) if code in e["message"]] or None

    async with cluster.harness.playing(), base._controllers(cluster, tmp_path, extra=_node_settings(gpu), **recovery):
        await _gpu_condition(cluster, first, healthy=False)
        await _until_node_event(cluster, first, base.CORDONED)
        await _gpu_condition(cluster, second, healthy=False)  # 1 of 2 GPU nodes cordoned: at the fraction
        latched = await base._until(
            lambda: _latched(cluster), "a KcoverBreakerLatched Event on the controls ConfigMap")
        await cluster.harness.fail_container(ns, "train-worker-1", base.CONTAINER, message="while latched")
        await base._until(lambda: held("BreakerLatched"), "the restart held as BreakerLatched")
        open_ = await breaker()
        with pytest.raises(errors.NotFoundError):  # kcover never writes the controls ConfigMap
            await cluster.client.request("GET", f"/api/v1/namespaces/{ns}/configmaps/kcover-controls")
        value = await controls.request_reset(gw, namespace=ns, name="kcover-controls", now=base.clock_.utcnow())

        async def closed() -> ledgerentries.Breaker | None:
            state = await breaker()
            return state if not state.latched else None
        reset = await base._until(closed, "the breaker closed in the ledger")
        assert reset.closed_at is not None
        await cluster.harness.fail_container(ns, "train-worker-1", base.CONTAINER, message="during the cooldown")
        cooling = await base._until(lambda: held("BreakerCooldown"), "the restart held as BreakerCooldown")
        restarted_early = base._about(await base._events(cluster), base.RESTARTED, uid)
        old = base._uids(await base._pods(cluster, "train"))
        restarted = await base._until_event(cluster, base.RESTARTED, uid, "the held restart once the cooldown is over")
        await base._recreated(cluster, "train", old)
        await asyncio.sleep(base.SETTLE)
        restarts = base._about(await base._events(cluster), base.RESTARTED, uid)
        second_node = await _node_obj(cluster, second)
    assert "latched open" in latched["message"]
    assert open_.latched
    assert "breaker tripped" in open_.reason
    assert reset.reset_request == value  # the request acted on, remembered so that it resets once
    assert "breaker was reset" in cooling[0]["message"]
    assert restarted_early == []  # the cooldown runs from the reset
    assert len(restarts) == 1, restarts  # then the held restart runs, once
    started = base.clock_.parse_time(restarted[0].get("eventTime") or restarted[0]["firstTimestamp"]).timestamp()
    assert started >= reset.closed_at + cooldown - 1.0  # second precision
    assert not second_node["spec"].get("unschedulable")  # the cordon the breaker refused was not carried out


async def _latched(cluster: Cluster) -> dict[str, Any] | None:
    return next((e for e in await base._events(cluster) if e.get("reason") == LATCHED), None)


# ------------------------------------------------------------------------------------------------ the ladder

REMEDIATION_LABEL = "kcover.io/remediation-requested"


async def _plain_pod(cluster: Cluster, name: str, node: str, *, daemonset: bool = False) -> None:
    ns = cluster.namespace
    meta: dict[str, Any] = {"name": name, "labels": {"app": name}}
    if daemonset:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "node-agent",
                                    "uid": "5b0d2d1e-0000-4000-8000-000000000001", "controller": True}]
    await cluster.client.request("POST", f"/api/v1/namespaces/{ns}/pods", body={
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]}})
    await cluster.harness.run_pod(ns, name)


async def _budget(cluster: Cluster, job: str, *, allowed: int, healthy: int, desired: int) -> None:
    """A PodDisruptionBudget over the job's pods, with the status the disruption controller would write
    (no such controller runs on either backend: the test plays it)."""
    path = f"/apis/policy/v1/namespaces/{cluster.namespace}/poddisruptionbudgets"
    pdb = await cluster.client.request("POST", path, body={
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": f"{job}-budget"},
        "spec": {"minAvailable": desired, "selector": {"matchLabels": {base.JOB_NAME: job}}}})
    pdb["status"] = {"observedGeneration": pdb["metadata"]["generation"], "disruptionsAllowed": allowed,
                     "currentHealthy": healthy, "desiredHealthy": desired, "expectedPods": healthy}
    await cluster.client.request("PUT", f"{path}/{job}-budget/status", body=pdb)


async def _evicted(cluster: Cluster) -> set[str]:
    """Pods the Eviction API took (the DisruptionTarget condition it adds; gone ones too)."""
    listed = await cluster.client.request("GET", f"/api/v1/namespaces/{cluster.namespace}/pods")
    return {p["metadata"]["name"] for p in listed.get("items") or []
            if any(c.get("type") == "DisruptionTarget" for c in (p.get("status") or {}).get("conditions") or [])}


@pytest.mark.parametrize(("mode", "evicted"), [
    ("none", set()),
    ("opted-in", {"train-worker-0"}),
    ("all", {"train-worker-0", "web"}),
])
async def test_cordon_drains_as_configured_honouring_the_budget_then_requests_remediation(
        cluster: Cluster, tmp_path: Path, mode: str, evicted: set[str]) -> None:
    gpu = _gpu_resource()
    node = await _gpu_node(cluster, gpu)
    await base._job(cluster, "train", node)  # two opted-in workers
    await _plain_pod(cluster, "web", node)  # not opted in
    await _plain_pod(cluster, "ds-agent", node, daemonset=True)
    await _budget(cluster, "train", allowed=1, healthy=2, desired=1)  # one of the two workers may go
    recovery = {"resume_interval_seconds": 0.3,
                "escalation": {"drain_mode": mode, "drain_timeout_seconds": 2.0, "remediation_enabled": True}}
    async with base._controllers(cluster, tmp_path, extra=_node_settings(gpu), **recovery):
        await _gpu_condition(cluster, node, healthy=False)
        await _until_node_event(cluster, node, base.CORDONED)
        person = await _until_node_event(cluster, node, ESCALATED, "Person")
        remediation = await _until_node_event(cluster, node, ESCALATED, "RequestRemediation")
        ended = (await _until_node_event(cluster, node, ESCALATED, "Drain", within=base.WAIT)
                 if mode != "none" else None)
        if ended is not None:
            async def final() -> dict[str, Any] | None:
                drains = await _node_events(cluster, node, ESCALATED)
                return next((e for e in drains if e.get("action") == "Drain" and "gave up" in e["message"]), None)
            ended = await base._until(final, "the drain to give up at its timeout")
        await asyncio.sleep(base.SETTLE)
        took = await _evicted(cluster)
        obj = await _node_obj(cluster, node)
    assert took == evicted
    if ended is not None:
        assert "1 still there" in ended["message"]
        assert "PodDisruptionBudget refused the eviction" in ended["message"]
    assert (obj["metadata"].get("labels") or {}).get(REMEDIATION_LABEL) == "true"
    cond = next(c for c in obj["status"]["conditions"] if c["type"] == "KcoverRemediationRequested")
    assert (cond["status"], cond["reason"]) == ("True", "KcoverRequested")
    assert REMEDIATION_LABEL in remediation["message"]
    assert "remediation requested" in person["message"]


async def test_a_job_failing_again_and_again_on_one_node_never_writes_to_the_node(
        cluster: Cluster, tmp_path: Path) -> None:
    """The job's own bug: restarted until its budget, and the node it fails on is never cordoned, tainted,
    annotated or validated (one workload's faults are no evidence against a node)."""
    gpu = _gpu_resource()
    node = await _gpu_node(cluster, gpu)
    train = await base._job(cluster, "train", node)
    uid, ns = train["metadata"]["uid"], cluster.namespace
    before = await _node_obj(cluster, node)
    recovery = {"workload_cooldown_seconds": 0.3, "max_restarts_per_window": 3}
    async with cluster.harness.playing(), base._controllers(cluster, tmp_path, extra=_node_settings(gpu),
                                                            **recovery):
        for attempt in range(4):
            old = base._uids(await base._pods(cluster, "train"))
            await cluster.harness.fail_container(ns, "train-worker-1", base.CONTAINER, message=f"failure {attempt}")
            if attempt == 3:
                budget = await base._until_event(cluster, base.SKIPPED, uid, "the budget's refusal")
                break

            async def restarted(n: int = attempt + 1) -> list[dict[str, Any]] | None:
                got = base._about(await base._events(cluster), base.RESTARTED, uid)
                return got if len(got) >= n else None
            await base._until(restarted, f"restart {attempt + 1}")
            for pod in await base._recreated(cluster, "train", old):
                await cluster.harness.run_pod(ns, pod["metadata"]["name"])
            await asyncio.sleep(0.5)  # past the workload cooldown
        await asyncio.sleep(base.SETTLE)
        after = await _node_obj(cluster, node)
        suspects = await _node_events(cluster, node, "KcoverNodeSuspect")
    assert "BudgetExhausted" in budget[0]["message"]
    assert not after["spec"].get("unschedulable")
    assert not [t for t in after["spec"].get("taints") or [] if t["key"].startswith("kcover.io/")]
    kcover_marks = {k for k in (after["metadata"].get("annotations") or {}) if k.startswith("kcover.io/")}
    assert kcover_marks == {k for k in (before["metadata"].get("annotations") or {}) if k.startswith("kcover.io/")}
    assert suspects == []


@pytest.mark.parametrize(("fixture", "exit_code", "cordons"), [(DIAG_FAIL, 226, True), (DIAG_PASS, 0, False)],
                         ids=["validation-fails", "validation-passes"])
async def test_three_jobs_failing_on_one_node_make_it_suspect_and_only_a_failed_validation_cordons_it(
        cluster: Cluster, tmp_path: Path, fixture: Path, exit_code: int, cordons: bool) -> None:
    """Different workloads failing on one node are the node's signature: kcover asks the node's agent for a
    validation (a real `dcgmi diag` output), cordons the node once if it fails, and leaves it schedulable,
    saying why in its Recovery, if it passes."""
    gpu = _gpu_resource()
    node = await _gpu_node(cluster, gpu)
    jobs = {name: (await base._job(cluster, name, node))["metadata"]["uid"] for name in ("ja", "jb", "jc")}
    ns = cluster.namespace
    async with _agent_validators(cluster, tmp_path, [node], fixture, exit_code=exit_code), \
            cluster.harness.playing(), base._controllers(cluster, tmp_path, extra=_node_settings(gpu)):
        for name, uid in jobs.items():
            await cluster.harness.fail_container(ns, f"{name}-worker-1", base.CONTAINER, message="exit 1")
            await base._until_event(cluster, base.RESTARTED, uid, f"the restart of {name}")
        suspect = await _until_node_event(cluster, node, "KcoverNodeSuspect")
        verdict = await _until_node_event(cluster, node, "KcoverSuspectFailed" if cordons else "KcoverSuspectValidated")
        if cordons:
            await _until_node_event(cluster, node, base.CORDONED)
        await asyncio.sleep(base.SETTLE)
        obj = await _node_obj(cluster, node)
        cordon_events = await _node_events(cluster, node, base.CORDONED)
        records = await cluster.client.request(
            "GET", f"/apis/kcover.io/v1alpha1/namespaces/{cluster.namespace}/recoveries")
    assert "3 different workloads restarted for faults on Node" in suspect["message"]
    assert bool(obj["spec"].get("unschedulable")) is cordons
    assert len(cordon_events) == (1 if cordons else 0)
    judged = [r for r in records.get("items") or [] if r["spec"]["decision"]["action"] == "ValidateNode"
              and r["spec"]["target"]["name"] == node]
    assert [r["status"].get("cause") for r in judged] == ["ValidationFailed" if cordons else "ValidatedHealthy"]
    assert "3 different workloads" in judged[0]["status"]["message"]
    assert verdict["involvedObject"]["name"] == node


async def test_dry_run_names_the_ladder_and_touches_nothing(cluster: Cluster, tmp_path: Path) -> None:
    """A node fault under dry run: every step of the ladder is told in a `KcoverDryRun...` Event (the cordon,
    the drain, the remediation request) and none is done: no eviction, no cordon, no label, no real Event."""
    gpu = _gpu_resource()
    node = await _gpu_node(cluster, gpu)
    await base._job(cluster, "train", node)
    recovery = {"dry_run": True, "escalation": {"drain_mode": "all", "remediation_enabled": True}}
    async with base._controllers(cluster, tmp_path, extra=_node_settings(gpu), **recovery):
        await _gpu_condition(cluster, node, healthy=False)
        cordon = await _until_node_event(cluster, node, "KcoverDryRunCordonedNode", "DryRunCordonNode")
        drain = await _until_node_event(cluster, node, "KcoverDryRunEscalated", "DryRunDrain")
        remediation = await _until_node_event(cluster, node, "KcoverDryRunEscalated", "DryRunRequestRemediation")
        person = await _until_node_event(cluster, node, "KcoverDryRunEscalated", "DryRunPerson")
        await asyncio.sleep(base.SETTLE)
        took = await _evicted(cluster)
        obj = await _node_obj(cluster, node)
        real = [e for e in await base._events(cluster, "default")
                if e["involvedObject"].get("name") == node and e.get("reason") in (base.CORDONED, ESCALATED)]
    for event in (cordon, drain, remediation, person):
        assert event["message"].startswith("dry run, nothing was changed: ")
    assert "cordoned, drain (all) started, remediation requested" in person["message"]
    assert took == set()
    assert not obj["spec"].get("unschedulable")
    assert REMEDIATION_LABEL not in (obj["metadata"].get("labels") or {})
    assert real == []
