"""Clocks: the `Clock` protocol, the system clock, and a loop-driven clock for virtual time.

Owns wall time (for timestamps written to the API) and monotonic time (for intervals).
Tests pass a clock tied to the event loop so virtual time (looptime) moves both.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> dt.datetime:
        """Timezone-aware UTC wall time."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""
        ...


class SystemClock:
    """Wall time from the OS, monotonic time from the running loop (so looptime fast-forwards it)."""

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)

    def monotonic(self) -> float:
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:
            return time.monotonic()


class LoopClock:
    """Wall time that moves with the running loop's clock: `start` when built, plus loop seconds since.

    Under virtual time (looptime) both `now()` and `monotonic()` fast-forward together, so timestamps
    written to the API, cooldowns and durations agree with the waits. Build it inside the running loop."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self._start = start or dt.datetime.now(dt.UTC)
        self._t0 = asyncio.get_running_loop().time()

    def now(self) -> dt.datetime:
        return self._start + dt.timedelta(seconds=asyncio.get_running_loop().time() - self._t0)

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def micro_time(moment: dt.datetime) -> str:
    """Format a Kubernetes MicroTime: exactly six fractional digits and a `Z` timezone."""
    if moment.tzinfo is None:
        raise ValueError("MicroTime needs a timezone-aware datetime")
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339(moment: dt.datetime) -> str:
    """Format a Kubernetes Time (second precision, `Z`)."""
    if moment.tzinfo is None:
        raise ValueError("Time needs a timezone-aware datetime")
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> dt.datetime:
    """Parse a Kubernetes Time or MicroTime into an aware UTC datetime."""
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)
