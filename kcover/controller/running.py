"""The controller process, composed: cache, detectors, bus, leader election and recovery.

Owns wiring and lifecycle only. Every replica keeps its cluster cache warm and runs its detectors;
only the replica holding the Lease hands bus events to the recovery engine, and the engine's work
is cancelled the moment leadership is lost. A follower does not act on what it observes: it holds
the events (up to `bus.subscriber_capacity`) and, when it becomes leader, replays those younger than
twice `lease.lease_duration_seconds`, since a leader that died before acting leaves faults nobody else
would act on; the ledger's cooldowns make replaying what the old leader did handle harmless. A batch a
leader could not finish (its Lease lost before or during it) is held again the same way.
`reconfigure()` applies new tunables live; fields marked `restart_required` are the reloader's
business. Readiness: caches synced, no detector failed, and (the default engine's) the leader's ledger served.

It decides nothing about faults (detectors, `kcover.recovery`) and does not read files or the
environment (`kcover.cli`). How it fails: a component that raises out of its own retry loop ends the
process's one TaskGroup, and the error propagates to the CLI, which exits non-zero; on `stop` the
Lease is released, the bus drained, and every task ends.
"""

from __future__ import annotations

import asyncio
import collections
import functools
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

import structlog

from kcover import bus as bus_
from kcover import errors, model, settings
from kcover import metrics as metrics_
from kcover.aio import clock as clock_
from kcover.controller import answering, fleet, recovering
from kcover.detectors import contract, registry, supervising
from kcover.kube import caching, events, leasing, podlogs, retrying
from kcover.kube import client as client_
from kcover.recovery import auditing

log = structlog.get_logger()


class Health(Protocol):
    """Where readiness checks are registered (`kcover.serving.Health`)."""

    def add_readiness(self, name: str, check: Callable[[], tuple[bool, str]]) -> None: ...

    def started(self) -> None: ...


class Engine(Protocol):
    """What the controller needs of the recovery engine.

    An engine may also define `async resume()`: called at the start of each leadership term (and at
    start without leader election), before any batch, then every `recovery.resume_interval_seconds`
    while leading, fenced like `handle`; the default engine
    finishes there the restarts a dead leader recorded in the ledger but did not carry out. It may also
    define `async background(stop)`, run in its own task for the process's life (the default engine
    writes its Recovery resources there, off the critical path)."""

    async def handle(self, events: Sequence[model.CollectorEvent]) -> None:
        """Plan and execute for a batch of events; called only while leading, cancelled on a loss."""
        ...

    def reconfigure(self, recovery: settings.RecoverySettings) -> None: ...


EngineFactory = Callable[[recovering.EngineDeps], Engine]


