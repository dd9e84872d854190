"""Retries of Kubernetes API requests: which failures to retry, how long to wait, when to give up.

Owns the retry loop every request of `client.KubeClient` goes through: a failure is retried with
jittered exponential backoff when it says nothing was done or that trying again may work — 429
(waiting what `Retry-After` or `details.retryAfterSeconds` asks, capped), 500, 502, 503, 504, and
connection errors and timeouts (status 0) — until the request's deadline. 409 is not retried here:
only a caller that re-reads can resolve a conflict (the ledger, node rewrites and the Lease do).

A `Fence` bounds writes made on behalf of a leader: before every attempt it is asked how long the
writer may still write, and each attempt's timeout stays below that, so no attempt the client still
waits for outlives the leader's term. A fence that says 0 raises `errors.NotLeaderError`.

It does not decide whether a request is safe to repeat: every write kcover makes is idempotent
or preconditioned (a uid or a resourceVersion), so repeating one whose answer was lost is harmless.
Deadlines are measured on the event loop's clock, so virtual time (looptime) moves them.

How it fails: the last error once the deadline leaves no room for another attempt; anything not
retryable at once, unchanged.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import structlog
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from kcover import errors, settings
from kcover.aio import backoff

log = structlog.get_logger()

T = TypeVar("T")

RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
"""HTTP statuses retried; 0 stands for a connection error or a timeout."""
RETRY_AFTER_JITTER = 0.2
"""A `Retry-After` wait is stretched by up to this fraction, so throttled clients do not return in step."""
MIN_ATTEMPT_SECONDS = 0.05
"""An attempt is not started with less time than this left: it could not finish."""


class Fence(Protocol):
    """How long a writer may still write (seconds); 0 or less once it may not."""

    def write_seconds_left(self) -> float: ...


@dataclass(frozen=True)
class Policy:
    """How one request is retried. `deadline_seconds` bounds all attempts and waits together."""

    deadline_seconds: float = 10.0
    initial_seconds: float = 0.1
    max_delay_seconds: float = 2.0
    max_retry_after_seconds: float = 5.0


DEFAULT = Policy()
NO_RETRY = Policy(deadline_seconds=0.0)


def policy_from(kube: settings.KubeSettings) -> Policy:
    """The policy the `kube.retry_*` settings describe."""
    return Policy(deadline_seconds=kube.retry_deadline_seconds, initial_seconds=kube.retry_initial_seconds,
                  max_delay_seconds=kube.retry_max_delay_seconds,
                  max_retry_after_seconds=kube.retry_max_delay_seconds)


def reason_of(exc: errors.KubeError) -> str:
    """The retry reason counted in `Stats` (and `kcover_api_retries`): throttled, server_error or connection."""
    if exc.status == 429:
        return "throttled"
    if exc.status == 0:
        return "connection"
    return "server_error"


def retryable(exc: BaseException) -> bool:
    return isinstance(exc, errors.KubeError) and (exc.status == 0 or exc.status in RETRYABLE_STATUSES)


@dataclass
class Stats:
    """Retries made, by reason, and requests given up after retrying; read by the metrics collector."""

    retries: Counter[str] = field(default_factory=Counter)
    exhausted: int = 0


class StatsCollector(Collector):
    """Exports a client's `Stats` when scraped: `kcover_api_retries{reason}`, `kcover_api_retries_exhausted`."""

    def __init__(self, stats: Stats) -> None:
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        retries = CounterMetricFamily("kcover_api_retries", "API requests retried, by reason (throttled, "
                                      "server_error, connection).", labels=["reason"])
        for reason in ("throttled", "server_error", "connection"):
            retries.add_metric([reason], self._stats.retries[reason])
        yield retries
        yield CounterMetricFamily("kcover_api_retries_exhausted", "API requests that still failed when their "
                                  "retry deadline passed.", value=self._stats.exhausted)


def delay_for(exc: errors.KubeError, back: backoff.Backoff, policy: Policy, rng: random.Random) -> float:
    """Seconds to wait before the next attempt: the server's Retry-After (capped, jittered) or the backoff."""
    if exc.retry_after is not None and exc.retry_after > 0:
        return min(exc.retry_after, policy.max_retry_after_seconds) * rng.uniform(1.0, 1.0 + RETRY_AFTER_JITTER)
    return back.next_delay()


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


async def call(attempt: Callable[[float], Awaitable[T]], *, policy: Policy, timeout: float, what: str,
               deadline_seconds: float | None = None, fence: Fence | None = None,
               stats: Stats | None = None, rng: random.Random | None = None,
               monotonic: Callable[[], float] = _loop_time,
               answer: Callable[[errors.KubeError], bool] | None = None) -> T:
    """Run `attempt(timeout_seconds)` until it succeeds, fails for good, or the deadline passes.

    `answer`, when given, picks out failures of a retryable status that are the request's own answer and
    raised at once (an eviction's 429 from a PodDisruptionBudget, beside priority and fairness's 429).

    `timeout` bounds one attempt; `deadline_seconds` (default `policy.deadline_seconds`) all of them and
    the waits between them: the first attempt is always made, with the whole `timeout`. A caller that bounds the call from outside
    (`asyncio.timeout`) passes its bound here too: when both expire together, the HTTP library may turn
    the outer cancellation into its own timeout error, and only this deadline then ends the loop.
    """
    back: backoff.Backoff | None = None  # with its jitter source, built at the first retry: most calls make none
    jitter = rng
    total = policy.deadline_seconds if deadline_seconds is None else min(deadline_seconds, policy.deadline_seconds)
    deadline = monotonic() + total
    first = True
    while True:
        budget = min(timeout, deadline - monotonic()) if not first else timeout
        if fence is not None:
            left = fence.write_seconds_left()
            if left <= 0:
                raise errors.NotLeaderError(f"{what}: not leading, write refused")
            budget = min(budget, left)
        try:
            return await attempt(max(budget, MIN_ATTEMPT_SECONDS))
        except errors.KubeError as exc:
            if _cancelling():
                # a timeout around this call fired while the attempt timed out on its own, and the HTTP
                # library turned that cancellation into the error: honour the cancellation, do not retry
                raise asyncio.CancelledError from exc
            if not retryable(exc) or total <= 0 or (answer is not None and answer(exc)):
                raise
            if back is None:
                jitter = jitter or random.Random()  # seeded from the OS: too dear to build for every request
                back = backoff.Backoff(initial=policy.initial_seconds, maximum=policy.max_delay_seconds, rng=jitter)
            assert jitter is not None
            delay = delay_for(exc, back, policy, jitter)
            if monotonic() + delay + MIN_ATTEMPT_SECONDS > deadline:
                if stats is not None:
                    stats.exhausted += 1
                log.warning("api_retries_exhausted", request=what, status=exc.status, error=str(exc)[:200])
                raise
            if stats is not None:
                stats.retries[reason_of(exc)] += 1
            log.debug("api_request_retried", request=what, status=exc.status, delay_seconds=round(delay, 3))
        await asyncio.sleep(delay)
        first = False


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
