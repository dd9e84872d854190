"""The recovery engine: a batch of faults in, planned and carried out while leading; the leader's periodic pass.

Owns what is in flight and the order of things. `handle(batch)` reads the ledger (once per term), plans
every event of the batch first (`planning.plan`), reserving each planned restart, cordon and device taint
before the next event is planned, with no `await` in between, so events of one batch never both see the
last free slot of a limit (five simultaneous node faults with a limit of one cordon one node); then it carries the
plans out concurrently, one `coordinating.Coordinator.run` per event. A restart's reservation ends with
its run; a cordon's once the cache shows the node cordoned; a device taint's with its run (the ledger
holds a done one, and its caps count it from there).

A fault whose first write failed before anything was recorded (the ledger's write during an API outage,
the ledger's kind not served) is kept (`keeping`) and handled again by `tick()` with backoff, until it succeeds, is
superseded, or passes `recovery.retry_seconds`; then it ends with a `KcoverRecoveryFailed` Event and
`kcover_faults_given_up_total`. Nothing is lost silently.

`tick()` is the leader's periodic pass (`recovery.resume_interval_seconds`): a person's breaker reset,
kcover's cordons found on nodes without their ledger entry (entered, as on each load of the ledger), the
pending intents (`restarting.resume_steps`), the held restarts (`holding.replan_held`), the pods that came
to a node kcover just cordoned after its plan (`latearrivals`), the
verifications' Events, the validations' answers, the drains, the device taints held past
`recovery.device_taints.max_hold_seconds` (removed, with an Event), and the retried faults. The engine is
called only while leading (the controller cancels its work when the Lease is lost); losing it mid-way
surfaces as `errors.NotLeaderError` from the gateway's fence, which propagates to the controller.

Failures: an API error of one event is logged and counted (`counts["errors"]`) and never ends the batch;
`counts` and `outcomes` expose what happened for tests and `kcover bench`.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
from collections.abc import Callable, Sequence

import structlog
from prometheus_client import Counter, Gauge

from kcover import codec, errors, metrics, model, settings
from kcover.aio import clock as clock_
from kcover.kube import projections as proj
from kcover.recovery import (
    controls,
    coordinating,
    cordoning,
    devicetainting,
    escalating,
    holding,
    keeping,
    latearrivals,
    ledger,
    ledgerentries,
    planinputs,
    planning,
    restarting,
    rules,
    targets,
    verifying,
)
from kcover.recovery import steps as st

log = structlog.get_logger()

CORDON_RESERVATION_SECONDS = 60.0
"""A done cordon stays reserved until the cache shows the node cordoned, or this long at most."""
ENTRY_SETTLE_SECONDS = 30.0
"""The periodic pass enters a cordon found without its ledger entry once it is this old (its own write
follows the Node's within milliseconds unless it failed)."""

class EngineMetrics:
    def __init__(self, m: metrics.Metrics) -> None:
        self.given_up = Counter("kcover_faults_given_up", "Faults kcover could not act on before "
                                "recovery.retry_seconds passed (their first write, or their planning, kept failing), "
                                "each with a "
                                "KcoverRecoveryFailed Event.", registry=m.registry)
        self.ledger_available = Gauge("kcover_ledger_available", "1 while the recovery ledger (LedgerEntry objects) "
                                      "can be read; 0 while its kind is not served: kcover then acts on nothing.",
                                      registry=m.registry)
        self.held = Gauge("kcover_restarts_held", "Restarts held for a blocker that lifts (pause, cooldown, budget, "
                          "breaker), planned again when it does.", registry=m.registry)
        self.ledger_available.set(1)


class RecoveryEngine:
    """Plans and carries out recovery for the leader. One per controller."""

    def __init__(self, snapshot: planinputs.Snapshot, ledger_: ledger.Ledger, coordinator: coordinating.Coordinator, *,
                 recovery: Callable[[], settings.RecoverySettings], clock: clock_.Clock, metrics_: metrics.Metrics,
                 devices: devicetainting.DeviceTaints, verifier: verifying.Verifier | None = None,
                 on_hold_dropped: Callable[[str, ledgerentries.HeldRestart, holding.Dropped], None] | None = None,
                 agent_condition: str = codec.AGENT_CONDITION_TYPE) -> None:
        self._snapshot = snapshot
        self._agent_condition = agent_condition
        self._on_hold_dropped = on_hold_dropped
        """Told (ledger key, the held entry, why with its code) when a held restart is dropped without
        running: the Recovery it left `Held` is moved on, whichever leader held it."""
        self.ledger = ledger_
        self.coordinator = coordinator
        self._recovery = recovery
        self._clock = clock
        self._metrics = metrics_
        self.engine_metrics = EngineMetrics(metrics_)
        self._devices = devices
        self._verifier = verifier
        self._rules = rules.parse_rules(recovery().rules)
        self._restarting: collections.Counter[str] = collections.Counter()
        """Unit key -> restarts of it planned and not finished."""
        self._cordoning: dict[str, float] = {}
        """Node -> when its cordon was planned, until the cache shows it cordoned."""
        self._cordoned_not_seen: set[str] = set()
        """Those of `_cordoning` whose cordon the API server took."""
        self._tainting: collections.Counter[tuple[str, str]] = collections.Counter()
        """(resourceID, node) -> device taints of it planned and not finished (the ledger holds a done one)."""
        self._suspecting: collections.Counter[str] = collections.Counter()
        """Nodes whose suspect validation a plan asked and the coordinator has not yet carried out."""
        self.kept = keeping.KeptFaults()
        """Faults to handle again (their first write failed before anything was recorded)."""
        self._expiry_recorded: set[str] = set()
        """resourceIDs whose removal past `device_taints.max_hold_seconds` was recorded only (record-only mode)."""
        self._unavailable_said = False
        self.ledger_problem = ""
        """Why the ledger cannot be used now ("" while it can): what /readyz says of it."""
        self.counts: collections.Counter[str] = collections.Counter()
        self._ticking = asyncio.Lock()
        self._late = latearrivals.LateArrivals()

    @property
    def outcomes(self) -> collections.deque[st.Outcome]:
        return self.coordinator.outcomes

    @property
    def in_flight_restarts(self) -> int:
        return sum(self._restarting.values())

    def reconfigure(self, recovery: settings.RecoverySettings) -> None:
        """Apply reloaded rules (validated first: `errors.ConfigError` keeps the old ones)."""
        self._rules = rules.parse_rules(recovery.rules)

    def _history(self) -> planinputs.History:
        cordoned = set(self._snapshot.kcover_cordons(self._recovery().taint_key))
        now = self._clock.monotonic()
        for node, at in list(self._cordoning.items()):
            if node in cordoned or now - at > CORDON_RESERVATION_SECONDS:
                del self._cordoning[node]
        self._cordoned_not_seen &= set(self._cordoning)
        return planinputs.History(ledger=self.ledger, restarts_in_flight=dict(self._restarting),
                                cordons_in_flight=frozenset(self._cordoning),
                                cordons_written=frozenset(self._cordoned_not_seen),
                                device_taints_served=self._devices.known_served,
                                device_taints_in_flight={rid: node for rid, node in self._tainting},
                                suspects_in_flight=frozenset(self._suspecting),
                                agent_condition=self._agent_condition)

    async def _ready(self, batch: Sequence[model.CollectorEvent] = ()) -> bool:
        """The ledger is loaded (and, for a batch with a DRA device's fault, device taint discovery fresh);
        False when the ledger cannot be read."""
        fresh = not self.ledger.loaded
        try:
            await self.ledger.ensure_loaded()
        except errors.NotLeaderError:
            raise
        except errors.KubeError as exc:
            log.warning("recovery_ledger_unreadable", error=str(exc)[:300])
            return False
        except errors.LedgerUnavailable as exc:
            await self._unavailable(exc)
            return False
        if fresh:
            # a load starts a term (or follows the ledger's return): every cordon found counts; one still
            # writing its own entry meanwhile is entered twice at worst, to the same effect
            await self._enter_cordons(settled=0.0)
        if self._unavailable_said:
            log.info("recovery_ledger_available")
            self._unavailable_said = False
            await self.say(st.Emit(self.controls_ref(), "KcoverLedgerAvailable", "Resume",
                                    "kcover's ledger (LedgerEntry objects) is served again: recovery resumes, the "
                                    "faults kept meanwhile first", warning=False))
        self.ledger_problem = ""
        self.engine_metrics.ledger_available.set(1)
        dra = [e for e in batch if e.fault.dra is not None and not e.cleared]
        if self._recovery().device_taints.enabled and dra and await self._devices.served_version() is None:
            self._metrics.device_taint_fallbacks.inc(len(dra))
            if not self._devices.unserved_said:
                self._devices.unserved_said = True
                node = dra[0].target.node or dra[0].target.name
                await self.say(st.Emit(st.node_ref(node), "KcoverDeviceTaintsUnavailable", "FallBack",
                                        "the API server serves no DeviceTaintRules (resource.k8s.io, KEP-5055): "
                                        f"device {dra[0].fault.dra.resource_id if dra[0].fault.dra else ''} and "
                                        "later device faults are answered at node level"))
        return True

    async def _enter_cordons(self, *, settled: float) -> None:
        """Enter in the ledger the cordons of kcover's found on nodes whose entry lacks them (`st.EnterCordon`):
        the Node is written before its entry, so a term that ended between the two, or an entry write that
        failed, left a cordon the node's cooldown and the breaker's window did not count. Only cordons recent
        enough for either to count, and at least `settled` seconds old (so no cordon of this term is still
        writing its entry). The annotation can be written by whoever may write the Node: entering a forged one
        only holds kcover back (a cooldown, one more cordon in the window), never moves a node."""
        rs = self._recovery()
        now = self._clock.now().timestamp()
        counts_since = now - max(rs.node_cooldown_seconds, rs.breaker_window_seconds)
        found: list[st.Step] = []
        for name in self._snapshot.cordoned_by_kcover():
            node = self._snapshot.node(name)
            landed = cordoning.landed_at(node, rs.taint_key) if node is not None else None
            if node is None or landed is None or landed < counts_since or now - landed < settled:
                continue
            entry = self.ledger.node(name)
            if not cordoning.entered(entry.cordoned_at if entry is not None else None, landed):
                found.append(st.EnterCordon(node=name, at=min(landed, now),
                                            reason=proj.get(node.annotations, proj.CORDON_REASON)))
        if not found:
            return
        try:
            await self.coordinator.run(found)
        except errors.LedgerUnavailable as exc:  # its CRD went away since it was read: said, and entered later
            await self._unavailable(exc)

    async def _unavailable(self, exc: errors.LedgerUnavailable) -> None:
        """The ledger's kind is not served: said once (log, Event, `kcover_ledger_available` 0, readiness)."""
        self.ledger_problem = str(exc)
        self.engine_metrics.ledger_available.set(0)
        if not self._unavailable_said:
            self._unavailable_said = True
            log.error("recovery_ledger_unavailable", error=str(exc))
            await self.say(st.Emit(self.controls_ref(), "KcoverLedgerUnavailable", "Refuse",
                                    f"kcover acts on nothing while its ledger cannot be read: {exc}"))

    async def say(self, emit: st.Emit) -> None:
        try:
            await self.coordinator.run([emit])
        except errors.KubeError as exc:
            log.warning("recovery_event_failed", reason=emit.reason, error=str(exc))

    def controls_ref(self) -> st.ObjectRef:
        rs = self._recovery()
        return st.ObjectRef("ConfigMap", "v1", rs.controls_name, rs.ledger_namespace)

    # ------------------------------------------------------------------------------------ faults

    async def handle(self, batch: Sequence[model.CollectorEvent]) -> None:
        """Plan every event of the batch (reserving as it goes), then carry the plans out concurrently."""
        self.counts["events"] += len(batch)
        if not await self._ready(batch):
            for event in batch:
                self._keep(event, "the recovery ledger cannot be read")
            return
        rs = self._recovery()
        now = self._clock.now()
        plans: list[tuple[model.CollectorEvent, list[st.Step]]] = []
        for event in batch:
            try:
                planned = planning.plan(event, self._snapshot, self._history(), rs, now, rules_=self._rules)
            except Exception as exc:  # one event a defect cannot plan must not end recovery for the batch's others
                self.counts["errors"] += 1
                log.exception("recovery_event_crashed", cause=event.id, stage="plan")
                self._keep(event, f"planning it raised {exc!r}, a defect in kcover")
                continue
            self._reserve(planned)
            plans.append((event, planned))
        try:
            async with asyncio.TaskGroup() as tg:
                for event, planned in plans:
                    tg.create_task(self._carry_out(event, planned), name=f"recovery:{event.id}")
        except BaseExceptionGroup as group:  # the term ended mid-batch: the controller holds the batch again
            lost = group.subgroup(errors.NotLeaderError)
            raise (lost.exceptions[0] if lost is not None else group.exceptions[0]) from None

    def _reserve(self, planned: Sequence[st.Step]) -> None:
        for step in planned:
            if isinstance(step, st.Restart):
                self._restarting[step.unit_key] += 1
            elif isinstance(step, st.Cordon):
                self._cordoning[step.node] = self._clock.monotonic()
                self._cordoned_not_seen.discard(step.node)
            elif isinstance(step, st.TaintDevice):
                self._tainting[(step.device.resource_id, step.node)] += 1
            elif isinstance(step, st.RequestValidation) and step.purpose is st.Purpose.SUSPECT:
                self._suspecting[step.node] += 1

    def _release(self, planned: Sequence[st.Step], outcomes: Sequence[st.Outcome]) -> None:
        for step in planned:
            if isinstance(step, st.Restart):
                self._restarting[step.unit_key] -= 1
                if self._restarting[step.unit_key] <= 0:
                    del self._restarting[step.unit_key]
            elif isinstance(step, st.TaintDevice):  # done or not, the ledger now holds what landed
                key = (step.device.resource_id, step.node)
                self._tainting[key] -= 1
                if self._tainting[key] <= 0:
                    del self._tainting[key]
            elif isinstance(step, st.RequestValidation) and step.purpose is st.Purpose.SUSPECT:
                self._suspecting[step.node] -= 1  # done or not, the ledger now holds the suspicion (or none)
                if self._suspecting[step.node] <= 0:
                    del self._suspecting[step.node]
        done = {o.step.node for o in outcomes if isinstance(o, st.Done) and isinstance(o.step, st.Cordon)}
        for step in planned:
            if isinstance(step, st.Cordon) and step.node not in done:
                self._cordoning.pop(step.node, None)
            elif isinstance(step, st.Cordon) and step.node in self._cordoning:
                self._cordoned_not_seen.add(step.node)

    async def _carry_out(self, event: model.CollectorEvent, planned: list[st.Step]) -> None:
        outcomes: list[st.Outcome] = []
        try:
            outcomes = await self.coordinator.run(planned)
        except errors.NotLeaderError:
            raise
        except errors.LedgerUnavailable as exc:  # its CRD went away under a running controller
            self._keep(event, str(exc))
            await self._unavailable(exc)
        except Exception as exc:  # task boundary: one bad event must not end recovery
            self.counts["errors"] += 1
            log.exception("recovery_event_crashed", cause=event.id, stage="carry_out")
            self._keep(event, f"carrying it out raised {exc!r}, a defect in kcover")
        finally:
            self._release(planned, outcomes)
        self._late.watch(outcomes, self._clock.monotonic())
        for outcome in outcomes:
            self.counts[f"{st.name_of(outcome.step)}:{st.result_of(outcome)}"] += 1
            if isinstance(outcome, st.Failed) and not outcome.recorded \
                    and isinstance(outcome.step, st.Restart | st.Cordon | st.TaintDevice | st.Hold):
                self._keep(event, f"its first write failed: {outcome.error}")
        if event.key in self.kept and outcomes and not any(isinstance(o, st.Failed) and not o.recorded for o in outcomes):
            self.kept.settled(event.key)

    def _keep(self, event: model.CollectorEvent, error: str) -> None:
        """Handle `event` again later: nothing was recorded for it."""
        now = self._clock.now().timestamp()
        kept = self.kept.keep(event, error, now)
        self.counts["retried"] += 1
        log.warning("recovery_retried_later", cause=event.id, reason=event.reason, attempts=kept.attempts,
                    in_seconds=round(kept.next_at - now, 1), error=error[:300])

    # ------------------------------------------------------------------------------------ the periodic pass

    async def tick(self) -> None:
        """The leader's periodic pass; see the module docstring. One at a time: the term's first pass and the
        periodic one may be asked for together, and a second pass over what the first is doing would take the
        same held restart, validation answer or drain twice."""
        async with self._ticking:
            await self._tick()

    async def _tick(self) -> None:
        if not await self._ready():
            await self._give_up_old(self._clock.now())
            return
        rs = self._recovery()
        now = self._clock.now()
        breaker = self.ledger.breaker()
        request = controls.reset_request(self._snapshot, breaker)
        if request:
            await self.coordinator.run([st.ResetBreaker(requested_at=request)])
        await self._enter_cordons(settled=ENTRY_SETTLE_SECONDS)
        await self.coordinator.run(restarting.resume_steps(self.ledger.pending(), self.coordinator.restarter.busy))
        await self._held(now, rs)
        await self._late_arrivals(now, rs)
        if self._verifier is not None:
            await self.coordinator.run(self._verifier.flush(now.timestamp()))
        await self._validations(now, rs)
        for drain in await self.coordinator.drainer.tick(now.timestamp()):
            about = st.node_ref(drain.node)
            message = (f"drain of Node {drain.node} gave up after {rs.escalation.drain_timeout_seconds:g}s: "
                       f"{model.counted(drain.evicted, 'pod')} evicted, {len(drain.waiting)} still there (last refusal: {drain.refused})"
                       if drain.waiting else f"drain of Node {drain.node} done: {model.counted(drain.evicted, 'pod')} evicted")
            await self.coordinator.run([st.Emit(about, escalating.ESCALATED, "Drain", message, warning=bool(drain.waiting))])
        await self._expire_device_taints(now, rs)
        await self._retry(now)
        self._metrics.breaker_open.set(1 if self.ledger.breaker().latched else 0)
        self.engine_metrics.held.set(len(self.ledger.held()))

    async def _validations(self, now: dt.datetime, rs: settings.RecoverySettings) -> None:
        """The validations that ended: a return's steps, or a suspect's verdict (`planning.verdict`)."""
        validations = self.coordinator.validations
        if self.ledger.loaded:
            for node, entry in self.ledger.suspects().items():
                if node not in self._suspecting:  # one being asked now is opened by its own step
                    await validations.adopt(node, entry, _suspicion_cause(node, entry))
        for ended in await validations.tick(now.timestamp()):
            if ended.open.purpose is not st.Purpose.SUSPECT:
                await self.coordinator.run(validations.after_return(ended))
                continue
            text = f"suspect ({ended.open.evidence}); {ended.describe()}"
            planned = planning.verdict(ended.open.node, ended.answer.outcome if ended.answer else None, text,
                                       ended.open.cause, self._snapshot, self._history(), rs, now)
            self._reserve(planned)
            outcomes: list[st.Outcome] = []
            try:
                outcomes = await self.coordinator.run([s for s in planned if not isinstance(s, st.Judge)])
                failed = [o for o in outcomes if isinstance(o, st.Failed)]
                if failed:  # the verdict is not recorded: the suspicion stays pending, its answer read again
                    log.warning("verdict_deferred", node=ended.open.node, step=st.name_of(failed[0].step),
                                error=failed[0].error[:300])
                else:
                    outcomes += await self.coordinator.run([s for s in planned if isinstance(s, st.Judge)])
            finally:
                self._release(planned, outcomes)

    async def _held(self, now: dt.datetime, rs: settings.RecoverySettings) -> None:
        for key, held in sorted(self.ledger.held().items(), key=lambda kv: kv[1].at):
            if self._restarting.get(key):
                continue
            planned, dropped = holding.replan_held(key, held, self._snapshot, self._history(), rs, now,
                                                    rules_=self._rules)
            if dropped:
                await self.coordinator.drop_hold(key, dropped)
                if self._on_hold_dropped is not None:
                    self._on_hold_dropped(key, held, dropped)
                if dropped.code is holding.DropCode.EXPIRED:
                    await self.say(st.Emit(self._unit_ref(held), "KcoverRecoveryFailed", "Hold",
                                            f"a restart held since {_when(held.at)} ({held.code}: {held.text}) was "
                                            f"given up: {dropped}"))
                continue
            restarts = [s for s in planned if isinstance(s.step if isinstance(s, st.RecordOnly) else s, st.Restart)]
            if not restarts:
                continue  # still held (the Hold step refreshes the record when it changed)
            outcomes = await self._run_reserved(planned)  # with a cordon of its own when the awaited one failed
            if any(isinstance(o.step, st.RecordOnly) and isinstance(o.step.step, st.Restart) for o in outcomes):
                await self.coordinator.drop_hold(key, "its restart is record only")

    async def _late_arrivals(self, now: dt.datetime, rs: settings.RecoverySettings) -> None:
        """Restart the units whose pods came to a node after the plan that cordoned it (`latearrivals`)."""
        for node, cause, seen in self._late.due(self._snapshot, self._clock.monotonic()):
            planned = planning.late_arrivals(cause, node, seen, self._snapshot, self._history(), rs, now)
            if not planned:
                continue
            log.warning("late_arrivals_planned", node=node, cause=cause.id, steps=[st.name_of(s) for s in planned])
            await self._run_reserved(planned)

    async def _run_reserved(self, planned: list[st.Step]) -> list[st.Outcome]:
        """Carry out steps the periodic pass planned, reserved while they run; a cordon among them that comes
        with its node's restarts is then watched for late arrivals (`latearrivals`)."""
        self._reserve(planned)
        outcomes: list[st.Outcome] = []
        try:
            outcomes = await self.coordinator.run(planned)
        finally:
            self._release(planned, outcomes)
        self._late.watch(outcomes, self._clock.monotonic())
        return outcomes

    async def _expire_device_taints(self, now: dt.datetime, rs: settings.RecoverySettings) -> None:
        """kcover's device taints held past `device_taints.max_hold_seconds` with no healthy word are removed;
        while `device-taint` is record only, each removal is recorded once (not at every pass) and the taint
        kept until the class is acted on again."""
        limit = rs.device_taints.max_hold_seconds
        held = self.ledger.tainted_devices()
        self._expiry_recorded &= {t.device.resource_id for _, t in held}
        record_only = settings.RecordOnly.DEVICE_TAINT in rs.record_only
        for node, taint in held:
            if now.timestamp() - taint.at < limit:
                break  # oldest first
            if record_only:
                if taint.device.resource_id in self._expiry_recorded:
                    continue
                self._expiry_recorded.add(taint.device.resource_id)
            await self.coordinator.run([st.UntaintDevice(
                device=taint.device, node=node, cause=None,
                why=f"kcover held it tainted since {_when(taint.at)}, {limit:g}s "
                    "(recovery.device_taints.max_hold_seconds), with no word that it is healthy again")])

    def _unit_ref(self, held: ledgerentries.HeldRestart) -> st.ObjectRef:
        cause = held.event()
        if cause is None:
            return self.controls_ref()
        t = cause.target
        return st.ObjectRef("Pod" if t.kind is model.TargetKind.POD else "Node", "v1", t.name or t.node,
                            t.namespace, t.uid)

    async def _retry(self, now: dt.datetime) -> None:
        await self._give_up_old(now)
        fresh = self.kept.due(now.timestamp())
        if fresh:
            await self.handle(fresh)

    async def _give_up_old(self, now: dt.datetime) -> None:
        """The kept faults past `recovery.retry_seconds` end with an Event (written if the API answers)."""
        rs = self._recovery()
        for retry in self.kept.given_up(now.timestamp(), rs.retry_seconds):
            self.engine_metrics.given_up.inc()
            log.error("recovery_given_up", cause=retry.event.id, reason=retry.event.reason, error=retry.error)
            about = targets.about_event(retry.event, self._snapshot)
            if about is not None:
                await self.say(st.Emit(about, "KcoverRecoveryFailed", "Recover",
                                        f"kcover could not act on {retry.event.reason} from {retry.event.detector} "
                                        f"on {retry.event.target.describe()} within {rs.retry_seconds:g}s, "
                                        f"nothing recorded ({retry.error})"))


def _suspicion_cause(node: str, entry: ledgerentries.Node) -> model.CollectorEvent:
    """The cause of a suspect's validation opened from the ledger (`Validations.adopt`): the suspicion itself."""
    at = entry.suspect_at if entry.suspect_at is not None else 0.0
    return model.CollectorEvent(
        id=f"suspect-{node}-{at:.3f}"[:120], detector=restarting.RESUMED_DETECTOR, severity=model.Severity.ERROR,
        reason="NodeSuspect", message=entry.suspicion or f"Node {node} is suspect",
        target=model.Target(kind=model.TargetKind.NODE, name=node, node=node),
        observed_at=dt.datetime.fromtimestamp(at, dt.UTC))


def _when(at: float) -> str:
    return clock_.rfc3339(dt.datetime.fromtimestamp(at, dt.UTC))
