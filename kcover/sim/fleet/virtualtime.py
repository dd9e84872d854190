"""Virtual time for the fleet replay: an asyncio event loop whose clock jumps to its next timer.

Owns `VirtualLoop`, a selector event loop whose `time()` is a counter that moves only when the loop
would otherwise wait: with nothing ready to run, it advances straight to the earliest scheduled timer
instead of sleeping. So weeks of cooldowns, watch timeouts and detector ticks pass in the time the
code between them takes, and `kcover.aio.clock.LoopClock` (wall time from the loop's clock) agrees
with every wait. Nothing here is kcover's product code; the product runs unchanged on this loop.

A file descriptor that is ready (the loop's own self-pipe, woken by a worker thread) is served as on
any loop, without moving the clock. With neither a ready callback, a ready descriptor nor a timer the
loop blocks on its descriptors for real, as a plain loop would (a worker thread may still wake it).
`run(coro)` runs a coroutine on a fresh loop and closes it, like `asyncio.run`.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _Selector(selectors.DefaultSelector):
    """Polls without blocking; a wait the loop asks for becomes a jump of the virtual clock."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            return list(super().select(None))
        assert self.loop is not None
        self.loop.advance(timeout)
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    """See the module docstring. `start` is the clock's first reading (seconds)."""

    def __init__(self, start: float = 0.0) -> None:
        selector = _Selector()
        super().__init__(selector)
        selector.loop = self
        self._now = start
        self.jumps = 0
        """How often the clock jumped (a measure of how many waits were skipped)."""

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self._now += seconds
            self.jumps += 1


def run(coro: Coroutine[Any, Any, T], *, start: float = 0.0) -> T:
    """Run `coro` to completion on a fresh `VirtualLoop`, then cancel what it left and close the loop (as
    `asyncio.run` does). The thread's current event loop is left as it was."""
    loop = VirtualLoop(start)
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
