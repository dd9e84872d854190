"""Pods that came to a node after the plan that cordons it, before its cordon held.

A node's fault restarts the workloads with pods on it (`planning`), and holds those restarts until its
cordon is written, so that their pods are not recreated there (`AwaitingCordon`). A workload restarted for
a fault of its own just before, whose restart was already under way when the node's plan ran, had no pod
on the node then; its operator may recreate one there before the cordon lands (seen in the chaos run under
API latency and 429s). Nothing restarted it: a rank left on the faulty node.

Owns, per node kcover cordoned to restart its workloads (`steps.Cordon.swept`), the pods that plan looked
at, for `WINDOW_SECONDS` after the cordon was written. `due()`, at each leader pass, gives the nodes with a
live pod not seen yet (each pod once); the engine plans them with `planning.late_arrivals` (a cooldown
holds such a restart like any other). It lives in the leader's memory: a leader change within the window
loses it, and the late pod is then left to its job's next fault.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kcover import model
from kcover.recovery import planinputs
from kcover.recovery import steps as st

WINDOW_SECONDS = 30.0
"""How long after its cordon was written a node is watched for late arrivals: a pod the scheduler bound
before the cordon reached it shows in the cache within the watch's delivery time, far less than this."""


@dataclass
class _Watched:
    cause: model.CollectorEvent
    seen: set[str]
    until: float


class LateArrivals:
    def __init__(self) -> None:
        self._watched: dict[str, _Watched] = {}

    def watch(self, outcomes: Sequence[st.Outcome], now: float) -> None:
        """Watch the nodes whose cordon, with the restart of their workloads, was written (`now`: monotonic)."""
        for o in outcomes:
            if isinstance(o, st.Done) and isinstance(o.step, st.Cordon) and o.step.swept is not None:
                self._watched[o.step.node] = _Watched(o.step.cause, set(o.step.swept), now + WINDOW_SECONDS)

    def due(self, snapshot: planinputs.Snapshot, now: float) -> list[tuple[str, model.CollectorEvent, frozenset[str]]]:
        """(node, its fault, the pods seen before) for each watched node with a live pod not seen yet; those
        pods count as seen from here on. Nodes past their window are forgotten."""
        out = []
        for node, watched in list(self._watched.items()):
            if now > watched.until:
                del self._watched[node]
                continue
            fresh = {p.uid for p in snapshot.pods_on_node(node) if not p.deleting and not p.terminal} - watched.seen
            if fresh:
                out.append((node, watched.cause, frozenset(watched.seen)))
                watched.seen |= fresh
        return out
