"""RDMA link detector (agent): an InfiniBand or RoCE port of the node that went down or keeps flapping.

Owns reading the node's RDMA ports and the judgement of their links. Every `poll_interval_seconds` it
reads, for each port under `sysfs_path` (the kernel's `/sys/class/infiniband/<device>/ports/<n>/`),
`state` ("4: ACTIVE"), `phys_state` ("5: LinkUp"), `link_layer` and `counters/link_downed` (the
port's PortLinkDownedCounter: how often the link failed its error recovery and went down). A training
job's collectives cross these links, so a bad cable or NIC shows on no GPU: every rank of the job
waits until NCCL's watchdog gives up, and without this detector nothing names the node. Two faults,
each the node's (`cordon-node-and-restart`, target the Node, `fault.check` `rdma/<device>/<port>/...`):

* **down**: a watched port not ACTIVE for `down_seconds` (a cable pulled, a NIC dead, a port that
  vanished with its device). It clears when the port is ACTIVE again.
* **flapping**: `flaps` link-downs of one port within `flap_window_seconds` (from `link_downed`'s rise,
  or, where the counter cannot be read, each ACTIVE -> not ACTIVE seen). One link-down below that is a
  `RdmaLinkFlapped` Warning a person can read, carrying `model.Evidence.LINK_DOWN` and asking for nothing:
  a switch's reboot takes every port under it down once. The controller records it, and a job with a rank
  on this node whose collective fails soon after blames the node (`recovery.judgement.link_down`). The
  fault clears after `flap_clear_seconds` without another link-down (a day by default: a flapping cable
  is a person's to replace, and a cordoned, idle node's quiet link proves little), or when the counter
  goes back (cleared by `perfquery -R` after a repair).

Which ports are watched: those matching `devices` (a full-match regex of `<device>` or
`<device>/<port>`) and `link_layers`. With `devices` empty, a port is watched once this agent has seen
it ACTIVE, so unused ports never count; with `devices` set, a matching port is expected ACTIVE from
the start (a node that booted with a dead cable is found). Nothing here is tenant input: sysfs is the
kernel's. A file that cannot be read or parsed makes its port unknown for that poll, logged once per
port and reason, never a fault.

Fails: no RDMA port under `sysfs_path` -> `errors.DetectorUnavailableError` (a node without RDMA; the
supervisor retries it slowly and the agent stays healthy). A read runs in a worker thread and is
bounded by `read_timeout_seconds` (a wedged HCA's firmware can block a counter read): a read that
times out is logged and the poll skipped. It never writes to the API.
"""

from __future__ import annotations

import asyncio
import collections
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

import structlog
from pydantic import BaseModel, ConfigDict, Field, field_validator

from kcover import bus as bus_
from kcover import errors, model
from kcover.aio import waiting
from kcover.detectors import contract

log = structlog.get_logger()

ACTIVE_STATES = frozenset({4, 5})
"""IB port states 4 ACTIVE and 5 ACTIVE_DEFER carry traffic; 1 DOWN, 2 INIT, 3 ARMED do not."""
MAX_PORTS = 256
"""More ports than any node has: the rest are ignored (and said so)."""
CHECK = "rdma"


class RdmaLinkConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sysfs_path: str = Field("/sys/class/infiniband", description="The kernel's RDMA device directory (visible in the agent's container while the host's RDMA subsystem is in shared network-namespace mode, the default; else mount the host's /sys and point here).")
    devices: str = Field("", description="Full-match regex of `<device>` or `<device>/<port>` to watch (e.g. `mlx5_[0-7]` for the compute fabric); matching ports must be ACTIVE from the start. Empty: every port, each watched once seen ACTIVE.")
    link_layers: list[str] = Field(default_factory=lambda: ["InfiniBand", "Ethernet"], description="Link layers watched (`link_layer`): InfiniBand, and Ethernet for RoCE.")
    poll_interval_seconds: float = Field(5.0, gt=0, description="Seconds between reads of the ports (a few small sysfs files each).")
    read_timeout_seconds: float = Field(10.0, gt=0, description="Seconds one read of every port may take before the poll is skipped.")
    down_seconds: float = Field(30.0, ge=0, description="Seconds a watched port must stay out of ACTIVE before it is a fault (shorter outages count as link-downs).")
    flaps: int = Field(2, ge=1, description="Link-downs of one port within the window that make it a fault (one is reported, not acted on: a switch's reboot takes every port under it down once).")
    flap_window_seconds: float = Field(3600.0, gt=0, description="Window in which `flaps` link-downs are counted.")
    flap_clear_seconds: float = Field(86400.0, gt=0, description="Seconds without a link-down after which a flapping port's fault clears.")

    @field_validator("devices")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"devices is not a valid regex: {exc}") from exc
        return value


@dataclass(frozen=True)
class Port:
    """One port as read: state and physical state codes with their names, link layer, and `link_downed`
    (None when unreadable). `state` None: the port could not be read (`problem` says why)."""

    device: str
    port: int
    state: int | None
    state_name: str = ""
    phys: str = ""
    link_layer: str = ""
    link_downed: int | None = None
    problem: str = ""

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


class PortReader(Protocol):
    """Where ports come from: the node's sysfs (`SysfsPorts`), or a replay's table."""

    async def read(self) -> list[Port]: ...


def parse_coded(text: str) -> tuple[int, str]:
    """`"4: ACTIVE"` -> (4, "ACTIVE"); the kernel's format of `state` and `phys_state` (ValueError if not)."""
    code, sep, name = text.strip().partition(":")
    if not sep or not code.strip().isdigit():
        raise ValueError(f"expected '<code>: <name>', got {text.strip()[:40]!r}")
    return int(code), name.strip()


def read_port(directory: Path, device: str, port: int) -> Port:
    """One port's files (blocking: sysfs reads; run in a thread)."""
    try:
        state, state_name = parse_coded((directory / "state").read_text())
        _, phys = parse_coded((directory / "phys_state").read_text())
    except (OSError, ValueError) as exc:
        return Port(device, port, None, problem=f"state: {exc}")
    try:
        layer = (directory / "link_layer").read_text().strip()
    except OSError:
        layer = "InfiniBand"  # kernels before link_layer existed had InfiniBand only
    try:
        downed: int | None = int((directory / "counters" / "link_downed").read_text().strip())
    except (OSError, ValueError):
        downed = None
    return Port(device, port, state, state_name, phys, layer, downed)


@dataclass
class SysfsPorts:
    root: Path

    def _read_all(self) -> list[Port]:
        ports: list[Port] = []
        for device in sorted(self.root.iterdir()) if self.root.is_dir() else []:
            try:
                numbers = sorted((p for p in (device / "ports").iterdir() if p.name.isdigit()),
                                 key=lambda p: int(p.name))
            except OSError:
                continue
            ports.extend(read_port(p, device.name, int(p.name)) for p in numbers)
        return ports

    async def read(self) -> list[Port]:
        return await asyncio.to_thread(self._read_all)


@dataclass
class _Track:
    watched: bool = False
    down_since: float | None = None
    """Monotonic seconds since the port is out of ACTIVE (or gone), while it is."""
    downed: int | None = None
    """`link_downed` at the last read (None: unreadable, or not read since the port came back)."""
    downs: collections.deque[float] = field(default_factory=collections.deque)
    """When each link-down in the window was counted."""
    last_down: float | None = None
    flapping: bool = False
    was_active: bool = False
    present: bool = True


@dataclass(frozen=True)
class Finding:
    key: str
    """`<device>/<port>/down`, `<device>/<port>/flapping`, or `<device>/<port>/flapped` (a note)."""
    port: Port
    reason: str
    message: str


