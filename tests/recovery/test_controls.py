"""The breaker reset through `kcover.io/breaker-reset=true` (kcover/recovery/controls.py) when another
write lands between the leader's read of the controls ConfigMap and its write.

Runs `Controls` with its own client and cache against the simulated API server over HTTP. The other
writer is a person (an unrelated annotation, or `kcover breaker reset`) whose write the test slips in
just before the leader's PUT. What is asserted is what the server ends up holding and the Events the
leader asked for: the reset still happens once, the person's write is kept, and the action is judged
(refused for the cooldown), never failed with a conflict.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from kcover import model, settings
from kcover.aio import clock as clock_
from kcover.kube import caching
from kcover.kube import client as client_
from kcover.recovery import actions, controls
from kcover.sim import server as simserver

NS = "kcover-system"
NAME = "kcover-controls"
PATH = f"/api/v1/namespaces/{NS}/configmaps/{NAME}"


@pytest.fixture
async def srv() -> AsyncIterator[simserver.SimServer]:
    server = simserver.SimServer(seed=1)
    await server.start()
    server.store.create("configmaps", {"metadata": {"name": NAME, "namespace": NS, "annotations": {
        controls.BREAKER: controls.OPEN, controls.BREAKER_REASON: "too many nodes cordoned",
        controls.BREAKER_OPENED_AT: "2026-01-01T00:00:00Z", controls.BREAKER_RESET: "true"}}})
    yield server
    await server.stop()


def _cordon() -> actions.CordonNode:
    cause = model.CollectorEvent(detector="node-condition", severity=model.Severity.ERROR, reason="NodeConditionBad",
                                 target=model.Target(kind=model.TargetKind.NODE, name="gpu-node-3"))
    return actions.CordonNode("gpu-node-3", "NodeConditionBad", cause)


async def _judge_with_a_write_before_the_put(srv: simserver.SimServer,
                                             other: Callable[[client_.KubeClient], Awaitable[None]],
                                             ) -> tuple[tuple[actions.SkipCode, str] | None, list[dict[str, Any]], int]:
    """The leader judges one cordon; `other` writes the ConfigMap right before the leader's first PUT of it.
    Returns the refusal, the Events the leader emitted, and how many PUTs it sent."""
    emitted: list[dict[str, Any]] = []
    puts = 0

    async def emit(about: actions.ObjectRef, **event: Any) -> None:
        emitted.append({"about": about, **event})

    async with client_.from_configuration(srv.kube_configuration()) as kube, \
            client_.from_configuration(srv.kube_configuration()) as person:
        request = kube.request

        async def racing(method: str, path: str, **kwargs: Any) -> Any:
            nonlocal puts
            if method == "PUT" and path == PATH:
                puts += 1
                if puts == 1:
                    await other(person)
            return await request(method, path, **kwargs)

        vars(kube)["request"] = racing
        cache = caching.ClusterCache(kube, watch_events=False, workload_kinds=caching.workload_kinds([]))
        stop = asyncio.Event()
        task = asyncio.create_task(cache.run(stop), name="cache")
        try:
            await cache.wait_synced()
            rs = settings.RecoverySettings(ledger_namespace=NS, controls_name=NAME, breaker_latch=True,
                                           breaker_cooldown_seconds=60.0)
            judge = controls.Controls(kube, cache, recovery=lambda: rs, clock=clock_.SystemClock(),
                                      is_leader=lambda: True, emit=emit)
            refusal = await judge.refusal(_cordon())
        finally:
            stop.set()
            await task
    return refusal, emitted, puts


async def test_a_persons_write_before_the_reset_is_kept_and_the_reset_still_happens(
        srv: simserver.SimServer) -> None:
    async def annotate(person: client_.KubeClient) -> None:
        await person.request("PATCH", PATH, body={"metadata": {"annotations": {"team": "on-call"}}},
                             content_type="application/merge-patch+json")

    refusal, emitted, puts = await _judge_with_a_write_before_the_put(srv, annotate)
    annotations = srv.store.get("configmaps", NS, NAME)["metadata"]["annotations"]
    assert refusal is not None
    assert refusal[0] is actions.SkipCode.BREAKER_COOLDOWN
    assert puts == 2  # the first conflicted, the second, on the fresh read, went through
    assert annotations.get("team") == "on-call"
    assert controls.BREAKER not in annotations
    assert controls.BREAKER_RESET not in annotations
    assert controls.BREAKER_CLOSED_AT in annotations
    assert [e["reason"] for e in emitted] == [controls.RESET_REASON]
    assert emitted[0]["about"].name == NAME


async def test_a_reset_by_someone_else_meanwhile_is_taken_as_it_is(srv: simserver.SimServer) -> None:
    async def breaker_reset(person: client_.KubeClient) -> None:
        assert await controls.reset(person, namespace=NS, name=NAME, now=clock_.utcnow())

    refusal, emitted, puts = await _judge_with_a_write_before_the_put(srv, breaker_reset)
    annotations = srv.store.get("configmaps", NS, NAME)["metadata"]["annotations"]
    assert refusal is not None
    assert refusal[0] is actions.SkipCode.BREAKER_COOLDOWN
    assert puts == 1  # the conflict's fresh read showed the latch closed: nothing left to write
    assert controls.BREAKER not in annotations
    assert controls.BREAKER_RESET not in annotations
    assert emitted == []  # the person's reset, not the leader's: no KcoverBreakerReset from the leader
