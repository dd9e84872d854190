"""Leader election on a coordination.k8s.io/v1 Lease, written here rather than borrowed.

Owns the campaign for one Lease: create it when absent, take it over when the holder let it
expire, renew it every retry period, step down when renewal has not succeeded within the renew
deadline, release it on shutdown (empty holder, duration 1 s) so a successor takes over at once,
and campaign again after a loss. It follows client-go's rules: expiry is judged on this process's
monotonic clock from the moment it *observed* the record change (never by comparing remote wall
clocks), every write carries the resourceVersion as precondition (409 = someone else won),
`leaseTransitions` grows on every change of holder, and MicroTimes have exactly six fractional digits.

It does not decide what a leader does: callers ask `is_leader()` before each write (it is false
as soon as the last successful renewal is older than the renew deadline, even if the renew loop
has not noticed yet), or hand their work to `run_while_leading()`, which cancels it on a loss.

How it fails: API errors never escape `run()`; they count as failed attempts, retried with jitter.
A leader that cannot renew steps down after `renew_deadline_seconds`; one that is cancelled
releases the Lease on the way out unless `release_on_exit` is off. A process that must exit without
waiting for its loop (a forced exit) calls `abandon()` from any thread: it stops counting as leader at
once and releases the Lease over connections of its own, bounded in time.
"""

from __future__ import annotations

import asyncio
import math
import random
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog

from kcover import errors, settings
from kcover import metrics as metrics_
from kcover.aio import clock as clock_
from kcover.aio import waiting
from kcover.kube import client as client_
from kcover.kube import decoding

log = structlog.get_logger()

API_VERSION = "coordination.k8s.io/v1"
JITTER = 0.2
"""Acquire attempts wait `retry_period * uniform(1, 1 + JITTER)`, so replicas do not move in step."""


def lease_path(namespace: str, name: str = "") -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    return f"{base}/{name}" if name else base


@dataclass(frozen=True)
class Record:
    """The election-relevant part of a Lease's spec."""

    holder: str = ""
    duration_seconds: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0

    @classmethod
    def from_lease(cls, lease: dict[str, Any]) -> Record:
        spec = lease.get("spec") or {}
        return cls(holder=str(spec.get("holderIdentity") or ""),
                   duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
                   acquire_time=spec.get("acquireTime"), renew_time=spec.get("renewTime"),
                   transitions=int(spec.get("leaseTransitions") or 0))

    def spec(self) -> dict[str, Any]:
        return {"holderIdentity": self.holder, "leaseDurationSeconds": self.duration_seconds,
                "acquireTime": self.acquire_time, "renewTime": self.renew_time,
                "leaseTransitions": self.transitions}


def is_held_by_other(observed: Record, identity: str, *, observed_at: float, now: float) -> bool:
    """Whether another holder's claim is still valid, judged by when we saw the record last change."""
    if not observed.holder or observed.holder == identity:
        return False
    return observed_at + observed.duration_seconds > now


def claim(observed: Record | None, identity: str, *, duration_seconds: int, now: str) -> Record:
    """The record to write to acquire or renew: keep acquireTime/transitions when renewing our own."""
    if observed is not None and observed.holder == identity:
        return Record(holder=identity, duration_seconds=duration_seconds,
                      acquire_time=observed.acquire_time or now, renew_time=now, transitions=observed.transitions)
    transitions = 0 if observed is None else observed.transitions + 1
    return Record(holder=identity, duration_seconds=duration_seconds, acquire_time=now, renew_time=now,
                  transitions=transitions)


def released(observed: Record, *, now: str) -> Record:
    """What a leader writes on shutdown: no holder, 1 s duration, so a successor need not wait."""
    return Record(holder="", duration_seconds=1, acquire_time=now, renew_time=now,
                  transitions=observed.transitions)


