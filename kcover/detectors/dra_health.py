"""DRA device health detector (controller): KEP-4680 `allocatedResourcesStatus` health per device.

Owns the per-device health state machine, read from the cluster cache: a device turning `Unhealthy`
is an Error naming the claim, resourceID and the device's message (typed: `fault.dra` from the
resourceID `driver/pool/device`, `fault.container`); `Unknown` lasting longer than
`unknown_warning_seconds` is a Warning; a return to `Healthy` after either is an Info with
`cleared=True`, and so is the first `Healthy` any pod reports for a device last reported `Unhealthy` (by
another pod: the faulty pod is usually gone by then; the device's health is the kubelet's per device, and
the return to service of an isolated device is how kcover learns of it). Nothing repeats
while a state holds, across re-lists and detector restarts (the state is the detector's
`context.state`). State is dropped when the pod goes away.

It never writes to the API. Without a cache it raises `DetectorUnavailableError`.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar

import structlog
from pydantic import BaseModel, ConfigDict, Field

from kcover import bus as bus_
from kcover import model
from kcover.detectors import contract, following
from kcover.kube import projections as proj

log = structlog.get_logger()

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
UNKNOWN = "Unknown"


class DraHealthConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    unknown_warning_seconds: float = Field(300.0, ge=0, description="Seconds a device may stay `Unknown` before a Warning: five minutes rides out a DRA driver restart.")
    tick_seconds: float = Field(5.0, gt=0, description="Seconds between checks of how long devices have been `Unknown`.")
    opt_in_only: bool = Field(False, description="Only pods opted in with `kcover.io/cascading-recovery`. Off: a bad device matters to its node whoever uses it.")


class Emit(enum.StrEnum):
    UNHEALTHY = "DeviceUnhealthy"
    UNKNOWN = "DeviceHealthUnknown"
    RECOVERED = "DeviceRecovered"


@dataclass(frozen=True)
class Track:
    health: str
    since: float
    """Monotonic seconds when `health` was first seen."""
    reported: str = ""
    """The state last reported: UNHEALTHY, UNKNOWN or '' (nothing outstanding)."""


def step(track: Track | None, health: str, now: float, unknown_after: float) -> tuple[Track, Emit | None]:
    """Advance one device's state on an observation (or a clock tick, with the same health). Pure."""
    if track is None:
        track = Track(health, now)
    elif track.health != health:
        track = Track(health, now, track.reported)
    if health == UNHEALTHY and track.reported != UNHEALTHY:
        return Track(health, track.since, UNHEALTHY), Emit.UNHEALTHY
    if health == UNKNOWN and not track.reported and now - track.since >= unknown_after:
        return Track(health, track.since, UNKNOWN), Emit.UNKNOWN
    if health == HEALTHY and track.reported:
        return Track(health, track.since), Emit.RECOVERED
    return track, None


def dra_device(resource_id: str) -> model.DraDevice | None:
    """`driver/pool/device` -> its parts, or None when it is not one. A pool name may itself hold
    slashes (ResourceSlice pools are slash-separated DNS subdomains); driver and device never do."""
    driver, _, rest = resource_id.partition("/")
    pool, _, device = rest.rpartition("/")
    if not (driver and pool and device):
        return None
    try:
        return model.DraDevice(driver=driver, pool=pool, device=device)
    except ValueError:
        return None


DeviceKey = tuple[str, str, str]
"""(container, claim, resourceID)."""


def devices(pod: proj.Pod) -> dict[DeviceKey, proj.ResourceHealth]:
    return {(c.name, r.claim, r.resource_id): r for c in pod.containers for r in c.resources}


@dataclass
class Kept:
    """What the detector remembers across restarts by the supervisor."""

    tracks: dict[str, dict[DeviceKey, Track]] = field(default_factory=dict)
    """Pod uid -> device -> state."""
    unhealthy: dict[str, str] = field(default_factory=dict)
    """resourceID -> node of every device reported Unhealthy and not yet seen Healthy again, by any pod."""


