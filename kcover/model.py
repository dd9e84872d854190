"""The data every layer shares: `CollectorEvent` and the ids it carries.

Owns the shape of a fault report. It does no I/O and knows nothing of where events come from.
Construction validates: a bad event fails loudly at the detector that built it, never downstream.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from typing import Any, NewType

from pydantic import BaseModel, ConfigDict, Field, field_validator

PodUid = NewType("PodUid", str)
NodeName = NewType("NodeName", str)
WorkloadUid = NewType("WorkloadUid", str)

MESSAGE_MAX = 1024
"""Longest message kept: the API server refuses Event messages past 1,024 characters."""


class Severity(enum.StrEnum):
    ERROR = "Error"
    WARNING = "Warning"
    INFO = "Info"
    """Informational notes (a device recovered); never leads to an action by default."""


class TargetKind(enum.StrEnum):
    POD = "Pod"
    NODE = "Node"
    DEVICE = "Device"
    WORKLOAD = "Workload"


class Target(BaseModel):
    """What the fault is about. A Device target names its node and its device id."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: TargetKind
    namespace: str = ""
    name: str = ""
    uid: str = ""
    node: str = ""
    device_id: str = ""
    workload_kind: str = ""
    """For kind Workload: the workload's kind, e.g. `PyTorchJob`."""

    def describe(self) -> str:
        if self.kind is TargetKind.POD or self.kind is TargetKind.WORKLOAD:
            return f"{self.kind.value} {self.namespace}/{self.name}"
        if self.kind is TargetKind.DEVICE:
            return f"Device {self.device_id} on {self.node}"
        return f"Node {self.name or self.node}"


def _new_id() -> str:
    return uuid.uuid4().hex


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class CollectorEvent(BaseModel):
    """One observation of a fault (or of its end) by one detector."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(default_factory=_new_id)
    detector: str
    target: Target
    severity: Severity
    reason: str = Field(min_length=1, max_length=128)
    """CamelCase reason a person can grep, e.g. `ContainerError`, `XID79`, `DeviceUnhealthy`."""
    message: str = ""
    observed_at: dt.datetime = Field(default_factory=_utcnow)
    dedupe_key: str = ""
    """Equal keys within the bus's dedupe window are delivered once. Empty means `detector/reason/target`."""
    attributes: dict[str, Any] = Field(default_factory=dict)

    @field_validator("message")
    @classmethod
    def _bound_message(cls, value: str) -> str:
        if len(value) > MESSAGE_MAX:
            return value[: MESSAGE_MAX - 3] + "..."
        return value

    @field_validator("observed_at")
    @classmethod
    def _aware_utc(cls, value: dt.datetime) -> dt.datetime:
        if value.tzinfo is None:
            raise ValueError("observed_at must be timezone-aware")
        return value.astimezone(dt.UTC)

    @property
    def key(self) -> str:
        if self.dedupe_key:
            return self.dedupe_key
        t = self.target
        return f"{self.detector}/{self.reason}/{t.kind.value}/{t.namespace}/{t.name}/{t.uid}/{t.node}/{t.device_id}"
