"""Resetting the latched breaker through its annotation, as docs/runbook.md (section 7) tells an operator.

The breaker latches on a cordon past `max_cordoned_fraction`; a restart is refused while it is latched.
The operator then writes `kcover.io/breaker-reset=true` on the controls ConfigMap over HTTP (what
`kubectl annotate` sends); the leader turns it into a reset on its next judgement: it takes the
annotation and the open marks off, writes the close time, leaves a `KcoverBreakerReset` Event, refuses
for the cooldown, and acts on the next fault after it. The real controller runs on every cluster backend
(the `cluster` fixture); the harness plays the kubelet and the Kubeflow operator.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import test_closed_loop_scenarios as loop
import test_recovery_scenarios as base

from kcover.recovery import controls

Cluster = Any
RESET = "KcoverBreakerReset"


async def _skipped(cluster: Cluster, uid: str, code: str) -> list[dict[str, Any]] | None:
    found = [e for e in base._about(await base._events(cluster), base.SKIPPED, uid) if code in e["message"]]
    return found or None


async def _reset_event(cluster: Cluster) -> dict[str, Any] | None:
    return next((e for e in await base._events(cluster) if e.get("reason") == RESET
                 and e["involvedObject"].get("kind") == "ConfigMap"), None)


async def test_breaker_reset_by_annotation_closes_the_latch_and_takes_the_annotation_off(
        cluster: Cluster, tmp_path: Path) -> None:
    gpu = loop._gpu_resource()
    first, second = await loop._gpu_node(cluster, gpu), await loop._gpu_node(cluster, gpu)
    plain = f"scn-{secrets.token_hex(3)}"
    await base._node(cluster.client, plain)  # the job's node: not one of the GPU nodes the breaker counts
    train = await base._job(cluster, "train", plain)
    uid, ns = train["metadata"]["uid"], cluster.namespace
    path = f"/api/v1/namespaces/{ns}/configmaps/kcover-controls"
    cooldown = 2.0
    recovery = {"breaker_latch": True, "breaker_cooldown_seconds": cooldown, "max_cordoned_fraction": 0.5,
                "workload_cooldown_seconds": 0.5}
    async with cluster.harness.playing(), base._controllers(cluster, tmp_path, extra=loop._node_settings(gpu),
                                                            **recovery):
        await loop._gpu_condition(cluster, first, healthy=False)
        await loop._until_node_event(cluster, first, base.CORDONED)
        await loop._gpu_condition(cluster, second, healthy=False)  # past the fraction: refused, and it latches
        await base._until(lambda: loop._latched(cluster), "a KcoverBreakerLatched Event on the controls ConfigMap")
        await cluster.harness.fail_container(ns, "train-worker-1", base.CONTAINER, message="while latched")
        latched = await base._until(lambda: _skipped(cluster, uid, "BreakerLatched"), "a BreakerLatched refusal")
        asked_at = base.clock_.utcnow()
        await cluster.client.request(  # `kubectl annotate configmap kcover-controls kcover.io/breaker-reset=true`
            "PATCH", path, body={"metadata": {"annotations": {controls.BREAKER_RESET: "true"}}},
            content_type="application/merge-patch+json")
        await cluster.harness.fail_container(ns, "train-worker-1", base.CONTAINER, message="after the reset")
        cooling = await base._until(lambda: _skipped(cluster, uid, "BreakerCooldown"), "a BreakerCooldown refusal")
        reset = await base._until(lambda: _reset_event(cluster), f"a {RESET} Event on the controls ConfigMap")
        cm = await cluster.client.request("GET", path)
        restarted_early = base._about(await base._events(cluster), base.RESTARTED, uid)
        annotations = cm["metadata"].get("annotations") or {}
        closed_at = base.clock_.parse_time(annotations.get(controls.BREAKER_CLOSED_AT, "1970-01-01T00:00:00Z"))
        ahead = closed_at.timestamp() + cooldown + 0.5 - base.clock_.utcnow().timestamp()
        await asyncio.sleep(max(0.0, ahead))
        old = base._uids(await base._pods(cluster, "train"))
        await cluster.harness.fail_container(ns, "train-worker-1", base.CONTAINER, message="after the cooldown")
        await base._until_event(cluster, base.RESTARTED, uid, "a restart once the cooldown is over")
        await base._recreated(cluster, "train", old)
        second_node = await loop._node_obj(cluster, second)
    assert controls.BREAKER_RESET in latched[0]["message"]  # the refusal tells the operator how to reset
    for key in (controls.BREAKER, controls.BREAKER_REASON, controls.BREAKER_OPENED_AT, controls.BREAKER_RESET):
        assert key not in annotations, annotations  # the latch is closed and the request taken off
    assert asked_at.replace(microsecond=0) <= closed_at <= base.clock_.utcnow()
    assert "breaker was reset" in cooling[0]["message"]
    assert restarted_early == []  # the cooldown runs from the reset
    assert reset["involvedObject"]["name"] == "kcover-controls"
    assert (reset["action"], reset["type"]) == ("Reset", "Normal")
    assert f"{controls.BREAKER_RESET}=true" in reset["message"]
    assert "taken off" in reset["message"]
    assert not second_node["spec"].get("unschedulable")  # the cordon the breaker refused was not carried out
