"""Scale probe (not a test): a ClusterCache over 5,000 nodes and 150,000 pods in the simulated cluster.

Prints the initial sync time, the cache's memory per pod (RSS delta after gc, and a deep size of the
cache's own structures), and the change-to-bus latency (store write -> pod-status event on the bus)
at 1,000 pod updates per second. Targets: sync <= 60 s, <= 3 KiB per pod, p99 <= 100 ms.

    python tests/kube/probe_cache_scale.py [--nodes 5000] [--pods 150000] [--rate 1000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import logging
import resource
import sys
import time
from typing import Any

import structlog

from kcover import bus as bus_
from kcover import metrics
from kcover.detectors import contract, pod_status
from kcover.kube import caching, client, watching
from kcover.sim import server as simserver


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def deep_size(roots: list[Any]) -> int:
    seen: set[int] = set()
    total = 0
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, tuple | list | set | frozenset):
            stack.extend(obj)
    return total


def pod_obj(i: int, nodes: int, job_uid: str) -> dict[str, Any]:
    job = f"job-{i // 32}"
    return {
        "metadata": {"name": f"{job}-worker-{i % 32}", "namespace": f"team-{i % 50}",
                     "labels": {"training.kubeflow.org/job-name": job, "training.kubeflow.org/replica-type": "worker",
                                "training.kubeflow.org/replica-index": str(i % 32), "kcover.io/cascading-recovery": "true",
                                "app.kubernetes.io/name": "trainer"},
                     "annotations": {"kubectl.kubernetes.io/default-container": "trainer",
                                     "sidecar.istio.io/inject": "false"},
                     "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": job,
                                          "uid": job_uid, "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"nodeName": f"gpu-node-{i % nodes}", "restartPolicy": "OnFailure", "schedulerName": "default-scheduler",
                 "containers": [{"name": "trainer", "image": "registry.example.com/ml/trainer:2026.01",
                                 "command": ["torchrun", "--nproc-per-node=8", "train.py"],
                                 "resources": {"limits": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"},
                                               "requests": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"}},
                                 "env": [{"name": "MASTER_ADDR", "value": f"{job}-master-0"},
                                         {"name": "WORLD_SIZE", "value": "32"}]}],
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
        "status": {"phase": "Running", "hostIP": "10.0.0.1", "podIP": "10.1.0.1", "qosClass": "Guaranteed",
                   "startTime": "2026-01-01T00:00:00Z",
                   "conditions": [{"type": t, "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
                                  for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
                   "containerStatuses": [{"name": "trainer", "ready": True, "restartCount": 0, "started": True,
                                          "image": "registry.example.com/ml/trainer:2026.01",
                                          "imageID": "registry.example.com/ml/trainer@sha256:" + "0" * 64,
                                          "containerID": "containerd://" + f"{i:064x}",
                                          "state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}}]},
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--gc-freeze", action="store_true",
                        help="gc.freeze() after seeding (the simulated server's objects live in another process in a real cluster) "
                             "and let the cache freeze after its sync (kube.gc_freeze_after_sync)")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    async with simserver.SimServer() as srv:
        t0 = time.perf_counter()
        for n in range(args.nodes):
            srv.store.create("nodes", {"metadata": {"name": f"gpu-node-{n}", "labels": {"nvidia.com/gpu.present": "true"}},
                                       "spec": {}, "status": {"capacity": {"nvidia.com/gpu": "8"}, "conditions": [
                                           {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                                           {"type": "KcoverGPUHealthy", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
        for ns in range(50):
            srv.store.create("namespaces", {"metadata": {"name": f"team-{ns}"}})
        job_uids: dict[int, str] = {}
        names: list[tuple[str, str]] = []
        for i in range(args.pods):
            j = i // 32
            if j not in job_uids:
                job = srv.store.create("pytorchjobs.kubeflow.org", {"metadata": {"name": f"job-{j}", "namespace": f"team-{i % 50}"}, "spec": {}})
                job_uids[j] = job["metadata"]["uid"]
            obj = srv.store.create("pods", pod_obj(i, args.nodes, job_uids[j]))
            names.append((obj["metadata"]["namespace"], obj["metadata"]["name"]))
        print(f"seeded {args.nodes} nodes, {args.pods} pods, {len(job_uids)} jobs in {time.perf_counter() - t0:.1f} s")

        kube = client.from_configuration(srv.kube_configuration(), request_timeout=300)
        gc.collect()
        if args.gc_freeze:
            gc.freeze()
        rss0 = rss_bytes()
        cache = caching.ClusterCache(kube, options=watching.ReflectorOptions(page_size=500, request_timeout_seconds=300),
                                     freeze_gc=args.gc_freeze)
        bus = bus_.Bus(dedupe_window_seconds=0)
        sub = bus.subscribe("probe", capacity=100_000)
        context = contract.DetectorContext(role=contract.Role.CONTROLLER, metrics=metrics.Metrics(), cluster=cache)
        detector = pod_status.PodStatusDetector("pod-status", pod_status.PodStatusConfig(), context)
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            t0 = time.perf_counter()
            tg.create_task(cache.run(stop), name="cache")
            tg.create_task(detector.run(bus, stop), name="pod-status")
            await cache.wait_synced()
            sync_s = time.perf_counter() - t0
            await asyncio.sleep(0.5)
            gc.collect()
            rss1 = rss_bytes()
            pods = len(cache.pods)
            roots: list[Any] = [cache.pods, cache._pod_by_name, cache._pods_by_node, cache._pods_by_owner,
                                cache._pods_by_label]
            deep = deep_size(roots)
            print(f"initial sync: {sync_s:.1f} s for {pods} pods, {len(cache.nodes)} nodes, {len(cache.workloads)} workloads")
            print(f"memory per cached pod: RSS delta {(rss1 - rss0) / pods:.0f} B (includes client buffers, nodes, "
                  f"allocator slack); deep size of pod store + indexes {deep / pods:.0f} B")

            written: dict[str, float] = {}
            lags: list[float] = []

            async def consume() -> None:
                async for ev in sub:
                    start = written.pop(ev.target.name, None)
                    if start is not None:
                        lags.append(time.perf_counter() - start)

            consumer = tg.create_task(consume(), name="consumer")
            total = int(args.rate * args.seconds)
            finished = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            t0 = time.perf_counter()
            for k in range(total):
                target = t0 + k / args.rate
                delay = target - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                ns, name = names[(k * 7919) % len(names)]

                def fail(obj: dict[str, Any]) -> None:
                    obj["status"]["containerStatuses"][0]["state"] = {
                        "terminated": {"reason": "Error", "exitCode": 1, "finishedAt": finished}}
                written[name] = time.perf_counter()
                srv.store.mutate("pods", ns, name, fail)
            elapsed = time.perf_counter() - t0
            await asyncio.sleep(2.0)
            stop.set()
            await bus.close(drain_timeout_seconds=1)
            consumer.cancel()
        lags.sort()
        p = lambda q: lags[min(len(lags) - 1, int(q * len(lags)))] * 1000  # noqa: E731
        print(f"change-to-bus at {total / elapsed:.0f} updates/s: {len(lags)}/{total} delivered, "
              f"p50 {p(0.5):.1f} ms, p99 {p(0.99):.1f} ms, max {lags[-1] * 1000:.1f} ms")
        await kube.close()


if __name__ == "__main__":
    asyncio.run(main())
