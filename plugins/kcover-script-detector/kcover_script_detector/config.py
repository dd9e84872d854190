"""The script detector's configuration model.

Owns the schema, defaults and units of the `script` detector's settings. It does no I/O; kcover
validates the `detectors.entries.script.config` mapping against `ScriptDetectorConfig` and fails
with a field-level `ConfigError` on anything invalid.
"""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kcover import model
from kcover_script_detector import checking


class ScriptTarget(enum.StrEnum):
    NODE = "node"
    """The check is about the node the agent runs on."""


class ScriptSpec(BaseModel):
    """One check script and how often, how long and under which reason it runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$", max_length=63,
                      description="Unique name of the check; appears in logs and event attributes.")
    path: str = Field(min_length=1, description="Executable to run (absolute path, or a name looked up in PATH).")
    args: list[str] = Field(default_factory=list, description="Arguments passed to the executable, no shell.")
    interval_seconds: float = Field(60.0, gt=0, description="Seconds between the starts of two runs. 60 s, like most NPD custom-plugin configs.")
    timeout_seconds: float = Field(5.0, gt=0, description="Seconds a run may take before its process group is killed and the result is unknown. 5 s is NPD's default plugin timeout.")
    reason: str = Field(pattern=r"^[A-Z][A-Za-z0-9]*$", max_length=100,
                        description="CamelCase reason of the events this check emits, e.g. `NTPProblem`.")
    severity: model.Severity = Field(model.Severity.ERROR, description="Severity of the event emitted when the script reports a problem (exit 1).")
    target: ScriptTarget = Field(ScriptTarget.NODE, description="What the check is about; only `node` for now.")
    action: model.Action = Field(model.Action.CORDON_NODE, description="Action recommended to the controller when the script reports a problem (exit 1, e.g. `critical: ib0 link down`): `cordon-node` by default, as a node check that fails means the node is unfit for work. `recovery.node_judgement` decides how far the controller honours it.")
    unknown_action: model.Action | None = Field(None, description="Action recommended when the check stays unknown for `unknown_threshold` runs; none by default (a check that cannot tell is reported, not acted on).")

    def recommended(self, status: checking.Status) -> model.Action | None:
        """The action this check recommends on entering `status`; a return to healthy recommends nothing."""
        if status is checking.Status.PROBLEM:
            return self.action
        if status is checking.Status.UNKNOWN:
            return self.unknown_action
        return None


class ScriptDetectorConfig(BaseModel):
    """Settings of the `script` detector."""

    model_config = ConfigDict(extra="forbid")

    scripts: list[ScriptSpec] = Field(default_factory=list, description="Check scripts to run; none by default.")
    max_output_length: int = Field(80, ge=1, le=1024, description="Characters of stdout kept as the event message. 80 is NPD's `max_output_length` default.")
    concurrency: int = Field(4, ge=1, description="Scripts running at once, at most, across all checks, so a burst of due checks cannot starve the node.")
    unknown_threshold: int = Field(3, ge=1, description="Consecutive unknown results (exit 2 or other, timeout, failure to start) before a Warning is emitted; one flaky run is not news.")

    @model_validator(mode="after")
    def _unique_names(self) -> ScriptDetectorConfig:
        names = [spec.name for spec in self.scripts]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"script names must be unique; repeated: {', '.join(duplicates)}")
        return self
