"""The coordinator: runs a plan's steps in order through the gateway; hooks observe outcomes and add steps.

Owns the one place steps are carried out. `Coordinator.run(steps)` takes the steps in order, carries each
out with its executor (a restart by `restarting.Restarter`, a cordon here, ...), hands the typed outcome
(`Done`, `Refused`, `Failed`, `Held`) to every hook, and runs the steps the hooks return after the current
ones: the audit's Events, the node ladder after a cordon, the breaker's latch after a breaker refusal,
the records and verification (the counting and the breaker's latch are `hooks`'). Nothing re-enters `run`; no outcome is parsed from a string.

A step whose class `recovery.record_only` names (`RECORD_CLASSES`), or that the plan made `RecordOnly`,
is not carried out: its outcome is `Done` of the `RecordOnly` step, which the audit writes as a
`KcoverRecordOnly...` Event and the records as a `RecordOnly` Recovery.

Executors are idempotent and write only through the gateway, whose fence is the leadership gate: a
replica that lost the Lease gets `errors.NotLeaderError` from its next write, which ends the run and
propagates (the controller cancels the run on a loss anyway). An API error in a step is its `Failed`
outcome, logged, and the next step runs; an Event that cannot be written is logged and never fails what
it records.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import structlog

from kcover import errors, model, settings
from kcover.aio import clock as clock_
from kcover.kube import gateway
from kcover.recovery import (
    admission,
    auditing,
    cordoning,
    devicetainting,
    escalating,
    ledger,
    ledgerentries,
    restarting,
    returning,
)
from kcover.recovery import steps as st
from kcover.recovery.steps import Code

log = structlog.get_logger()

NODE_WRITE_ATTEMPTS = 5
ALREADY_HELD = "the ledger holds this device tainted already"
RO = settings.RecordOnly
RECORD_CLASSES: dict[type, settings.RecordOnly] = {
    st.Restart: RO.RESTART, st.Cordon: RO.CORDON, st.Uncordon: RO.UNCORDON, st.TaintDevice: RO.DEVICE_TAINT,
    st.UntaintDevice: RO.DEVICE_TAINT, st.RequestValidation: RO.VALIDATION, st.Drain: RO.DRAIN,
    st.RequestRemediation: RO.REMEDIATION,
}
"""The step of each `recovery.record_only` class (a Resume finishes a restart already recorded: never held back)."""


def _joined(prior: ledgerentries.HeldRestart | None, cause: model.CollectorEvent) -> model.CollectorEvent | None:
    """The cause of the restart held before this fault (`prior`), if it is another fault's."""
    first = prior.event() if prior is not None else None
    return first if first is not None and first.id != cause.id else None


async def _read_beside(read: Awaitable[gateway.NodeBody], guard: Awaitable[None]) -> gateway.NodeBody:
    """`read` and `guard` at once; the read's answer only once the guard has passed. A guard's error (or this
    task's cancellation) cancels the read, which is then dropped: nothing is acted on without the guard."""
    reading = asyncio.ensure_future(read)
    try:
        await guard
    except BaseException:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reading
        raise
    return await reading


class Hook(Protocol):
    """Observes one outcome; returns the steps that follow from it (run after the current ones)."""

    def after(self, step: st.Step, outcome: st.Outcome) -> Sequence[st.Step]: ...


