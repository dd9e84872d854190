"""Running a node command as an asyncio subprocess: the `CommandRunner` seam and its one implementation.

Owns process handling for every command kcover and its plugins run on a node (`dcgmi`, `mx-smi`,
`ibv_devinfo`, check scripts): no shell, stdin closed, the command in a session (process group) of its
own, stdout and stderr each read up to `max_output_bytes` (the rest is read and discarded, so a chatty
tool cannot fill memory), and the whole process group killed (SIGKILL) and reaped when the command runs
past its timeout or the caller is cancelled, so a script's background children go with it. It does not
interpret what a command prints.

How it fails: a program that is not installed raises `CommandNotFoundError`, one that cannot be started
(not executable) `CommandError`, a run past its timeout `CommandTimeoutError`; a non-zero exit status is
a result, not an error. Cancellation propagates once the process group is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

MAX_OUTPUT_BYTES = 4 * 1024 * 1024
"""Bytes of stdout (and of stderr) kept per run by default: a `dcgmi diag -r 4 -j` document on 8 GPUs is
tens of KiB, so 4 MiB bounds a runaway tool without ever cutting a real one."""
_READ_CHUNK = 64 * 1024


class CommandError(Exception):
    """A command could not be run to completion."""


class CommandNotFoundError(CommandError):
    """The program is not installed (or not in PATH) here."""


class CommandTimeoutError(CommandError):
    """The command ran past its timeout; its process group was killed."""


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    """The exit status; negative when a signal ended it (-9: killed)."""
    stdout: str
    """What it printed (UTF-8, undecodable bytes replaced), at most `max_output_bytes` of it."""
    stderr: str


class CommandRunner(Protocol):
    """Runs one command. Tests and the simulated cluster answer with recorded output instead."""

    async def run(self, argv: Sequence[str], *, timeout_seconds: float) -> CommandResult:
        """Run `argv` to completion. Raises `CommandNotFoundError`, `CommandError` or `CommandTimeoutError`."""
        ...


@dataclass(frozen=True)
class SubprocessRunner:
    """`CommandRunner` over asyncio subprocesses (see the module docstring)."""

    max_output_bytes: int = MAX_OUTPUT_BYTES

    async def run(self, argv: Sequence[str], *, timeout_seconds: float) -> CommandResult:
        if not argv:
            raise CommandError("no command to run")
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True)
        except FileNotFoundError as exc:
            raise CommandNotFoundError(f"{argv[0]} not found") from exc
        except OSError as exc:
            raise CommandError(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
        assert process.stdout is not None
        assert process.stderr is not None
        finished = False
        try:
            async with asyncio.timeout(timeout_seconds):
                out, err = await asyncio.gather(_read(process.stdout, self.max_output_bytes),
                                                _read(process.stderr, self.max_output_bytes))
                returncode = await process.wait()
            finished = True
        except TimeoutError as exc:
            raise CommandTimeoutError(f"{' '.join(argv)} ran past {timeout_seconds:g}s and was killed") from exc
        finally:
            if not finished:
                # a timeout or a cancellation: the group still has members (the pipes are open), so its id
                # cannot have been reused
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                if process.returncode is None:
                    await process.wait()
        return CommandResult(returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


async def _read(stream: asyncio.StreamReader, limit: int) -> bytes:
    """Everything `stream` gives until its end, keeping the first `limit` bytes."""
    kept = bytearray()
    while chunk := await stream.read(_READ_CHUNK):
        room = limit - len(kept)
        if room > 0:
            kept += chunk[:room]
    return bytes(kept)
