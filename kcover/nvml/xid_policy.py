"""XID policy as data, the pure decision on one XID, and the kernel-log XID line parser.

Owns the schema of `xid-policy.yaml` (shipped as `kcover/data/xid-policy.yaml`; `config/xid-policy.yaml`
is a symlink to it), merging an operator's override file onto it, `XidPolicy.decide()` (XID, earlier
occurrences, now -> `Decision`) and `parse_xid()` for `NVRM: Xid` kernel log lines. It lives in the
nvml layer, not in `kcover.agent`, because the NVML and DCGM detectors (a lower layer) attach its
verdict to their events. It does no I/O except `load()`, which reads the two YAML files.

Fails with `errors.ConfigError` (one line per bad entry) on an invalid policy file; unknown XID codes
are never an error: they get the policy's `unknown` entry (reported, never dropped).
"""

from __future__ import annotations

import enum
import importlib.resources
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kcover import errors, model

Action = model.Action
"""What the policy recommends for an XID; `ignore` is logged and counted, and no event is published."""


class XidClass(enum.StrEnum):
    APPLICATION = "application"
    HARDWARE = "hardware"
    DRIVER = "driver"
    NVLINK = "nvlink"
    UNKNOWN = "unknown"


class Threshold(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int = Field(1, ge=1, description="Occurrences on one GPU, this one included.")
    window_seconds: float = Field(0.0, ge=0, description="Seconds the occurrences must fall within; 0 = any time.")


class Escalation(Threshold):
    action: Action = Action.CORDON_NODE


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = ""
    xid_class: XidClass = Field(XidClass.UNKNOWN, alias="class")
    severity: model.Severity = model.Severity.WARNING
    action: Action = Action.REPORT
    threshold: Threshold = Field(default_factory=Threshold)
    escalate: Escalation | None = None


@dataclass(frozen=True)
class Decision:
    xid: int
    name: str
    xid_class: XidClass
    severity: model.Severity
    action: Action
    occurrences: int
    """Occurrences on this GPU within the longest window the entry looks at (this one included)."""
    escalated: bool
    known: bool
    window_seconds: float = 0.0
    """The window `occurrences` were counted in; 0 = any time (since the agent started)."""

    @property
    def reason(self) -> str:
        return f"XID{self.xid}"


class Judge(Protocol):
    """What judging an XID needs of a policy: `XidPolicy` in kcover; the detector contract hands it to
    detectors as `DetectorContext.xid_policy`."""

    @property
    def longest_window_seconds(self) -> float:
        """Seconds of history any entry counts occurrences over (0 when none does)."""
        ...

    def decide(self, xid: int, history: Sequence[float], now: float) -> Decision:
        """Judge one XID given the monotonic times of its earlier occurrences on the same GPU."""
        ...


def _count_within(history: Sequence[float], now: float, window: float) -> int:
    if window <= 0:
        return len(history) + 1
    return sum(1 for t in history if now - t <= window) + 1


class XidPolicy:
    """A validated policy. Build with `load()` or `from_mapping()`."""

    def __init__(self, entries: Mapping[int, Entry], unknown: Entry) -> None:
        self.entries = dict(entries)
        self.unknown = unknown

    @property
    def longest_window_seconds(self) -> float:
        windows = [e.threshold.window_seconds for e in self.entries.values()]
        windows += [e.escalate.window_seconds for e in self.entries.values() if e.escalate]
        return max(windows, default=0.0)

    def entry(self, xid: int) -> Entry:
        return self.entries.get(xid, self.unknown)

    def decide(self, xid: int, history: Sequence[float], now: float) -> Decision:
        """`history`: times (monotonic seconds) of earlier occurrences of this XID on the same GPU."""
        entry = self.entry(xid)
        action = entry.action
        window = entry.threshold.window_seconds
        seen = _count_within(history, now, window)
        if seen < entry.threshold.count and action is not Action.IGNORE:
            action = Action.REPORT
        escalated = False
        if entry.escalate is not None:
            repeats = _count_within(history, now, entry.escalate.window_seconds)
            if repeats >= entry.escalate.count:
                action, escalated = entry.escalate.action, True
                if repeats >= seen:
                    seen, window = repeats, entry.escalate.window_seconds
        return Decision(xid=xid, name=entry.name, xid_class=entry.xid_class, severity=entry.severity,
                        action=action, occurrences=seen, escalated=escalated, known=xid in self.entries,
                        window_seconds=window)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, base: XidPolicy | None = None,
                     source: str = "xid policy") -> XidPolicy:
        """Validate `{"unknown": {...}, "xids": {code: {...}}}`; entries replace `base`'s per code."""
        problems: list[str] = []
        entries: dict[int, Entry] = dict(base.entries) if base else {}
        unknown = base.unknown if base else Entry(xid_class=XidClass.UNKNOWN)
        if "unknown" in data:
            try:
                unknown = Entry.model_validate(data["unknown"])
            except ValidationError as exc:
                problems += [f"{source}: unknown: {e['msg']}" for e in exc.errors()]
        raw = data.get("xids") or {}
        if not isinstance(raw, Mapping):
            raise errors.ConfigError(f"{source}: xids must be a mapping of code to entry")
        for code, body in raw.items():
            try:
                number = int(code)
                entries[number] = Entry.model_validate(body)
            except (TypeError, ValueError) as exc:
                errs = exc.errors() if isinstance(exc, ValidationError) else [{"loc": (), "msg": str(exc)}]
                for e in errs:
                    loc = ".".join(str(p) for p in e["loc"])
                    problems.append(f"{source}: xids.{code}{'.' + loc if loc else ''}: {e['msg']}")
        if problems:
            raise errors.ConfigError("invalid XID policy", problems)
        return cls(entries, unknown)


