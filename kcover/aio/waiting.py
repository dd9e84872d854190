"""Waiting with a way out: sleep until stopped, the first of several signals, an awaitable unless stopped,
and the process's SIGINT and SIGTERM as a stop event.

Owns the one way kcover waits for "X, or the stop signal, or a timeout", so no module writes its own
race of `stop.wait()` against something else, nor its own SIGINT handling. Every helper returns as soon
as the answer is known (a signal already set returns at once), cancels and awaits whatever it started
before it returns, and never swallows the caller's own cancellation. What the awaited work raises
propagates. No module state, no I/O (`process_stop_signals` sets the running loop's signal handlers, and
takes them off on leaving); the times are the running loop's (so looptime's virtual time moves them).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Iterator
from typing import TypeVar

T = TypeVar("T")


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds`, waking early when `stop` is set. True when `stop` is set (already, or during the
    sleep); False when the time ran out."""
    if stop.is_set():
        return True
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(seconds, 0.0)):
            await stop.wait()
    return stop.is_set()


async def first_of(*events: asyncio.Event, timeout: float | None = None) -> asyncio.Event | None:
    """Wait until one of `events` is set, for at most `timeout` seconds (None: no limit). Returns the first
    of `events`, in the order given, that is set, or None when the time ran out first."""
    if not events:
        raise ValueError("first_of needs at least one event")
    found = _first_set(events)
    if found is not None or (timeout is not None and timeout <= 0):
        return found
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.wait(waiters)
    return _first_set(events)


def _first_set(events: tuple[asyncio.Event, ...]) -> asyncio.Event | None:
    return next((event for event in events if event.is_set()), None)


async def or_stop(work: Awaitable[T], stop: asyncio.Event, *, timeout: float | None = None) -> T | None:
    """Await `work` unless `stop` is set (or `timeout` seconds pass) first: its result, or None when it was
    cut short, in which case `work` is cancelled and awaited before this returns. A result that arrives
    together with the stop signal is returned, not lost. For work whose result is never None (a queue's
    item, a batch, a chunk); what `work` raises propagates."""
    task = asyncio.ensure_future(work)
    if stop.is_set() and not task.done():
        task.cancel()
        await asyncio.wait({task})
        return None
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if not task.done():
            task.cancel()
        await asyncio.wait({task, stopper})
    if task.cancelled():
        return None
    return task.result()


@contextlib.contextmanager
def process_stop_signals() -> Iterator[asyncio.Event]:
    """An event that SIGINT and SIGTERM set while inside (the running loop's handlers, removed on leaving:
    SIGINT raises KeyboardInterrupt again, SIGTERM ends the process again). Not left to Python's KeyboardInterrupt: a process started in the background by a shell
    without job control inherits SIGINT ignored, and then only SIGKILL stopped it. Off the main thread no
    handler can be set, and the event is set by nobody: cancelling is the way to stop there."""
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stopped.set)
        except (RuntimeError, ValueError):
            continue
        installed.append(sig)
    try:
        yield stopped
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
