"""The `kcover` command line: the composition root.

Owns running one command (which one, and the process's exit code); its modules own the rest: reading
files and the environment and building settings with their provenance (`configuring`), checking all of
the configuration (`kcover.checking`: rules, detector configs, XID policy) before a role starts or a
reload applies, the parser (`parsing`), a long-running role's process (`lifecycle`: signals, one
TaskGroup, the health server, hot reload), the one-shot cluster commands (`operating`) and
`kcover detectors` (`detectorlisting`). The roles get what they need from `wiring`.

How it fails: exit codes 0 success, 1 invalid configuration or a failed check, 2 usage errors (argparse),
`PIPE_CLOSED_EXIT` when the reader of stdout went away.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence

import kcover
from kcover import logs, settings, wiring
from kcover.cli import configuring, detectorlisting, lifecycle, operating, parsing


def cmd_version(_: argparse.Namespace) -> int:
    print(f"kcover {kcover.__version__} (python {sys.version.split()[0]})")
    return 0


PIPE_CLOSED_EXIT = 128 + signal.SIGPIPE
"""Exit code when the reader of stdout went away (`kcover status | head`): the code of a process that SIGPIPE
ended, as `git log | head` reports, without a traceback."""


def _pipe_closed(exc: BaseException) -> bool:
    """The reader of stdout went away: a BrokenPipeError, alone or as everything a task group raised."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_pipe_closed(e) for e in exc.exceptions)
    return isinstance(exc, BrokenPipeError)


def _sim_inject(rest: list[str]) -> int:
    """`kcover sim inject KIND ...`: a fault into a cluster `kcover sim --serve` is serving."""
    code: int = importlib.import_module("kcover.sim.control").main(parsing.sim_inject_parser().parse_args(rest))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; quiet when stdout is a pipe its reader closed (see `PIPE_CLOSED_EXIT`)."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # inside the guard: what is still buffered meets a closed pipe here, not at exit
    except (BrokenPipeError, BaseExceptionGroup) as exc:
        if not _pipe_closed(exc):
            raise
        # stdout cannot be flushed any more: point it at /dev/null so the interpreter's exit flush is quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return PIPE_CLOSED_EXIT
    return code


def _main(argv: Sequence[str] | None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:2] == ["sim", "inject"]:
        logs.configure(settings.LoggingSettings(level="warning"))
        return _sim_inject(given[2:])
    parser = parsing.build_parser(wiring.ROLES, command=given[0] if given and given[0] in parsing.TOOLS else "")
    args = parser.parse_args(given)
    # Until a role has read its settings, log warnings and errors to stderr only.
    logs.configure(settings.LoggingSettings(level="warning"))
    args.config_given = "--config" in (argv if argv is not None else sys.argv)
    if args.command in parsing.TOOLS:
        code: int = parsing.tool(args.command).main(args)
        return code
    if args.command == "version":
        return cmd_version(args)
    if args.command == "detectors":
        return detectorlisting.cmd_detectors(args)
    if args.command == "config":
        if args.config_command == "check":
            return configuring.cmd_config_check(args)
        return configuring.cmd_config_show(args)
    if args.command in ("breaker", "status"):
        # one-shot: what went wrong is the command's own message; the client's retry log lines only repeat it
        logs.configure(settings.LoggingSettings(level=args.log_level or "error"))
        return operating.cmd_breaker_reset(args) if args.command == "breaker" else operating.cmd_status(args)
    _, role, _ = wiring.ROLES[args.command]
    return lifecycle.run_role(args, role)


