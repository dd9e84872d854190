"""The recovery engine: bus events in, planned and executed actions out, only while leading.

Owns the loop over a bus `Subscription`: for each event it plans with the cache snapshot and the
ledger's history (`policy.plan`), then executes the actions in order through the `Executor`. The
events of a batch are handled concurrently. Restarts in flight (planned and not yet finished) are
counted here and handed to the policy, whose breaker refuses a restart past
`recovery.max_concurrent_restarts` (read from the live settings, so a reload applies to the next plan);
nothing else is bounded by it. A restart in flight also counts as a restart of its unit just now, so
the other pods of a failing job plan a routine cooldown skip instead of a second restart.
Planning and reserving happen without an `await` between them, so concurrent events never both see
the last free slot. `handle()` while not leading counts the batch and acts on nothing (the controller
hands a leader only; it holds what it observes while following and replays it when it leads).
`resume()`, called by the controller when a term starts, lets the executor finish restarts an
earlier leader recorded but did not carry out.

Failures: an API error while handling one event is logged and counted (`counts["errors"]`); losing
the Lease mid-action (`NotLeaderError`) stops that event's remaining actions. Neither ends the loop.
`counts` exposes what happened for tests and `kcover bench`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Callable, Sequence

import structlog

from kcover import bus as bus_
from kcover import errors, model, settings
from kcover.aio import clock as clock_
from kcover.recovery import actions, executing, ledger, policy

log = structlog.get_logger()


class RecoveryEngine:
    def __init__(self, subscription: bus_.Subscription | None, snapshot: policy.ClusterSnapshot, ledger_: ledger.Ledger,
                 executor: executing.Executor, *, recovery: settings.RecoverySettings, clock: clock_.Clock,
                 is_leader: Callable[[], bool]) -> None:
        self._sub = subscription
        self._snapshot = snapshot
        self._ledger = ledger_
        self._executor = executor
        self._clock = clock
        self._is_leader = is_leader
        self._rules = policy.parse_rules(recovery.rules)
        self._settings = recovery
        self._restarting: dict[str, list[float]] = {}
        """Ledger key -> when each restart of that unit in flight (planned, not finished) was planned."""
        self.counts: collections.Counter[str] = collections.Counter()
        self.results: collections.deque[executing.Result] = collections.deque(maxlen=1000)
        """The most recent results, newest last (for tests and diagnostics)."""

    @property
    def in_flight_restarts(self) -> int:
        """Restarts planned and not yet finished (what the breaker compares with `max_concurrent_restarts`)."""
        return sum(len(times) for times in self._restarting.values())

    def reconfigure(self, recovery: settings.RecoverySettings) -> None:
        """Apply reloaded settings (rules are validated first; ConfigError keeps the old ones)."""
        self._rules = policy.parse_rules(recovery.rules)
        self._settings = recovery
        self._executor.settings = recovery

    async def run(self, stop: asyncio.Event) -> None:
        """Handle events until `stop` is set or the bus closes."""
        if self._sub is None:
            raise ValueError("this engine was built without a subscription; call handle()")
        sub = self._sub
        stopped = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                getter = asyncio.ensure_future(sub.get_batch())
                await asyncio.wait({getter, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    break
                batch = getter.result()
                if not batch:
                    break
                await self.handle(batch)
        finally:
            stopped.cancel()

    async def handle(self, batch: Sequence[model.CollectorEvent]) -> None:
        """Plan and execute a batch, its events concurrently; counts and ignores it while not leading."""
        if not self._is_leader():
            self.counts["not_leader"] += len(batch)
            return
        async with asyncio.TaskGroup() as tg:
            for event in batch:
                tg.create_task(self._guarded(event), name=f"recovery:{event.id}")

    async def _guarded(self, event: model.CollectorEvent) -> None:
        try:
            await self.handle_event(event)
        except errors.NotLeaderError:
            self.counts["not_leader"] += 1
            log.info("recovery_lost_leadership", cause=event.id)
        except errors.KubeError as exc:
            self.counts["errors"] += 1
            log.warning("recovery_action_failed", cause=event.id, reason=event.reason, error=str(exc))
        except Exception:  # task boundary: one bad event must not end recovery
            self.counts["errors"] += 1
            log.exception("recovery_event_crashed", cause=event.id)

    async def resume(self) -> list[executing.Result]:
        """At the start of a leadership term: finish the restarts an earlier leader recorded but did not carry out."""
        if not self._is_leader():
            return []
        try:
            await self._ledger.ensure_loaded()
            results = await self._executor.resume()
        except errors.NotLeaderError:
            self.counts["not_leader"] += 1
            return []
        except errors.KubeError as exc:
            self.counts["errors"] += 1
            log.warning("recovery_resume_failed", error=str(exc))
            return []
        for result in results:
            self.counts[f"resume:{result.outcome.value}"] += 1
            self.results.append(result)
        return results

    def _history(self) -> policy.History:
        """The ledger's history plus the restarts in flight that the ledger does not hold yet."""
        history = self._ledger.history(self.in_flight_restarts, dry_run=self._settings.dry_run)
        if not self._restarting:
            return history
        restarts = dict(history.restarts)
        for key, planned_at in self._restarting.items():
            times = restarts.get(key, ())
            if not times or times[-1] < max(planned_at):
                restarts[key] = (*times, max(planned_at))
        return dataclasses.replace(history, restarts=restarts)

    async def handle_event(self, event: model.CollectorEvent) -> list[executing.Result]:
        """Plan and execute one event; raises what the executor raises."""
        self.counts["events"] += 1
        await self._ledger.ensure_loaded()
        now = self._clock.now()
        planned = policy.plan(event, self._snapshot, self._history(), self._settings, now, rules=self._rules)
        # reserve before the first await, so events planned meanwhile see these restarts in flight
        reserved = [a.ledger_key for a in planned if isinstance(a, actions.RestartWorkload)]
        for key in reserved:
            self._restarting.setdefault(key, []).append(now.timestamp())
        results: list[executing.Result] = []
        try:
            for action in planned:
                if not self._is_leader():
                    raise errors.NotLeaderError("lost the Lease while recovering")
                try:
                    result = await self._executor.execute(action)
                finally:
                    if isinstance(action, actions.RestartWorkload):
                        self._release(action.ledger_key)
                        reserved.remove(action.ledger_key)
                self.counts[f"{actions.action_name(action)}:{result.outcome.value}"] += 1
                if isinstance(action, actions.Skip):
                    self.counts[f"skip:{action.code.value}"] += 1
                elif result.outcome is executing.Outcome.SKIPPED:
                    self.counts["refused_at_execution"] += 1
                results.append(result)
                self.results.append(result)
        finally:
            for key in reserved:  # not reached: the event ended early
                self._release(key)
        return results

    def _release(self, key: str) -> None:
        times = self._restarting[key]
        times.pop(0)
        if not times:
            del self._restarting[key]
