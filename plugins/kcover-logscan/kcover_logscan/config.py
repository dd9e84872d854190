"""The logscan detector's configuration model.

Owns the schema, defaults and units of the `logscan` detector's settings. It does no I/O; an invalid
regular expression or a repeated pattern name fails validation with a field-level message.
"""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kcover import model
from kcover_logscan import classifying


class LogSource(enum.StrEnum):
    AUTO = "auto"
    """The current container's log first, then the previous instance's when nothing matched (the
    container may already have been restarted by the kubelet)."""
    CURRENT = "current"
    PREVIOUS = "previous"


def _default_severities() -> dict[classifying.FailureClass, model.Severity]:
    return {classifying.FailureClass.HARDWARE_SUSPECT: model.Severity.WARNING,
            classifying.FailureClass.COMMUNICATION: model.Severity.INFO,
            classifying.FailureClass.APPLICATION: model.Severity.INFO}


class LogscanConfig(BaseModel):
    """Settings of the `logscan` detector."""

    model_config = ConfigDict(extra="forbid")

    source_detector: str = Field("pod-status", description="Detector whose events (Pod targets naming a container in `fault.container`) trigger a scan.")
    reasons: list[str] = Field(default_factory=list, description="Event reasons that trigger a scan, e.g. `ContainerError`, `ContainerOOMKilled` (pod-status's reasons); empty means every reason of the source detector.")
    log_source: LogSource = Field(LogSource.AUTO, description="Which container instance's log to read.")
    tail_lines: int = Field(200, ge=1, le=10_000, description="Lines read from the end of the log. 200 holds a Python traceback plus the NCCL lines around it.")
    limit_bytes: int = Field(64 * 1024, ge=1024, le=4 * 1024 * 1024, description="Bytes read at most per log, so a chatty job cannot make the controller buffer megabytes.")
    max_lines: int = Field(5, ge=1, le=50, description="Matching lines kept in the event's `lines` attribute.")
    max_line_length: int = Field(300, ge=20, le=4096, description="Characters kept of each matching line.")
    concurrency: int = Field(8, ge=1, le=256, description="Logs read at once, at most, so a wave of failures does not flood the API server.")
    remember: int = Field(50_000, ge=100, description="Container failures (pod uid, container, the source event's key) remembered as already classified; the oldest are forgotten first. 50,000 covers a third of a 150,000-pod cluster failing at once.")
    patterns: list[classifying.Pattern] = Field(default_factory=lambda: list(classifying.DEFAULT_PATTERNS),
                                                description="Regex table; replaces the defaults when set.")
    severities: dict[classifying.FailureClass, model.Severity] = Field(
        default_factory=_default_severities,
        description="Severity of the event per class. Hardware-suspect is a Warning so node-level policy can look; the others inform (pod-status already reported the failure).")

    @model_validator(mode="after")
    def _unique_pattern_names(self) -> LogscanConfig:
        names = [pattern.name for pattern in self.patterns]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"pattern names must be unique; repeated: {', '.join(repeated)}")
        self.severities = {**_default_severities(), **self.severities}
        return self
