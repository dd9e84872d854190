"""Whose cordon is it (kcover/recovery/cordoning.py): the hand-over rule as a table."""

from __future__ import annotations

from typing import Any

import pytest

from kcover.recovery import cordoning

KEY = "kcover.io/unhealthy"
OURS = {"key": KEY, "value": "XID79", "effect": "NoSchedule"}


def _node(*, unschedulable: bool = True, taints: tuple[dict[str, str], ...] = (OURS,),
          annotations: dict[str, str] | None = None) -> dict[str, Any]:
    marks = {"kcover.io/cordoned-by": "kcover", "kcover.io/cordon-taints": "gpu-team/reserved:NoSchedule"}
    return {"metadata": {"name": "gpu-1", "annotations": {**marks, **(annotations or {})}},
            "spec": {"unschedulable": unschedulable, "taints": list(taints)}}


RESERVED = {"key": "gpu-team/reserved", "effect": "NoSchedule"}


@pytest.mark.parametrize(("node", "why"), [
    (_node(), ""),
    (_node(taints=(OURS, RESERVED)), ""),  # there when kcover cordoned: not a person's new cordon
    (_node(taints=(OURS, {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"})), ""),  # lifecycle
    (_node(taints=(OURS, {"key": "maintenance", "effect": "PreferNoSchedule"})), ""),  # does not block
    (_node(annotations={"kcover.io/keep-cordoned": "True"}), "kcover.io/keep-cordoned=true"),
    (_node(unschedulable=False), "un-cordoned it meanwhile"),
    (_node(taints=()), "removed kcover's taint"),
    (_node(taints=(OURS, {"key": "maintenance", "effect": "NoSchedule"})), "maintenance:NoSchedule was added"),
    (_node(taints=(OURS, {"key": "medik8s.io/remediation", "effect": "NoExecute"})), "medik8s.io/remediation:NoExecute"),
])
def test_taken_over(node: dict[str, Any], why: str) -> None:
    found = cordoning.taken_over(node, KEY)
    assert (found == "") if not why else (why in found), found


def test_record_keeps_the_other_scheduling_taints_sorted() -> None:
    taints = [OURS, {"key": "b", "effect": "NoExecute"}, {"key": "a", "effect": "NoSchedule"},
              {"key": "c", "effect": "PreferNoSchedule"}, {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]
    assert cordoning.record(taints, KEY) == "a:NoSchedule,b:NoExecute"
