"""Running one check script: node-problem-detector's plugin protocol over kcover's command runner.

Owns turning one run of a check script into a `checking.Result`. The script runs through the context's
command runner (kcover's subprocess runner, `contract.SubprocessRunner`: no shell, stdin closed, the
script in a process group of its own, its output read up to a bound and the rest discarded, and the
whole group, background children included, killed past `timeout_seconds` or on cancellation); its exit
status and stdout are read by the NPD protocol (`checking`). It never raises for a script's failure: a
script that cannot start or overruns its timeout is an unknown result. Cancellation propagates.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from kcover.detectors import contract
from kcover_script_detector import checking

log = structlog.get_logger()


async def run_script(runner: contract.CommandRunner, argv: Sequence[str], *, timeout_seconds: float,
                     max_output_length: int) -> checking.Result:
    """Run `argv` once and map its outcome to a `Result` by the NPD protocol."""
    try:
        result = await runner.run(argv, timeout_seconds=timeout_seconds)
    except contract.CommandTimeoutError:
        log.warning("script_timed_out", argv=list(argv), timeout_seconds=timeout_seconds)
        return checking.Result(checking.Status.UNKNOWN, f"timed out after {timeout_seconds:g}s"[:max_output_length],
                               timed_out=True)
    except contract.CommandError as exc:
        log.warning("script_start_failed", argv=list(argv), error=str(exc))
        return checking.Result(checking.Status.UNKNOWN, f"cannot start: {exc}"[:max_output_length])
    return checking.Result(checking.status_from_exit(result.returncode),
                           checking.message_from_output(result.stdout.encode(), max_output_length), result.returncode)
