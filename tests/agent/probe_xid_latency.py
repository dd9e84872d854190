"""Benchmark (not a test): XID injected in the fake NVML backend -> Node condition on the simulated API server.

Runs the whole agent (supervisor, NVML detector with its 500 ms default event wait, reporter) against
SimServer, injects XID 79 `--count` times, and measures from the injection to the moment a watch on
the Node shows `KcoverGPUHealthy=False`. Between injections it waits for the condition to return to
True (hold 0.05 s), so every sample is a fresh transition. Prints p50/p90/p99/max. Target: p99 <= 1 s.

    python tests/agent/probe_xid_latency.py --count 200
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import orjson
import structlog

from kcover import layering, metrics
from kcover.agent import running
from kcover.kube import client
from kcover.nvml import fake
from kcover.sim import server as simserver

NODE = "probe-node"


async def probe(count: int) -> list[float]:
    config = layering.layer(file_data={
        "bus": {"dedupe_window_seconds": 0},
        "agent": {"node_name": NODE, "condition_hold_seconds": 0.05, "min_write_interval_seconds": 0.0,
                  "max_events_per_minute": 100_000},
        "detectors": {"entries": {"nvml": {}, "dcgm": {"enabled": False}}},
    }).settings
    samples: list[float] = []
    async with simserver.SimServer() as srv:
        srv.store.create("nodes", {"metadata": {"name": NODE}, "spec": {}, "status": {}})
        kube = client.from_configuration(srv.kube_configuration())
        watcher = client.from_configuration(srv.kube_configuration())
        nvml = fake.FakeNvml(8)
        stop = asyncio.Event()
        status: asyncio.Queue[tuple[float, str]] = asyncio.Queue()

        async def watch() -> None:
            query = {"watch": "true", "fieldSelector": f"metadata.name={NODE}"}
            async with watcher.stream("/api/v1/nodes", query=query, read_timeout=3600) as resp:
                async for line in resp.content:
                    obj: dict[str, Any] = orjson.loads(line)["object"]
                    for cond in (obj.get("status") or {}).get("conditions") or []:
                        if cond["type"] == "KcoverGPUHealthy":
                            status.put_nowait((time.perf_counter(), cond["status"]))

        async def until(want: str) -> float:
            while True:
                at, value = await asyncio.wait_for(status.get(), 10)
                if value == want:
                    return at

        async with asyncio.TaskGroup() as group:
            watch_task = group.create_task(watch(), name="probe:watch")
            agent = group.create_task(running.run(config, client=kube, metrics=metrics.Metrics(), health=None,
                                                  stop=stop, nvml=nvml, reporter_tick_seconds=0.02),
                                      name="probe:agent")
            await until("True")
            for i in range(count):
                while not status.empty():
                    status.get_nowait()
                started = time.perf_counter()
                nvml.xid(79, gpu_index=i % 8)
                samples.append(await until("False") - started)
                await until("True")
            stop.set()
            await agent
            watch_task.cancel()
        await kube.close()
        await watcher.close()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    samples = sorted(asyncio.run(probe(args.count)))

    def pct(p: float) -> float:
        return samples[min(len(samples) - 1, int(p * len(samples)))] * 1000

    print(f"XID -> Node condition, {len(samples)} injections: p50 {pct(0.50):.1f} ms, p90 {pct(0.90):.1f} ms, "
          f"p99 {pct(0.99):.1f} ms, max {samples[-1] * 1000:.1f} ms, mean {statistics.mean(samples) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
