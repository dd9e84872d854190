"""The controller's recovery, assembled: gateway, ledger, coordinator with its hooks, engine.

Owns the default `EngineFactory` of `running.Controller`: `build()` composes the gateway (HTTP with the
leader's fence, behind the dry-run gateway, which records instead of writing while `recovery.dry_run` is
on: dry run is that substitution, never a branch in recovery), the ledger, the executors, the hooks in their order
(counting, records, verification, the node ladder, the breaker latch, and the audit's Events last) and the
engine, plus the log-saving hook (`recovery.logsaving.save`). `LeaderEngine` is what the controller
drives: `handle(batch)` while leading, `resume()` at the start of a term and then periodically (the
engine's `tick`), `background(stop)` for the Recovery writer, `reconfigure()` on reload. The ledger is
read again at the start of every leadership term, so a new leader never plans with what it remembered
from an earlier one. It decides nothing itself.

How it fails: as the engine does (errors per event are logged and counted there).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kcover import errors, model, settings
from kcover import metrics as metrics_
from kcover.aio import clock as clock_
from kcover.controller import fleet
from kcover.kube import caching, gateway, retrying
from kcover.kube import client as client_
from kcover.kube import projections as proj
from kcover.recovery import (
    auditing,
    coordinating,
    devicetainting,
    dryrun,
    engine,
    escalating,
    holding,
    hooks,
    ledger,
    ledgerentries,
    logsaving,
    recording,
    recoveries,
    restarting,
    returning,
    verifying,
)
from kcover.recovery import steps as st


@dataclass(frozen=True)
class EngineDeps:
    """What an engine factory is given by the controller."""

    settings: settings.Settings
    client: client_.KubeClient
    cache: caching.ClusterCache
    metrics: metrics_.Metrics
    clock: clock_.Clock
    is_leader: Callable[[], bool]
    epoch: Callable[[], int]
    """The leadership epoch (`LeaderElector.leadership_epoch`); it changes on every acquisition."""
    identity: str
    fence: retrying.Fence | None = None
    """Bounds each write to the leader's term (the `LeaderElector`); None without leader election."""


class LeaderEngine:
    """The engine as the controller drives it; see the module docstring."""

    def __init__(self, inner: engine.RecoveryEngine, gw: dryrun.DryRun, recorder: recording.Recorder,
                 epoch: Callable[[], int], live: _Live, *, synced: Callable[[], Awaitable[bool]] | None = None,
                 leading: Callable[[], bool] = lambda: True) -> None:
        self.inner = inner
        self.gateway = gw
        self.recorder = recorder
        self.faults: fleet.FaultMetrics | None = None
        """`kcover_faults_total`, counted for every event handed to the engine (the leader's)."""
        self._epoch = epoch
        self._live = live
        self._synced = synced
        self._leading = leading
        self._loaded_epoch = -1
        self._records_said = ""

    @property
    def ledger(self) -> ledger.Ledger:
        return self.inner.ledger

    def _new_term(self) -> None:
        """A new term (or dry run turned on or off) reads the ledger again: never plan with an earlier term's."""
        epoch = self._epoch()
        changed = self.gateway.changed()
        if epoch != self._loaded_epoch or changed:
            if self._loaded_epoch != -1 or changed:
                self.inner.ledger.forget()
            self._loaded_epoch = epoch

    async def resume(self) -> None:
        """The leader's periodic pass (and the first of a term): once the cache is synced."""
        if self._synced is not None and not await self._synced():
            return
        self._new_term()
        await self.inner.tick()
        await self._say_records()

    async def _say_records(self) -> None:
        """An Event once when Recovery resources stop being served (their CRD missing), and once they are again."""
        unserved, was = self.recorder.unserved, self._records_said
        self._records_said = unserved
        if bool(unserved) == bool(was):
            return
        ref = self.inner.controls_ref()
        if unserved:
            await self.inner.say(st.Emit(ref, "KcoverRecordsUnavailable", "Record",
                                          f"{unserved}: Recovery resources are dropped (counted in "
                                          "kcover_recovery_records_failed_total{reason=\"not_served\"}); recovery "
                                          "goes on, its ledger is its memory"))
        else:
            await self.inner.say(st.Emit(ref, "KcoverRecordsAvailable", "Record",
                                          "Recovery resources are served again and written", warning=False))

    def ledger_readiness(self) -> tuple[bool, str]:
        """/readyz's `ledger`: failing while the leader finds its LedgerEntry kind not served (it acts on nothing)."""
        if not self._leading():
            return True, "not leading"
        problem = self.inner.ledger_problem
        return (False, problem) if problem else (True, "")

    def records_readiness(self) -> tuple[bool, str]:
        """/readyz's `records`: passing, and saying so, while Recovery resources are not served (recovery goes on)."""
        unserved = self.recorder.unserved if self._leading() else ""
        return True, f"{unserved}; recovery goes on" if unserved else ""

    async def background(self, stop: asyncio.Event) -> None:
        """Work beside the engine, off its critical path: writing the Recovery resources."""
        await self.recorder.run(stop)

    async def handle(self, events: Sequence[model.CollectorEvent]) -> None:
        if self.faults is not None:
            for event in events:
                self.faults.count(event)
        self._new_term()
        await self.inner.handle(events)

    def reconfigure(self, recovery: settings.RecoverySettings) -> None:
        self.inner.reconfigure(recovery)  # validates rules first; a ConfigError leaves everything as it was
        self._live.recovery = recovery


