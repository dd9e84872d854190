"""The closed-loop `kcover sim` scenarios (kcover/sim/loopscenarios.py) on every cluster backend: a restart
that stalls is reported Stalled with the scheduler's message and a person is called (`restart-stalled`),
and paused targets are skipped with Events until the pause is lifted (`pause`). The real controller runs
against the backend; the harness plays the operator and, here, the scheduler that cannot place the pods.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import test_recovery_scenarios as base

from kcover.recovery import controls

Cluster = Any
STALLED = "KcoverRecoveryStalled"
ESCALATED = "KcoverEscalated"
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


async def test_paused_workload_namespace_and_global_are_skipped_until_lifted(cluster: Cluster, tmp_path: Path) -> None:
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
    old = base._uids(await base._pods(cluster, "train"))
    async with cluster.harness.playing(), base._controllers(cluster, tmp_path, workload_cooldown_seconds=0.5):
        for attempt, (path, scope) in enumerate(scopes, start=1):
            await _annotate(kube, path, "true")
            await asyncio.sleep(0.5)  # the cache sees the workload's annotation
            await cluster.harness.fail_container(ns, "train-worker-1", base.CONTAINER, message=f"failure {attempt}")

            async def paused(scope: str = scope, attempt: int = attempt) -> bool:
                skipped = base._about(await base._events(cluster), base.SKIPPED, uid)
                return len([e for e in skipped if "Paused" in e["message"] and scope in e["message"]]) >= 1 \
                    and len([e for e in skipped if "Paused" in e["message"]]) >= attempt
            await base._until(paused, f"a Paused skip ({scope})")
            await _annotate(kube, path, None)
        assert base._about(await base._events(cluster), base.RESTARTED, uid) == []
        await asyncio.sleep(0.6)
        await cluster.harness.fail_container(ns, "train-worker-1", base.CONTAINER, message="after the pause")
        await base._until_event(cluster, base.RESTARTED, uid, "a restart once the pause was lifted")
        await base._recreated(cluster, "train", old)


async def _annotate(kube: Any, path: str, value: str | None) -> None:
    await kube.request("PATCH", path, body={"metadata": {"annotations": {controls.PAUSED: value}}},
                       content_type="application/merge-patch+json")
