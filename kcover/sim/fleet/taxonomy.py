"""The fault taxonomy of the fleet replay: fault classes, their rates, their truth and their signals.

Owns the schema of `kcover/data/fleet-taxonomy.yaml` (also `config/fleet-taxonomy.yaml`; the file says
where its counts come from and what every field means) and loading it (`load()`, the shipped file or
`--taxonomy FILE`). A class has a count observed over `observed.gpus` GPUs and `observed.days` days,
so a rate per GPU-day; the truth a policy is scored against (`blame`), the physics of what follows
(`physics`) and the signals it produces (`signals`, weighted). It decides nothing and does no I/O
but reading the file.

Fails with `errors.ConfigError`, one line per bad field (`classes[3].signals[0].xid: ...`), on a file
that does not match the schema; two classes with one name and an `xid` signal without a code are errors.
"""

from __future__ import annotations

import enum
import importlib.resources
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kcover import errors


class Blame(enum.StrEnum):
    """What the fault truly was: what an ideal policy isolates (device, node) or leaves in service."""

    DEVICE = "device"
    NODE = "node"
    WORKLOAD = "workload"
    UNKNOWN = "unknown"

    @property
    def hardware(self) -> bool:
        return self in (Blame.DEVICE, Blame.NODE)


class Physics(enum.StrEnum):
    PERSISTENT = "persistent"
    """Fails whatever runs on the part, after each start, until isolated and repaired."""
    TRANSIENT = "transient"
    """Happens once (a node away for `down_hours`, then back and healthy)."""
    FOLLOWS_JOB = "follows-job"
    """A bug in the job on the node: fails that job wherever it runs, `bug_failures` times, then fixed."""


class SignalKind(enum.StrEnum):
    XID = "xid"
    """The node's agent sees the XID on the GPU; the rank on the node exits with an error."""
    EXIT = "exit"
    """The rank on the node exits with an error; nothing else shows."""
    NCCL = "nccl"
    """Nothing on any node; every rank of the job exits when the NCCL watchdog times out."""
    LINK = "link"
    """The node's agent sees one of its RDMA ports go down and up (`link_downed` rises); every rank of the
    job exits when the NCCL watchdog times out."""
    NOTREADY = "notready"
    """The node stops reporting (Ready=False); its pods are lost; the other ranks time out."""


class Signal(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    signal: SignalKind
    xid: int | None = Field(None, ge=0, description="The XID code, for `xid` signals.")
    weight: float = Field(1.0, gt=0, description="Relative chance of this signal among the class's.")

    @model_validator(mode="after")
    def _xid_needs_code(self) -> Signal:
        if (self.signal is SignalKind.XID) != (self.xid is not None):
            raise ValueError("an xid signal needs its `xid` code, and only an xid signal has one")
        return self


class FaultClass(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9-]*$")
    label: str = ""
    category: str = ""
    count: float = Field(ge=0, description="Onsets observed over `observed` (the paper's interruptions).")
    blame: Blame
    physics: Physics
    signals: tuple[Signal, ...] = Field(min_length=1)
    recur_minutes: float = Field(10.0, gt=0, description="Persistent: mean minutes from a job's start on the part "
                                                         "to its next failure there.")
    down_hours: float = Field(0.0, ge=0, description="Transient `notready`: hours the node is away.")
    dcgm: bool = Field(False, description="A DCGM diagnostic on the node fails while the fault lasts.")


class Range(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    min: int = Field(ge=1)
    max: int = Field(ge=1)


class Observed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: int = Field(gt=0)
    days: float = Field(gt=0)


class Taxonomy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = 1
    source: str = ""
    observed: Observed
    bug_failures: Range = Range(min=2, max=6)
    """How many times a software bug fails its job before it is fixed (uniform, both ends included)."""
    bug_minutes: float = Field(20.0, gt=0)
    """Mean minutes from a bugged job's start to its next failure."""
    classes: tuple[FaultClass, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Taxonomy:
        names = [c.name for c in self.classes]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"class names must be unique: {', '.join(twice)}")
        if self.bug_failures.max < self.bug_failures.min:
            raise ValueError("bug_failures.max must not be below bug_failures.min")
        return self

    def rate_per_gpu_day(self, cls: FaultClass) -> float:
        return cls.count / (self.observed.gpus * self.observed.days)

    def by_name(self) -> dict[str, FaultClass]:
        return {c.name: c for c in self.classes}


SHIPPED = "data/fleet-taxonomy.yaml"


def shipped_text() -> str:
    return importlib.resources.files("kcover").joinpath(SHIPPED).read_text("utf-8")


def from_mapping(data: Mapping[str, Any], *, source: str = "taxonomy") -> Taxonomy:
    try:
        return Taxonomy.model_validate(data)
    except ValidationError as exc:
        problems = [f"{source}: {'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()]
        raise errors.ConfigError("invalid fault taxonomy", problems) from exc


def load(path: str = "") -> Taxonomy:
    """The shipped taxonomy, or the one in `path`."""
    if not path:
        return from_mapping(yaml.safe_load(shipped_text()), source=f"kcover/{SHIPPED}")
    try:
        data = yaml.safe_load(Path(path).read_text("utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise errors.ConfigError(f"{path}: cannot read the fault taxonomy: {exc}") from exc
    if not isinstance(data, Mapping):
        raise errors.ConfigError(f"{path}: the top level must be a mapping")
    return from_mapping(data, source=path)
