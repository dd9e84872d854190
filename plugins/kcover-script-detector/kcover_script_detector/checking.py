"""Pure decisions of the script detector: what a run's result means and when it is news.

Owns the node-problem-detector custom-plugin protocol (exit 0 healthy, 1 problem, anything else
unknown; stdout, trimmed and truncated, is the message) and the per-check state machine that turns
results into transitions. It does no I/O and never fails on odd input.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Status(enum.StrEnum):
    HEALTHY = "healthy"
    PROBLEM = "problem"
    UNKNOWN = "unknown"


EXIT_HEALTHY = 0
EXIT_PROBLEM = 1


def status_from_exit(returncode: int | None) -> Status:
    """NPD's mapping: 0 OK, 1 NonOK, 2 (or anything else, including a kill) Unknown."""
    if returncode == EXIT_HEALTHY:
        return Status.HEALTHY
    if returncode == EXIT_PROBLEM:
        return Status.PROBLEM
    return Status.UNKNOWN


def message_from_output(output: bytes, max_length: int) -> str:
    """Decode stdout, trim surrounding whitespace and keep at most `max_length` characters (as NPD does)."""
    text = output.decode("utf-8", errors="replace").strip()
    return text[:max_length]


@dataclass(frozen=True)
class Result:
    """One run of a check script."""

    status: Status
    message: str
    returncode: int | None = None
    timed_out: bool = False


@dataclass(frozen=True)
class CheckState:
    """What was last reported for a check, and how many unknowns in a row have been seen since."""

    reported: Status | None = None
    """None until the first definite result; the first healthy result is not news."""
    unknown_streak: int = 0


@dataclass(frozen=True)
class Transition:
    """A change worth an event: the check now holds `status`, and was `previous` before."""

    status: Status
    previous: Status | None


def observe(state: CheckState, result: Result, *, unknown_threshold: int) -> tuple[CheckState, Transition | None]:
    """Fold one result into the state; return the transition to report, if any.

    * problem: reported once when entered (from nothing, healthy or unknown);
    * unknown: reported once after `unknown_threshold` unknowns in a row;
    * healthy: reported (as a recovery) only when leaving problem or unknown.
    """
    status = result.status
    if status is Status.UNKNOWN:
        streak = state.unknown_streak + 1
        if streak >= unknown_threshold and state.reported is not Status.UNKNOWN:
            return CheckState(Status.UNKNOWN, streak), Transition(Status.UNKNOWN, state.reported)
        return CheckState(state.reported, streak), None
    next_state = CheckState(status, 0)
    if status is state.reported:
        return next_state, None
    if status is Status.HEALTHY and state.reported is None:
        return next_state, None
    return next_state, Transition(status, state.reported)
