"""Link-down evidence in the plan: one link-down of a node's RDMA port noted, and the cordon it explains.

Owns the `recovery.judgement.link_down` rule. An agent's one link-down (`model.Evidence.LINK_DOWN`, the
`rdma-link` detector's `RdmaLinkFlapped`, below its flap threshold) moves nothing by itself (a switch's
reboot takes every port under it down once): `note` makes it a `NoteLinkDown` step, which the coordinator
records in the node's ledger entry. When a workload with a pod on that node is restarted for a fault of its
own (a container exit, not an XID) within `link_seconds` after it, the link explains the failure (its ranks
waited on the dead link until NCCL's watchdog ended them): `cordons` gives the cordon of that node, placed
before the restart so the workload's pods do not come back to it, unless more than `link_nodes` of the
workload's nodes saw a link-down in that time (a switch's or the fabric's). The cordon goes through the
planner's one admission (breaker, window caps, cooldown, pause). Pure: no I/O, never raises.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kcover import model, settings
from kcover.recovery import judging
from kcover.recovery import steps as st


class Cordoning(Protocol):
    """The planner's cordon: its steps (the `Cordon`, or a `Refuse` with the admission's reason)."""

    def __call__(self, name: str, *, reason: str = "") -> list[st.Step]: ...


def note(event: model.CollectorEvent, js: settings.JudgementSettings) -> list[st.Step]:
    """The step recording an evidence event's link-down; none for other evidence, a target without a node,
    or with `link_down` off."""
    node = event.target.node_name
    if event.evidence is not model.Evidence.LINK_DOWN or not node or js.link_down is settings.JudgementMode.OFF:
        return []
    return [st.NoteLinkDown(node=node, at=event.observed_at.timestamp(), cause=event)]


@dataclass(frozen=True)
class LinkBlame:
    """A node whose link-down explains a restarted job's failure (`linked`)."""

    node: str
    text: str


def linked(steps: Sequence[st.Step], view: judging.View, evidence: judging.Evidence, js: settings.JudgementSettings
           ) -> list[LinkBlame]:
    """The nodes to cordon before the restarts in `steps`: for a restart for a fault of the workload's own (a
    container exit, not an XID), the nodes of the workload whose agent saw an RDMA port go down within
    `link_seconds` before the fault (`ledgerentries.Node.link_downs`), when there are at most `link_nodes` of
    them (more is a switch's or the fabric's). Empty with `link_down` off."""
    if js.link_down is settings.JudgementMode.OFF:
        return []
    out: list[LinkBlame] = []
    blamed: set[str] = set()
    for step in steps:
        if not isinstance(step, st.Restart) or step.blame is not model.Blame.WORKLOAD or step.cause.fault.xid is not None:
            continue
        failed_at = step.cause.observed_at.timestamp()
        downs: dict[str, float] = {}
        for pod in view.pods_of_workload(step.workload.uid):
            if not pod.node or pod.node in downs:
                continue
            entry = evidence.node(pod.node)
            seen = entry.link_downs_within(failed_at - js.link_seconds, failed_at) if entry is not None else []
            if seen:
                downs[pod.node] = max(seen)
        if not downs or len(downs) > js.link_nodes:
            continue
        for node, at in sorted(downs.items()):
            if node not in blamed:
                blamed.add(node)
                out.append(LinkBlame(node, f"an RDMA port of Node {node} went down {failed_at - at:.0f}s before "
                                           f"{step.what} failed (recovery.judgement.link_seconds {js.link_seconds:g})"))
    return out


def cordons(steps: Sequence[st.Step], view: judging.View, evidence: judging.Evidence, js: settings.JudgementSettings,
            cordon: Cordoning) -> list[st.Step]:
    """The steps to run before the restarts in `steps`: `cordon(node, reason=...)` (the planner's, with its
    admission and refusals) for each node `linked` finds, the node blamed; `RecordOnly` in `record` mode."""
    out: list[st.Step] = []
    record = js.link_down is settings.JudgementMode.RECORD
    for found in linked(steps, view, evidence, js):
        for step in cordon(found.node, reason=found.text):
            if isinstance(step, st.Cordon):
                step = dataclasses.replace(step, blame=model.Blame.NODE)
                out.append(st.RecordOnly(step, "recovery.judgement.link_down: record") if record else step)
            else:
                out.append(step)
    return out
