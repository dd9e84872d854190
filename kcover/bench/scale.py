"""Scale and throughput: initial sync time, controller RSS per cached pod, pod updates absorbed per second.

Owns both sides of the measurement. The orchestrator (`measure`) seeds the cluster up to each size
(sizes grow, so each step only adds objects), then starts a fresh controller *worker process*
(`python -m kcover.bench.scale --kubeconfig PATH`) so its RSS holds nothing but the controller: the
API server is another process (the simulated one, or a real cluster). The worker runs the whole
controller without the recovery engine (cache, detectors, bus), prints one JSON line once synced,
records when each pod-status event reaches its bus, and prints those arrivals when told `report` on
stdin. For throughput the orchestrator writes container failures to distinct pods at a fixed rate
and joins its write times with the worker's arrivals (wall clock: same machine).

How it fails: a worker that exits early or prints no JSON raises `errors.KcoverError` with its
stderr tail; API errors propagate.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

import structlog

from kcover import errors, metrics, model, serving, settings
from kcover.bench import objects, rawapi, seeding, simproc
from kcover.controller import running as controller_running
from kcover.kube import client as client_

log = structlog.get_logger()

TEAMS = 50
WORKERS_PER_JOB = 32


@dataclass(frozen=True)
class Size:
    nodes: int
    pods: int


class Seeded:
    """What has been seeded so far, so the next size only adds the difference."""

    def __init__(self) -> None:
        self.nodes: list[str] = []
        self.pods: list[tuple[str, str]] = []
        self.jobs = 0
        self.namespaces = False

    async def grow(self, api: rawapi.RawApi, size: Size, *, concurrency: int = 48) -> float:
        started = time.perf_counter()
        if not self.namespaces:
            await seeding.namespaces(api, [f"team-{t}" for t in range(TEAMS)])
            self.namespaces = True
        new_nodes = [f"gpu-{i:05d}" for i in range(len(self.nodes), size.nodes)]
        await seeding.nodes(api, new_nodes, concurrency=concurrency)
        self.nodes += new_nodes
        specs = []
        missing = size.pods - len(self.pods)
        while missing > 0:
            workers = min(WORKERS_PER_JOB, missing)
            specs.append((f"team-{self.jobs % TEAMS}", f"job-{self.jobs:05d}", workers))
            self.jobs += 1
            missing -= workers
        made = await seeding.jobs(api, specs, node_names=self.nodes, concurrency=concurrency,
                                  first_index=len(self.pods))
        self.pods += [(j.namespace, p) for j in made for p in j.pods]
        return time.perf_counter() - started


def bench_settings() -> settings.Settings:
    return settings.Settings.model_validate({"lease": {"enabled": False},
                                             "kube": {"workload_kinds": ["pytorchjobs.kubeflow.org"]}})


# --------------------------------------------------------------------------------------------- worker process

def _rss() -> int:
    return simproc.rss_bytes()


async def worker(kubeconfig: str) -> None:
    """The controller worker: sync, print the numbers, record bus arrivals until `report`."""
    kube = await client_.connect(kubeconfig, request_timeout=300)
    controller = controller_running.Controller(bench_settings(), client=kube, metrics=metrics.Metrics(),
                                               health=serving.Health(), recover=False)
    gc.collect()
    rss0 = _rss()  # after imports and construction: the delta is what the cluster's objects cost
    sub = controller.bus.subscribe("bench", capacity=1_000_000)
    arrivals: dict[str, float] = {}

    async def record() -> None:
        async for event in sub:
            if event.severity is model.Severity.ERROR:
                arrivals.setdefault(event.target.name, time.time())

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    async with asyncio.TaskGroup() as tg:
        t0 = time.perf_counter()
        tg.create_task(controller.run(stop), name="bench:controller")
        tg.create_task(record(), name="bench:recorder")
        await controller.cache.wait_synced()
        sync_seconds = time.perf_counter() - t0
        await asyncio.sleep(0.5)
        gc.collect()
        rss1 = _rss()
        print(json.dumps({"sync_seconds": sync_seconds, "rss_before": rss0, "rss_after": rss1,
                          "pods": len(controller.cache.pods), "nodes": len(controller.cache.nodes),
                          "cpu_seconds": time.process_time()}), flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)
        print(json.dumps({"arrivals": arrivals, "cpu_seconds": time.process_time(),
                          "peak_rss": simproc.peak_rss_bytes()}), flush=True)
        stop.set()
    await kube.close()


# --------------------------------------------------------------------------------------------- orchestrator

class Worker:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, kubeconfig: str) -> Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kcover.bench.scale", "--kubeconfig", kubeconfig,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            limit=1 << 28)  # the arrivals line holds one entry per updated pod
        return cls(proc)

    async def line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        try:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except TimeoutError:
            raw = b""
        try:
            data: dict[str, Any] = json.loads(raw)
            return data
        except ValueError:
            self.proc.kill()
            _, err = await self.proc.communicate()
            raise errors.KcoverError(f"the bench controller worker failed: {err.decode()[-2000:]}") from None

    async def report(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"report\n")
        await self.proc.stdin.drain()
        data = await self.line(timeout)
        await asyncio.wait_for(self.proc.wait(), 30)
        return data

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


async def churn(api: rawapi.RawApi, targets: list[tuple[str, str]], *, rate: float) -> dict[str, float]:
    """Fail one container per target pod at `rate` writes per second; returns wall time of each write."""
    written: dict[str, float] = {}
    start = time.perf_counter()
    tasks: set[asyncio.Task[None]] = set()

    async def one(ns: str, name: str) -> None:
        await seeding.write_pod_status(api, ns, name, objects.failed_status(0))

    for k, (ns, name) in enumerate(targets):
        delay = start + k / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        written[name] = time.time()
        task = asyncio.create_task(one(ns, name), name="bench:churn-write")
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    return written


async def measure(kubeconfig: str, sizes: list[Size], *, seed: bool, throughput_rate: float,
                  throughput_seconds: float, sync_timeout: float = 600.0) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Scale rows per size, and throughput (at the first size) as a dict."""
    rows: list[dict[str, Any]] = []
    throughput: dict[str, Any] = {}
    seeded = Seeded()
    async with await rawapi.open_api(kubeconfig) as api:
        for index, size in enumerate(sizes):
            seed_seconds = await seeded.grow(api, size) if seed else 0.0
            log.info("bench_scale_seeded", nodes=size.nodes, pods=size.pods, seconds=round(seed_seconds, 1))
            w = await Worker.start(kubeconfig)
            try:
                synced = await w.line(sync_timeout)
                row = {"nodes": synced["nodes"], "pods": synced["pods"], "seed_seconds": round(seed_seconds, 2),
                       "sync_seconds": round(synced["sync_seconds"], 3),
                       "rss_delta_bytes": synced["rss_after"] - synced["rss_before"],
                       "rss_bytes": synced["rss_after"]}
                row["bytes_per_pod"] = round(row["rss_delta_bytes"] / max(1, row["pods"]))
                written: dict[str, float] = {}
                if index == 0 and throughput_rate > 0 and seeded.pods:
                    count = min(len(seeded.pods), int(throughput_rate * throughput_seconds))
                    step = max(1, len(seeded.pods) // count)
                    targets = [seeded.pods[(k * step) % len(seeded.pods)] for k in range(count)]
                    cpu0 = synced["cpu_seconds"]
                    written = await churn(api, targets, rate=throughput_rate)
                    await asyncio.sleep(2.0)
                report = await w.report(60)
                row["peak_rss_bytes"] = report["peak_rss"]
                rows.append(row)
                if written:
                    throughput = _throughput(written, report["arrivals"], report["cpu_seconds"] - cpu0,
                                             rate=throughput_rate)
            finally:
                await w.kill()
    return rows, throughput


def _throughput(written: dict[str, float], arrivals: dict[str, float], cpu_seconds: float, *,
                rate: float) -> dict[str, Any]:
    lags = sorted(arrivals[n] - t for n, t in written.items() if n in arrivals)
    first = min(written.values())
    last = max((arrivals[n] for n in written if n in arrivals), default=first)
    absorbed = len(lags) / max(1e-9, last - first)
    return {"offered_per_second": rate, "updates": len(written), "delivered": len(lags),
            "absorbed_per_second": round(absorbed, 1),
            "controller_cpu_seconds": round(cpu_seconds, 3),
            "updates_per_cpu_second": round(len(lags) / max(1e-9, cpu_seconds), 1),
            "lag_seconds": lags}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kcover.bench.scale",
                                     description="the bench's controller worker process (started by `kcover bench`)")
    parser.add_argument("--kubeconfig", required=True)
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    asyncio.run(worker(args.kubeconfig))


if __name__ == "__main__":
    main()
