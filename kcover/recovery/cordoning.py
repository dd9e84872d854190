"""Cordons: kcover's edit of a Node, and whose cordon it is when kcover would make the node schedulable again.

Owns `refusal()` (the one rule for "kcover will not cordon this node": already cordoned by kcover, or
unschedulable by someone else), applied by the plan to the cached node and by the executor to the node it
just read, `cordon()` and `uncordon()`, the pure edits the executor applies before its write,
`landed_at()` and `entered()` (is a cordon found on a node in its ledger entry), and the hand-over rule
below. At cordon
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

import re
from collections.abc import Iterable, Mapping
from typing import Any

from kcover import model
from kcover.aio import clock as clock_
from kcover.kube import gateway
from kcover.kube import projections as proj
from kcover.recovery.steps import Code

ENTRY_SLACK_SECONDS = 2.0
"""How much earlier than a node's `kcover.io/cordoned-at` its ledger entry's cordon time may be and still
be that cordon (the annotation is written at whole seconds, before the entry)."""
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


def refusal(*, cordoned_by_kcover: bool, unschedulable: bool, kcover_tainted: bool, node: str
            ) -> tuple[Code, str] | None:
    """Why kcover does not cordon `node` now, or None. While kcover's cordon holds (`proj.kcover_cordon_holds`)
    it is already cordoned; its marks alone are no cordon, so a new fault cordons the node again."""
    if proj.kcover_cordon_holds(cordoned_by_kcover=cordoned_by_kcover, unschedulable=unschedulable,
                                kcover_tainted=kcover_tainted):
        return Code.ALREADY_CORDONED, f"Node {node} is already cordoned by kcover"
    if unschedulable:
        return Code.CORDONED_BY_OTHERS, (f"Node {node} is already unschedulable (not by kcover); kcover leaves it "
                                         "alone")
    return None


def refusal_to_return(*, cordoned_by_kcover: bool, node: str) -> tuple[Code, str] | None:
    """Why kcover does not un-cordon `node`: only a node kcover cordoned goes back to service by kcover."""
    if not cordoned_by_kcover:
        return Code.NOT_CORDONED_BY_KCOVER, f"Node {node} was not cordoned by kcover"
    return None


_NOT_LABEL = re.compile(r"[^A-Za-z0-9._-]+")


def taint_value(text: str) -> str:
    """A taint value: at most 63 characters of [A-Za-z0-9._-], starting and ending alphanumeric."""
    value = _NOT_LABEL.sub("-", text)[:63].strip("-._")
    return value or "fault"


def taints(taint_key: str, reason: str, *, no_execute: bool, now: str) -> list[gateway.TaintBody]:
    """kcover's taints for a cordon: NoSchedule, and NoExecute with `recovery.taint_no_execute`."""
    value = taint_value(reason)
    out: list[gateway.TaintBody] = [{"key": taint_key, "value": value, "effect": "NoSchedule"}]
    if no_execute:
        out.append({"key": taint_key, "value": value, "effect": "NoExecute", "timeAdded": now})
    return out


def cordon(node: gateway.NodeBody, *, taint_key: str, ours: list[gateway.TaintBody], reason: str,
           now: str) -> tuple[Code, str] | None:
    """Edit `node` in place into kcover's cordon; a refusal (nothing edited) when `refusal()` says no."""
    meta = node.setdefault("metadata", {})
    annotations = dict(meta.get("annotations") or {})
    spec = node.setdefault("spec", {})
    name = meta.get("name", "")
    refused = refusal(cordoned_by_kcover=annotations.get(proj.CORDONED_BY) == "kcover",
                      unschedulable=spec.get("unschedulable") is True,
                      kcover_tainted=any(t.get("key") == taint_key for t in spec.get("taints") or []), node=name)
    if refused is not None:
        return refused
    mine = {(t["key"], t["effect"]) for t in ours}
    kept = [t for t in spec.get("taints") or [] if (t.get("key"), t.get("effect")) not in mine]
    spec["taints"] = kept + ours
    spec["unschedulable"] = True
    annotations[proj.CORDONED_BY] = "kcover"
    annotations[proj.CORDON_TAINTS] = record(kept, taint_key)
    annotations[proj.CORDON_REASON] = model.fit(reason, model.MESSAGE_MAX)
    annotations[proj.CORDONED_AT] = now
    meta["annotations"] = annotations
    return None


def landed_at(node: proj.Node, taint_key: str) -> float | None:
    """When kcover's whole cordon (its annotation, `spec.unschedulable` and its taint) landed on `node`, by its
    `kcover.io/cordoned-at`; None when the node does not carry all of it or the time does not parse."""
    if not (node.cordoned_by_kcover and node.unschedulable and any(t.key == taint_key for t in node.taints)):
        return None
    try:
        return clock_.parse_time(proj.get(node.annotations, proj.CORDONED_AT)).timestamp()
    except ValueError:
        return None


def entered(cordoned_at: float | None, landed: float) -> bool:
    """Whether a ledger entry's cordon time (`cordoned_at`) is the cordon that `landed` then, or a later one."""
    return cordoned_at is not None and cordoned_at >= landed - ENTRY_SLACK_SECONDS


def uncordon(node: gateway.NodeBody, *, taint_key: str) -> tuple[tuple[Code, str] | None, str]:
    """Edit `node` in place to undo kcover's cordon: (refusal, "") when it is not kcover's, else (None, why a
    person took it over or ""). Taken over, kcover removes only its own taint and annotations."""
    meta = node.setdefault("metadata", {})
    annotations = dict(meta.get("annotations") or {})
    refused = refusal_to_return(cordoned_by_kcover=annotations.get(proj.CORDONED_BY) == "kcover",
                                node=meta.get("name", ""))
    if refused is not None:
        return refused, ""
    taken = taken_over(node, taint_key)
    for key in (proj.CORDONED_BY, proj.CORDON_REASON, proj.CORDONED_AT, proj.CORDON_TAINTS):
        annotations.pop(key, None)
    meta["annotations"] = annotations
    spec = node.setdefault("spec", {})
    spec["taints"] = [t for t in spec.get("taints") or [] if t.get("key") != taint_key]
    if not taken:
        spec.pop("unschedulable", None)
    return None, taken
