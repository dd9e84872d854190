"""The subprocess runner for real: exit status, output bounds, the typed errors, and that a timeout or a
cancellation kills the command's whole process group (a background child included)."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from pathlib import Path

import pytest

from kcover.aio import commands


def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _alive(pid: int) -> bool:
    """Running: a zombie (killed, not yet reaped by whichever process adopted it) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


async def _gone(pid: int) -> bool:
    for _ in range(1500):  # the child is killed with its group (up to 30 s on a loaded machine)
        if not _alive(pid):
            return True
        await asyncio.sleep(0.02)
    return False


async def test_a_command_runs_and_its_status_and_output_come_back(tmp_path: Path) -> None:
    argv = [_script(tmp_path, "two.sh", 'echo "to stdout"; echo "to stderr" >&2; exit 3\n')]
    result = await commands.SubprocessRunner().run(argv, timeout_seconds=10)
    assert result == commands.CommandResult(3, "to stdout\n", "to stderr\n")


async def test_output_past_the_bound_is_read_and_dropped(tmp_path: Path) -> None:
    argv = [_script(tmp_path, "chatty.sh", "yes 0123456789 | head -c 1000000\n")]
    result = await commands.SubprocessRunner(max_output_bytes=100).run(argv, timeout_seconds=10)
    assert result.returncode == 0  # the writer was never blocked by a full pipe
    assert result.stdout == ("0123456789\n" * 10)[:100]


async def test_a_missing_program_and_an_unrunnable_one_are_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(commands.CommandNotFoundError, match="no-such-tool not found"):
        await commands.SubprocessRunner().run(["no-such-tool", "-v"], timeout_seconds=10)
    plain = tmp_path / "not-executable"
    plain.write_text("echo hi\n")
    with pytest.raises(commands.CommandError, match="cannot run") as caught:
        await commands.SubprocessRunner().run([str(plain)], timeout_seconds=10)
    assert not isinstance(caught.value, commands.CommandNotFoundError)
    with pytest.raises(commands.CommandError, match="no command"):
        await commands.SubprocessRunner().run([], timeout_seconds=10)


async def test_a_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    argv = [_script(tmp_path, "hang.sh", f"sleep 300 &\necho $! > {pid_file}\nwait\n")]
    started = time.monotonic()
    with pytest.raises(commands.CommandTimeoutError, match=r"ran past 0\.5s"):
        await commands.SubprocessRunner().run(argv, timeout_seconds=0.5)
    assert time.monotonic() - started < 10
    assert await _gone(int(pid_file.read_text()))


async def test_cancelling_the_caller_kills_the_group_and_propagates(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    argv = [_script(tmp_path, "hang.sh", f"sleep 300 &\necho $! > {pid_file}\nwait\n")]
    run = asyncio.create_task(commands.SubprocessRunner().run(argv, timeout_seconds=300))
    for _ in range(1500):  # the script started and wrote its child's pid (up to 30 s on a loaded machine)
        if pid_file.exists() and pid_file.read_text().strip():
            break
        await asyncio.sleep(0.02)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert await _gone(int(pid_file.read_text()))


async def test_a_background_child_that_keeps_the_pipe_open_is_waited_for_then_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    argv = [_script(tmp_path, "leave.sh", f"echo started\nsleep 300 &\necho $! > {pid_file}\nexit 0\n")]
    with pytest.raises(commands.CommandTimeoutError):
        await commands.SubprocessRunner().run(argv, timeout_seconds=0.5)
    assert await _gone(int(pid_file.read_text()))
