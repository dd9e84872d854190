"""Resetting the latched breaker through its annotation, as docs/runbook.md (section 7) tells an operator.

The breaker latches on a cordon past `max_cordoned_fraction`; its state is the ledger's (the LedgerEntry
`kcover-ledger.breaker`), and a restart it refuses is held (`KcoverRecoveryHeld`, `BreakerLatched`). The
operator writes `kcover.io/breaker-reset=true` on the controls ConfigMap over HTTP (what `kubectl create
configmap` and `kubectl annotate` send: kcover only reads that ConfigMap, it never creates or changes it);
the leader turns the request into one reset: it closes the breaker in the ledger, remembers the request's
value so that the same value never resets again, leaves a `KcoverBreakerReset` Event, refuses for the
cooldown, and then restarts the held workload once. The real controller runs on every cluster backend (the
`cluster` fixture); the harness plays the kubelet and the Kubeflow operator.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import pytest
import test_closed_loop_scenarios as loop
import test_recovery_scenarios as base

from kcover import errors
from kcover.kube import gateway
from kcover.recovery import controls, ledger, ledgerentries

Cluster = Any
RESET = controls.RESET_REASON


async def _held(cluster: Cluster, uid: str, code: str) -> list[dict[str, Any]] | None:
    found = [e for e in base._about(await base._events(cluster), loop.HELD, uid) if code in e["message"]]
    return found or None


async def _reset_events(cluster: Cluster) -> list[dict[str, Any]]:
    return [e for e in await base._events(cluster) if e.get("reason") == RESET
            and e["involvedObject"].get("kind") == "ConfigMap"]


async def _breaker(cluster: Cluster) -> ledgerentries.Breaker:
    """The breaker as the ledger holds it, read over the API like `kcover breaker reset` reads it."""
    book = ledger.Ledger(gateway.Http(cluster.client), namespace=cluster.namespace, name="kcover-ledger",
                         retention_seconds=lambda: 3600.0)
    await book.load()
    return book.breaker()


async def test_breaker_reset_by_annotation_closes_the_latch_once_and_restarts_the_held_job_after_the_cooldown(
        cluster: Cluster, tmp_path: Path) -> None:
    gpu = loop._gpu_resource()
    first, second = await loop._gpu_node(cluster, gpu), await loop._gpu_node(cluster, gpu)
    plain = f"scn-{secrets.token_hex(3)}"
    await base._node(cluster.client, plain)  # the job's node: not one of the GPU nodes the breaker counts
    train = await base._job(cluster, "train", plain)
    uid, ns = train["metadata"]["uid"], cluster.namespace
    path = f"/api/v1/namespaces/{ns}/configmaps/kcover-controls"
    cooldown = 3.0
    recovery = {"breaker_latch": True, "breaker_cooldown_seconds": cooldown, "max_cordoned_fraction": 0.5,
                "workload_cooldown_seconds": 0.5, "resume_interval_seconds": 0.3}
    async with cluster.harness.playing(), base._controllers(cluster, tmp_path, extra=loop._node_settings(gpu),
                                                            **recovery):
        await loop._gpu_condition(cluster, first, healthy=False)
        await loop._until_node_event(cluster, first, base.CORDONED)
        await loop._gpu_condition(cluster, second, healthy=False)  # past the fraction: refused, and it latches
        await base._until(lambda: loop._latched(cluster), "a KcoverBreakerLatched Event on the controls ConfigMap")
        await cluster.harness.fail_container(ns, "train-worker-1", base.CONTAINER, message="while latched")
        held = await base._until(lambda: _held(cluster, uid, "BreakerLatched"), "a restart held as BreakerLatched")
        before = await _breaker(cluster)
        with pytest.raises(errors.NotFoundError):
            await cluster.client.request("GET", path)  # kcover never writes the controls ConfigMap
        old = base._uids(await base._pods(cluster, "train"))
        asked_at = base.clock_.utcnow().timestamp()
        await cluster.client.request("POST", f"/api/v1/namespaces/{ns}/configmaps", body={
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kcover-controls", "annotations": {controls.BREAKER_RESET: "true"}}})
        reset = (await base._until(lambda: _reset_events(cluster), f"a {RESET} Event on the controls ConfigMap"))[0]
        after = await _breaker(cluster)
        restarted_early = base._about(await base._events(cluster), base.RESTARTED, uid)
        restarted = await base._until_event(cluster, base.RESTARTED, uid, "the held restart once the cooldown is over")
        await base._recreated(cluster, "train", old)
        await asyncio.sleep(base.SETTLE)
        restarts = base._about(await base._events(cluster), base.RESTARTED, uid)
        # The same request does not reset the breaker again: it trips once more and stays latched.
        await loop._gpu_condition(cluster, second, healthy=True)
        await asyncio.sleep(1.5)  # past the node-condition detector's recovered_hold_seconds
        await loop._gpu_condition(cluster, second, healthy=False)

        async def latched_again() -> ledgerentries.Breaker | None:
            state = await _breaker(cluster)
            return state if state.latched else None
        again = await base._until(latched_again, "the breaker latched again")
        await asyncio.sleep(base.SETTLE)
        still = await _breaker(cluster)
        resets = await _reset_events(cluster)
        cm = await cluster.client.request("GET", path)
        second_node = await loop._node_obj(cluster, second)
    assert controls.BREAKER_RESET in held[0]["message"]  # the hold tells the operator how to reset
    assert before.latched
    assert before.reset_request == ""
    assert not after.latched
    assert after.reset_request == "true"
    assert after.closed_at is not None
    assert asked_at - 1.0 <= after.closed_at <= base.clock_.utcnow().timestamp()
    assert restarted_early == []  # nothing restarted before the reset
    assert len(restarts) == 1, restarts  # the held restart ran once
    started = base.clock_.parse_time(restarted[0].get("eventTime") or restarted[0]["firstTimestamp"]).timestamp()
    assert started >= after.closed_at + cooldown - 1.0  # the cooldown runs from the reset (second precision)
    assert reset["involvedObject"]["name"] == "kcover-controls"
    assert (reset["action"], reset["type"]) == ("Reset", "Normal")
    assert "reset on request (true)" in reset["message"]
    assert again.reset_request == "true"
    assert still.latched
    assert len(resets) == 1, resets
    assert (cm["metadata"].get("annotations") or {}).get(controls.BREAKER_RESET) == "true"  # kcover left it
    assert not second_node["spec"].get("unschedulable")  # the cordons the breaker refused were not carried out
