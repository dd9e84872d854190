"""The controller's recovery engine, assembled: snapshot, ledger, executor, log sink.

Owns the default `EngineFactory` of `running.Controller`: it builds `recovery.engine.RecoveryEngine`
over the cluster cache, the ledger ConfigMap and the executor, hands the executor a log-saving hook
(`recovery.logsaving.save`), and re-reads the ledger at the start of every leadership epoch so a new
leader never plans with what it remembered from an earlier term. `resume()` (called by the controller
when a term starts, and periodically while it leads) waits for the cache, reloads the ledger and has the executor finish restarts an
earlier leader recorded but did not carry out. It decides nothing itself.

How it fails: as the engine does (errors per event are logged and counted there). A log save that
fails raises from the hook, and the executor applies `save_logs.proceed_on_failure`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from kcover import errors, model, settings
from kcover import metrics as metrics_
from kcover.aio import clock as clock_
from kcover.controller import fleet
from kcover.kube import caching, retrying
from kcover.kube import client as client_
from kcover.kube import projections as proj
from kcover.recovery import actions, engine, ledger, logsaving, overseeing


@dataclass(frozen=True)
class EngineDeps:
    """What an engine factory is given by the controller."""

    settings: settings.Settings
    client: client_.KubeClient
    cache: caching.ClusterCache
    metrics: metrics_.Metrics
    clock: clock_.Clock
    is_leader: Callable[[], bool]
    """The fence: executors check it right before each write and raise `errors.NotLeaderError`."""
    epoch: Callable[[], int]
    """The leadership epoch (`LeaderElector.leadership_epoch`); it changes on every acquisition."""
    identity: str
    fence: retrying.Fence | None = None
    """Bounds each write attempt to the leader's term (the `LeaderElector`); None without leader election."""


class LeaderEngine:
    """`RecoveryEngine` plus a ledger reload whenever leadership (its epoch) changed since the last batch."""

    def __init__(self, inner: engine.RecoveryEngine, ledger_: ledger.Ledger, epoch: Callable[[], int],
                 live: _Live, *, synced: Callable[[], Awaitable[bool]] | None = None,
                 overseer: overseeing.Overseer | None = None) -> None:
        self.inner = inner
        self.overseer = overseer
        self.faults: fleet.FaultMetrics | None = None
        """`kcover_faults_total`, counted for every event handed to the engine (the leader's)."""
        """Verification, escalation and controls around the executor; its `tick()` runs on every resume pass."""
        self.ledger = ledger_
        self._epoch = epoch
        self._live = live
        self._synced = synced
        self._loaded_epoch = -1

    async def _reload(self) -> None:
        epoch = self._epoch()
        if epoch != self._loaded_epoch:
            await self.ledger.load()
            self._loaded_epoch = epoch

    async def resume(self) -> None:
        """Start of a term: once the cache is synced, finish what an earlier leader recorded but did not do."""
        if self._synced is not None and not await self._synced():
            return
        await self._reload()
        await self.inner.resume()
        if self.overseer is not None:
            await self.overseer.tick()

    async def background(self, stop: asyncio.Event) -> None:
        """Work beside the engine, off its critical path: writing the Recovery resources the overseer notes."""
        if self.overseer is not None:
            await self.overseer.recorder.run(stop)

    async def handle(self, events: Sequence[model.CollectorEvent]) -> None:
        if self.faults is not None:
            for event in events:
                self.faults.count(event)
        await self._reload()
        await self.inner.handle(events)

    def reconfigure(self, recovery: settings.RecoverySettings) -> None:
        self.inner.reconfigure(recovery)  # validates rules first; a ConfigError leaves everything as it was
        self._live.recovery = recovery


def build(deps: EngineDeps) -> LeaderEngine:
    """The default engine factory for `running.Controller`."""
    live = _Live(deps.settings.recovery)
    snap = deps.cache  # the cache is the policy's snapshot: one cluster model
    ledger_ = ledger.Ledger(deps.client, namespace=live.recovery.ledger_namespace,
                            name=live.recovery.ledger_name, is_leader=deps.is_leader,
                            retention_seconds=live.retention_seconds, fence=deps.fence,
                            layout=live.recovery.ledger_layout.value)
    sink = logsaving.LogSaveMetrics(deps.metrics.registry)

    async def save_logs(workload: actions.WorkloadRef, pods: Sequence[proj.Pod]) -> str | None:
        result = await logsaving.save(deps.client, workload, [logsaving.from_cache(p) for p in pods],
                                      settings=live.recovery.save_logs,
                                      now=deps.clock.now(), metrics=sink)
        if result.error is not None:
            raise errors.KcoverError(f"saving logs failed: {result.error} (partial copy: {result.path})")
        return result.path

    executor = overseeing.Overseer(deps.client, snap, ledger_, cache=deps.cache, recovery=live.recovery,
                                   metrics_=deps.metrics, clock=deps.clock, identity=deps.identity,
                                   is_leader=deps.is_leader, save_logs=save_logs, epoch=deps.epoch,
                                   fence=deps.fence)
    inner = engine.RecoveryEngine(None, snap, ledger_, executor, recovery=live.recovery, clock=deps.clock,
                                  is_leader=deps.is_leader)
    leader = LeaderEngine(inner, ledger_, deps.epoch, live, synced=deps.cache.wait_synced, overseer=executor)
    leader.faults = fleet.FaultMetrics(deps.metrics.registry)
    return leader


class _Live:
    """The live recovery settings, shared by the hooks above and replaced on reload."""

    def __init__(self, recovery: settings.RecoverySettings) -> None:
        self.recovery = recovery

    def retention_seconds(self) -> float:
        """How long the ledger keeps an entry: as long as any check still reads it (budget window, cooldowns)."""
        r = self.recovery
        return max(r.restart_window_seconds, r.workload_cooldown_seconds, r.node_cooldown_seconds)

