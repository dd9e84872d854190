"""The recovery engine: bus events in, planned and executed actions out, only while leading.

Owns the loop over a bus `Subscription`: for each event it plans with the cache snapshot and the
ledger's history (`policy.plan`), then executes the actions in order through the `Executor`. Events
are handled concurrently up to `recovery.max_concurrent_restarts`; restarts in flight are handed to
the policy (the breaker's concurrency half). A follower drops events (they are re-observed when the
fault persists, and the ledger carries what the old leader did). `resume()`, called by the controller
when a term starts, lets the executor finish restarts an earlier leader recorded but did not carry out.

Failures: an API error while handling one event is logged and counted (`counts["errors"]`); losing
the Lease mid-action (`NotLeaderError`) stops that event's remaining actions. Neither ends the loop.
`counts` exposes what happened for tests and `kcover bench`.
"""

from __future__ import annotations

import asyncio
import collections
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
        self._slots = asyncio.Semaphore(recovery.max_concurrent_restarts)
        self.in_flight_restarts = 0
        self.counts: collections.Counter[str] = collections.Counter()
        self.results: collections.deque[executing.Result] = collections.deque(maxlen=1000)
        """The most recent results, newest last (for tests and diagnostics)."""

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
        """Plan and execute a batch, events concurrently (bounded); drops it while following."""
        if not self._is_leader():
            self.counts["not_leader"] += len(batch)
            return
        async with asyncio.TaskGroup() as tg:
            for event in batch:
                tg.create_task(self._guarded(event), name=f"recovery:{event.id}")

    async def _guarded(self, event: model.CollectorEvent) -> None:
        async with self._slots:
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

    async def handle_event(self, event: model.CollectorEvent) -> list[executing.Result]:
        """Plan and execute one event; raises what the executor raises."""
        self.counts["events"] += 1
        await self._ledger.ensure_loaded()
        history = self._ledger.history(self.in_flight_restarts, dry_run=self._settings.dry_run)
        planned = policy.plan(event, self._snapshot, history, self._settings, self._clock.now(), rules=self._rules)
        results: list[executing.Result] = []
        for action in planned:
            if not self._is_leader():
                raise errors.NotLeaderError("lost the Lease while recovering")
            restart = isinstance(action, actions.RestartWorkload)
            if restart:
                self.in_flight_restarts += 1
            try:
                result = await self._executor.execute(action)
            finally:
                if restart:
                    self.in_flight_restarts -= 1
            self.counts[f"{actions.action_name(action)}:{result.outcome.value}"] += 1
            if isinstance(action, actions.Skip):
                self.counts[f"skip:{action.code.value}"] += 1
            elif result.outcome is executing.Outcome.SKIPPED:
                self.counts["refused_at_execution"] += 1
            results.append(result)
            self.results.append(result)
        return results
