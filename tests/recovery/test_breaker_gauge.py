"""`kcover_breaker_open` follows the breaker's latch, on virtual time against the simulated cluster in-process.

docs/runbook.md: 1 while the breaker is latched open (the ledger's breaker entry), 0 once a person reset it.
It is not the last decision's outcome: the restarts refused while latched, the refusals of the cooldown after
the reset and the restart allowed after it leave it where the latch is; a new leader that loads the latched
breaker from the ledger says 1 from its first pass. The reset is `kcover breaker reset`'s
(`controls.request_reset`), acted on by the leader's next pass.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import test_engine as eng
from harness import engines

from kcover import metrics
from kcover.controller import recovering
from kcover.kube import gateway
from kcover.recovery import controls

pytestmark = pytest.mark.looptime

GAUGE = "kcover_breaker_open"
LATCHING = {"recovery": {"breaker_latch": True, "max_cordoned_fraction": 0.2, "breaker_cooldown_seconds": 5.0}}


def gauge(m: metrics.Metrics) -> float | None:
    return m.registry.get_sample_value(GAUGE)


def refused(r: engines.Rig, code: str) -> int:
    return sum(1 for e in r.events("KcoverRecoveryHeld") if code in e["message"])


async def test_the_breaker_gauge_is_1_while_latched_on_every_leader_and_0_once_reset() -> None:
    objs: list[dict[str, Any]] = [*eng.nodes(4), *eng.pytorchjob(node="n3")]
    eng.failing(objs[5])
    async with engines.rig(objs, overrides=LATCHING) as r:
        await r.tick()
        assert gauge(r.metrics) == 0, "closed before anything tripped it"
        await r.handle(eng.node_fault("n0"))
        await r.handle(eng.node_fault("n1"))  # 1 of 4 held: past 0.2, refused, and it latches
        assert eng._breaker(r).latched
        await r.tick()
        assert gauge(r.metrics) == 1

        # a later decision refused while latched (the restart held) leaves it open, pass after pass
        await r.handle(eng.pod_fault("train-0"))
        assert refused(r, "BreakerLatched") == 1
        assert gauge(r.metrics) == 1
        for _ in range(3):
            await asyncio.sleep(2.0)
            await r.tick()
            assert gauge(r.metrics) == 1
        assert r.pod_uids() == {f"train-{i}" for i in range(4)}, "nothing restarted while latched"

        # a new leader (its own process, its own metrics) loads the latched breaker from the ledger
        fresh = metrics.Metrics(process=False)
        successor = recovering.build(recovering.EngineDeps(
            settings=r.settings, client=r.kube, cache=r.cache, metrics=fresh, clock=r.clock,
            is_leader=lambda: True, epoch=lambda: 2, identity="kcover-successor"))
        assert gauge(fresh) == 0
        await successor.resume()
        assert gauge(fresh) == 1

        # `kcover breaker reset`: the annotation, acted on by the leader's next pass
        rs = r.settings.recovery
        await controls.request_reset(gateway.Http(r.kube), namespace=rs.ledger_namespace, name=rs.controls_name,
                                     now=r.clock.now())
        await r.settle()
        await r.tick()
        assert not eng._breaker(r).latched
        assert len(r.events("KcoverBreakerReset")) == 1
        assert gauge(r.metrics) == 0

        # the cooldown's refusals, and then the held restart allowed, leave it closed
        await r.handle(eng.node_fault("n2"))
        (skipped,) = r.events("KcoverRecoverySkipped", name="n2")
        assert skipped["message"].startswith("BreakerCooldown:")
        assert r.store.get("nodes", "", "n2")["spec"].get("unschedulable") is not True
        await r.tick()
        assert gauge(r.metrics) == 0
        await asyncio.sleep(6.0)
        await r.tick()
        assert r.pod_uids() == set(), "the held restart ran after the cooldown"
        assert not eng._breaker(r).latched
        assert gauge(r.metrics) == 0
