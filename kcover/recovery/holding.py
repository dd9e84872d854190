"""Held restarts planned again: `replan_held`, once its blocker may have lifted.

Owns when a restart held for a blocker that lifts (`steps.Hold`: a pause, a cooldown, the budget window,
the breaker) runs, stays held or is dropped: it is planned again with `planning.plan` on its cause, and
dropped when it expired (`recovery.hold_seconds`), when its cause cannot be read, or when the workload
recovered by itself meanwhile. A restart held for its node's verdict (`AwaitingVerdict`) runs `judged`: the
verdict answered its fault, which is no evidence against the node again. Pure, like the plan.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Sequence

from kcover import model, settings
from kcover.aio import clock as clock_
from kcover.kube import projections as proj
from kcover.recovery import ledgerentries, planinputs, planning, rules
from kcover.recovery import steps as st


class DropCode(enum.StrEnum):
    """Why a held restart was dropped without running, as its Recovery's cause."""
    EXPIRED = "HoldExpired"
    RECOVERED = "RecoveredByItself"
    DROPPED = "HoldDropped"


class Dropped(str):
    """The text of why a held restart was dropped, with its `code` (read, never parsed from the text); empty
    (`KEPT`) when it was not."""

    code: DropCode

    def __new__(cls, text: str, code: DropCode = DropCode.DROPPED) -> Dropped:
        self = super().__new__(cls, text)
        self.code = code
        return self


KEPT = Dropped("")
"""A held restart planned again, not dropped."""


def _failed_since(pod: proj.Pod, at: float) -> bool:
    """A container of the pod ended with an error at or after `at` (whole seconds), or the pod failed."""
    if pod.phase == "Failed":
        return True
    for c in pod.containers:
        for term in (c.terminated, c.last_terminated):
            if term is not None and term.exit_code != 0:
                try:
                    if clock_.parse_time(term.finished_at).timestamp() + 1.0 >= at:
                        return True
                except ValueError:
                    return True
    return False


def replan_held(key: str, held: ledgerentries.HeldRestart, snapshot: planinputs.Snapshot, history: planinputs.History,
                rs: settings.RecoverySettings, now: dt.datetime,
                rules_: Sequence[rules.Rule] | None = None) -> tuple[list[st.Step], Dropped]:
    """Plan a held restart again: (steps, why it was dropped). Dropped (no steps) when it expired, when its
    cause cannot be read, or when the workload recovered by itself meanwhile: its faulting pod was replaced
    (by its operator) and no pod of it failed since, or, for a node's fault, none of its pods is left on
    that node. A container restarted in place by its kubelet is no recovery of the job: the pod is still
    there, and the restart of the unit still runs."""
    if now.timestamp() >= held.until:
        return [], Dropped("it was held past recovery.hold_seconds", DropCode.EXPIRED)
    cause = held.event()
    if cause is None:
        return [], Dropped("its cause could not be read")
    workload_uid = key[2:].split(".g")[0]
    if cause.target.kind is model.TargetKind.POD:
        pod = snapshot.pod(cause.target.uid)
        if pod is None or pod.deleting:  # replaced meanwhile: planned again only on a pod failing since
            failing = sorted((p for p in snapshot.pods_of_workload(workload_uid)
                              if not p.deleting and _failed_since(p, held.at)), key=lambda p: (p.namespace, p.name))
            if not failing:
                return [], Dropped("it recovered by itself: its faulting pod was replaced and none failed since",
                                 DropCode.RECOVERED)
            pod = failing[0]
            cause = cause.model_copy(update={"target": model.Target(
                kind=model.TargetKind.POD, namespace=pod.namespace, name=pod.name, uid=pod.uid, node=pod.node)})
    steps = planning.plan(cause, snapshot, history, rs, now, rules_=rules_,
                          judged=held.code == st.Code.AWAITING_VERDICT)
    mine = [s for s in steps if isinstance(s, st.Restart | st.Hold) and _key_of(s) == key]
    if not mine:
        return [], Dropped("the fault no longer calls for a restart of it")
    step = mine[0]
    restart = step.restart if isinstance(step, st.Hold) else step
    if cause.target.kind is not model.TargetKind.POD and restart.node and not any(
            p.node == restart.node for p in snapshot.pods_of_workload(workload_uid) if not p.deleting):
        return [], Dropped(f"none of its pods runs on Node {restart.node} any more")
    if isinstance(step, st.Hold):
        return [st.Hold(step.restart, step.code, step.text, until=min(step.until, held.until))], KEPT
    if held.code == st.Code.AWAITING_CORDON:  # the cordon it waited for did not land: this plan's own first
        return [*(s for s in steps if isinstance(s, st.Cordon) and s.node == restart.node), step], KEPT
    return [step], KEPT



def _key_of(step: st.Restart | st.Hold) -> str:
    return step.restart.unit_key if isinstance(step, st.Hold) else step.unit_key