def default_identity() -> str:
    """Host name (the pod name in a cluster) plus a random suffix, as client-go's examples do."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class LeaderElector:
    """Campaigns for one Lease until `stop` is set. One instance per process."""

    def __init__(self, client: client_.KubeClient, lease: settings.LeaseSettings, *, identity: str,
                 metrics: metrics_.Metrics | None = None, clock: clock_.Clock | None = None,
                 on_change: Callable[[bool], None] | None = None, release_on_exit: bool = True,
                 rng: random.Random | None = None) -> None:
        if not identity:
            raise errors.ConfigError("leader election needs a non-empty identity")
        self._client = client
        self.settings = lease
        self.identity = identity
        self._metrics = metrics
        self._clock = clock or clock_.SystemClock()
        self.on_change = on_change
        """Told True when this replica starts leading and False when it stops (set by whoever acts on it)."""
        self.release_on_exit = release_on_exit
        self._rng = rng or random.Random()
        self.leading = asyncio.Event()
        """Set while this replica leads."""
        self.following = asyncio.Event()
        """Set while it does not; set initially."""
        self.following.set()
        self.leadership_epoch = 0
        """Incremented on every acquisition; work started in one epoch must not write in another."""
        self._observed: Record | None = None
        self._observed_rv = ""
        self._observed_at = 0.0
        self._last_renew = -math.inf
        self._abandoned = False
        """Set by `abandon()`: never leader again, whatever the loop still believes."""
        self._other_seen_at = -math.inf
        """Monotonic time a holder other than this replica was last seen renewing (its record changed)."""
        self.leader_seen_before_term = -math.inf
        """When the current term began: the last time (monotonic) another replica was seen leading before it.
        Work observed after that moment (less the Lease duration) may be work no leader carried out: an outage
        of the API server or a leader's death left nobody renewing. This replica's own earlier terms do not
        count: what it still holds is what it did not act on (a term that flapped, acquired and lost before
        its first batch, acted on nothing, and counting it dropped the faults held across it)."""

    # ------------------------------------------------------------------------------------------- queries

    def reconfigure(self, lease: settings.LeaseSettings) -> None:
        """Apply new timings live; name, namespace and identity need a restart."""
        self.settings = lease

    @property
    def _duration(self) -> int:
        return max(1, math.ceil(self.settings.lease_duration_seconds))

    def is_leader(self) -> bool:
        """True only while leading *and* the last successful renewal is younger than the renew deadline."""
        if not self.leading.is_set() or self._abandoned:
            return False
        return self._clock.monotonic() - self._last_renew < self.settings.renew_deadline_seconds

    def write_seconds_left(self) -> float:
        """The `retrying.Fence` of this replica's writes: how long a write started now may take.

        Until the last successful renewal plus the renew deadline plus half the safety margin
        (`lease_duration - renew_deadline`): a successor takes over no sooner than the lease duration
        after it saw that renewal, so an attempt bounded by this ends, on this side, before another
        term can begin, with half the margin left for clock rates and the network. 0 when not leading.
        """
        if not self.is_leader():
            return 0.0
        lease = self.settings
        margin = max(0.0, lease.lease_duration_seconds - lease.renew_deadline_seconds)
        return self._last_renew + lease.renew_deadline_seconds + margin / 2 - self._clock.monotonic()

    def ensure_leader(self) -> None:
        """Raise `errors.NotLeaderError` unless `is_leader()`; call it right before a write."""
        if not self.is_leader():
            raise errors.NotLeaderError(f"{self.identity} does not hold lease {self.settings.name}")

    def _leader_seen_at(self) -> float:
        """Monotonic time this replica last saw another holder renew the Lease; -inf if never."""
        return self._other_seen_at

    @property
    def observed_holder(self) -> str:
        return self._observed.holder if self._observed else ""

    # ---------------------------------------------------------------------------------------- campaign

    async def run(self, stop: asyncio.Event) -> None:
        """Acquire, renew, step down, re-campaign, until `stop`; then release if leading."""
        try:
            while not stop.is_set():
                if not await self._acquire(stop):
                    break
                await self._renew(stop)
        finally:
            was_leading = self.leading.is_set()
            self._set_leading(False, reason="shutdown")
            if was_leading and self.release_on_exit:
                await asyncio.shield(self._release())

    async def _acquire(self, stop: asyncio.Event) -> bool:
        """Try until acquired (True) or stopped (False); a watch cuts the wait short on a release."""
        log.info("lease_campaign_started", lease=self.settings.name, identity=self.identity)
        released = asyncio.Event()
        watcher = asyncio.create_task(self._watch_releases(released, stop), name="lease-watch")
        try:
            while not stop.is_set():
                started = self._clock.monotonic()
                released.clear()
                seen = self._leader_seen_at()  # before this attempt's own read and write of the Lease
                if await self._try_acquire_or_renew(budget=self.settings.renew_deadline_seconds):
                    self.leader_seen_before_term = seen
                    self._last_renew = started
                    self.leadership_epoch += 1
                    self._set_leading(True, reason="acquired")
                    return True
                delay = self.settings.retry_period_seconds * self._rng.uniform(1.0, 1.0 + JITTER)
                await waiting.first_of(stop, released, timeout=delay)
            return False
        finally:
            await _cancel(watcher)

    async def _watch_releases(self, released: asyncio.Event, stop: asyncio.Event) -> None:
        """Set `released` when the Lease is released or deleted, so a follower need not wait a retry period.

        Best effort: any error ends this watch for a retry period; polling alone stays correct.
        """
        query: dict[str, str | int | bool] = {"watch": "true", "fieldSelector": f"metadata.name={self.settings.name}",
                 "timeoutSeconds": 300, "allowWatchBookmarks": "true"}
        while not stop.is_set():
            since = {"resourceVersion": self._observed_rv} if self._observed_rv else {}
            try:
                async with self._client.stream(lease_path(self.settings.namespace), query={**query, **since},
                                               read_timeout=330) as response:
                    async for line in response.content:
                        event = decoding.loads(line)
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":
                            break
                        if kind == "DELETED" or (kind == "MODIFIED" and not Record.from_lease(obj).holder):
                            released.set()
            except (errors.KubeError, aiohttp.ClientError, TimeoutError) as exc:
                log.debug("lease_watch_failed", lease=self.settings.name, error=str(exc) or type(exc).__name__)
            await waiting.sleep_or_stop(stop, self.settings.retry_period_seconds)

    async def _renew(self, stop: asyncio.Event) -> None:
        """Renew every retry period until the deadline passes without success, or stop."""
        while True:
            if await waiting.sleep_or_stop(stop, self.settings.retry_period_seconds):
                return
            started = self._clock.monotonic()
            remaining = self._last_renew + self.settings.renew_deadline_seconds - started
            ok = remaining > 0 and await self._try_acquire_or_renew(budget=remaining)
            if ok:
                self._last_renew = started
                continue
            if self._observed is not None and self._observed.holder not in ("", self.identity):
                self._set_leading(False, reason="taken_over")
                return
            if self._clock.monotonic() - self._last_renew >= self.settings.renew_deadline_seconds:
                self._set_leading(False, reason="renew_deadline_exceeded")
                return

    async def _try_acquire_or_renew(self, *, budget: float) -> bool:
        if self._abandoned:
            return False  # a forced exit is releasing the Lease: never write it again
        now_wall = clock_.micro_time(self._clock.now())
        path = lease_path(self.settings.namespace, self.settings.name)
        try:
            async with asyncio.timeout(max(budget, 0.001)):
                try:
                    lease = await self._client.request("GET", path, timeout=budget, deadline=budget)
                except errors.NotFoundError:
                    record = claim(None, self.identity, duration_seconds=self._duration, now=now_wall)
                    body = {"apiVersion": API_VERSION, "kind": "Lease",
                            "metadata": {"name": self.settings.name, "namespace": self.settings.namespace},
                            "spec": record.spec()}
                    created = await self._client.request("POST", lease_path(self.settings.namespace),
                                                         body=body, timeout=budget, deadline=budget)
                    self._observe(created)
                    return True
                self._observe(lease)
                observed = self._observed
                assert observed is not None
                if is_held_by_other(observed, self.identity, observed_at=self._observed_at,
                                    now=self._clock.monotonic()):
                    return False
                if observed.holder != self.identity and self.leading.is_set():
                    return False  # someone else took it over while we believed we led
                record = claim(observed, self.identity, duration_seconds=self._duration, now=now_wall)
                body = dict(lease)
                body["spec"] = {**(lease.get("spec") or {}), **record.spec()}
                updated = await self._client.request("PUT", path, body=body, timeout=budget, deadline=budget)
                self._observe(updated)
                return True
        except errors.ConflictError:
            log.debug("lease_conflict", lease=self.settings.name, identity=self.identity)
            return False
        except (errors.KubeError, TimeoutError) as exc:
            log.warning("lease_attempt_failed", lease=self.settings.name, identity=self.identity,
                        error=str(exc) or type(exc).__name__)
            return False

    def _observe(self, lease: dict[str, Any]) -> None:
        record = Record.from_lease(lease)
        if record != self._observed:
            self._observed = record
            self._observed_at = self._clock.monotonic()
            if record.holder and record.holder != self.identity:
                self._other_seen_at = self._observed_at
        self._observed_rv = str((lease.get("metadata") or {}).get("resourceVersion") or "")

    async def _release(self) -> None:
        """Write an empty holder with duration 1 s, bounded in time; failures only logged."""
        observed = self._observed
        if observed is None or observed.holder != self.identity:
            return
        path = lease_path(self.settings.namespace, self.settings.name)
        record = released(observed, now=clock_.micro_time(self._clock.now()))
        body = {"apiVersion": API_VERSION, "kind": "Lease",
                "metadata": {"name": self.settings.name, "namespace": self.settings.namespace,
                             "resourceVersion": self._observed_rv},
                "spec": record.spec()}
        timeout = self.settings.renew_deadline_seconds
        try:
            async with asyncio.timeout(timeout):
                updated = await self._client.request("PUT", path, body=body, timeout=timeout, deadline=timeout)
            self._observe(updated)
            log.info("lease_released", lease=self.settings.name, identity=self.identity)
        except (errors.KubeError, TimeoutError) as exc:
            log.warning("lease_release_failed", lease=self.settings.name, identity=self.identity,
                        error=str(exc) or type(exc).__name__)

    def abandon(self, timeout: float) -> None:
        """For a forced exit, from any thread (the process's loop may be blocked): stop counting as leader
        (every fenced write is refused from now on) and release the Lease if this replica holds it, within
        `timeout` seconds, on a loop and connections of its own. Never raises; a failure is logged."""
        self._abandoned = True
        if self.release_on_exit:
            try:
                asyncio.run(asyncio.wait_for(self._release_fresh(), timeout))
            except Exception as exc:  # a forced exit must go on: the successor then waits for expiry
                log.warning("lease_release_failed", lease=self.settings.name, identity=self.identity,
                            error=str(exc) or type(exc).__name__, forced=True)

    async def _release_fresh(self) -> None:
        kube = self._client.fork()
        path = lease_path(self.settings.namespace, self.settings.name)
        try:
            for _ in range(3):  # a renewal this process's loop still had in flight may win the first PUT
                lease = await kube.request("GET", path)
                observed = Record.from_lease(lease)
                if observed.holder != self.identity:
                    return
                record = released(observed, now=clock_.micro_time(self._clock.now()))
                try:
                    await kube.request("PUT", path, body={
                        "apiVersion": API_VERSION, "kind": "Lease",
                        "metadata": {"name": self.settings.name, "namespace": self.settings.namespace,
                                     "resourceVersion": str((lease.get("metadata") or {}).get("resourceVersion") or "")},
                        "spec": record.spec()})
                except errors.ConflictError:
                    continue
                log.info("lease_released", lease=self.settings.name, identity=self.identity, forced=True)
                return
        finally:
            await kube.close()

    def _set_leading(self, leading: bool, *, reason: str) -> None:
        if leading == self.leading.is_set():
            return
        if leading:
            self.following.clear()
            self.leading.set()
            log.info("lease_acquired", lease=self.settings.name, identity=self.identity,
                     epoch=self.leadership_epoch, transitions=self._observed.transitions if self._observed else 0)
        else:
            self.leading.clear()
            self.following.set()
            (log.info if reason == "shutdown" else log.warning)(
                "lease_lost", lease=self.settings.name, identity=self.identity, reason=reason,
                epoch=self.leadership_epoch)
        if self._metrics is not None:
            self._metrics.is_leader.set(1 if leading else 0)
        if self.on_change is not None:
            self.on_change(leading)

    # ------------------------------------------------------------------------------------ leader work

    async def run_while_leading(self, work: Callable[[], Awaitable[None]], stop: asyncio.Event) -> None:
        """Run `work()` during each leadership epoch; cancel it when leadership is lost or on stop.

        `work` returning early is fine (it is not restarted within the epoch); raising propagates.
        """
        while not stop.is_set():
            if await waiting.first_of(stop, self.leading) is stop:
                return
            epoch = self.leadership_epoch
            task = asyncio.create_task(_as_coroutine(work), name=f"leader-work-{epoch}")
            waiter = asyncio.create_task(waiting.first_of(stop, self.following), name=f"leader-watch-{epoch}")
            try:
                await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if task.done():
                    task.result()  # a failure of the work propagates
                    await waiter  # finished early: idle until this epoch ends
                    continue
            finally:
                await _cancel(task, waiter)
            log.info("leader_work_cancelled", identity=self.identity, epoch=epoch)


async def _as_coroutine(work: Callable[[], Awaitable[None]]) -> None:
    await work()


async def _cancel(*tasks: asyncio.Task[Any]) -> None:
    """Cancel child tasks and wait for them without swallowing our own cancellation."""
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)
