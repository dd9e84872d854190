"""Background pod status churn for the fleet bench, in a process of its own.

Owns the writer (`python -m kcover.bench.churning --kubeconfig PATH --rate N --targets FILE`): it flips
the Ready condition (and the container's `ready`) of the pods listed in FILE (`namespace/name` per line),
round robin, at N status writes per second, as kubelets do when readiness probes fail and recover. None
is a fault (no container terminates), so the controller's detectors read each change and act on none.
It runs until its stdin closes, then prints one JSON line: writes made, errors, seconds, the rate
achieved and how far behind schedule it fell. A process of its own, so its event loop and CPU are not
the controller's under test; `Churn` starts and stops it from the bench.

How it fails: API errors are counted, not raised (a churned pod deleted meanwhile is no reason to stop);
`Churn.stop()` raises `errors.KcoverError` if the writer printed no report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from kcover import errors
from kcover.aio import clock
from kcover.bench import objects, rawapi, seeding
from kcover.kube import client as client_

log = structlog.get_logger()

IN_FLIGHT = 64
"""Status writes in flight at most: past it the writer falls behind schedule (and says so)."""


def flip(ready: bool) -> objects.Obj:
    """A strategic-merge patch of a pod's status: Ready (and the container's `ready`) set to `ready`."""
    now = clock.rfc3339(clock.utcnow())
    value = "True" if ready else "False"
    return {"status": {"conditions": [{"type": "Ready", "status": value, "lastTransitionTime": now},
                                      {"type": "ContainersReady", "status": value, "lastTransitionTime": now}],
                       "containerStatuses": [{"name": objects.CONTAINER, "ready": ready}]}}


async def write(kubeconfig: str, targets: Sequence[tuple[str, str]], *, rate: float, stop: asyncio.Event) -> dict[str, Any]:
    """Flip the targets' readiness at `rate` writes a second until `stop`; the report."""
    gate = asyncio.Semaphore(IN_FLIGHT)
    counts = {"writes": 0, "errors": 0}
    behind = 0.0
    ready: dict[int, bool] = {}
    started = time.perf_counter()
    async with await rawapi.open_api(kubeconfig) as api:

        async def one(index: int) -> None:
            ns, name = targets[index]
            state = not ready.get(index, True)
            ready[index] = state
            try:
                await api.request("PATCH", f"{seeding.pods_path(ns)}/{name}/status", body=flip(state),
                                  content_type=client_.STRATEGIC_MERGE_PATCH)
                counts["writes"] += 1
            except errors.KubeError:
                counts["errors"] += 1
            finally:
                gate.release()

        async with asyncio.TaskGroup() as tg:
            k = 0
            while not stop.is_set() and targets:
                due = started + k / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    continue
                behind = max(behind, -delay)
                await gate.acquire()
                tg.create_task(one(k % len(targets)), name="bench:churn")
                k += 1
    seconds = time.perf_counter() - started
    return {**counts, "seconds": round(seconds, 2), "offered_per_second": rate,
            "achieved_per_second": round(counts["writes"] / seconds, 1) if seconds else 0.0,
            "max_behind_seconds": round(behind, 3), "targets": len(targets)}


class Churn:
    """The churn writer as a child process: `async with Churn.running(kubeconfig, targets, rate=N) as c:`."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.report: dict[str, Any] = {}

    @classmethod
    @contextlib.asynccontextmanager
    async def running(cls, kubeconfig: str, targets: Sequence[tuple[str, str]], *, rate: float) -> Any:
        with tempfile.NamedTemporaryFile("w", prefix="kcover-bench-churn-", suffix=".txt") as f:
            f.write("".join(f"{ns}/{name}\n" for ns, name in targets))
            f.flush()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "kcover.bench.churning", "--kubeconfig", kubeconfig, "--rate", str(rate),
                "--targets", f.name, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            churn = cls(proc)
            try:
                yield churn
            finally:
                await churn.stop()

    async def stop(self) -> dict[str, Any]:
        if self.report:
            return self.report
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            out, err = await asyncio.wait_for(self.proc.communicate(), 60)
        except TimeoutError:
            self.proc.kill()
            out, err = await self.proc.communicate()
        try:
            self.report = json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise errors.KcoverError(f"the bench's churn writer printed no report: {err.decode()[-2000:]}") from None
        return self.report


def _targets(path: str) -> list[tuple[str, str]]:
    out = []
    for line in Path(path).read_text().splitlines():
        ns, _, name = line.strip().partition("/")
        if name:
            out.append((ns, name))
    return out


async def _main(kubeconfig: str, rate: float, targets: list[tuple[str, str]]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def until_stdin_closes() -> None:
        await loop.run_in_executor(None, sys.stdin.read)
        stop.set()

    waiter = asyncio.create_task(until_stdin_closes(), name="bench:churn-stdin")
    report = await write(kubeconfig, targets, rate=rate, stop=stop)
    waiter.cancel()
    print(json.dumps(report), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kcover.bench.churning", description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--targets", required=True)
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    asyncio.run(_main(args.kubeconfig, args.rate, _targets(args.targets)))


if __name__ == "__main__":
    main()
