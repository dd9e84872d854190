"""The controller process, composed: cache, detectors, bus, leader election and recovery.

Owns wiring and lifecycle only. Every replica keeps its cluster cache warm and runs its detectors;
only the replica holding the Lease hands bus events to the recovery engine, and the engine's work
is cancelled the moment leadership is lost (followers discard what they observe: the leader's own
detectors see the same faults). `reconfigure()` applies new tunables live; fields marked
`restart_required` are the reloader's business. Readiness: caches synced and no detector failed.

It decides nothing about faults (detectors, `kcover.recovery`) and does not read files or the
environment (`cli.py`). How it fails: a component that raises out of its own retry loop ends the
process's one TaskGroup, and the error propagates to the CLI, which exits non-zero; on `stop` the
Lease is released, the bus drained, and every task ends.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from kcover import bus as bus_
from kcover import errors, model, settings
from kcover import metrics as metrics_
from kcover.aio import clock as clock_
from kcover.controller import recovering
from kcover.detectors import contract, registry, supervising
from kcover.kube import caching, leasing, podlogs
from kcover.kube import client as client_

log = structlog.get_logger()


class Health(Protocol):
    """Where readiness checks are registered (`kcover.serving.Health`)."""

    def add_readiness(self, name: str, check: Callable[[], tuple[bool, str]]) -> None: ...


class Engine(Protocol):
    """What the controller needs of the recovery engine."""

    async def handle(self, events: Sequence[model.CollectorEvent]) -> None:
        """Plan and execute for a batch of events; called only while leading, cancelled on a loss."""
        ...

    def reconfigure(self, recovery: settings.RecoverySettings) -> None: ...


EngineFactory = Callable[[recovering.EngineDeps], Engine]


def default_identity() -> str:
    """Host name (the pod name in a cluster) plus a random suffix, as client-go's examples do."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class Controller:
    """One controller replica. Build it, `await run(stop)`, and call `reconfigure()` on reload."""

    def __init__(self, cfg: settings.Settings, *, client: client_.KubeClient, metrics: metrics_.Metrics,
                 health: Health, clock: clock_.Clock | None = None,
                 detector_registry: registry.Registry | None = None, engine_factory: EngineFactory | None = None,
                 cache: caching.ClusterCache | None = None, recover: bool = True) -> None:
        self.settings = cfg
        self.clock = clock or clock_.SystemClock()
        self.metrics = metrics
        self.identity = cfg.lease.identity or default_identity()
        self.bus = bus_.Bus(dedupe_window_seconds=cfg.bus.dedupe_window_seconds,
                            block_timeout_seconds=cfg.bus.block_timeout_seconds, clock=self.clock.monotonic)
        self.cache = cache or caching.ClusterCache.from_settings(client, cfg.kube)
        context = contract.DetectorContext(role=contract.Role.CONTROLLER, metrics=metrics, clock=self.clock,
                                           cache=self.cache,
                                           extras={"log_reader": podlogs.KubeLogReader(client)})
        self.supervisor = supervising.Supervisor(detector_registry or registry.discover(), context, self.bus,
                                                 cfg.detectors, metrics)
        self.supervisor.wanted(cfg.detectors)  # fail fast on unknown detectors or bad detector configs
        self.elector: leasing.LeaderElector | None = None
        if cfg.lease.enabled:
            self.elector = leasing.LeaderElector(client, cfg.lease, identity=self.identity, metrics=metrics,
                                                 clock=self.clock)
        else:
            metrics.is_leader.set(1)
        self.subscription = self.bus.subscribe("recovery", capacity=cfg.bus.subscriber_capacity,
                                               overflow=bus_.Overflow.DROP_OLDEST)
        self.engine: Engine | None = None
        if recover:
            factory = engine_factory or recovering.build
            self.engine = factory(recovering.EngineDeps(settings=cfg, client=client, cache=self.cache,
                                                        metrics=metrics, clock=self.clock, is_leader=self.is_leader,
                                                        epoch=self._epoch, identity=self.identity))
        self.discarded = 0
        """Events a follower dropped (the leader acts on its own observations)."""
        health.add_readiness("cache", self._cache_ready)
        health.add_readiness("detectors", self.supervisor.readiness)

    def _epoch(self) -> int:
        return self.elector.leadership_epoch if self.elector is not None else 1

    def is_leader(self) -> bool:
        return self.elector.is_leader() if self.elector is not None else True

    def _cache_ready(self) -> tuple[bool, str]:
        pending = [r.name for r in self.cache.reflectors if not r.synced.is_set()]
        return (not pending, f"waiting for {', '.join(pending)}" if pending else "synced")

    async def run(self, stop: asyncio.Event) -> None:
        log.info("controller_starting", identity=self.identity, lease=self.settings.lease.enabled,
                 engine=self.engine is not None)
        inner = asyncio.Event()  # set after `stop`, once the bus is closed, for the election to end last
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.cache.run(stop), name="cache")
            tg.create_task(self._detectors(stop), name="detectors")
            tg.create_task(self._consume(), name="recovery")
            if self.elector is not None:
                tg.create_task(self.elector.run(inner), name="leader-election")
            await stop.wait()
            await self.bus.close(drain_timeout_seconds=self.settings.bus.drain_timeout_seconds)
            inner.set()
        log.info("controller_stopped", identity=self.identity)

    async def _detectors(self, stop: asyncio.Event) -> None:
        if await self.cache.wait_synced(stop):
            log.info("cache_synced", reflectors=len(self.cache.reflectors))
            await self.supervisor.run(stop)

    async def _consume(self) -> None:
        """Hand batches to the engine while leading; drop them while following. Ends when the bus closes."""
        while batch := await self.subscription.get_batch():
            if self.engine is None or not self.is_leader():
                self.discarded += len(batch)
                continue
            await self._handle(self.engine, batch)

    async def _handle(self, engine: Engine, batch: Sequence[model.CollectorEvent]) -> None:
        """Run one batch, cancelled at once if leadership is lost meanwhile."""
        if self.elector is None:
            await engine.handle(batch)
            return
        work = asyncio.create_task(engine.handle(batch), name="recovery-batch")
        lost = asyncio.create_task(self.elector.following.wait(), name="recovery-fence")
        try:
            await asyncio.wait({work, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, lost):
                task.cancel()
            await asyncio.wait({work, lost})
        if work.cancelled():
            log.warning("recovery_cancelled_on_leadership_loss", events=len(batch))
            return
        error = work.exception()
        if isinstance(error, errors.NotLeaderError):
            log.warning("recovery_fenced", error=str(error))
        elif error is not None:
            raise error

    async def reconfigure(self, new: settings.Settings, changed: set[str] | None = None) -> None:
        """Apply tunables live: bus, detectors, lease timings, recovery. Raises ConfigError, applying nothing."""
        self.supervisor.wanted(new.detectors)  # validate before touching anything
        self.bus.configure(dedupe_window_seconds=new.bus.dedupe_window_seconds,
                           block_timeout_seconds=new.bus.block_timeout_seconds)
        touched = self.supervisor.reconfigure(new.detectors)
        if self.elector is not None:
            self.elector.reconfigure(new.lease)
        if self.engine is not None:
            self.engine.reconfigure(new.recovery)
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