def build(deps: EngineDeps) -> LeaderEngine:
    """The default engine factory for `running.Controller`."""
    live = _Live(deps.settings.recovery)
    rs = live.recovery
    gw = dryrun.DryRun(gateway.Http(deps.client, fence=deps.fence), active=lambda: live.recovery.dry_run)
    ledger_ = ledger.Ledger(gw, namespace=rs.ledger_namespace, name=rs.ledger_name,
                            retention_seconds=live.retention_seconds)
    sink = logsaving.LogSaveMetrics(deps.metrics.registry)

    async def save_logs(workload: st.WorkloadRef, pods: Sequence[proj.Pod]) -> str | None:
        if gw.dry:
            return None  # a dry run copies nothing
        result = await logsaving.save(deps.client, workload, [logsaving.from_cache(p) for p in pods],
                                      settings=live.recovery.save_logs, now=deps.clock.now(), metrics=sink)
        if result.error is not None:
            raise errors.KcoverError(f"saving logs failed: {result.error} (partial copy: {result.path})")
        return result.path

    recovery = live.get
    restarter = restarting.Restarter(gw, ledger_, deps.cache, recovery=recovery, clock=deps.clock,
                                     identity=deps.identity, epoch=deps.epoch, save_logs=save_logs)
    devices = devicetainting.DeviceTaints(deps.client, gw, options=lambda: live.recovery.device_taints,
                                          metrics_=deps.metrics, clock=deps.clock)
    verify_metrics = verifying.VerifyMetrics(deps.metrics.registry)
    recorder = recording.Recorder(gw, recording.RecordMetrics(deps.metrics.registry), recovery=recovery,
                                  clock=deps.clock, identity=deps.identity, is_leader=deps.is_leader)
    verifier = verifying.Verifier(deps.cache, verify_metrics, settings_=lambda: live.recovery.verify,
                                  on_end=_on_verified(recorder))
    coordinator = coordinating.Coordinator(
        gw, ledger_, restarter=restarter, devices=devices,
        validations=returning.Validations(gw, deps.cache, recovery=recovery, clock=deps.clock),
        drainer=escalating.Drainer(gw), recovery=recovery, clock=deps.clock, identity=deps.identity)
    coordinator.hooks = [
        hooks.Counting(deps.metrics, deps.clock, escalation=verify_metrics.steps),
        recording.Records(recorder, verifying=lambda: live.recovery.verify.enabled),
        verifying.Verify(verifier, recovery=recovery, now=lambda: deps.clock.now().timestamp()),
        escalating.Ladder(deps.cache, recovery=recovery),
        hooks.Breaker(recovery=recovery, latched=lambda: ledger_.breaker().latched),
        auditing.Audit(recovery=recovery),
    ]
    inner = engine.RecoveryEngine(deps.cache, ledger_, coordinator, recovery=recovery, clock=deps.clock,
                                  metrics_=deps.metrics, devices=devices, verifier=verifier,
                                  on_hold_dropped=_on_hold_dropped(recorder, deps.clock),
                                  agent_condition=deps.settings.agent.condition_type)
    leader = LeaderEngine(inner, gw, recorder, deps.epoch, live, synced=deps.cache.wait_synced,
                          leading=deps.is_leader)
    leader.faults = fleet.FaultMetrics(deps.metrics.registry)
    return leader


def _on_hold_dropped(recorder: recording.Recorder, clock: clock_.Clock
                     ) -> Callable[[str, ledgerentries.HeldRestart, holding.Dropped], None]:
    """A held restart dropped without running: its Recovery leaves `Held` (Failed when given up at
    `recovery.hold_seconds`, Recovered when the workload recovered by itself, Refused otherwise), also
    when an earlier leader held it (named from the ledger's entry, `recoveries.held_ref`)."""
    phases = {holding.DropCode.EXPIRED: (recoveries.Phase.FAILED, "given up"),
              holding.DropCode.RECOVERED: (recoveries.Phase.RECOVERED, "not restarted"),
              holding.DropCode.DROPPED: (recoveries.Phase.REFUSED, "not restarted")}

    def dropped(key: str, held: ledgerentries.HeldRestart, why: holding.Dropped) -> None:
        phase, said = phases[why.code]
        recorder.phase(key, phase, at=clock.now().timestamp(), cause=why.code.value, message=f"{said}: {why}",
                       known=recoveries.held_ref(key, held))
    return dropped


def _on_verified(recorder: recording.Recorder) -> Callable[[verifying.Record], None]:
    def on_end(record: verifying.Record) -> None:
        if record.outcome is verifying.Outcome.STALLED:
            cause = record.cause.value if record.cause is not None else ""
            recorder.phase(record.key, recoveries.Phase.STALLED, at=record.at, cause=cause, message=record.detail)
        else:
            finished = record.outcome is verifying.Outcome.FINISHED
            recorder.phase(record.key, recoveries.Phase.RECOVERED, at=record.at, mttr_seconds=record.mttr_seconds,
                           cause="Finished" if finished else "",
                           message="the workload finished after its restart" if finished else
                           "every pod Running again with a new uid")
    return on_end


class _Live:
    """The live recovery settings, shared by the parts above and replaced on reload."""

    def __init__(self, recovery: settings.RecoverySettings) -> None:
        self.recovery = recovery

    def get(self) -> settings.RecoverySettings:
        return self.recovery

    def retention_seconds(self) -> float:
        """How long the ledger keeps an entry (`RecoverySettings.memory_seconds`)."""
        return self.recovery.memory_seconds()


def describe(leader: LeaderEngine) -> Mapping[str, Any]:
    """For diagnostics: what the engine holds in flight."""
    return {"restarts_in_flight": leader.inner.in_flight_restarts, "held": len(leader.ledger.held()),
            "pending": len(leader.ledger.pending()), "dry_run": leader.gateway.dry}
