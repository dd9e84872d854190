"""Pure classification of a failed container's log tail: communication, application or hardware-suspect.

Owns the failure classes, the default pattern table and `classify()`. It does no I/O. Patterns are
regular expressions matched line by line; when several match, the highest `priority` wins (a CUDA
illegal memory access outranks the NCCL errors other ranks print after it, and torch elastic's
`ChildFailedError` wrapper only decides when nothing more specific matched); equal priorities go to
the pattern that matched first in the log. Invalid regexes are refused when the config is validated.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator


class FailureClass(enum.StrEnum):
    COMMUNICATION = "communication"
    """Collective communication failed (NCCL, network): often a peer or the fabric, not this pod."""
    APPLICATION = "application"
    """The program itself failed (assertion, bad input, framework error): restarting rarely helps."""
    HARDWARE_SUSPECT = "hardware-suspect"
    """The GPU or its memory probably misbehaved: worth checking the node."""


def reason_for(failure_class: FailureClass) -> str:
    """The CamelCase event reason: `LogClassifiedHardwareSuspect`, `LogClassifiedCommunication`, ..."""
    return "LogClassified" + "".join(part.capitalize() for part in failure_class.value.split("-"))


class Pattern(BaseModel):
    """One regular expression and the class a matching log line suggests."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(min_length=1, description="Stable id of the pattern, reported in the event's `pattern` attribute.")
    regex: str = Field(min_length=1, description="Python regular expression searched in each log line.")
    failure_class: Annotated[FailureClass, Field(alias="class")]
    priority: int = Field(0, description="Higher wins when several patterns match one log.")

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"invalid regular expression: {exc}") from exc
        return value


HW = FailureClass.HARDWARE_SUSPECT
APP = FailureClass.APPLICATION
COMM = FailureClass.COMMUNICATION


def _p(name: str, regex: str, failure_class: FailureClass, priority: int) -> Pattern:
    return Pattern(name=name, regex=regex, failure_class=failure_class, priority=priority)


DEFAULT_PATTERNS: tuple[Pattern, ...] = (
    # Hardware-suspect: the device reported a fault this process did not cause by its logic alone.
    _p("xid", r"\bXid\b", HW, 40),
    _p("ecc-error", r"(?i)\bECC error", HW, 40),
    _p("cuda-illegal-memory-access", r"an illegal memory access was encountered", HW, 30),
    _p("cuda-unspecified-launch-failure", r"unspecified launch failure", HW, 30),
    _p("cuda-launch-timeout", r"the launch timed out and was terminated", HW, 30),
    _p("cudnn-execution-failed", r"CUDNN_STATUS_EXECUTION_FAILED", HW, 30),
    # Application: the program's own fault.
    _p("cuda-device-side-assert", r"device-side assert triggered", APP, 20),
    _p("cudnn-status", r"CUDNN_STATUS_(?!EXECUTION_FAILED|SUCCESS)[A-Z_]+", APP, 20),
    # Communication: collectives and the network between ranks.
    _p("nccl-remote-error", r"remote process exited or there was a network error", COMM, 10),
    _p("nccl-unhandled-system-error", r"unhandled system error", COMM, 10),
    _p("nccl-error", r"(?i)\bNCCL error", COMM, 10),
    _p("nccl-warn", r"\bNCCL WARN\b", COMM, 10),
    _p("nccl-watchdog-timeout", r"Watchdog caught collective operation timeout", COMM, 10),
    # Application, last resort: torch elastic's summary of any failed worker.
    _p("torch-elastic-child-failed", r"torch\.distributed\.elastic\.multiprocessing\.errors\.ChildFailedError", APP, 0),
)


@dataclass(frozen=True)
class Classification:
    failure_class: FailureClass
    pattern: str
    """Name of the deciding pattern."""
    lines: tuple[str, ...]
    """Log lines the deciding pattern matched, first ones first, bounded."""


def classify(log_tail: str, patterns: Sequence[Pattern] = DEFAULT_PATTERNS, *, max_lines: int = 5,
             max_line_length: int = 300) -> Classification | None:
    """Classify a log tail by `patterns`; None when nothing matched."""
    compiled = [(pattern, re.compile(pattern.regex)) for pattern in patterns]
    first_hit: dict[str, int] = {}
    hits: dict[str, list[str]] = {}
    for number, line in enumerate(log_tail.splitlines()):
        for pattern, regex in compiled:
            if regex.search(line):
                first_hit.setdefault(pattern.name, number)
                kept = hits.setdefault(pattern.name, [])
                if len(kept) < max_lines:
                    kept.append(line.strip()[:max_line_length])
    if not first_hit:
        return None
    winner = max((p for p in patterns if p.name in first_hit), key=lambda p: (p.priority, -first_hit[p.name]))
    return Classification(winner.failure_class, winner.name, tuple(hits[winner.name]))
