"""The executor with the loop closed: controls before every action, verification and escalation after.

Owns the order around `executing.Executor`'s writes, not the writes themselves:

* before an action: the operator controls (`controls.Controls`: a pause at any scope, a latched
  breaker or its cooldown) refuse it with an audited `KcoverRecoverySkipped`; before a restart, the
  workload ladder (`escalating.Repeats`) may cordon the faulting node first, so the job restarts
  elsewhere;
* an un-cordon waits for the node's validation when `recovery.return_validation` asks for one
  (`returning.Returner`: a pass un-cordons, a failure climbs the node ladder again);
* after it: a restart done is followed until the workload runs again (`verifying.Verifier`); a
  cordon done climbs the node ladder (drain, remediation request, a person); an un-cordon takes
  the remediation request back; a breaker refusal latches the breaker (`recovery.breaker_latch`);
  a budget refusal counts as the workload ladder's last step.

`tick()` is the periodic part (the leader's pass every `recovery.resume_interval_seconds`): Stalled
recoveries, the Events of verified ones, drains a PodDisruptionBudget held back. It decides nothing
the policy decides and fails as the executor does (errors propagate to the engine, which logs them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import structlog

from kcover import errors, model, settings
from kcover.kube import caching
from kcover.kube import client as kube_client
from kcover.recovery import (
    actions,
    controls,
    escalating,
    executing,
    ledger,
    policy,
    recording,
    returning,
    verifying,
)

log = structlog.get_logger()

ESCALATED = "KcoverEscalated"
Outcome = executing.Outcome


def _about(action: actions.Action) -> actions.ObjectRef | None:
    if isinstance(action, actions.RestartWorkload):
        return action.workload
    if isinstance(action, actions.CordonNode | actions.UncordonNode | actions.TaintDevice | actions.UntaintDevice):
        return policy.node_ref(action.node)
    if isinstance(action, actions.Skip | actions.RecordOnly):
        return action.about
    return None


class Overseer(executing.Executor):
    """`executing.Executor` plus controls, verification and the escalation ladder."""

    def __init__(self, kube: kube_client.KubeClient, snapshot: policy.ClusterSnapshot, ledger_: ledger.Ledger, *,
                 cache: caching.ClusterCache | None, **kwargs: Any) -> None:
        super().__init__(kube, snapshot, ledger_, **kwargs)
        self.verify_metrics = verifying.VerifyMetrics(self._metrics.registry)
        self.recorder = recording.Recorder(kube, recording.RecordMetrics(self._metrics.registry),
                                           recovery=lambda: self.settings, clock=self._clock,
                                           identity=self.identity, is_leader=self._is_leader, fence=self._fence)
        """The Recovery resources: noted here after each action, written by `recorder.run()` in its own task."""
        self.verifier = verifying.Verifier(cache, self.verify_metrics, settings_=lambda: self.settings.verify,
                                           emit=self.emit, on_end=self._verified)
        self.controls = controls.Controls(kube, snapshot, recovery=lambda: self.settings, clock=self._clock,
                                          is_leader=self._is_leader, fence=self._fence, emit=self.emit)
        self.repeats = escalating.Repeats()
        self.drainer = escalating.Drainer(kube, is_leader=self._is_leader, fence=self._fence)
        self.returner = returning.Returner(kube, snapshot, recovery=lambda: self.settings, metrics_=self._metrics,
                                           clock=self._clock, emit=self.emit, uncordon=self.execute,
                                           escalate=self._validation_failed, fence=self._fence)

    def _step(self, ladder: str, step: str) -> None:
        self.verify_metrics.steps.labels(ladder=ladder, step=step).inc()

    async def execute(self, action: actions.Action) -> executing.Result:
        refusal = await self.controls.refusal(action)
        if refusal is not None:
            code, text = refusal
            prefix = "dry run: " if self.settings.dry_run else ""
            return await self._refuse(action, code, prefix + text, _about(action))
        if isinstance(action, actions.UncordonNode) and self.returner.wanted(action):
            return await self.returner.ask(action)
        if isinstance(action, actions.RestartWorkload):
            await self._cordon_if_repeating(action)
            before = self._members(action) if self.settings.verify.enabled else []
            try:
                result = await super().execute(action)
            except errors.KubeError as exc:  # the delete failed: the intent stays pending, resumed later
                self.recorder.note(action, recording.Phase.ACTING, cause="DeleteFailed",
                                   message=f"the delete failed and is retried: {exc}")
                raise
            if result.outcome is Outcome.DONE:
                self._step("workload", "restart")
                if self.settings.verify.enabled:
                    self._follow(action, before)
                self._record_restart(action, result)
            return result
        result = await super().execute(action)
        if result.outcome is Outcome.DONE and isinstance(action, actions.CordonNode | actions.UncordonNode):
            self.recorder.note(action, recording.Phase.RECOVERED, message=f"{recording.decision(action)} done")
        if isinstance(action, actions.Skip):
            await self._after_skip(action)
        elif isinstance(action, actions.CordonNode) and result.outcome in (Outcome.DONE, Outcome.DRY_RUN):
            await self._node_ladder(action, dry_run=result.outcome is Outcome.DRY_RUN)
        elif isinstance(action, actions.UncordonNode) and result.outcome is Outcome.DONE:
            await self._withdraw_remediation(action.node)
        return result

    # ----------------------------------------------------------------------------------- records

    async def skip(self, action: actions.Skip) -> executing.Result:
        result = await super().skip(action)
        if action.audit and action.about is not None:
            self.recorder.note(action, recording.Phase.REFUSED, cause=action.code.value, message=action.text)
        return result

    def _record_restart(self, action: actions.RestartWorkload, result: executing.Result) -> None:
        verified = self.settings.verify.enabled
        self.recorder.note(action, recording.Phase.VERIFYING if verified else recording.Phase.RECOVERED,
                           cause="" if verified else "NotVerified",
                           message=f"deleted {result.deleted} pods" + ("" if verified else
                                                                       "; recovery.verify.enabled is off"))

    def _verified(self, record: verifying.Record) -> None:
        if record.outcome is verifying.Outcome.STALLED:
            cause = record.cause.value if record.cause is not None else ""
            self.recorder.phase(record.key, recording.Phase.STALLED, at=record.at, cause=cause, message=record.detail)
        else:
            finished = record.outcome is verifying.Outcome.FINISHED
            self.recorder.phase(record.key, recording.Phase.RECOVERED, at=record.at, mttr_seconds=record.mttr_seconds,
                                cause="Finished" if finished else "",
                                message="the workload finished after its restart" if finished else
                                "every pod Running again with a new uid")

    async def resume(self) -> list[executing.Result]:
        """`Executor.resume()`, then the records of what it did: a restart finished is followed like any
        other, one given up is Failed, an intent the cluster disagreed with is Refused."""
        pending = self._ledger.pending()
        results = await super().resume()
        for result in results:
            action = result.action
            if not isinstance(action, actions.RestartWorkload):
                continue
            if result.outcome is Outcome.DONE:
                intent = pending.get(action.ledger_key)
                if self.settings.verify.enabled and intent is not None:
                    self._follow_resumed(action, intent)
                self._record_restart(action, result)
            elif result.detail.startswith("failed:"):
                self.recorder.note(action, recording.Phase.FAILED, cause="DeleteFailed",
                                   message=result.detail.removeprefix("failed: "))
            elif result.detail.startswith("refused:"):
                self.recorder.note(action, recording.Phase.REFUSED, cause=actions.SkipCode.INTENT_REFUSED.value,
                                   message=result.detail.removeprefix("refused: "), acted=False)
        return results

    def _follow_resumed(self, action: actions.RestartWorkload, intent: ledger.Intent) -> None:
        now = self._clock.now().timestamp()
        what = action.workload.describe() + (f" {action.unit}" if action.unit else "")
        self.verifier.follow(verifying.Followed(
            key=action.ledger_key, workload=action.workload, selector=action.selector, what=what,
            old_uids=frozenset(intent.uids), expected=len(intent.uids), fault_at=intent.at, restarted_at=now,
            deadline=now + self.settings.verify.deadline_seconds, fault=intent.message), lambda: self._clock.now().timestamp())

    # ----------------------------------------------------------------------------------- verification

    def _follow(self, action: actions.RestartWorkload, before: Sequence[Any]) -> None:
        now = self._clock.now().timestamp()
        node = ""
        if action.pod is not None:
            pod = self._snapshot.pod(action.pod.uid)
            node = pod.node if pod is not None else ""
        what = action.workload.describe() + (f" {action.unit}" if action.unit else "")
        cause = action.cause
        self.verifier.follow(verifying.Followed(
            key=action.ledger_key, workload=action.workload, selector=action.selector, what=what,
            old_uids=frozenset(p.uid for p in before), expected=len(before),
            fault_at=cause.observed_at.timestamp(), restarted_at=now,
            deadline=now + self.settings.verify.deadline_seconds,
            fault=f"{cause.reason} from {cause.detector}", node=node), lambda: self._clock.now().timestamp())

    async def tick(self) -> None:
        """The periodic pass: Stalled recoveries and the Events of ended ones; drains held back by a budget."""
        if not self._is_leader():
            return
        now = self._clock.now().timestamp()
        await self.verifier.flush(now)
        await self.returner.tick(now)
        for drain in await self.drainer.tick(now):
            about = policy.node_ref(drain.node)
            if drain.waiting:
                await self.emit(about, reason=ESCALATED, action="Drain", warning=True,
                                message=f"drain of Node {drain.node} gave up after "
                                        f"{self.settings.escalation.drain_timeout_seconds:g}s: {drain.evicted} pods "
                                        f"evicted, {len(drain.waiting)} still there (last refusal: {drain.refused})")
            else:
                await self.emit(about, reason=ESCALATED, action="Drain", warning=False,
                                message=f"drain of Node {drain.node} done: {drain.evicted} pods evicted")

    # ----------------------------------------------------------------------------------- workload ladder

    async def _cordon_if_repeating(self, action: actions.RestartWorkload) -> None:
        esc = self.settings.escalation
        if esc.repeat_count <= 0:
            return
        node = action.cause.target.node
        if action.pod is not None:
            pod = self._snapshot.pod(action.pod.uid)
            node = pod.node if pod is not None else node
        if not node:
            return
        now = self._clock.now()
        count = self.repeats.record(action.workload.uid, node, now.timestamp(), esc.repeat_window_seconds)
        if count < esc.repeat_count:
            return
        self.repeats.forget(action.workload.uid, node)
        history = self._ledger.history(dry_run=self.settings.dry_run)
        planned = policy.cordon_for(action.cause, self._snapshot, history, self.settings, now, node)
        for step in planned:
            if isinstance(step, actions.CordonNode):
                self._step("workload", "cordon_elsewhere")
                await self.emit(action.workload, reason=ESCALATED, action="CordonAndRestartElsewhere", warning=True,
                                message=f"{action.workload.describe()} failed on Node {node} {count} times within "
                                        f"{esc.repeat_window_seconds:g}s: kcover cordons the node so the restart "
                                        "lands elsewhere")
            await self.execute(step)

    async def _after_skip(self, action: actions.Skip) -> None:
        if action.code is actions.SkipCode.BUDGET_EXHAUSTED:
            self._step("workload", "stop")
        elif action.code is actions.SkipCode.BREAKER_OPEN and await self.controls.trip(action):
            rs = self.settings
            self._metrics.breaker_open.set(1)
            about = actions.ObjectRef("ConfigMap", "v1", rs.controls_name, rs.ledger_namespace)
            await self.emit(about, reason="KcoverBreakerLatched", action="Latch", warning=True,
                            message=f"{'dry run: ' if rs.dry_run else ''}the breaker latched open: {action.text}. "
                                    "kcover refuses restarts and cordons until a person resets it "
                                    f"(`kcover breaker reset`, or annotate this ConfigMap {controls.BREAKER_RESET}=true)")

    # ----------------------------------------------------------------------------------- node ladder

    async def _node_ladder(self, action: actions.CordonNode, *, dry_run: bool) -> None:
        esc = self.settings.escalation
        node = action.node
        about = policy.node_ref(node)
        if dry_run:
            steps = [f"drain ({esc.drain_mode.value})"] if esc.drain_mode is not settings.DrainMode.NONE else []
            steps += ["request remediation"] if esc.remediation_enabled else []
            await self.emit(about, reason=ESCALATED, action="DryRunEscalate",
                            message=f"dry run: after the cordon of Node {node} kcover would "
                                    f"{', '.join([*steps, 'call a person'])}")
            return
        self._step("node", "cordon")
        done = ["cordoned"]
        if esc.drain_mode is not settings.DrainMode.NONE:
            pods = escalating.drain_candidates(self._snapshot, node, esc.drain_mode)
            drain = self.drainer.start(node, pods, self._clock.now().timestamp() + esc.drain_timeout_seconds)
            await self.drainer.evict(drain)
            self._step("node", "drain")
            await self.emit(about, reason=ESCALATED, action="Drain", warning=True,
                            message=f"draining Node {node} ({esc.drain_mode.value}) through the Eviction API: "
                                    f"{drain.evicted} of {len(pods)} pods evicted, {len(drain.waiting)} waiting "
                                    f"(PodDisruptionBudgets; retried for {esc.drain_timeout_seconds:g}s)")
            done.append(f"drain ({esc.drain_mode.value}) started")
        if esc.remediation_enabled:
            await escalating.set_remediation(self._kube, node, requested=True, clock=self._clock, fence=self._fence,
                                             message=f"kcover cordoned the node: {action.reason}")
            self._step("node", "remediation")
            await self.emit(about, reason=ESCALATED, action="RequestRemediation", warning=True,
                            message=f"asked for remediation of Node {node}: label {escalating.REMEDIATION_LABEL}=true "
                                    f"and condition {escalating.REMEDIATION_CONDITION}=True")
            done.append("remediation requested")
        self._step("node", "person")
        back = ("kcover returns it to service once its fault has stayed cleared" if self.settings.uncordon_enabled
                else "recovery.uncordon_enabled is off: a person returns it to service")
        await self.emit(about, reason=ESCALATED, action="Person", warning=True,
                        message=f"Node {node}: {', '.join(done)}; a person should repair it ({back})")

    async def _validation_failed(self, action: actions.UncordonNode, why: str) -> None:
        """A node that failed its return-to-service validation climbs the node ladder again."""
        cause = action.cause or model.CollectorEvent(
            detector="kcover-validation", severity=model.Severity.ERROR, reason="ValidationFailed", message=why,
            target=model.Target(kind=model.TargetKind.NODE, name=action.node, node=action.node))
        cordon = actions.CordonNode(node=action.node, reason=f"validation failed: {why}", cause=cause)
        await self._node_ladder(cordon, dry_run=False)

    async def _withdraw_remediation(self, node: str) -> None:
        if not self.settings.escalation.remediation_enabled:
            return
        await escalating.set_remediation(self._kube, node, requested=False, clock=self._clock, fence=self._fence,
                                         message="kcover returned the node to service")
