"""The drainer's passes over a cordoned node's pods (kcover.recovery.escalating.Drainer), on one event loop."""

from __future__ import annotations

import asyncio
from typing import cast

from kcover.kube import gateway
from kcover.recovery import escalating
from kcover.recovery import steps as st


class SlowEvictions:
    """The one gateway method a drain uses: each eviction waits until `release` is set, and is recorded."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.evicted: list[str] = []

    async def evict_pod(self, namespace: str, name: str, uid: str) -> gateway.Removal:
        await self.release.wait()
        self.evicted.append(f"{namespace}/{name}")
        return gateway.Removal.REMOVED


async def test_a_retry_tick_during_the_drain_steps_first_pass_evicts_each_pod_once_and_fails_nothing() -> None:
    """Seen on the real kube-apiserver: the engine's tick retried a drain while the step's first pass was still
    awaiting an eviction; both passes evicted the same pods and the second removal from `waiting` raised
    KeyError, failing the cordon step after it had landed (its Event never written, the retry refused
    AlreadyCordoned)."""
    evictions = SlowEvictions()
    drainer = escalating.Drainer(cast(gateway.Gateway, evictions))
    pods = [st.PodRef("ml", f"w-{i}", f"uid-{i}") for i in range(3)]
    drain = drainer.start("n1", pods, deadline=100.0)
    first = asyncio.create_task(drainer.evict(drain))
    await asyncio.sleep(0)  # the first pass is waiting on its first eviction
    retry = asyncio.create_task(drainer.tick(now=1.0))
    await asyncio.sleep(0)
    evictions.release.set()
    await first
    ended = await retry
    assert sorted(evictions.evicted) == ["ml/w-0", "ml/w-1", "ml/w-2"]
    assert drain.evicted == 3
    assert not drain.waiting
    assert ended == []  # its pass left the drain to the one in progress
    assert await drainer.tick(now=2.0) == [drain]
    assert drainer.drains == {}
