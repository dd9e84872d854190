"""Running node commands (`mx-smi`, `ibv_devinfo`): the `CommandRunner` seam and its subprocess default.

Owns process handling only: the command runs without a shell in its own process group, bounded by
a timeout after which the group is killed. A command that is not installed raises
`CommandNotFoundError`; a timeout raises `CommandTimeoutError`; a non-zero exit is a result, not an
error. Cancellation kills the process and propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kcover import errors


class CommandError(errors.KcoverError):
    """A node command could not be run to completion."""


class CommandNotFoundError(CommandError):
    """The executable is not installed (or not in PATH) on this node."""


class CommandTimeoutError(CommandError):
    """The command ran past its timeout and was killed."""


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


class CommandRunner(Protocol):
    async def run(self, argv: Sequence[str], *, timeout_seconds: float) -> CommandResult: ...


class SubprocessRunner:
    """Runs commands as asyncio subprocesses."""

    async def run(self, argv: Sequence[str], *, timeout_seconds: float) -> CommandResult:
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True)
        except FileNotFoundError as exc:
            raise CommandNotFoundError(f"{argv[0]} not found") from exc
        except OSError as exc:
            raise CommandError(f"cannot run {argv[0]}: {exc}") from exc
        completed = False
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_seconds)
            completed = True
        except TimeoutError as exc:
            raise CommandTimeoutError(f"{' '.join(argv)} ran past {timeout_seconds:g}s") from exc
        finally:
            if not completed:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                if process.returncode is None:
                    await process.wait()
        return CommandResult(process.returncode if process.returncode is not None else -1,
                             stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace"))
