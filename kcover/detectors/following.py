"""What every cache-following controller detector shares: the follow loop.

Owns the loop the pod-status, DRA health, Event and node-condition detectors would otherwise each write:
wait for the cluster cache's first sync, subscribe to its changes, optionally tick, and unsubscribe on
stop. It is not a detector and decides nothing. The state those detectors keep across restarts is the
context's (`DetectorContext.state`); a detector without a cache raises `DetectorUnavailableError`
through `contract.cluster_of` before it gets here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kcover.aio import waiting
from kcover.detectors import contract


async def follow(cluster: contract.ClusterView, stop: asyncio.Event, on_change: contract.OnChange, *,
                 tick_seconds: float | None = None, on_tick: Callable[[], None] | None = None) -> None:
    """After the first sync, deliver every cache change to `on_change` (and tick) until `stop`."""
    if not await cluster.wait_synced(stop):
        return
    unsubscribe = cluster.subscribe(on_change)
    try:
        if on_tick is None or tick_seconds is None:
            await stop.wait()
            return
        while not await waiting.sleep_or_stop(stop, tick_seconds):
            on_tick()
    finally:
        unsubscribe()
