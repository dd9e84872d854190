"""What the roles cost as processes: start-up to leading, idle RSS, CPU seconds per fault.

Owns running `kcover controller` and `kcover agent` exactly as a user does (`python -m kcover.cli`, a
child process each, settings through `--set`) against the bench's cluster, and reading their figures
from outside: the time from spawning the controller to its `lease_acquired` log line, each role's
resident memory once ready and settled (`/proc/PID/statm`), and the controller's CPU time
(`/proc/PID/stat`) over a series of pod-error faults, each waited for until its job's pods are being
deleted, less the CPU the same process spends idle over as long. It measures processes; the in-process
latency figures are `latency.py`'s.

How it fails: a role that exits early, or does not lead, get ready or act within `timeout` seconds,
raises `errors.KcoverError` with its log tail; API errors propagate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import structlog

from kcover import errors
from kcover.bench import objects, rawapi, seeding, simproc

log = structlog.get_logger()

NS = "kcover-bench-footprint"


def namespace_of(run_id: str) -> str:
    """The run's namespace (a real API server without kube-controller-manager never finishes deleting one)."""
    return f"{NS}-{run_id}" if run_id else NS
SETTLE_SECONDS = 1.0
"""Seconds a ready role is left alone before its memory is read (its first renewals and ticks done)."""
IDLE_CPU_SECONDS = 2.0
"""Seconds over which the controller's idle CPU rate is read, to subtract it from the faults' CPU."""


