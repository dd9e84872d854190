"""Bus throughput: events published and delivered per second with N subscribers.

`python -m kcover.bench.bus_probe --events 400000 --subscribers 4` publishes distinct events (dedupe
on, so the dedupe window's bookkeeping is in the measurement) while N consumer tasks drain their
queues concurrently, and prints one JSON document with the rate and its ratio to the target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from kcover import bus, model

TARGET_EVENTS_PER_SECOND = 200_000


async def measure(events: int, subscribers: int, batch: int = 1000) -> dict[str, float]:
    b = bus.Bus(dedupe_window_seconds=5.0)
    subs = [b.subscribe(f"s{i}", capacity=events) for i in range(subscribers)]
    target = model.Target(kind=model.TargetKind.POD, namespace="ns", name="p")
    prepared = [model.CollectorEvent(detector="bench", target=target, severity=model.Severity.ERROR,
                                     reason="Bench", dedupe_key=str(i)) for i in range(events)]
    counts = [0] * subscribers

    async def consume(i: int) -> None:
        while batch_ := await subs[i].get_batch():
            counts[i] += len(batch_)

    consumers = [asyncio.create_task(consume(i)) for i in range(subscribers)]
    start = time.perf_counter()
    for offset in range(0, events, batch):
        for event in prepared[offset:offset + batch]:
            b.publish_nowait(event)
        await asyncio.sleep(0)  # let consumers run between batches, as detectors yield between changes
    await b.close(drain_timeout_seconds=60)
    await asyncio.gather(*consumers)
    elapsed = time.perf_counter() - start
    assert all(c == events for c in counts), counts
    rate = events / elapsed
    return {"events": events, "subscribers": subscribers, "seconds": round(elapsed, 3),
            "published_and_delivered_per_second": round(rate), "deliveries_per_second": round(rate * subscribers),
            "target_per_second": TARGET_EVENTS_PER_SECOND, "ratio_to_target": round(rate / TARGET_EVENTS_PER_SECOND, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--subscribers", type=int, default=4)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.events, args.subscribers))))


if __name__ == "__main__":
    main()
