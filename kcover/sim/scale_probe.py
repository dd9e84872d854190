"""Scale probe (not a test): seed 5,000 nodes and 150,000 pods, then time a paginated list and a watch.

    python -m kcover.sim.scale_probe [--nodes 5000] [--pods 150000] [--limit 500]

Prints seeding time, the time of a full `limit`-paginated list of all pods over HTTP (aiohttp +
orjson, as kcover's reflectors read), the time to receive every ADDED of a watch from "0", and
the process's peak RSS. Client and server share one process and one event loop, so the times
include both sides. Numbers are for comparison between runs, not assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
from typing import Any

import aiohttp
import orjson

from kcover.sim import server as simserver


def node(i: int) -> dict[str, Any]:
    return {"metadata": {"name": f"gpu-{i:05d}", "labels": {"kubernetes.io/hostname": f"gpu-{i:05d}",
                                                            "nvidia.com/gpu.product": "H200"}},
            "spec": {}, "status": {"capacity": {"nvidia.com/gpu": "8"},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(i: int, nodes: int) -> dict[str, Any]:
    job, index = divmod(i, 8)
    name = f"job-{job:05d}-worker-{index}"
    return {
        "metadata": {"name": name, "namespace": f"team-{job % 20}",
                     "labels": {"training.kubeflow.org/job-name": f"job-{job:05d}",
                                "training.kubeflow.org/replica-type": "worker",
                                "training.kubeflow.org/replica-index": str(index),
                                "kcover.io/cascading-recovery": "true"},
                     "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                          "name": f"job-{job:05d}", "uid": f"00000000-0000-4000-8000-{job:012d}",
                                          "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"nodeName": f"gpu-{i % nodes:05d}", "restartPolicy": "OnFailure",
                 "containers": [{"name": "pytorch", "image": "trainer:1",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running", "containerStatuses": [{
            "name": "pytorch", "ready": True, "restartCount": 0, "image": "trainer:1",
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]},
    }


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def probe(nodes: int, pods: int, limit: int) -> None:
    async with simserver.SimServer() as srv:
        started = time.perf_counter()
        for i in range(nodes):
            srv.store.create("nodes", node(i))
        for i in range(20):
            srv.store.create("namespaces", {"metadata": {"name": f"team-{i}"}})
        for i in range(pods):
            srv.store.create("pods", pod(i, nodes))
        print(f"seeded {nodes} nodes + {pods} pods in {time.perf_counter() - started:.1f} s; "
              f"peak RSS {peak_rss_mib():.0f} MiB", flush=True)
        async with aiohttp.ClientSession() as session:
            started = time.perf_counter()
            seen, pages, token = 0, 0, ""
            while True:
                params = {"limit": str(limit)}
                if token:
                    params["continue"] = token
                async with session.get(srv.url + "/api/v1/pods", params=params) as resp:
                    page = orjson.loads(await resp.read())
                seen += len(page["items"])
                pages += 1
                token = page["metadata"].get("continue", "")
                if not token:
                    break
            print(f"paginated list: {seen} pods in {pages} pages of {limit} in "
                  f"{time.perf_counter() - started:.2f} s", flush=True)
            started = time.perf_counter()
            received = 0
            async with session.get(srv.url + "/api/v1/pods", params={"watch": "1", "resourceVersion": "0"},
                                   timeout=aiohttp.ClientTimeout(total=None)) as resp:
                while received < pods:
                    line = await resp.content.readline()
                    if not line:
                        break
                    event = orjson.loads(line)
                    received += event["type"] == "ADDED"
            print(f"watch from 0: {received} ADDED in {time.perf_counter() - started:.2f} s", flush=True)
        print(f"peak RSS {peak_rss_mib():.0f} MiB", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kcover.sim.scale_probe")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--limit", type=int, default=500)
    args = parser.parse_args(argv)
    asyncio.run(probe(args.nodes, args.pods, args.limit))


if __name__ == "__main__":
    main()
