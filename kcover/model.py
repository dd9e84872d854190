"""The data every layer shares: `CollectorEvent`, the typed meaning it carries, and its ids.

Owns the shape of a fault report: what it is about (`Target`), which fault it is (`Fault`: XID,
GPU, DRA device, check), what its source judges should happen (`Action`), whether it reports the
end of a fault (`cleared`) and how often it was seen (`occurrences` within `window_seconds`).
Every consumer reads meaning from these typed fields; `attributes` is detail shown to people and
is never read to decide anything. It does no I/O and knows nothing of where events come from.
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
"""Longest message kept, in UTF-8 bytes: the API server refuses Event messages past 1,024 bytes."""
NAME_MAX = 128
"""Bytes of an Event's reason, action and reportingInstance the API server accepts."""


def counted(n: int, noun: str) -> str:
    """`n` and `noun`, plural unless `n` is 1 ("1 pod", "4 pods")."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def fit(text: str, max_bytes: int, *, suffix: str = "...") -> str:
    """`text` cut to at most `max_bytes` UTF-8 bytes on a character boundary, `suffix` marking a cut.

    The API server measures lengths with Go's `len`, in bytes: 600 CJK characters are 1,800 bytes."""
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= max_bytes:
        return text
    room = max_bytes - len(suffix.encode())
    if room <= 0:
        return raw[:max_bytes].decode("utf-8", "ignore")
    return raw[:room].decode("utf-8", "ignore") + suffix


class Severity(enum.StrEnum):
    ERROR = "Error"
    WARNING = "Warning"
    INFO = "Info"
    """Informational notes (a device recovered); never leads to an action by default."""


class Action(enum.StrEnum):
    """What should happen about a fault, from least to most: a rule's action, or a source's judgement."""

    IGNORE = "ignore"
    """Logged and counted, nothing else."""
    REPORT = "report"
    """An Event a person can read; nothing is changed."""
    RESTART_WORKLOAD = "restart-workload"
    """Restart the workloads the fault touches (the pod's, or those on the faulting GPU)."""
    CORDON_NODE = "cordon-node"
    """Take the node out of scheduling; its running workloads are left alone."""
    CORDON_NODE_AND_RESTART = "cordon-node-and-restart"
    """Take the node out of scheduling and restart the opted-in workloads that have pods on it."""


class Evidence(enum.StrEnum):
    """What an observation that asks for no action is evidence of, for the judgement to read later."""

    LINK_DOWN = "link-down"
    """One link-down of one of the node's RDMA ports (the agent's `rdma-link` detector, below its flap
    threshold): alone it moves nothing (a switch's reboot takes every port under it down once); a job with a
    rank on that node whose collective fails soon after blames the node (`recovery.judgement.link_down`)."""


class Blame(enum.StrEnum):
    """What a fault is attributed to (`recovery.judging.attribute`): the thing a fix should move."""

    DEVICE = "device"
    """One GPU or DRA device: isolate it (or its node where devices cannot be isolated) and restart its holders."""
    NODE = "node"
    """The node: cordon it and restart what ran there."""
    WORKLOAD = "workload"
    """The workload itself (a container exit, an application XID): restart it; a node moves only on
    differential evidence (different workloads failing there), through a validation."""
    UNKNOWN = "unknown"
    """Nothing says which: the rules decide alone."""


class DraDevice(BaseModel):
    """One device allocated through DRA, as `allocatedResourcesStatus` and ResourceSlices name it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    driver: str = Field(min_length=1, max_length=253)
    pool: str = Field(min_length=1, max_length=253)
    device: str = Field(min_length=1, max_length=253)

    @property
    def resource_id(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


class Fault(BaseModel):
    """Which fault this is, independent of who saw it. Empty fields are unknown."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    xid: int | None = Field(None, ge=0)
    """NVIDIA XID code."""
    gpu_index: int | None = Field(None, ge=0)
    """NVML index of the GPU on its node."""
    gpu_uuid: str = Field("", max_length=128)
    dra: DraDevice | None = None
    check: str = Field("", max_length=128)
    """Name of the failing check: a DCGM test or health system, a plugin's check, a condition type."""
    container: str = Field("", max_length=253)
    """The failing container, for faults of one pod."""
    pods: tuple[str, ...] = ()
    """Pods holding the faulting device, as `namespace/name`, as the node saw them (PodResources)."""

    def describe(self) -> str:
        parts = []
        if self.xid is not None:
            parts.append(f"XID {self.xid}")
        if self.gpu_index is not None or self.gpu_uuid:
            parts.append(f"GPU {'' if self.gpu_index is None else self.gpu_index} {self.gpu_uuid}".replace("  ", " ").strip())
        if self.dra is not None:
            parts.append(f"device {self.dra.resource_id}")
        if self.check:
            parts.append(f"check {self.check}")
        return ", ".join(parts)


NO_FAULT = Fault()


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

    @property
    def node_name(self) -> str:
        """The node the target is on (`node`), or is (a Node target's `name`); "" for neither."""
        return self.node or (self.name if self.kind is TargetKind.NODE else "")

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
    fault: Fault = NO_FAULT
    recommended: Action | None = None
    """The source's own judgement (the agent's XID policy, a plugin's configured action); None leaves
    the decision to the controller's rules. How the two combine: `recovery.node_judgement`."""
    cleared: bool = False
    """True when this event reports that the fault has ended (a condition back to good, a health
    watch no longer failing). A cleared event never leads to a restart or a cordon."""
    occurrences: int = Field(1, ge=1)
    """How often the source saw this fault, this time included, within `window_seconds`."""
    window_seconds: float = Field(0.0, ge=0)
    """The window `occurrences` were counted in; 0 = since the source started."""
    evidence: Evidence | None = None
    """What this observation is evidence of, when it is (recorded by the controller for the judgement; an
    evidence event asks for no action itself)."""
    signal: str = Field("", max_length=512)
    """Identity of the outside signal this observation answers (an annotated Event's uid and count), or
    empty. Recovery records the signals it acted on in the ledger and never acts on one twice: not
    after a failover, a restart or a replay."""
    attributes: dict[str, Any] = Field(default_factory=dict)
    """Detail for people (logs, Event messages). Never read to decide anything."""

    @field_validator("message")
    @classmethod
    def _bound_message(cls, value: str) -> str:
        return fit(value, MESSAGE_MAX)

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
