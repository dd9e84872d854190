"""A simulated node's `dcgmi`: answers `dcgmi diag -r N` with real recorded DCGM output.

Owns one `kcover.aio.commands.CommandRunner` per simulated node, handed to that node's agent, so the agent's own
validation loop (`kcover.agent.validating`) runs unchanged and parses what a real dcgmi printed. The
answer follows the node's `FakeNvml`: while any GPU is lost (NVML cannot reach it, or NVML is down), the diagnostic
prints the recorded failure (`GPU Memory | Fail - All`, CUDA cannot initialise) with a non-zero exit
code; otherwise the recorded pass (every test passed). Both recordings live in
kcover/sim/recorded/dcgmi-diag (their sources are in tests/fixtures/SOURCES.md, where the same files
are). It records every command it was asked to run (`calls`) so a scenario can say what ran.
How it fails: argv that is not `dcgmi diag -r <level>` gets exit code 2 and a usage line on stderr,
as a real dcgmi answers bad arguments; it never raises.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.resources
from collections.abc import Sequence
from dataclasses import dataclass, field

from kcover import errors
from kcover.aio import clock as clock_
from kcover.aio import commands
from kcover.nvml import fake

PASSED = "ramble-r3-pass-dcgm3.3.9-h200x8-table.txt"
FAILED = "nccl-tests-264-r3-fail-cuda-init-dcgm3.3.8-h100x8-table.txt"
FAILED_EXIT_CODE = 226
"""The exit code of the failing run (any non-zero code: the verdict reads the table, not the code)."""


def recorded(name: str) -> str:
    """One recorded `dcgmi diag` output."""
    return importlib.resources.files("kcover.sim").joinpath(f"recorded/dcgmi-diag/{name}").read_text("utf-8")


@dataclass(frozen=True)
class Call:
    """One command the node's agent ran, when, and what it printed."""

    at: dt.datetime
    argv: tuple[str, ...]
    returncode: int
    recording: str
    """The recorded output it printed (a file name in recorded/dcgmi-diag), or "" for a usage error."""


@dataclass
class FakeDcgmi:
    """`kcover.aio.commands.CommandRunner` for one simulated node; its verdict follows `nvml`'s GPUs."""

    nvml: fake.FakeNvml
    calls: list[Call] = field(default_factory=list)

    def healthy(self) -> bool:
        """Every GPU answers NVML (none lost, NVML up)."""
        try:
            for index in range(self.nvml.device_count()):
                self.nvml.probe(index)
        except errors.NvmlError:
            return False
        return True

    async def run(self, argv: Sequence[str], *, timeout_seconds: float) -> commands.CommandResult:
        args = list(argv[1:])
        level = args[args.index("-r") + 1] if "-r" in args[:-1] else ""
        at = clock_.utcnow()
        if not args or args[0] != "diag" or not level.isdigit():
            self.calls.append(Call(at, tuple(argv), 2, ""))
            return commands.CommandResult(2, "", f"usage: dcgmi diag -r <level> [-j] (got {' '.join(args)})\n")
        name, code = (PASSED, 0) if self.healthy() else (FAILED, FAILED_EXIT_CODE)
        self.calls.append(Call(at, tuple(argv), code, name))
        return commands.CommandResult(code, await asyncio.to_thread(recorded, name), "")