class DraHealthDetector:
    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = DraHealthConfig

    def __init__(self, name: str, config: DraHealthConfig, context: contract.DetectorContext) -> None:
        self.name = name
        self.config = config
        self._context = context
        kept = context.state(name, Kept)
        self.tracks = kept.tracks
        self.unhealthy = kept.unhealthy
        self._bus: bus_.Bus | None = None

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        cluster = contract.cluster_of(self._context, self.name)
        self._bus = bus
        await following.follow(cluster, stop, self._on_change, tick_seconds=self.config.tick_seconds,
                               on_tick=lambda: self._tick(cluster))

    def _on_change(self, kind: contract.ChangeKind, old: contract.Record | None, new: contract.Record | None) -> None:
        cluster = self._context.cluster
        if cluster is None:
            return
        if new is None:
            if isinstance(old, proj.Pod):
                self.tracks.pop(old.uid, None)
            return
        if not isinstance(new, proj.Pod):
            return
        if not any(c.resources for c in new.containers) and new.uid not in self.tracks:
            return
        self._evaluate(cluster, new)

    def _tick(self, cache: contract.ClusterView) -> None:
        for uid, tracks in list(self.tracks.items()):
            if any(t.health == UNKNOWN and not t.reported for t in tracks.values()):
                pod = cache.pod(uid)
                if pod is not None:
                    self._evaluate(cache, pod)

    def _evaluate(self, cache: contract.ClusterView, pod: proj.Pod) -> None:
        now = self._context.clock.monotonic()
        tracks = self.tracks.setdefault(pod.uid, {})
        current = devices(pod)
        for key in [k for k in tracks if k not in current]:
            del tracks[key]
        opted: bool | None = None
        for key, res in current.items():
            track, emit = step(tracks.get(key), res.health, now, self.config.unknown_warning_seconds)
            if emit is None and res.health == HEALTHY and res.resource_id in self.unhealthy:
                emit = Emit.RECOVERED  # another pod (a validation pod) got the device and reports it healthy
            if emit is Emit.UNHEALTHY and res.resource_id:
                self.unhealthy[res.resource_id] = pod.node
            elif emit is Emit.RECOVERED:
                self.unhealthy.pop(res.resource_id, None)
            if emit is not None:
                if opted is None:
                    opted = not self.config.opt_in_only or cache.opted_in(pod)
                if not opted:
                    continue
                self._publish(cache, pod, key[0], res, emit)
            tracks[key] = track
        if not tracks:
            del self.tracks[pod.uid]

    def _publish(self, cache: contract.ClusterView, pod: proj.Pod, container: str, res: proj.ResourceHealth,
                 emit: Emit) -> None:
        severity = {Emit.UNHEALTHY: model.Severity.ERROR, Emit.UNKNOWN: model.Severity.WARNING,
                    Emit.RECOVERED: model.Severity.INFO}[emit]
        attributes: dict[str, Any] = {"claim": res.claim, "resource_id": res.resource_id, "health": res.health}
        if res.message:
            attributes["device_message"] = res.message
        workload = cache.workload_ref(pod)
        if workload is not None:
            attributes["workload"] = dict(workload)
        text = f"device {res.resource_id or '?'} of {res.claim or '?'} is {res.health}"
        if res.message:
            text += f": {res.message}"
        event = model.CollectorEvent(
            detector=self.name, severity=severity, reason=emit.value, message=text,
            target=model.Target(kind=model.TargetKind.POD, namespace=pod.namespace, name=pod.name, uid=pod.uid,
                                node=pod.node),
            dedupe_key=f"{self.name}/{emit.value}/{pod.uid}/{container}/{res.claim}/{res.resource_id}",
            fault=model.Fault(dra=dra_device(res.resource_id), container=container),
            cleared=emit is Emit.RECOVERED, attributes=attributes, observed_at=self._context.clock.now())
        log.info("device_health_changed", pod=f"{pod.namespace}/{pod.name}", claim=res.claim,
                 resource_id=res.resource_id, health=res.health, emitted=emit.value)
        assert self._bus is not None
        try:
            self._bus.publish_nowait(event)
        except bus_.BusClosedError:
            log.debug("bus_closed_event_dropped", detector=self.name)
