"""Whose cordon is it: the rule that decides whether kcover may make a node it cordoned schedulable again.

Owns the pure functions the executor applies to a Node it read, at cordon and at un-cordon. At cordon
kcover writes `spec.unschedulable`, its taint (`recovery.taint_key`) and annotations, among them
`kcover.io/cordon-taints`: the other scheduling taints (NoSchedule, NoExecute) the node had then.

`kubectl cordon` on a node that is already unschedulable changes nothing the API server keeps, so no
rule can see a person "cordoning again" by that alone. A person takes a cordon over by a change kcover
can see, and `taken_over()` names it:

* `kcover.io/keep-cordoned: "true"` (any letter case) on the Node: the documented way to say "keep it";
* `spec.unschedulable` no longer true (a person un-cordoned it; cordoning it again by hand afterwards
  is covered by the next rule only if they also tainted it, so use the annotation);
* kcover's taint gone (a person removed it);
* a NoSchedule or NoExecute taint that was not on the node when kcover cordoned it (`kubectl taint`
  for maintenance, a remediator's taint), except the node lifecycle taints the control plane itself
  manages (`node.kubernetes.io/*`, `node.cloudprovider.kubernetes.io/*`), which come and go with Ready.

When a person took the cordon over, kcover removes only its own taint and annotations and leaves
`spec.unschedulable` as the person left it ("hands the cordon over"); otherwise it un-cordons. It does
no I/O and never raises.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kcover.kube import projections as proj

SYSTEM_TAINT_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")
"""Taints the node lifecycle and cloud controllers add and remove themselves: never a person's cordon."""
BLOCKING = frozenset({"NoSchedule", "NoExecute"})


def other_blocking_taints(taints: Iterable[Mapping[str, Any]], taint_key: str) -> list[str]:
    """`key:effect` of the scheduling taints that are neither kcover's nor the control plane's, sorted."""
    out = {f"{t.get('key')}:{t.get('effect')}" for t in taints
           if t.get("effect") in BLOCKING and t.get("key") != taint_key
           and not str(t.get("key") or "").startswith(SYSTEM_TAINT_PREFIXES)}
    return sorted(out)


def record(taints: Iterable[Mapping[str, Any]], taint_key: str) -> str:
    """The `kcover.io/cordon-taints` value kcover writes at cordon."""
    return ",".join(other_blocking_taints(taints, taint_key))


def taken_over(node: Mapping[str, Any], taint_key: str) -> str:
    """Why a person took kcover's cordon of `node` (a raw Node) over, or "" when it is still kcover's."""
    meta = node.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    spec = node.get("spec") or {}
    taints = spec.get("taints") or []
    if str(annotations.get(proj.KEEP_CORDONED, "")).lower() == "true":
        return f"a person asked to keep it cordoned ({proj.KEEP_CORDONED}=true)"
    if spec.get("unschedulable") is not True:
        return "a person un-cordoned it meanwhile"
    if not any(t.get("key") == taint_key for t in taints):
        return f"a person removed kcover's taint {taint_key}"
    before = set(filter(None, str(annotations.get(proj.CORDON_TAINTS, "")).split(",")))
    added = [t for t in other_blocking_taints(taints, taint_key) if t not in before]
    if added:
        return f"the taint {', '.join(added)} was added after kcover's cordon"
    return ""