@dataclass
class Judge:
    """The ports' links over time (pure: reads and monotonic seconds in, findings and notes out)."""

    config: RdmaLinkConfig
    tracks: dict[str, _Track] = field(default_factory=dict)
    last: dict[str, Port] = field(default_factory=dict)

    def _selected(self, port: Port) -> bool:
        if port.link_layer and port.link_layer not in self.config.link_layers:
            return False
        pattern = self.config.devices
        return not pattern or bool(re.fullmatch(pattern, port.device) or re.fullmatch(pattern, port.name))

    def observe(self, ports: list[Port], now: float) -> tuple[list[Finding], list[Finding]]:
        """Fold one read in: (the faults present now, link-downs below the threshold, each to report once)."""
        ports = ports[:MAX_PORTS]
        unknown = {p.name for p in ports if p.state is None}
        seen = {p.name: p for p in ports if p.state is not None and self._selected(p)}
        notes: list[Finding] = []
        for name, port in seen.items():
            track = self.tracks.setdefault(name, _Track(watched=bool(self.config.devices)))
            track.watched = track.watched or port.active
            downs = self._downs(track, port)
            track.downed, track.present, track.was_active = port.link_downed, True, port.active
            if port.active:
                track.down_since = None
            elif track.down_since is None:
                track.down_since = now
            self.last[name] = port
            if downs and track.watched:
                notes.extend(self._count(name, track, port, downs, now))
        for name, track in self.tracks.items():
            if name in seen or name in unknown or not track.present or not track.watched:
                continue
            if track.was_active:  # its device vanished while the link was up: one link-down
                notes.extend(self._count(name, track, self.last[name], 1, now))
            track.present, track.was_active, track.downed = False, False, None
            if track.down_since is None:
                track.down_since = now
        return self._findings(now), notes

    def _downs(self, track: _Track, port: Port) -> int:
        """Link-downs since the last read: the counter's rise, else an ACTIVE -> not ACTIVE seen."""
        if port.link_downed is not None and track.downed is not None:
            if port.link_downed < track.downed:  # the counters were cleared (`perfquery -R`, after a repair)
                track.downs.clear()
                track.flapping, track.last_down = False, None
                return 0
            return port.link_downed - track.downed
        return 1 if track.present and track.was_active and not port.active and port.link_downed is None else 0

    def _count(self, name: str, track: _Track, port: Port, downs: int, now: float) -> list[Finding]:
        track.downs.extend([now] * min(downs, self.config.flaps))
        track.last_down = now
        if len(self._window(track, now)) >= self.config.flaps:
            track.flapping = True
            return []
        return [Finding(f"{name}/flapped", port, "RdmaLinkFlapped",
                        f"{_describe(port)} went down ({len(track.downs)} of {self.config.flaps} link-downs "
                        f"within {self.config.flap_window_seconds:g} s that make it a fault)")]

    def _window(self, track: _Track, now: float) -> collections.deque[float]:
        while track.downs and now - track.downs[0] > self.config.flap_window_seconds:
            track.downs.popleft()
        return track.downs

    def _findings(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        for name, track in sorted(self.tracks.items()):
            if not track.watched:
                continue
            port = self.last[name]
            if track.down_since is not None and now - track.down_since >= self.config.down_seconds:
                what = "is missing (its device is gone)" if not track.present else \
                    f"is {port.state_name or port.state} (physical state {port.phys or 'unknown'})"
                out.append(Finding(f"{name}/down", port, "RdmaLinkDown",
                                   f"{_describe(port)} {what} for {now - track.down_since:.0f} s"))
            if track.flapping and track.last_down is not None \
                    and now - track.last_down >= self.config.flap_clear_seconds:
                track.flapping = False
            if track.flapping:
                out.append(Finding(f"{name}/flapping", port, "RdmaLinkFlapping",
                                   f"{_describe(port)} went down {self.config.flaps} or more times within "
                                   f"{self.config.flap_window_seconds:g} s (link_downed "
                                   f"{'unreadable' if port.link_downed is None else port.link_downed})"))
        return out


def _describe(port: Port) -> str:
    return f"RDMA port {port.device} port {port.port} ({port.link_layer or 'unknown link layer'})"


class RdmaLinkDetector:
    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.AGENT})
    config_model: ClassVar[type[BaseModel]] = RdmaLinkConfig

    def __init__(self, name: str, config: RdmaLinkConfig, context: contract.DetectorContext,
                 reader: PortReader | None = None) -> None:
        self.name = name
        self.config = config
        self.context = context
        self.reader: PortReader = reader or SysfsPorts(Path(config.sysfs_path))
        self.judge = Judge(config)
        self._active: dict[str, Finding] = {}
        self._told: set[str] = set()

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        first = await self._read()
        if first is not None and not first:
            raise errors.DetectorUnavailableError(f"no RDMA port under {self.config.sysfs_path}")
        self.context.metrics.health_checks.started(self.name)
        log.info("rdma_link_detector_started", detector=self.name, ports=len(first or []))
        ports = first
        while True:
            if ports is not None:
                await self.check(bus, ports)
            if await waiting.sleep_or_stop(stop, self.config.poll_interval_seconds):
                return
            ports = await self._read()

    async def _read(self) -> list[Port] | None:
        try:
            return await asyncio.wait_for(self.reader.read(), self.config.read_timeout_seconds)
        except TimeoutError:
            log.warning("rdma_read_timed_out", detector=self.name, timeout_seconds=self.config.read_timeout_seconds)
            return None

    async def check(self, bus: bus_.Bus, ports: list[Port]) -> None:
        """Judge one read of the ports and publish what changed (the replay calls this for each read)."""
        for port in ports:
            told = f"{port.name}:{port.problem}"
            if port.problem and told not in self._told:
                self._told.add(told)
                log.warning("rdma_port_unreadable", detector=self.name, port=port.name, problem=port.problem)
        if len(ports) > MAX_PORTS and "too-many" not in self._told:
            self._told.add("too-many")
            log.warning("rdma_too_many_ports", detector=self.name, ports=len(ports), watched=MAX_PORTS)
        findings, notes = self.judge.observe(ports, self.context.clock.monotonic())
        self.context.metrics.health_checks.succeeded(self.name)
        for note in notes:
            await self._publish(bus, note, model.Severity.WARNING, model.Action.REPORT, cleared=False,
                                evidence=model.Evidence.LINK_DOWN)
        now = {f.key: f for f in findings}
        for key, finding in now.items():
            if key not in self._active:
                await self._publish(bus, finding, model.Severity.ERROR, model.Action.CORDON_NODE_AND_RESTART,
                                    cleared=False)
        for key, finding in list(self._active.items()):
            if key not in now:
                await self._publish(bus, finding, model.Severity.INFO, None, cleared=True)
        self._active = now

    async def _publish(self, bus: bus_.Bus, finding: Finding, severity: model.Severity,
                       action: model.Action | None, *, cleared: bool, evidence: model.Evidence | None = None) -> None:
        node = self.context.node_name
        reason = finding.reason + ("Cleared" if cleared else "")
        message = ("cleared: " if cleared else "") + finding.message
        check = f"{CHECK}/{finding.key}"[:128]
        log.info("rdma_link_observed", detector=self.name, port=finding.port.name, reason=reason, cleared=cleared)
        await bus.publish(model.CollectorEvent(
            detector=self.name, target=model.Target(kind=model.TargetKind.NODE, node=node, name=node),
            severity=severity, reason=model.fit(reason, model.NAME_MAX, suffix=""),
            message=model.fit(message, model.MESSAGE_MAX), observed_at=self.context.clock.now(),
            dedupe_key=f"{self.name}/{finding.key}/{'cleared' if cleared else 'active'}/{finding.port.link_downed}",
            fault=model.Fault(check="" if action is model.Action.REPORT else check),
            recommended=action, cleared=cleared, evidence=evidence))