def default_policy_text() -> str:
    return importlib.resources.files("kcover").joinpath("data/xid-policy.yaml").read_text("utf-8")


def load(override_file: str = "") -> XidPolicy:
    """The shipped policy, with `override_file` (if given) merged on top per XID code."""
    policy = XidPolicy.from_mapping(yaml.safe_load(default_policy_text()), source="kcover/data/xid-policy.yaml")
    if not override_file:
        return policy
    try:
        data = yaml.safe_load(Path(override_file).read_text("utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise errors.ConfigError(f"{override_file}: cannot read the XID policy: {exc}") from exc
    if not isinstance(data, Mapping):
        raise errors.ConfigError(f"{override_file}: the top level must be a mapping")
    return XidPolicy.from_mapping(data, base=policy, source=override_file)


# ---------------------------------------------------------------------------------------------- kernel log

_XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?)\):"
                     r" (?P<code>\d+), ?(?P<rest>.*)$")
_PID_RE = re.compile(r"pid='?(?P<pid><unknown>|\d+)'?,(?: name=(?P<name>.*?),)? ")
_RECOVERY_RE = re.compile(r"GPU recovery action changed from 0x[0-9a-fA-F]+ \((?P<old>[^)]*)\) to "
                          r"0x[0-9a-fA-F]+ \((?P<new>[^)]*)\)")
_GPU_AT_RE = re.compile(r"NVRM: GPU at PCI:(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}): "
                        r"(?P<uuid>GPU-[0-9A-Za-z<>\- ]+?)\s*$")


@dataclass(frozen=True)
class KernelXid:
    """One `NVRM: Xid` kernel log line."""

    code: int
    pci_bus_id: str
    """Lower case `dddd:bb:dd` as the kernel prints it (no function number)."""
    pid: int | None
    process: str
    message: str
    recovery_action: str = ""
    """For XID 154: the recovery action the driver now asks for (e.g. `Drain and Reset`)."""


def _bus(text: str) -> str:
    domain, _, rest = text.lower().partition(":")
    rest = rest.split(".")[0]
    return f"{int(domain, 16):04x}:{rest}"


def parse_xid(line: str) -> KernelXid | None:
    """Parse a dmesg/journal/syslog line; None when it is not an XID line."""
    match = _XID_RE.search(line.rstrip("\n"))
    if match is None:
        return None
    rest = match["rest"].strip()
    pid: int | None = None
    process = ""
    who = _PID_RE.match(rest)
    if who is not None:
        pid = int(who["pid"]) if who["pid"].isdigit() else None
        process = who["name"] if who["name"] and who["name"] != "<unknown>" else ""
        rest = rest[who.end():]
    recovery = _RECOVERY_RE.search(rest)
    return KernelXid(code=int(match["code"]), pci_bus_id=_bus(match["bus"]), pid=pid, process=process,
                     message=rest.strip(), recovery_action=recovery["new"] if recovery else "")


def parse_gpu_at(line: str) -> tuple[str, str] | None:
    """`NVRM: GPU at PCI:0000:91:00: GPU-b6c3...` -> (`0000:91:00`, `GPU-b6c3...`), else None."""
    match = _GPU_AT_RE.search(line.rstrip("\n"))
    if match is None:
        return None
    return _bus(match["bus"]), match["uuid"]
