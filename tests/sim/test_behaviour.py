"""The node lifecycle controller's Ready taints, as a pure function (`behaviour.ready_taints`)."""

from __future__ import annotations

from typing import Any

import pytest

from kcover.sim import behaviour

NOT_READY = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
UNREACHABLE = {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}
NOT_READY_EXECUTE = {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}
OWN = {"key": "kcover.io/unhealthy", "value": "XID79", "effect": "NoSchedule"}


def node(ready: str | None, *taints: dict[str, Any]) -> dict[str, Any]:
    conditions = [] if ready is None else [{"type": "MemoryPressure", "status": "False"},
                                           {"type": "Ready", "status": ready}]
    spec = {"taints": list(taints)} if taints else {}
    return {"metadata": {"name": "n"}, "spec": spec, "status": {"conditions": conditions}}


@pytest.mark.parametrize(("given", "expected"), [
    (node("True", NOT_READY), []),
    (node("True", OWN, NOT_READY, NOT_READY_EXECUTE), [OWN, NOT_READY_EXECUTE]),
    (node("True", UNREACHABLE), []),
    (node("True"), None),
    (node("True", OWN), None),
    (node("False"), [NOT_READY]),
    (node("False", OWN, UNREACHABLE), [OWN, NOT_READY]),
    (node("False", {**NOT_READY, "value": "x"}), None),
    (node("Unknown", NOT_READY), [UNREACHABLE]),
    (node(None, NOT_READY), None),  # the kubelet has not reported: left alone
    (node("Maybe", NOT_READY), None),
])
def test_ready_taints(given: dict[str, Any], expected: list[dict[str, Any]] | None) -> None:
    assert behaviour.ready_taints(given) == expected


def test_ready_taints_leaves_its_argument_alone() -> None:
    given = node("True", OWN, NOT_READY)
    behaviour.ready_taints(given)
    assert given["spec"]["taints"] == [OWN, NOT_READY]
