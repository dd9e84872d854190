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


async def test_a_drain_past_its_deadline_during_a_pass_ends_after_it_with_every_eviction_counted() -> None:
    """A tick at the deadline while the step's first pass still awaits its evictions ended the drain with the
    evictions of that pass uncounted (its Event said fewer pods than were evicted)."""
    evictions = SlowEvictions()
    drainer = escalating.Drainer(cast(gateway.Gateway, evictions))
    drain = drainer.start("n1", [st.PodRef("ml", f"w-{i}", f"uid-{i}") for i in range(2)], deadline=10.0)
    first = asyncio.create_task(drainer.evict(drain))
    await asyncio.sleep(0)
    assert await drainer.tick(now=11.0) == []  # past the deadline, but its pass is in progress
    evictions.release.set()
    await first
    assert await drainer.tick(now=12.0) == [drain]
    assert (drain.evicted, drain.waiting) == (2, {})
