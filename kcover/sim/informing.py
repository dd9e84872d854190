"""Store watches merged for the simulated cluster's controllers: one stream of changes over several resources.

Owns `follow`: a watch on each named resource key of a `Store` (every existing object first, as
ADDED, then changes as they are written), merged into one async iterator of (key, change). A watcher
the store closes (one that fell behind) is restarted from a full list, so a consumer sees every
object again as ADDED rather than missing changes, as an informer relists. It ends when `stop` is
set; it holds no state beyond its watchers, which it closes on the way out.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any

from kcover.sim import store as stores
from kcover.sim import tables


async def follow(store: stores.Store, keys: Iterable[str], stop: asyncio.Event) -> AsyncIterator[tuple[str, tables.Change]]:
    """Every change of the resources `keys`, initial ADDEDs first, until `stop` is set."""
    watchers = {key: store.watch(key, tables.Filter(), None) for key in keys}
    getters: dict[str, asyncio.Future[tables.Change | None]] = {}
    stopping = asyncio.ensure_future(stop.wait())
    try:
        while not stop.is_set():
            key = next((k for k, w in watchers.items() if w.initial), None)
            if key is not None:
                yield key, watchers[key].initial.popleft()
                continue
            for k, w in watchers.items():
                if k not in getters:
                    getters[k] = asyncio.ensure_future(w.queue.get())
            waiting: set[asyncio.Future[Any]] = {*getters.values(), stopping}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                break
            for k in [k for k, g in getters.items() if g.done()]:
                change = getters.pop(k).result()
                if change is None:  # closed (fell behind): start over from a full list
                    watchers[k] = store.watch(k, tables.Filter(), None)
                    continue
                yield k, change
    finally:
        stopping.cancel()
        for getter in getters.values():
            getter.cancel()
        for watcher in watchers.values():
            watcher.close()
