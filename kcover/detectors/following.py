"""What every cache-following controller detector shares: kept state and the follow loop.

Owns two things the pod-status, DRA health, Event and node-condition detectors would otherwise each
write: state that outlives a restart by the supervisor (`context.extras["detector_state"][name]`),
and the loop that waits for the cluster cache's first sync, subscribes to its changes, optionally
ticks, and unsubscribes on stop. It is not a detector and decides nothing. Without a cache in the
context it raises `DetectorUnavailableError` naming the detector.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from kcover import errors
from kcover.detectors import contract
from kcover.kube import caching

T = TypeVar("T")

OnChange = Callable[[caching.Kind, Any, Any], None]


def kept_state(context: contract.DetectorContext, name: str, kind: type[T], factory: Callable[[], T]) -> T:
    """The detector's state object, created once per process and reused across supervisor restarts."""
    states = context.extras.setdefault("detector_state", {})
    state = states.get(name)
    if not isinstance(state, kind):
        state = states[name] = factory()
    return state


def cache_of(context: contract.DetectorContext, name: str) -> caching.ClusterCache:
    cache = context.cache
    if not isinstance(cache, caching.ClusterCache):
        raise errors.DetectorUnavailableError(f"{name} needs the controller's cluster cache")
    return cache


async def follow(cache: caching.ClusterCache, stop: asyncio.Event, on_change: OnChange, *,
                 tick_seconds: float | None = None, on_tick: Callable[[], None] | None = None) -> None:
    """After the first sync, deliver every cache change to `on_change` (and tick) until `stop`."""
    if not await cache.wait_synced(stop):
        return
    unsubscribe = cache.subscribe(on_change)
    try:
        if on_tick is None or tick_seconds is None:
            await stop.wait()
            return
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), tick_seconds)
            on_tick()
    finally:
        unsubscribe()
