"""The coordinator's own hooks: counting every outcome, and latching the breaker after it refused.

Owns `Counting` (`kcover_actions_total{action,result}`, the node ladder's `kcover_escalation_steps_total`,
and the fault-to-action histogram, timed on the cause's `observed_at` against the controller's clock) and
`Breaker` (after a `BreakerOpen` refusal, with `recovery.breaker_latch`, a `LatchBreaker` step saying what
tripped it). Each is a `coordinating.Hook`: it observes one outcome and returns the steps that follow. No
I/O of their own: metrics are in-process, the latch is a step the coordinator carries out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client import Counter

from kcover import metrics, settings
from kcover.aio import clock as clock_
from kcover.recovery import steps as st
from kcover.recovery.steps import Code


class Counting:
    """The hook counting every outcome (`kcover_actions_total{action,result}`), the node ladder's steps
    (`kcover_escalation_steps_total`), and timing fault to action."""

    def __init__(self, metrics_: metrics.Metrics, clock: clock_.Clock, *, escalation: Counter | None = None) -> None:
        self._metrics = metrics_
        self._clock = clock
        self._escalation = escalation

    def after(self, step: st.Step, outcome: st.Outcome) -> Sequence[st.Step]:
        if isinstance(step, st.Emit):
            return ()
        self._metrics.actions.labels(action=st.name_of(step), result=st.result_of(outcome)).inc()
        cause = st.cause_of(step)
        if isinstance(outcome, st.Done) and not outcome.noop and cause is not None \
                and isinstance(step, st.Restart | st.Cordon | st.TaintDevice):
            self._metrics.fault_to_action.observe(max((self._clock.now() - cause.observed_at).total_seconds(), 0.0))
        if self._escalation is not None and isinstance(outcome, st.Done) and not outcome.noop:
            rung = {st.Cordon: "cordon", st.Drain: "drain", st.CallPerson: "person"}.get(type(step))
            if isinstance(step, st.RequestRemediation) and step.requested:
                rung = "remediation"
            if rung is not None:
                self._escalation.labels(ladder="node", step=rung).inc()
        return ()


class Breaker:
    """The hook that latches the breaker once it refused (`recovery.breaker_latch`), saying what tripped it."""

    def __init__(self, *, recovery: Callable[[], settings.RecoverySettings], latched: Callable[[], bool]) -> None:
        self._recovery = recovery
        self._latched = latched

    def after(self, step: st.Step, outcome: st.Outcome) -> Sequence[st.Step]:
        if not isinstance(outcome, st.Refused | st.Held) or outcome.code is not Code.BREAKER_OPEN:
            return ()
        cause = st.cause_of(step)
        if not self._recovery().breaker_latch or self._latched() or cause is None:
            return ()
        return (st.LatchBreaker(reason=outcome.text, cause=cause),)