@dataclass
class Figures:
    startup_to_leading: list[float] = field(default_factory=list)
    """Seconds from spawning `kcover controller` to its `lease_acquired` line, one per start."""
    controller_idle_rss_bytes: int = 0
    agent_idle_rss_bytes: int = 0
    cpu_seconds_per_fault: float = 0.0
    faults: int = 0


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Role:
    """A `kcover controller` or `kcover agent` child process and its JSON log lines."""

    def __init__(self, proc: asyncio.subprocess.Process, port: int, started: float) -> None:
        self.proc = proc
        self.port = port
        self.started = started
        self.lines: list[tuple[float, dict[str, Any]]] = []
        self.changed = asyncio.Event()
        self._reader = asyncio.create_task(self._read(), name="bench:role-log")

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for raw in self.proc.stderr:
            with contextlib.suppress(ValueError):
                self.lines.append((time.perf_counter(), json.loads(raw)))
                self.changed.set()

    def tail(self) -> str:
        return "\n".join(json.dumps(line) for _, line in self.lines[-20:])

    def timeline(self, start: float, end: float, *, limit: int = 40) -> list[list[Any]]:
        """[seconds after `start`, event] of the first line of each event the role logged between the two
        perf_counter moments, in order (at most `limit`): where a role's time went."""
        seen: set[str] = set()
        out: list[list[Any]] = []
        for at, line in self.lines:
            event = str(line.get("event", ""))
            if start <= at <= end and event not in seen and len(out) < limit:
                seen.add(event)
                out.append([round(at - start, 3), event])
        return out

    async def logged(self, event: str, *, timeout: float) -> float:
        """perf_counter when the role logged `event` (waiting for it)."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    for at, line in self.lines:
                        if line.get("event") == event:
                            return at
                    if self.proc.returncode is not None or self._reader.done():
                        break
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            pass
        raise errors.KcoverError(f"the bench's kcover process did not log {event}: {self.tail()}")

    async def ready(self, *, timeout: float) -> None:
        """Wait for /readyz to answer 200."""
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"http://127.0.0.1:{self.port}/readyz") as response:
                        if response.status == 200:
                            return
                if self.proc.returncode is not None:
                    break
                await asyncio.sleep(0.05)
        raise errors.KcoverError(f"the bench's kcover process did not get ready: {self.tail()}")

    def rss(self) -> int:
        return simproc.rss_bytes(self.proc.pid)

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._reader, 5)


@contextlib.asynccontextmanager
async def role(command: str, kubeconfig: str, settings_: Sequence[str], *extra: str) -> AsyncIterator[Role]:
    """Run `kcover COMMAND` with JSON logs on stderr and `--set` for each of `settings_`."""
    port = simproc.free_port()
    argv = [sys.executable, "-m", "kcover.cli", command, "--kubeconfig", kubeconfig, "--port", str(port),
            "--log-format", "json", "--log-level", "info", "--config", os.devnull, *extra]
    for item in ("server.host=127.0.0.1", *settings_):
        argv += ["--set", item]
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    running = Role(proc, port, started)
    try:
        yield running
    finally:
        await running.stop()


def controller_settings(lease_name: str, log_dir: str, namespace: str) -> list[str]:
    """Product defaults, but: its own Lease, ledger and namespace, only the PyTorchJob workload kind
    (the others' CRDs may be absent), and the log sink in a temporary folder."""
    return [f"lease.name={lease_name}", f"lease.namespace={namespace}", f"lease.identity={lease_name}",
            "kube.workload_kinds=[pytorchjobs.kubeflow.org]", f"recovery.ledger_namespace={namespace}",
            f"recovery.ledger_name={lease_name}-ledger", f"recovery.save_logs.directory={log_dir}",
            *(f"recovery.{key}={value}" for key, value in objects.BREAKER_OFF.items())]


async def measure(kubeconfig: str, *, starts: int, faults: int, timeout: float = 60.0, run_id: str = "") -> Figures:
    """`starts` controller start-ups (the last one measured idle and over `faults` pod errors), one agent."""
    figures = Figures()
    ns = namespace_of(run_id)
    async with await rawapi.open_api(kubeconfig) as api:
        await seeding.namespaces(api, [ns])
        node = f"bench-footprint-{uuid.uuid4().hex[:6]}"
        await seeding.nodes(api, [node])
        await seeding.running_pod(api, objects.agent_pod(ns, node))
        with tempfile.TemporaryDirectory(prefix="kcover-bench-footprint-") as tmp:
            for i in range(starts):
                lease = f"bench-{uuid.uuid4().hex[:8]}"
                async with role("controller", kubeconfig, controller_settings(lease, tmp, ns)) as controller:
                    figures.startup_to_leading.append(await controller.logged("lease_acquired", timeout=timeout)
                                                      - controller.started)
                    if i < starts - 1:
                        continue
                    await controller.ready(timeout=timeout)
                    await asyncio.sleep(SETTLE_SECONDS)
                    figures.controller_idle_rss_bytes = controller.rss()
                    if faults:
                        figures.cpu_seconds_per_fault = await _fault_cpu(api, controller, node, faults,
                                                                         namespace=ns, timeout=timeout)
                        figures.faults = faults
            nvml_file = Path(tmp) / "nvml"
            nvml_file.touch()
            async with role("agent", kubeconfig, [f"agent.event_namespace={ns}", "detectors.entries.dcgm.enabled=false"],
                            "--node-name", node, "--fake-nvml", str(nvml_file)) as agent:
                await agent.ready(timeout=timeout)
                await asyncio.sleep(SETTLE_SECONDS)
                figures.agent_idle_rss_bytes = agent.rss()
    return figures


async def _fault_cpu(api: rawapi.RawApi, controller: Role, node: str, faults: int, *, namespace: str,
                     timeout: float) -> float:
    """CPU seconds the controller spends per pod-error restart, its idle rate subtracted: the lower of the
    rates measured just before and just after the faults (an idle second that held a garbage collection or
    a relist on a loaded machine would otherwise be charged to idleness and hide the faults' cost)."""
    specs = [(namespace, f"cpu-{uuid.uuid4().hex[:8]}", 2) for _ in range(faults)]
    jobs = await seeding.jobs(api, specs, node_names=[node])
    await asyncio.sleep(SETTLE_SECONDS)  # the seeded pods reach the controller's cache
    before = await _idle_rate(controller)
    cpu0, t0 = controller.cpu(), time.perf_counter()
    for job in jobs:
        await seeding.write_pod_status(api, namespace, job.pods[1], objects.failed_status(1))
        await _until_deleted(api, job, timeout=timeout)
    await asyncio.sleep(0.5)  # the Event and the ledger write follow the delete
    spent, elapsed = controller.cpu() - cpu0, time.perf_counter() - t0
    idle_rate = min(before, await _idle_rate(controller))
    return max(0.0, spent - idle_rate * elapsed) / faults


async def _idle_rate(controller: Role) -> float:
    """The controller's CPU seconds per second over `IDLE_CPU_SECONDS` with nothing to do."""
    cpu0, t0 = controller.cpu(), time.perf_counter()
    await asyncio.sleep(IDLE_CPU_SECONDS)
    return (controller.cpu() - cpu0) / (time.perf_counter() - t0)


async def _until_deleted(api: rawapi.RawApi, job: seeding.Job, *, timeout: float) -> None:
    """Poll the job's pods until each is gone or has a deletionTimestamp (no kubelet finishes them)."""
    selector = f"training.kubeflow.org/job-name={job.name}"
    async with asyncio.timeout(timeout):
        while True:
            listed = await api.request("GET", seeding.pods_path(job.namespace), query={"labelSelector": selector})
            if all((p.get("metadata") or {}).get("deletionTimestamp") for p in listed.get("items") or []):
                return
            await asyncio.sleep(0.01)
