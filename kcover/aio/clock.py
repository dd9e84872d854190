"""Clocks: the `Clock` protocol, the system clock, and `FakeClock`, the one clock tests use.

Owns wall time (for timestamps written to the API), monotonic time (for intervals) and the formats
Kubernetes writes times in. `SystemClock` reads monotonic time from the running loop, so virtual time
(looptime) fast-forwards it. `FakeClock` moves only when a test says so, or with the loop's time; it is
product code (like structlog's `testing`) so that no test writes its own. No I/O; the formatters raise
`ValueError` for a naive datetime.
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


EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
"""Where a `FakeClock` starts unless told otherwise: a fixed moment, so tests do not depend on today."""


class FakeClock:
    """A `Clock` for tests: wall and monotonic time that move together, only when the test says so
    (`advance`), or also with the running loop's time when `follow_loop` (so looptime's virtual time, or
    real time, moves them: timestamps written to the API, cooldowns and waits then agree). `set_now`
    moves the wall clock alone, as an NTP step would; monotonic time never goes back."""

    def __init__(self, start: dt.datetime = EPOCH, *, monotonic_start: float | None = None,
                 follow_loop: bool = False) -> None:
        if start.tzinfo is None:
            raise ValueError("FakeClock needs a timezone-aware start")
        self._start = start.astimezone(dt.UTC)
        self._follow_loop = follow_loop
        self._origin: float | None = None
        if follow_loop:
            try:
                self._origin = asyncio.get_running_loop().time()  # from now; else from its first reading
            except RuntimeError:
                pass
        self._monotonic_start = monotonic_start
        """None: 0, or when following the loop its time when the clock started, so that `monotonic()` is
        the loop's own time as `SystemClock`'s is (waits and intervals agree)."""
        self._advanced = 0.0
        self._wall_shift = dt.timedelta()
        self._last: tuple[float, dt.timedelta, dt.datetime] | None = None
        """The last `now()` and what it was computed from: read again and again within one loop step."""

    @property
    def elapsed(self) -> float:
        """Seconds this clock has moved since it started (advanced, plus the loop's time when following it)."""
        moved = self._advanced
        if self._follow_loop:
            now = asyncio.get_running_loop().time()
            if self._origin is None:
                self._origin = now
            moved += now - self._origin
        return moved

    def _base(self) -> float:
        if self._monotonic_start is not None:
            return self._monotonic_start
        return self._origin if self._follow_loop and self._origin is not None else 0.0

    def now(self) -> dt.datetime:
        elapsed, shift, last = self.elapsed, self._wall_shift, self._last
        if last is not None and last[0] == elapsed and last[1] == shift:
            return last[2]
        moment = self._start + shift + dt.timedelta(seconds=elapsed)
        self._last = (elapsed, shift, moment)
        return moment

    def monotonic(self) -> float:
        elapsed = self.elapsed  # first: a loop-following clock may take its origin now
        return self._base() + elapsed

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by `seconds`."""
        if seconds < 0:
            raise ValueError("a clock does not go back; use set_now() for a wall-clock step")
        self._advanced += seconds

    def set_now(self, moment: dt.datetime) -> None:
        """Set the wall clock to `moment` (forward or back); monotonic time does not move."""
        if moment.tzinfo is None:
            raise ValueError("set_now needs a timezone-aware datetime")
        self._wall_shift += moment - self.now()


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