class Coordinator:
    """Carries out steps; see the module docstring."""

    def __init__(self, gw: gateway.Gateway, ledger_: ledger.Ledger, *, restarter: restarting.Restarter,
                 devices: devicetainting.DeviceTaints, validations: returning.Validations,
                 drainer: escalating.Drainer, recovery: Callable[[], settings.RecoverySettings], clock: clock_.Clock,
                 identity: str, hooks: Sequence[Hook] = ()) -> None:
        self.gateway = gw
        self._ledger = ledger_
        self.restarter = restarter
        self.devices = devices
        self.validations = validations
        self.drainer = drainer
        self._recovery = recovery
        self._clock = clock
        self.identity = identity
        self.hooks: list[Hook] = list(hooks)
        self.outcomes: collections.deque[st.Outcome] = collections.deque(maxlen=1000)
        """The most recent outcomes, newest last (for tests and diagnostics)."""

    async def run(self, steps: Sequence[st.Step]) -> list[st.Outcome]:
        """Carry out `steps` in order, and the steps the hooks add after them; the outcomes, in order."""
        queue = collections.deque(steps)
        out: list[st.Outcome] = []
        while queue:
            step = queue.popleft()
            outcome = await self._carry_out(step)
            out.append(outcome)
            self.outcomes.append(outcome)
            for hook in self.hooks:  # the outcome's step: what was carried out (a Resume with its restart)
                queue.extend(hook.after(outcome.step, outcome))
        return out

    async def _carry_out(self, step: st.Step) -> st.Outcome:
        held_back = RECORD_CLASSES.get(type(step))
        if held_back is not None and held_back in self._recovery().record_only:
            step = st.RecordOnly(step, f"recovery.record_only: {held_back.value}")
        try:
            return await self._execute(step)
        except errors.NotLeaderError:
            raise
        except errors.KubeError as exc:
            log.warning("recovery_step_failed", step=st.name_of(step), error=str(exc)[:300])
            return st.Failed(step, str(exc)[:300])

    async def _execute(self, step: st.Step) -> st.Outcome:
        if isinstance(step, st.RecordOnly):
            log.info("recovery_recorded_only", step=st.name_of(step), why=step.why)
            return st.Done(step, detail=step.why)
        if isinstance(step, st.Restart):
            return await self.restarter.restart(step)
        if isinstance(step, st.Resume):
            return await self.restarter.resume(step)
        if isinstance(step, st.Cordon):
            return await self.cordon(step)
        if isinstance(step, st.EnterCordon):
            return await self.enter_cordon(step)
        if isinstance(step, st.NoteLinkDown):
            return await self.note_link_down(step)
        if isinstance(step, st.Uncordon):
            return await self.uncordon(step)
        if isinstance(step, st.TaintDevice):
            return await self.taint(step)
        if isinstance(step, st.UntaintDevice):
            return await self.untaint(step)
        if isinstance(step, st.Refuse):
            log.info("recovery_refused", code=step.code.value, text=step.text, cause=step.cause.id, audit=step.audit)
            return st.Refused(step, step.code, step.text)
        if isinstance(step, st.Hold):
            return await self.hold(step)
        if isinstance(step, st.Report):
            return st.Done(step)
        if isinstance(step, st.Drain):
            return await self.drain(step)
        if isinstance(step, st.RequestRemediation):
            await escalating.set_remediation(self.gateway, step.node, requested=step.requested, message=step.message,
                                             clock=self._clock)
            return st.Done(step)
        if isinstance(step, st.CallPerson):
            return st.Done(step)
        if isinstance(step, st.RequestValidation):
            return await self.validate(step)
        if isinstance(step, st.Judge):
            return await self.judge(step)
        if isinstance(step, st.LatchBreaker):
            return await self.latch(step)
        if isinstance(step, st.ResetBreaker):
            return await self.reset(step)
        return await self.emit(step)

    # ------------------------------------------------------------------------------------ Events

    async def emit(self, step: st.Emit) -> st.Outcome:
        body = auditing.event_body(step.about, reason=step.reason, action=step.action, message=step.message,
                                   warning=step.warning, now=self._clock.now(),
                                   controller=auditing.REPORTING_CONTROLLER, instance=self.identity)
        try:
            await self.gateway.post_event(body)
        except errors.NotLeaderError:
            raise
        except errors.KubeError as exc:
            log.warning("recovery_event_failed", reason=step.reason, object=step.about.describe(), error=str(exc))
            return st.Failed(step, str(exc)[:300])
        return st.Done(step)

    # ------------------------------------------------------------------------------------ nodes

    async def _rewrite_node(self, name: str, change: Callable[[gateway.NodeBody], tuple[Code, str] | None],
                            *, guard: Awaitable[None] | None = None
                            ) -> tuple[gateway.NodeBody, tuple[Code, str] | None]:
        """Read-modify-write a Node with its resourceVersion as precondition, retrying on 409. `change` edits
        it in place, or returns why not (then nothing is written). `guard`, a check that must pass before
        the Node is written, runs beside the first read: one round trip on the action's path, not two;
        when it raises, nothing is written and its error is the answer."""
        for attempt in range(NODE_WRITE_ATTEMPTS):
            if attempt == 0 and guard is not None:
                node = await _read_beside(self.gateway.get_node(name), guard)
            else:
                node = await self.gateway.get_node(name)
            refused = change(node)
            if refused is not None:
                return node, refused
            try:
                return await self.gateway.replace_node(node), None
            except errors.ConflictError:
                continue
        raise errors.KubeError(f"Node {name}: still conflicting after {NODE_WRITE_ATTEMPTS} attempts", status=409)

    async def cordon(self, step: st.Cordon) -> st.Outcome:
        """The node first (idempotent: a node kcover cordoned already is left as it is), then its ledger entry
        (the node's cooldown and the signal), re-checked there against what another replica wrote. Never the
        other way round: a term ending between the two would leave the cooldown of a cordon that never
        landed, and the successor's replay would be refused by it (a chaos run lost a node fault so)."""
        rs = self._recovery()
        now = self._clock.now()
        key = f"n.{step.node}"
        signal = step.cause.signal
        breaker = self._ledger.breaker()
        replayed = admission.replayed(self._ledger.acted_on(signal, key), signal, f"Node {step.node}")
        refused = replayed or admission.cordon(self._ledger.node(step.node), step.node, rs=rs, now=now.timestamp(),
                                               breaker_state=breaker, load=None)
        if refused is not None:
            return st.Refused(step, refused.code, refused.text)
        ours = cordoning.taints(rs.taint_key, step.cause.reason, no_execute=rs.taint_no_execute,
                                now=clock_.rfc3339(now))
        fault = f"{step.cause.reason} from {step.cause.detector}: {step.reason}"
        # the node is written before its entry: not without a ledger (checked while the node is read)
        _, refusal = await self._rewrite_node(step.node, lambda node: cordoning.cordon(
            node, taint_key=rs.taint_key, ours=ours, reason=fault, now=clock_.rfc3339(now)),
            guard=self._ledger.confirm_served())
        if refusal is not None and refusal[0] is not Code.ALREADY_CORDONED:
            return st.Refused(step, refusal[0], refusal[1])

        def record(entry: ledgerentries.Entry, signals: dict[str, float]) -> str | None:
            assert isinstance(entry, ledgerentries.Node)
            entry.cordoned_at = now.timestamp()
            entry.reason = step.reason[:120]
            if signal:
                signals[f"{signal}|{key}"] = now.timestamp()
            return None

        await self._ledger.update(key, record, now=now.timestamp())
        if refusal is not None:
            return st.Done(step, detail=refusal[1], noop=True)
        log.info("node_cordoned", node=step.node, reason=step.reason, cause=step.cause.id)
        return st.Done(step)

    async def note_link_down(self, step: st.NoteLinkDown) -> st.Outcome:
        """The link-down in the node's ledger entry (fenced, so it outlives this term for the judgement)."""
        now = self._clock.now().timestamp()

        def note(entry: ledgerentries.Entry, signals: dict[str, float]) -> str | None:
            assert isinstance(entry, ledgerentries.Node)
            return None if entry.note_link_down(step.at) else "recorded already"

        already = await self._ledger.update(f"n.{step.node}", note, now=now)
        if already is not None:
            return st.Done(step, detail=already, noop=True)
        log.info("node_link_down_noted", node=step.node, at=step.at)
        return st.Done(step)

    async def enter_cordon(self, step: st.EnterCordon) -> st.Outcome:
        """The ledger entry of a cordon that landed without one; nothing if the entry holds it (or a later one)."""
        now = self._clock.now().timestamp()

        def enter(entry: ledgerentries.Entry, signals: dict[str, float]) -> str | None:
            assert isinstance(entry, ledgerentries.Node)
            if cordoning.entered(entry.cordoned_at, step.at):
                return "the ledger holds this cordon"
            entry.cordoned_at = step.at
            entry.reason = step.reason[:120]
            return None

        if await self._ledger.update(f"n.{step.node}", enter, now=now) is not None:
            return st.Done(step, detail="the ledger holds this cordon", noop=True)
        log.warning("node_cordon_entered", node=step.node, cordoned_at=step.at, reason=step.reason,
                    why="kcover's cordon was on the node without its ledger entry (a term ended between the two)")
        return st.Done(step)

    async def uncordon(self, step: st.Uncordon) -> st.Outcome:
        rs = self._recovery()
        taken = ""

        def change(node: gateway.NodeBody) -> tuple[Code, str] | None:
            nonlocal taken
            refused, taken = cordoning.uncordon(node, taint_key=rs.taint_key)
            return refused

        _, refusal = await self._rewrite_node(step.node, change)
        if refusal is not None:
            return st.Refused(step, refusal[0], refusal[1])
        log.info("node_uncordoned", node=step.node, handed_over=taken or None)
        return st.Done(step, detail=taken)

    # ------------------------------------------------------------------------------------ devices

    async def taint(self, step: st.TaintDevice) -> st.Outcome:
        """The node's ledger entry first (the device taints' caps re-checked there, on the entry as the API
        server holds it), then kcover's DeviceTaintRule: no device is tainted that the ledger does not hold,
        so its caps count it and its bounded life ends it."""
        rs = self._recovery()
        rid = step.device.resource_id
        rule = devicetainting.rule_name(step.device)
        if await self.devices.served_version() is None:
            return self._unserved(step)
        now = self._clock.now().timestamp()
        recent = self._ledger.device_taints_since(now - rs.device_taints.window_seconds)

        def record(entry: ledgerentries.Entry, signals: dict[str, float]) -> admission.Refusal | str | None:
            assert isinstance(entry, ledgerentries.Node)
            if rid in entry.devices:
                return ALREADY_HELD  # a replay, or a write that landed before its rule: the rule is written again
            refused = admission.device_taint(entry, rid, step.node, rs=rs, now=now, breaker_state=self._ledger.breaker(),
                                             recent=recent, load=admission.DeviceLoad())
            if refused is not None:
                return refused
            entry.devices[rid] = ledgerentries.TaintedDevice(step.device, now)
            return None

        refusal = await self._ledger.update(f"n.{step.node}", record, now=now)
        if isinstance(refusal, admission.Refusal):
            return st.Refused(step, refusal.code, refusal.text)
        got = await self.devices.taint(step.device, node=step.node, reason=step.reason, cause=step.cause.id)
        if got is devicetainting.Outcome.UNSERVED:
            await self._forget_device(step.node, rid)
            return self._unserved(step)
        if got is devicetainting.Outcome.FOREIGN:
            log.warning("device_taint_rule_foreign", device=rid, rule=rule)
            await self._forget_device(step.node, rid)
            return st.Done(step, detail=f"a DeviceTaintRule {rule} exists and is not kcover's: left alone", noop=True)
        if got is devicetainting.Outcome.EXISTS:
            return st.Done(step, detail=rule, noop=True)
        log.info("device_tainted", device=rid, node=step.node)
        return st.Done(step, detail=rule)

    def _unserved(self, step: st.TaintDevice) -> st.Outcome:
        return st.Refused(step, Code.DEVICE_TAINTS_UNSERVED,
                          f"the API server stopped serving DeviceTaintRules: device {step.device.resource_id} is "
                          "not tainted; its next fault is answered at node level")

    async def untaint(self, step: st.UntaintDevice) -> st.Outcome:
        """kcover's rule of the device goes (only kcover's), then the ledger's record of it, whatever was found:
        a rule that is gone or not kcover's is no taint kcover holds."""
        got = await self.devices.untaint(step.device)
        await self._forget_device(step.node, step.device.resource_id)
        if got is devicetainting.Outcome.REMOVED:
            log.info("device_untainted", device=step.device.resource_id, node=step.node, why=step.why)
            return st.Done(step, detail=devicetainting.rule_name(step.device))
        return st.Done(step, detail=got.value, noop=True)

    async def _forget_device(self, node: str, rid: str) -> None:
        if not node:
            return

        def forget(entry: ledgerentries.Entry, signals: dict[str, float]) -> str | None:
            assert isinstance(entry, ledgerentries.Node)
            if entry.devices.pop(rid, None) is None:
                return "not held"
            return None

        await self._ledger.update(f"n.{node}", forget, now=self._clock.now().timestamp())

    # ------------------------------------------------------------------------------------ holds

    async def hold(self, step: st.Hold) -> st.Outcome:
        """Keep a refused restart in the ledger, to plan it again when its blocker lifts."""
        now = self._clock.now().timestamp()
        w = step.restart.workload
        held = ledgerentries.HeldRestart(code=step.code.value, text=step.text[:300], at=now, until=step.until,
                                         cause=step.cause.model_dump_json(), workload=f"{w.kind}/{w.namespace}/{w.name}")

        prior: ledgerentries.HeldRestart | None = None

        def keep(entry: ledgerentries.Entry, signals: dict[str, float]) -> str | None:
            nonlocal prior
            assert isinstance(entry, ledgerentries.Unit)
            prior = entry.held
            if entry.held is not None and (entry.held.code, entry.held.until) == (held.code, held.until):
                return "already held"
            entry.held = held if entry.held is None else ledgerentries.HeldRestart(
                code=held.code, text=held.text, at=entry.held.at, until=min(held.until, entry.held.until),
                cause=entry.held.cause, workload=entry.held.workload or held.workload)
            return None

        kept = await self._ledger.update(step.restart.unit_key, keep, now=now) is None
        joined = _joined(prior, step.cause)
        if kept:
            log.info("restart_held", workload=step.restart.what, code=step.code.value, until=round(step.until, 3),
                     joined=joined.id if joined is not None else None)
        return st.Held(step, step.code, step.text, step.until, joined=joined)

    async def drop_hold(self, key: str, why: str) -> None:
        """Forget a held restart (planned again and done, expired, or recovered by itself)."""
        def forget(entry: ledgerentries.Entry, signals: dict[str, float]) -> str | None:
            assert isinstance(entry, ledgerentries.Unit)
            if entry.held is None:
                return "not held"
            entry.held = None
            return None

        if await self._ledger.update(key, forget, now=self._clock.now().timestamp()) is None:
            log.info("restart_hold_dropped", key=key, why=why)

    # ------------------------------------------------------------------------------------ the ladder

    async def drain(self, step: st.Drain) -> st.Outcome:
        esc = self._recovery().escalation
        drain = self.drainer.start(step.node, step.pods, self._clock.now().timestamp() + esc.drain_timeout_seconds)
        await self.drainer.evict(drain)
        return st.Done(step, detail=f"draining Node {step.node} ({esc.drain_mode.value}) through the Eviction API: "
                                    f"{drain.evicted} of {len(step.pods)} pods evicted, {len(drain.waiting)} waiting "
                                    f"(PodDisruptionBudgets; retried for {esc.drain_timeout_seconds:g}s)")

    # ------------------------------------------------------------------------------------ suspects

    async def validate(self, step: st.RequestValidation) -> st.Outcome:
        """A validation; for a suspect, its ledger entry first, with the request's id (so a successor does not
        ask again at once, and reads the answer: `Validations.adopt`)."""
        if step.purpose is not st.Purpose.SUSPECT:
            return await self.validations.ask(step)
        now = self._clock.now().timestamp()
        timeout = self._recovery().judgement.validation_timeout_seconds
        request_id = returning.new_request_id()

        def suspect(entry: ledgerentries.Entry, signals: dict[str, float]) -> str | None:
            assert isinstance(entry, ledgerentries.Node)
            if entry.pending_suspicion() and entry.suspect_at is not None and now - entry.suspect_at < timeout:
                return "already suspect, its validation not answered yet"
            entry.suspect_at, entry.suspicion, entry.request = now, step.evidence[:500], request_id
            return None

        already = await self._ledger.update(f"n.{step.node}", suspect, now=now)
        if already is not None:
            return st.Done(step, detail=already, noop=True)
        return await self.validations.ask(step, request_id=request_id)

    async def judge(self, step: st.Judge) -> st.Outcome:
        now = self._clock.now().timestamp()

        def settle(entry: ledgerentries.Entry, signals: dict[str, float]) -> str | None:
            assert isinstance(entry, ledgerentries.Node)
            entry.judged_at, entry.verdict = now, step.verdict
            return None

        await self._ledger.update(f"n.{step.node}", settle, now=now)
        log.info("node_judged", node=step.node, verdict=step.verdict.value, why=step.text)
        return st.Done(step)

    # ------------------------------------------------------------------------------------ the breaker

    async def latch(self, step: st.LatchBreaker) -> st.Outcome:
        now = self._clock.now().timestamp()

        def open_(entry: ledgerentries.Entry, signals: dict[str, float]) -> str | None:
            assert isinstance(entry, ledgerentries.Breaker)
            if entry.latched:
                return "already latched"
            entry.opened_at, entry.reason = now, step.reason[:250]
            return None

        if await self._ledger.update(ledgerentries.BREAKER_KEY, open_, now=now) is not None:
            return st.Done(step, detail="already latched", noop=True)
        log.warning("breaker_latched", reason=step.reason)
        return st.Done(step)

    async def reset(self, step: st.ResetBreaker) -> st.Outcome:
        now = self._clock.now().timestamp()
        was = ""

        def close(entry: ledgerentries.Entry, signals: dict[str, float]) -> str | None:
            nonlocal was
            assert isinstance(entry, ledgerentries.Breaker)
            if entry.reset_request == step.requested_at:
                return "this request was acted on already"
            entry.reset_request = step.requested_at
            if not entry.latched:
                return None  # remembered, so it is not looked at again; nothing to close
            was = entry.reason
            entry.opened_at, entry.reason, entry.closed_at = None, "", now
            return None

        if await self._ledger.update(ledgerentries.BREAKER_KEY, close, now=now) is not None or not was:
            return st.Done(step, detail="the breaker was not latched", noop=True)
        log.info("breaker_reset", by="request", was=was)
        return st.Done(step, detail=f"it had latched open: {was}")