class Controller:
    """One controller replica. Build it, `await run(stop)`, and call `reconfigure()` on reload."""

    def __init__(self, cfg: settings.Settings, *, client: client_.KubeClient, metrics: metrics_.Metrics,
                 health: Health, clock: clock_.Clock | None = None,
                 detector_registry: registry.Registry | None = None, engine_factory: EngineFactory | None = None,
                 cache: caching.ClusterCache | None = None, recover: bool = True,
                 elector: leasing.LeaderElector | None = None) -> None:
        """`elector`: a campaign the caller already runs (started before this controller was imported and
        built, so that a Lease is won while the rest starts); the controller acts on it but neither runs nor
        ends it. None: the controller runs its own when `lease.enabled`."""
        self.settings = cfg
        self.clock = clock or clock_.SystemClock()
        self.metrics = metrics
        self.client = client
        self.identity = elector.identity if elector is not None else cfg.lease.identity or leasing.default_identity()
        self.bus = bus_.Bus(dedupe_window_seconds=cfg.bus.dedupe_window_seconds,
                            block_timeout_seconds=cfg.bus.block_timeout_seconds, clock=self.clock.monotonic)
        metrics.registry.register(bus_.BusCollector(self.bus))  # kcover_bus_* on /metrics
        metrics.registry.register(retrying.StatsCollector(client.retry_stats))  # kcover_api_retries*
        self.cache = cache or caching.ClusterCache.from_settings(
            client, cfg.kube, controls=(cfg.recovery.ledger_namespace, cfg.recovery.controls_name))
        metrics.registry.register(fleet.FleetCollector(self.cache, condition_type=cfg.agent.condition_type))
        self.answers = answering.Answers(client, clock=self.clock, identity=self.identity, is_leader=self.is_leader)
        """Warning Events answering refused signals (a forged Event), written by the leader."""
        context = contract.DetectorContext(role=contract.Role.CONTROLLER, metrics=metrics, clock=self.clock,
                                           cluster=self.cache, gateway=client, namespace=cfg.recovery.ledger_namespace,
                                           refusals=self.answers, log_reader=podlogs.KubeLogReader(client),
                                           agent_condition_type=cfg.agent.condition_type)
        self.supervisor = supervising.Supervisor(detector_registry or registry.discover(), context, self.bus,
                                                 cfg.detectors, metrics)
        self.supervisor.wanted(cfg.detectors)  # fail fast on unknown detectors or bad detector configs
        self.supervisor.on_failure = self._detector_failed
        self.elector: leasing.LeaderElector | None = elector
        self._runs_campaign = elector is None and cfg.lease.enabled
        if self._runs_campaign:
            self.elector = leasing.LeaderElector(client, cfg.lease, identity=self.identity, metrics=metrics,
                                                 clock=self.clock)
        if self.elector is not None:
            self.elector.on_change = self._on_leadership
            self.answers.fence = self.elector
        else:
            metrics.is_leader.set(1)
        self.subscription = self.bus.subscribe("recovery", capacity=cfg.bus.subscriber_capacity,
                                               overflow=bus_.Overflow.DROP_OLDEST)
        self.engine: Engine | None = None
        if recover:
            factory = engine_factory or recovering.build
            self.engine = factory(recovering.EngineDeps(settings=cfg, client=client, cache=self.cache,
                                                        metrics=metrics, clock=self.clock, is_leader=self.is_leader,
                                                        epoch=self._epoch, identity=self.identity,
                                                        fence=self.elector))
        self.held_while_following = 0
        """Events this replica observed while following: not acted on then, held for a replay (see `_held`)."""
        self._held: collections.deque[tuple[float, model.CollectorEvent]] = collections.deque(
            maxlen=cfg.bus.subscriber_capacity)
        """(monotonic time, event) a follower observed: replayed when it becomes leader, because a leader
        that died without acting (its Lease not released) leaves faults nobody else would act on."""
        self._held_evicted = 0
        """Held events pushed out by newer ones (the deque's capacity) since the last take."""
        self.held_dropped = 0
        """Held events a term's start did not replay (older than its horizon, or pushed out): logged then."""
        self._replay = asyncio.Event()
        self._resumed_epoch = -1
        if self.elector is None or self.elector.is_leader():
            self._replay.set()  # no term starts (or one started before this controller was built): resume at once
        health.add_readiness("cache", self.cache.readiness)
        health.add_readiness("detectors", self.supervisor.readiness)
        for name in ("ledger", "records"):  # the default engine's: its ledger and its Recovery resources
            check: Callable[[], tuple[bool, str]] | None = getattr(self.engine, f"{name}_readiness", None)
            if check is not None:
                health.add_readiness(name, check)
        health.started()  # its own checks are in: the process's `role` check (failing while it starts) goes

    async def _detector_failed(self, name: str, detail: str, required: bool) -> None:
        """A `KcoverDetectorFailed` Event on the controller's Lease (every replica writes its own)."""
        lease = self.settings.lease
        body = events.body(events.About("Lease", "coordination.k8s.io/v1", lease.name, lease.namespace),
                           reason="KcoverDetectorFailed", action="RunDetector", warning=True,
                           message=f"{'required' if required else 'optional'} detector {name} failed on "
                                   f"{self.identity} ({detail}); restarting it with backoff",
                           now=self.clock.now(), controller=auditing.REPORTING_CONTROLLER, instance=self.identity)
        await self.client.request("POST", events.path_of(body), body=body)

    def _epoch(self) -> int:
        return self.elector.leadership_epoch if self.elector is not None else 1

    def is_leader(self) -> bool:
        return self.elector.is_leader() if self.elector is not None else True

    async def run(self, stop: asyncio.Event) -> None:
        log.info("controller_starting", identity=self.identity, lease=self.settings.lease.enabled,
                 engine=self.engine is not None)
        inner = asyncio.Event()  # set after `stop`, once the bus is closed, for the election to end last
        try:
            await self._run(stop, inner)
        except BaseExceptionGroup as group:  # said before the process ends, in the log people read
            log.error("controller_crashed", identity=self.identity,
                      errors=[f"{type(e).__name__}: {e}"[:300] for e in group.exceptions[:5]],
                      exc_info=group)
            raise
        log.info("controller_stopped", identity=self.identity)

    async def _run(self, stop: asyncio.Event, inner: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as tg:
            if self.elector is not None and self._runs_campaign:  # first: the campaign runs while the cache syncs
                tg.create_task(self.elector.run(inner), name="leader-election")
            tg.create_task(self.cache.run(stop), name="cache")
            tg.create_task(self._detectors(stop), name="detectors")
            tg.create_task(self._consume(stop), name="recovery")
            tg.create_task(self._resume_pending(stop), name="recovery-resume")
            tg.create_task(self.answers.run(stop), name="refusal-answers")
            background: Callable[[asyncio.Event], Coroutine[Any, Any, None]] | None = getattr(
                self.engine, "background", None)
            drained = asyncio.Event()  # the records' writer ends after the bus drained, before the Lease goes
            records = tg.create_task(background(drained), name="recovery-records") if background else None
            await stop.wait()
            await self.bus.close(drain_timeout_seconds=self.settings.bus.drain_timeout_seconds)
            drained.set()
            if records is not None:  # its last flush writes what the drained faults recorded, still leading
                await asyncio.wait({records}, timeout=self.settings.bus.drain_timeout_seconds)
            inner.set()

    async def _detectors(self, stop: asyncio.Event) -> None:
        if await self.cache.wait_synced(stop):
            log.info("cache_synced", reflectors=len(self.cache.reflectors))
            await self.supervisor.run(stop)

    async def _resume_pending(self, stop: asyncio.Event) -> None:
        """While leading, pass over the ledger's pending restarts every `recovery.resume_interval_seconds`.

        A restart whose delete failed (the API kept refusing past the retry deadline) stays pending in the
        ledger; this is what tries it again, for as long as it is valid, instead of only when a term starts."""
        resume: Callable[[], Coroutine[Any, Any, None]] | None = getattr(self.engine, "resume", None)
        if resume is None:
            return
        while not await _wait(stop, self.settings.recovery.resume_interval_seconds):
            if not self.is_leader() or self._resumed_epoch != self._epoch():
                continue  # the term's first resume is `_consume`'s
            try:
                await self._fenced(resume, "recovery-resume", 0, stop=stop)
            except Exception:  # task boundary: a failed pass is logged, the next one tries again
                log.exception("recovery_resume_crashed")

    def _on_leadership(self, leading: bool) -> None:
        if leading:
            self._replay.set()  # wake the consumer: resume the engine, replay held events

    def _take_held(self) -> list[model.CollectorEvent]:
        """Held events young enough that the old leader may have died before acting on them.

        A dead leader keeps the Lease for up to `lease_duration_seconds` before a follower takes it, so
        twice that, and `lease.replay_margin_seconds` more, before the last time another leader was seen
        renewing is kept; older events were the old leader's to act on. The margin is for the old leader's
        own view: its cache may have shown it a fault later than this replica's did (an overloaded process,
        a watch re-established), or not before it died, while it still renewed. A leader also keeps, in its
        memory only, a fault whose first write kept failing while it still renewed (the ledger's kind not
        served, 500s on its writes), for up to `recovery.retry_seconds`: the horizon reaches back that far
        when it is longer, so a leader that died retrying does not take the fault with it. The engine's ledger
        (cooldowns, reloaded per epoch) and its preconditions make replaying what the old leader did act on
        harmless: a replayed fault it acted on is refused (its pod replaced, its node cordoned)."""
        now = self.clock.monotonic()
        alive = self.elector.leader_seen_before_term if self.elector is not None else now
        # counted from the last time a leader was seen alive, not from now: while the API server was down,
        # or this replica's own term ended mid-batch, no leader acted on what was held meanwhile
        lease = self.settings.lease
        kept = max(2 * lease.lease_duration_seconds, self.settings.recovery.retry_seconds)
        horizon = min(now, alive) - kept - lease.replay_margin_seconds
        events = [ev for at, ev in self._held if at >= horizon]
        old = [ev for at, ev in self._held if at < horizon]
        if old or self._held_evicted:
            # the old leader's to act on: said, so that a fault missed this way can be traced to the horizon
            log.info("held_events_not_replayed", older_than_horizon=len(old), pushed_out=self._held_evicted,
                     horizon_seconds_ago=round(now - horizon, 1),
                     examples=[f"{ev.reason} {ev.target.kind}/{ev.target.name}" for ev in old[-5:]])
        self.held_dropped += len(old) + self._held_evicted
        self._held_evicted = 0
        self._held.clear()
        return events

    async def _next_batch(self) -> list[model.CollectorEvent] | None:
        """The next bus batch, [] when leadership was just acquired with events held, None once the bus closed."""
        getter = asyncio.ensure_future(self.subscription.get_batch())
        replay = asyncio.ensure_future(self._replay.wait())
        try:
            await asyncio.wait({getter, replay}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            replay.cancel()
            if not getter.done():
                getter.cancel()  # no event is lost: get_batch takes from the queue only when it returns
                await asyncio.wait({getter})
        self._replay.clear()
        if getter.cancelled():
            return []
        return getter.result() or None

    async def _consume(self, stop: asyncio.Event) -> None:
        """Hand batches to the engine while leading; hold them while following. Ends when the bus closes.

        Nothing is acted on before the cache has synced (a Lease won during the sync waits for it); a
        warm follower that becomes leader acts at once."""
        if not await self.cache.wait_synced(stop):
            return
        while (batch := await self._next_batch()) is not None:
            if self.engine is None or not self.is_leader():
                if self.engine is not None:
                    now = self.clock.monotonic()
                    self._held_evicted += max(0, len(self._held) + len(batch) - (self._held.maxlen or 0))
                    self._held.extend((now, ev) for ev in batch)
                self.held_while_following += len(batch)
                continue
            if self._resumed_epoch != self._epoch():
                self._resumed_epoch = self._epoch()
                resume: Callable[[], Coroutine[Any, Any, None]] | None = getattr(self.engine, "resume", None)
                if resume is not None:
                    try:
                        await self._fenced(resume, "recovery-resume", 0, stop=stop)
                    except Exception:  # task boundary: the periodic pass tries again; the batch is still handled
                        log.exception("recovery_resume_crashed")
            batch = self._take_held() + batch
            if not batch:
                continue
            handled = self.is_leader() and await self._fenced(functools.partial(self.engine.handle, batch),
                                                              "recovery-batch", len(batch))
            if not (handled and self.is_leader()):
                # leadership ended before or during the batch (the engine then acts on nothing, or stops half
                # way, and returns): hold the batch again, so that this replica replays it when it leads again.
                # A Lease lost during the resume that starts a term, or one that flaps back to the same
                # replica, otherwise lost these faults; the ledger's replay memory, cooldowns and pending
                # intents make a second handling of what was done harmless
                now = self.clock.monotonic()
                self._held.extend((now, ev) for ev in batch)
                log.info("recovery_batch_held_again", events=len(batch))

    async def _fenced(self, work_of: Callable[[], Coroutine[Any, Any, None]], name: str, events: int, *,
                      stop: asyncio.Event | None = None) -> bool:
        """Run engine work, cancelled at once if leadership is lost (or `stop` is set) meanwhile; False when
        it was cancelled so."""
        if self.elector is None and stop is None:
            await work_of()
            return True
        work = asyncio.create_task(work_of(), name=name)
        ends = {asyncio.create_task(e.wait(), name="recovery-fence")
                for e in (self.elector.following if self.elector is not None else None, stop) if e is not None}
        try:
            await asyncio.wait({work, *ends}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, *ends):
                task.cancel()
            await asyncio.wait({work, *ends})
        if work.cancelled():
            log.warning("recovery_cancelled_on_leadership_loss", work=name, events=events)
            return False
        error = work.exception()
        if isinstance(error, errors.NotLeaderError):
            log.warning("recovery_fenced", error=str(error))
            return False
        if error is not None:
            raise error
        return True

    async def reconfigure(self, new: settings.Settings, changed: set[str] | None = None) -> None:
        """Apply tunables live: bus, detectors, lease timings, recovery. Raises ConfigError, applying nothing."""
        self.supervisor.wanted(new.detectors)  # validate before touching anything
        if self.engine is not None:
            self.engine.reconfigure(new.recovery)  # validates the rules before it changes anything
        self.bus.configure(dedupe_window_seconds=new.bus.dedupe_window_seconds,
                           block_timeout_seconds=new.bus.block_timeout_seconds)
        touched = self.supervisor.reconfigure(new.detectors)
        if self.elector is not None:
            self.elector.reconfigure(new.lease)
        self.settings = new
        log.info("controller_reconfigured", detectors_restarted=touched, changed=sorted(changed or ()))


async def run(cfg: settings.Settings, *, client: client_.KubeClient, metrics: metrics_.Metrics,
              health: Health, stop: asyncio.Event, clock: clock_.Clock | None = None,
              detector_registry: registry.Registry | None = None,
              engine_factory: EngineFactory | None = None) -> None:
    """Run one controller replica until `stop`. For hot reload, build a `Controller` and keep it."""
    controller = Controller(cfg, client=client, metrics=metrics, health=health, clock=clock,
                            detector_registry=detector_registry, engine_factory=engine_factory)
    await controller.run(stop)


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Wait up to `seconds`; True when `stop` is set."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True
