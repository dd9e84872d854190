"""The audit: the Kubernetes Event kcover leaves on every object it acted on or refused to act on.

Owns `Audit`, a coordinator hook that turns an outcome into the `Emit` step of its Event (reason a person
can grep, a message saying what was done and why), and `event_body`, which has `kcover.kube.events` (the
one module that builds Event bodies: MicroTime, the namespace rule, the API server's limits) build the
Event on the step's object. Routine refusals (`steps.ROUTINE`) and no-op outcomes
write nothing, so a 1,000-pod job failing at once writes one Event, not 1,000. The Events of a dry run are
rewritten by its gateway (`dryrun`). Pure: the coordinator writes what this returns.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from kcover import kinds, model, settings
from kcover.aio import clock as clock_
from kcover.kube import events, gateway
from kcover.recovery import ledgerentries
from kcover.recovery import steps as st

REPORTING_CONTROLLER = "kcover.io/controller"


def event_body(about: st.ObjectRef, *, reason: str, action: str, message: str, warning: bool,
               now: dt.datetime, controller: str, instance: str) -> events.EventBody:
    """A core/v1 Event on `about`, in its namespace (`default` for cluster-scoped objects): the body, its
    namespace rule and its limits are `kcover.kube.events`', the one module that builds Events."""
    return events.body(about, reason=reason, action=action, message=message, warning=warning, now=now,
                       controller=controller, instance=instance)


def _fault(cause: model.CollectorEvent | None) -> str:
    if cause is None:
        return "a fault"
    return f"{cause.reason} from {cause.detector} on {cause.target.describe()}"


def _why(cause: model.CollectorEvent | None) -> str:
    if cause is None:
        return ""
    return f"after {_fault(cause)}" + (f": {cause.message}" if cause.message else "")


def _verb(step: st.Restart) -> str:
    return "evicted" if step.removal is kinds.Removal.EVICT else "deleted"


def _blamed(blame: model.Blame) -> str:
    return "" if blame is model.Blame.UNKNOWN else f"; blamed on the {blame.value}"


RECORD_ONLY_PREFIX = "record only, nothing was changed"


def record_only_reason(reason: str) -> str:
    """`KcoverCordonedNode` -> `KcoverRecordOnlyCordonedNode`: a reason no real action uses."""
    return model.fit(f"KcoverRecordOnly{reason.removeprefix('Kcover')}", model.NAME_MAX, suffix="")


_VERDICTS = {
    "healthy": ("KcoverSuspectValidated", False, "passed its validation: it stays schedulable, and the evidence "
                                                 "before it no longer counts against it"),
    "faulty": ("KcoverSuspectFailed", True, "failed its validation: kcover cordons it"),
    "unvalidated": ("KcoverSuspectUnvalidated", True, "could not be validated and shows no hardware signal: kcover "
                                                     "leaves it schedulable"),
}


def about_of(step: st.Step) -> st.ObjectRef | None:
    """The object a step's Event goes on."""
    if isinstance(step, st.Restart | st.Hold):
        return (step.restart if isinstance(step, st.Hold) else step).workload
    if isinstance(step, st.Resume):
        return step.restart.workload if step.restart is not None else None
    if isinstance(step, st.Cordon | st.Uncordon | st.TaintDevice | st.UntaintDevice | st.Drain | st.RequestRemediation
                  | st.RequestValidation | st.Judge):
        return st.node_ref(step.node)
    if isinstance(step, st.RecordOnly):
        return about_of(step.step)
    if isinstance(step, st.Refuse | st.Report):
        return step.about
    if isinstance(step, st.CallPerson):
        return step.about
    return None


