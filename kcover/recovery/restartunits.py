"""Restart units: which pods one restart of a workload takes away, and the ledger key it counts under.

Owns `Unit` (the labels selecting a unit's pods, its ledger key, for a LeaderWorkerSet which group),
`unit_of` (the unit a pod belongs to, from the kinds table) and `members` (the pods a restart of the unit
takes away). `planning` plans a unit's restart with them and `restarting` vets a pending restart again.

Does not own owner resolution or opt-in (`kube.ownership`), the kinds table (`kinds`) or whether a restart
may run (`planning`, `admission`). Pure: no I/O; nothing here raises.
"""

from __future__ import annotations

from dataclasses import dataclass

from kcover import kinds
from kcover.kube import ownership
from kcover.kube import projections as proj
from kcover.recovery import planinputs
from kcover.recovery import steps as st


@dataclass(frozen=True)
class Unit:
    """A workload's restart unit: the labels selecting its pods, its ledger key, and for LWS which group."""

    selector: st.Selector
    key: str
    description: str = ""


def unit_of(resolved: ownership.Resolved, pod: proj.Pod) -> Unit:
    """The restart unit `pod` belongs to, from the kinds table."""
    w = resolved.workload
    table = kinds.of(w.group, w.kind)
    if table is None:  # resolution returns restartable kinds only
        return Unit(st.Selector(()), f"w.{w.uid}")
    named = ownership.jobset_in(resolved.chain) if table.family is kinds.Family.TRAINJOB else None
    owner_name, owner_uid = (named.name, named.uid) if named is not None else (w.name, w.uid)
    labels: list[tuple[str, str]] = [(table.membership_label, owner_name)]
    uid_bearing = False
    pod_labels = dict(pod.labels)
    for label in table.uid_labels:
        if pod_labels.get(label) == owner_uid:
            labels.append((label, owner_uid))
            uid_bearing = True
            break
    for label in table.narrowing_labels:
        if pod_labels.get(label):
            labels.append((label, pod_labels[label]))
    key, description = f"w.{w.uid}", ""
    group = pod_labels.get(table.group_label, "") if table.group_label else ""
    if group:
        labels.append((table.group_label, group))
        key, description = f"w.{w.uid}.g{group}", f"group {group}"
    return Unit(st.Selector(tuple(labels), uid_bearing=uid_bearing), key, description)


def members(snapshot: planinputs.Snapshot, w: proj.Workload, selector: st.Selector) -> tuple[st.PodRef, ...]:
    """The pods a restart of the unit takes away: its pods (by owner chain), not terminal, not terminating."""
    pods = [p for p in snapshot.pods_of_workload(w.uid)
            if selector.matches(p.labels) and not p.deleting and not p.terminal]
    return tuple(st.PodRef(p.namespace, p.name, p.uid) for p in sorted(pods, key=lambda p: (p.namespace, p.name)))
