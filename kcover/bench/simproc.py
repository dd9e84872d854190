"""The simulated API server as a child process, reached only over HTTP.

Owns starting `python -m kcover.sim.server` on a free port with a kubeconfig written for it, waiting
until it serves, reading its resident memory, and stopping it. The bench never imports `kcover.sim`
(the layers contract keeps `sim` and `bench` independent), and a separate process keeps the server's
memory and CPU out of the controller's numbers, as in a real cluster.

How it fails: `errors.KcoverError` when the server does not come up within `start_timeout` seconds
(its stderr tail in the message).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import structlog

from kcover import errors

log = structlog.get_logger()


@dataclass(frozen=True)
class SimProcess:
    url: str
    kubeconfig: str
    pid: int


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes(pid: int | str = "self") -> int:
    """Peak resident set size of a process's own memory (`VmHWM`, Linux). Not `ru_maxrss`: that one
    keeps the parent's RSS at fork across the exec, so a worker started by a bench holding a large
    cluster would report the bench's memory as its own peak."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/{pid}/status has no VmHWM")


@contextlib.asynccontextmanager
async def running(*, start_timeout: float = 30.0) -> AsyncIterator[SimProcess]:
    """Start a simulated API server in a child process; stop it on exit."""
    with tempfile.TemporaryDirectory(prefix="kcover-bench-") as tmp:
        kubeconfig = str(Path(tmp) / "kubeconfig")
        port = free_port()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kcover.sim.server", "--port", str(port), "--kubeconfig-out", kubeconfig,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            assert proc.stdout is not None
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), start_timeout)
            except TimeoutError:
                line = b""
            if not line.startswith(b"kcover sim API server at"):
                proc.kill()
                _, err = await proc.communicate()
                raise errors.KcoverError(f"the simulated API server did not start: {err.decode()[-2000:]}")
            url = line.decode().rsplit(" ", 1)[-1].strip()
            log.info("bench_sim_started", url=url, pid=proc.pid)
            yield SimProcess(url=url, kubeconfig=kubeconfig, pid=proc.pid)
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 10)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
