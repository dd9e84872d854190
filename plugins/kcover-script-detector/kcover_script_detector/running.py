"""Running one check script as an asyncio subprocess, bounded in time and output.

Owns process handling: the script starts in its own session (a new process group), its stdout is
read up to a byte bound (the rest is drained and discarded), stderr is discarded, and on timeout or
cancellation the whole process group is killed (SIGKILL) and the script reaped. It never raises for a script's failure:
a script that cannot start or overruns its timeout is an unknown result. Cancellation propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Sequence

import structlog

from kcover_script_detector import checking

log = structlog.get_logger()

_READ_CHUNK = 4096
_BYTES_PER_CHAR = 4
"""UTF-8 needs at most 4 bytes a character: reading 4 × max_output_length bytes is always enough."""


async def _read_bounded(stream: asyncio.StreamReader, limit: int) -> bytes:
    kept = bytearray()
    while chunk := await stream.read(_READ_CHUNK):
        room = limit - len(kept)
        if room > 0:
            kept += chunk[:room]
    return bytes(kept)


def _kill_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


async def run_script(argv: Sequence[str], *, timeout_seconds: float, max_output_length: int) -> checking.Result:
    """Run `argv` once and map its outcome to a `Result` by the NPD protocol."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        log.warning("script_start_failed", argv=list(argv), error=str(exc))
        return checking.Result(checking.Status.UNKNOWN, f"cannot start: {exc.strerror or exc}"[:max_output_length])
    assert process.stdout is not None
    limit = max_output_length * _BYTES_PER_CHAR

    async def finish() -> tuple[bytes, int]:
        assert process.stdout is not None
        output = await _read_bounded(process.stdout, limit)
        return output, await process.wait()

    completed = False
    try:
        output, returncode = await asyncio.wait_for(finish(), timeout_seconds)
        completed = True
    except TimeoutError:
        log.warning("script_timed_out", argv=list(argv), timeout_seconds=timeout_seconds)
        return checking.Result(checking.Status.UNKNOWN, f"timed out after {timeout_seconds:g}s"[:max_output_length],
                               timed_out=True)
    finally:
        if not completed:
            # Timeout or cancellation: the group still has members, so its id cannot have been reused.
            _kill_group(process)
            if process.returncode is None:
                await process.wait()
    return checking.Result(checking.status_from_exit(returncode),
                           checking.message_from_output(output, max_output_length), returncode)
