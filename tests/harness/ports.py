"""The port a kcover process bound, read from its log.

A test starts `kcover controller` or `kcover agent` with port 0 and learns the port from the
`http_server_started` line the process logs once it has bound one (JSON or console format). A port picked
by the test, closed and passed on could be taken by another process (an outgoing connection's ephemeral
port, another test's server) before the child binds it: a fresh-clone CI run lost a test that way.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

_PORT = re.compile(r'"port":\s*(\d+)|\bport=(\d+)')


def bound_port(log: Path) -> int | None:
    """The port of the first `http_server_started` line in `log`; None before there is one."""
    if not log.exists():
        return None
    for line in log.read_text(errors="replace").splitlines():
        if "http_server_started" in line and (match := _PORT.search(line)):
            return int(match.group(1) or match.group(2))
    return None


def _tail(log: Path, lines: int = 20) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


async def wait_bound_port(log: Path, proc: asyncio.subprocess.Process, *, within: float = 60.0) -> int:
    """`bound_port(log)` once the process logged it; fails if it exits or takes longer than `within`."""
    deadline = time.monotonic() + within
    while (port := bound_port(log)) is None:
        if proc.returncode is not None or time.monotonic() > deadline:
            tail = _tail(log)
            state = f"exited {proc.returncode}" if proc.returncode is not None else f"not serving after {within:g} s"
            raise AssertionError(f"kcover {state} before it logged its port:\n{tail}")
        await asyncio.sleep(0.02)
    return port