class Audit:
    """The coordinator hook writing the Event of every outcome a person needs to see."""

    def __init__(self, *, recovery: Callable[[], settings.RecoverySettings]) -> None:
        self._recovery = recovery

    def after(self, step: st.Step, outcome: st.Outcome) -> list[st.Step]:
        if isinstance(step, st.Emit):
            return []
        emit = self._emit(step, outcome)
        return [emit] if emit is not None else []

    def _emit(self, step: st.Step, outcome: st.Outcome) -> st.Emit | None:
        rs = self._recovery()
        about = about_of(step)
        if isinstance(outcome, st.Refused):
            if outcome.code is st.Code.INTENT_REFUSED and isinstance(step, st.Resume):
                ledger_ref = st.ObjectRef("LedgerEntry", gateway.LEDGER_GROUP_VERSION,
                                          ledgerentries.object_name(rs.ledger_name, step.key), rs.ledger_namespace)
                return st.Emit(ledger_ref, "KcoverIntentRefused", "RestartWorkload",
                               f"dropped the pending restart {step.intent.id} under {step.key} (recorded by "
                               f"{step.intent.leader or 'unknown'}): {outcome.text}; nothing was removed")
            if not outcome.audit or (isinstance(step, st.Refuse) and not step.audit) or about is None:
                return None
            return st.Emit(about, "KcoverRecoverySkipped", "Skip",
                           f"{outcome.code.value}: {outcome.text} (fault {_fault(st.cause_of(step))})")
        if isinstance(outcome, st.Held):
            assert isinstance(step, st.Hold)
            until = clock_.rfc3339(dt.datetime.fromtimestamp(outcome.until, dt.UTC))
            return st.Emit(step.restart.workload, "KcoverRecoveryHeld", "Hold",
                           f"{step.restart.what} is held ({outcome.code.value}: {outcome.text}); kcover restarts it "
                           f"once that lifts, unless it recovers by itself, until {until} {_why(step.cause)}"
                           + (f"; one restart covers it and the fault held first ({_fault(outcome.joined)})"
                              if outcome.joined is not None else ""))
        if isinstance(outcome, st.Failed):
            if isinstance(step, st.Resume) and step.restart is not None:
                return st.Emit(step.restart.workload, "KcoverRecoveryFailed", "RestartWorkload",
                               f"could not restart {step.restart.what} within {rs.workload_cooldown_seconds:.0f}s "
                               f"({outcome.error}); the restart was not counted against its budget. Fault: "
                               f"{step.intent.message}")
            return None  # a failed attempt: the intent stays pending and the resume pass tries again
        assert isinstance(outcome, st.Done)
        if outcome.noop:
            return None
        return self._done(step, outcome)

    def _done(self, step: st.Step, outcome: st.Done) -> st.Emit | None:
        rs = self._recovery()
        saved = f"; {outcome.detail}" if outcome.detail else ""
        if isinstance(step, st.RecordOnly):
            inner = step.step
            removed = len(inner.members) if isinstance(inner, st.Restart) else 0
            would = self._done(inner, st.Done(inner, removed=removed))
            if would is None:
                return None
            return st.Emit(would.about, record_only_reason(would.reason),
                           model.fit(f"RecordOnly{would.action}", model.NAME_MAX, suffix=""),
                           f"{RECORD_ONLY_PREFIX} ({step.why}): {would.message}", warning=would.warning)
        if isinstance(step, st.Restart):
            return st.Emit(step.workload, "KcoverRestartedWorkload", "RestartWorkload",
                           f"restarted {step.what}: {_verb(step)} {model.counted(outcome.removed, 'pod')} "
                           f"({step.selector.render()}) {_why(step.cause)}{_blamed(step.blame)}{saved}")
        if isinstance(step, st.Resume) and step.restart is not None:
            r = step.restart
            recorded = clock_.rfc3339(dt.datetime.fromtimestamp(step.intent.at, dt.UTC))
            return st.Emit(r.workload, "KcoverRestartedWorkload", "RestartWorkload",
                           f"restarted {r.what}: {_verb(r)} {model.counted(outcome.removed, 'pod')} ({r.selector.render()}), "
                           f"finishing the restart {step.intent.leader} recorded at {recorded} after "
                           f"{step.intent.message}{saved}")
        if isinstance(step, st.Cordon):
            return st.Emit(st.node_ref(step.node), "KcoverCordonedNode", "CordonNode",
                           f"cordoned Node {step.node} (taint {rs.taint_key}): {step.reason}{_blamed(step.blame)}; "
                           f"{_why(step.cause)}")
        if isinstance(step, st.Uncordon):
            if outcome.detail:
                return st.Emit(st.node_ref(step.node), "KcoverCordonHandedOver", "HandOver",
                               f"Node {step.node}: its fault cleared, but {outcome.detail}; kcover removed only its "
                               "own taint and annotations and left the node as the person left it", warning=False)
            return st.Emit(st.node_ref(step.node), "KcoverUncordonedNode", "UncordonNode",
                           f"un-cordoned Node {step.node}: its fault cleared", warning=False)
        if isinstance(step, st.TaintDevice):
            return st.Emit(st.node_ref(step.node), "KcoverTaintedDevice", "TaintDevice",
                           f"tainted device {step.device.resource_id} on Node {step.node} "
                           f"({rs.device_taints.effect.value}, DeviceTaintRule {outcome.detail}); the node stays "
                           f"schedulable: {step.reason}")
        if isinstance(step, st.UntaintDevice):
            return st.Emit(st.node_ref(step.node) if step.node else st.ObjectRef("DeviceTaintRule",
                                                                                 "resource.k8s.io/v1", outcome.detail),
                           "KcoverUntaintedDevice", "UntaintDevice",
                           f"removed kcover's DeviceTaintRule of device {step.device.resource_id}"
                           + (f" on Node {step.node}" if step.node else "") + f": {step.why}",
                           warning=False)
        if isinstance(step, st.Report) and step.about is not None:
            return st.Emit(step.about, "KcoverFaultReported", "Report", f"{step.cause.detector} reported {step.text}")
        if isinstance(step, st.Drain):
            return st.Emit(st.node_ref(step.node), "KcoverEscalated", "Drain", outcome.detail)
        if isinstance(step, st.RequestRemediation):
            if step.requested:
                return st.Emit(st.node_ref(step.node), "KcoverEscalated", "RequestRemediation",
                               f"asked for remediation of Node {step.node}: label kcover.io/remediation-requested=true "
                               f"and condition KcoverRemediationRequested=True ({step.message})")
            return None
        if isinstance(step, st.CallPerson):
            return st.Emit(step.about, "KcoverEscalated", "Person", step.message)
        if isinstance(step, st.RequestValidation):
            if step.purpose is st.Purpose.SUSPECT:
                return st.Emit(st.node_ref(step.node), "KcoverNodeSuspect", "RequestValidation",
                               f"Node {step.node} is suspect: {step.evidence}. kcover asked its agent to run "
                               f"{outcome.detail or 'a validation'}; the node stays schedulable unless it fails "
                               f"{_why(step.cause)}")
            return st.Emit(st.node_ref(step.node), "KcoverValidation", "RequestValidation",
                           f"before returning Node {step.node} to service kcover asked its agent to run "
                           f"{outcome.detail}")
        if isinstance(step, st.Judge):
            reason, warning, said = _VERDICTS[step.verdict.value]
            return st.Emit(st.node_ref(step.node), reason, "Judge", f"Node {step.node} {said}: {step.text}",
                           warning=warning)
        if isinstance(step, st.LatchBreaker):
            return st.Emit(self._controls(), "KcoverBreakerLatched", "Latch",
                           f"the breaker latched open: {step.reason}. kcover refuses restarts and cordons until a "
                           f"person resets it (`kcover breaker reset`, or annotate this ConfigMap "
                           f"kcover.io/breaker-reset=true); restarts refused meanwhile are held. A reset closes the "
                           f"latch; kcover then refuses restarts and cordons for {rs.breaker_cooldown_seconds:g}s "
                           "(recovery.breaker_cooldown_seconds), plans the held restarts again, and starts the "
                           "breaker's window again at the reset")
        if isinstance(step, st.ResetBreaker):
            return st.Emit(self._controls(), "KcoverBreakerReset", "Reset",
                           f"the breaker was reset on request ({step.requested_at}); {outcome.detail}. kcover refuses "
                           f"restarts and cordons for {rs.breaker_cooldown_seconds:g}s more "
                           "(recovery.breaker_cooldown_seconds), then plans the held restarts again; the breaker's window "
                           "starts again at the reset", warning=False)
        return None

    def _controls(self) -> st.ObjectRef:
        rs = self._recovery()
        return st.ObjectRef("ConfigMap", "v1", rs.controls_name, rs.ledger_namespace)
