"""Operator controls (kcover/recovery/controls.py): whose pause holds what, and the breaker's reset request.

The pause table is in tests/recovery/test_planning.py (the plan reads the controls); here: which reset
request the leader acts on, and `kcover breaker reset`'s write of it against the simulated API server.
"""

from __future__ import annotations

from typing import Any

import pytest
from harness import engines

from kcover.aio import clock as clock_
from kcover.kube import caching, gateway
from kcover.recovery import controls, ledgerentries

CM = "kcover-controls"
NS = "kcover-system"


def view(annotations: dict[str, str] | None) -> caching.ClusterCache:
    objs: list[dict[str, Any]] = []
    if annotations is not None:
        objs.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": CM, "namespace": NS, "annotations": annotations}})
    return caching.ClusterCache.offline(objs)


LATCHED = ledgerentries.Breaker(opened_at=100.0, reason="2 of 10 GPU nodes cordoned")


@pytest.mark.parametrize(("annotations", "breaker", "expected"), [
    ({controls.BREAKER_RESET: "2026-01-01T00:00:00Z"}, LATCHED, "2026-01-01T00:00:00Z"),
    ({controls.BREAKER_RESET: "true"}, LATCHED, "true"),
    ({controls.BREAKER_RESET: "false"}, LATCHED, ""),
    ({controls.BREAKER_RESET: ""}, LATCHED, ""),
    ({}, LATCHED, ""),
    (None, LATCHED, ""),
    # a request acted on once does not reset a later latch
    ({controls.BREAKER_RESET: "true"}, ledgerentries.Breaker(opened_at=200.0, reason="x", reset_request="true"), ""),
    # on a breaker that is not latched a request changes nothing (and is not even looked at)
    ({controls.BREAKER_RESET: "2026-01-01T00:00:00Z"}, ledgerentries.Breaker(), ""),
])
def test_which_reset_request_the_leader_acts_on(annotations: dict[str, str] | None, breaker: ledgerentries.Breaker,
                                                expected: str) -> None:
    assert controls.reset_request(view(annotations), breaker) == expected


def test_describe_says_what_the_breaker_is_doing() -> None:
    assert controls.describe(LATCHED, now=200.0, cooldown_seconds=300).startswith("latched open since ")
    assert controls.describe(ledgerentries.Breaker(closed_at=150.0), now=200.0, cooldown_seconds=300) == \
        "reset 50s ago; cooling down for 250s"
    assert controls.describe(ledgerentries.Breaker(closed_at=150.0), now=500.0, cooldown_seconds=300) == "closed"


@pytest.mark.looptime
async def test_the_reset_request_is_written_without_losing_a_persons_annotations() -> None:
    async with engines.rig() as r:
        gw = gateway.Http(r.kube)
        value = await controls.request_reset(gw, namespace=NS, name=CM, now=clock_.utcnow())
        cm = r.store.get("configmaps", NS, CM)
        assert cm["metadata"]["annotations"] == {controls.BREAKER_RESET: value}  # created when missing
        r.store.mutate("configmaps", NS, CM, lambda c: c["metadata"]["annotations"].update({"team": "gpu-ops"}))
        again = await controls.request_reset(gw, namespace=NS, name=CM, now=clock_.utcnow())
        annotations = r.store.get("configmaps", NS, CM)["metadata"]["annotations"]
        assert annotations == {controls.BREAKER_RESET: again, "team": "gpu-ops"}
