"""Scale and throughput: initial sync time, controller RSS per cached pod, pod updates absorbed per second.

Owns both sides of the measurement. The orchestrator (`measure`) seeds the cluster up to each size
(sizes grow, so each step only adds objects), then starts a fresh controller *worker process*
(`python -m kcover.bench.scale --kubeconfig PATH`) so its RSS holds nothing but the controller: the
API server is another process (the simulated one, or a real cluster). The worker runs the whole
controller without the recovery engine (cache, detectors, bus), prints one JSON line once synced,
records when each pod-status event reaches its bus, and prints those arrivals when told `report` on
stdin. Told `arm`, it resets its peak RSS and watches its reflectors; told `relisted`, it answers once
each has listed again (the fleet bench expires every watch in between) with when each did and the peak
RSS meanwhile. For throughput the orchestrator writes container failures to distinct pods at a fixed rate
and joins its write times with the worker's arrivals (wall clock: same machine).

How it fails: a worker that exits early or prints no JSON raises `errors.KcoverError` with its
stderr tail; API errors propagate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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


def bench_settings(workload_kinds: tuple[str, ...] = ("pytorchjobs.kubeflow.org",)) -> settings.Settings:
    return settings.Settings.model_validate({"lease": {"enabled": False},
                                             "kube": {"workload_kinds": list(workload_kinds)}})


# --------------------------------------------------------------------------------------------- worker process

def _rss() -> int:
    return simproc.rss_bytes()


def _reset_peak_rss() -> None:
    """Set `VmHWM` back to the current RSS (Linux: `5` to /proc/self/clear_refs), to read a later peak alone."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class _Relist:
    """The worker's watch on its own re-lists: armed before the API server expires every watch, answered
    once the pod and node reflectors have listed again and the others had `GRACE_SECONDS` more (a collection
    written since the compaction resumes its watch without a re-list), with when each listed, how long the
    list took, and the RSS peak meanwhile."""

    REQUIRED = ("pods", "nodes")
    GRACE_SECONDS = 5.0

    def __init__(self, controller: controller_running.Controller) -> None:
        self.reflectors = list(controller.cache.reflectors)
        self.before = {r.name: r.lists for r in self.reflectors}
        self.done: dict[str, float] = {}
        self.sampled = _rss()
        _reset_peak_rss()
        self._task = asyncio.create_task(self._watch(), name="bench:relist-watch")

    async def _watch(self) -> None:
        grace_until = float("inf")
        while len(self.done) < len(self.reflectors) and time.monotonic() < grace_until:
            for r in self.reflectors:
                if r.name not in self.done and r.lists > self.before[r.name]:
                    self.done[r.name] = time.time()
            if grace_until == float("inf") and all(n in self.done for n in self.REQUIRED):
                grace_until = time.monotonic() + self.GRACE_SECONDS
            self.sampled = max(self.sampled, _rss())
            await asyncio.sleep(0.02)

    async def wait(self, timeout: float) -> dict[str, Any]:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        self._task.cancel()
        gc.collect()
        return {"relisted": {r.name: {"at": self.done[r.name], "list_seconds": round(r.list_seconds, 3),
                                      "objects": len(r.store)} for r in self.reflectors if r.name in self.done},
                "not_relisted": [r.name for r in self.reflectors if r.name not in self.done],
                "peak_rss": simproc.peak_rss_bytes(), "sampled_max_rss": self.sampled, "rss": _rss()}


async def worker(kubeconfig: str, workload_kinds: tuple[str, ...] = ("pytorchjobs.kubeflow.org",)) -> None:
    """The controller worker: sync, print the numbers, then answer commands on stdin (`arm` and `relisted`
    around an expiry of every watch; `report`: the bus arrivals, and exit)."""
    kube = await client_.connect(kubeconfig, request_timeout=300)
    controller = controller_running.Controller(bench_settings(workload_kinds), client=kube, metrics=metrics.Metrics(),
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
        t0, cpu0 = time.perf_counter(), time.process_time()
        tg.create_task(controller.run(stop), name="bench:controller")
        tg.create_task(record(), name="bench:recorder")
        await controller.cache.wait_synced()
        sync_seconds, sync_cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
        await asyncio.sleep(0.5)
        gc.collect()
        rss1 = _rss()
        print(json.dumps({"sync_seconds": sync_seconds, "sync_cpu_seconds": sync_cpu_seconds,
                          "lists": {r.name: round(r.list_seconds, 3) for r in controller.cache.reflectors},
                          "rss_before": rss0, "rss_after": rss1,
                          "pods": len(controller.cache.pods), "nodes": len(controller.cache.nodes),
                          "cpu_seconds": time.process_time(), "peak_rss": simproc.peak_rss_bytes()}), flush=True)
        relist: _Relist | None = None
        while True:
            command = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
            if command == "arm":
                relist = _Relist(controller)
                print(json.dumps({"armed": time.time(), "rss": _rss()}), flush=True)
            elif command.startswith("relisted") and relist is not None:
                timeout = float(command.partition(" ")[2] or 600)
                print(json.dumps(await relist.wait(timeout)), flush=True)
            else:  # `report`, or stdin closed
                break
        print(json.dumps({"arrivals": arrivals, "cpu_seconds": time.process_time(),
                          "peak_rss": simproc.peak_rss_bytes()}), flush=True)
        stop.set()
    await kube.close()


# --------------------------------------------------------------------------------------------- orchestrator

class Worker:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, kubeconfig: str, *, workload_kinds: tuple[str, ...] = ()) -> Worker:
        kinds_ = ("--workload-kinds", ",".join(workload_kinds)) if workload_kinds else ()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kcover.bench.scale", "--kubeconfig", kubeconfig, *kinds_,
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

    async def ask(self, command: str, timeout: float) -> dict[str, Any]:
        """Send one command line; its JSON answer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        await self.proc.stdin.drain()
        return await self.line(timeout)

    async def report(self, timeout: float) -> dict[str, Any]:
        data = await self.ask("report", timeout)
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
    parser.add_argument("--workload-kinds", default="pytorchjobs.kubeflow.org",
                        help="the workload kinds the controller watches, plural.group,...")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    asyncio.run(worker(args.kubeconfig, tuple(k for k in args.workload_kinds.split(",") if k)))


if __name__ == "__main__":
    main()
