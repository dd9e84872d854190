"""Event watcher (controller): Events annotated `kcover.io/need-recovery: "true"` ask for recovery.

Owns the trust decision on such Events, read from the cluster cache (which keeps only annotated
core/v1 Events; events.k8s.io Events are the same store). An Event is accepted when it is fresh
(its latest of `series.lastObservedTime`, `lastTimestamp`, `eventTime` within `staleness_seconds`) and:
* for a Pod: it lives in the Pod's namespace, the Pod exists, and the Event's uid (if any) is the
  live Pod's — so nobody can aim an Event at another namespace's pods or at a recreated pod;
* for a Node: its reporter (`reportingController`/`reportingComponent` or `source.component`) is in
  `trusted_reporters` — anyone who can write an Event must not be able to cordon nodes.
Updates are re-evaluated when the Event's count, series count or time moved. Refusals are logged
with their reason and counted in `kcover_events_rejected{reason}`, once per Event revision.

What the Event says about the fault is read with `kcover.codec.decode_annotations` into the published
event's typed fields (`fault`, `recommended`, `cleared`, `occurrences`, `window_seconds`); an Event
whose recommended action, cleared flag or pod list cannot be read is refused with the codec's reason
(`bad_recommended_action`, `bad_fault_cleared`, `bad_pods`), and unreadable detail is dropped and
logged. A cleared Event is published as an Info with `cleared=True`.

It never writes to the API. Without a cache it raises `DetectorUnavailableError`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import structlog
from pydantic import BaseModel, ConfigDict, Field

from kcover import bus as bus_
from kcover import codec, model
from kcover.aio import clock as clock_
from kcover.detectors import contract, following
from kcover.kube import caching
from kcover.kube import projections as proj

log = structlog.get_logger()

REASON = "RecoveryRequested"


class EventWatcherConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    staleness_seconds: float = Field(180.0, gt=0, description="Seconds: Events last observed longer ago are ignored; the Go project's 3 minutes.")
    trusted_reporters: list[str] = Field(default_factory=lambda: ["kcover.io/agent"],
                                         description="reportingController / source.component values allowed to target Nodes: kcover's own agent by default.")


class Verdict(NamedTuple):
    target: model.Target | None
    """Set when accepted."""
    reason: str
    """Why refused (snake_case), or the reporter when accepted."""


def observed_at(ev: proj.KubeEvent) -> dt.datetime | None:
    """The latest time the Event says it was seen, or None when it carries none."""
    best: dt.datetime | None = None
    for text in (ev.series_last_observed, ev.last_timestamp, ev.event_time, ev.first_timestamp):
        if not text:
            continue
        try:
            moment = clock_.parse_time(text)
        except ValueError:
            continue
        if best is None or moment > best:
            best = moment
    return best


def reporter_of(ev: proj.KubeEvent) -> str:
    return ev.reporting_controller or ev.source_component


def judge(ev: proj.KubeEvent, *, now: dt.datetime, config: EventWatcherConfig,
          pod_lookup: Callable[[str, str], proj.Pod | None],
          node_lookup: Callable[[str], proj.Node | None]) -> Verdict:
    """Accept or refuse one annotated Event (pure but for the two lookups)."""
    seen = observed_at(ev)
    if seen is None:
        return Verdict(None, "no_timestamp")
    if (now - seen).total_seconds() > config.staleness_seconds:
        return Verdict(None, "stale")
    inv = ev.involved
    if inv.kind == "Pod":
        if inv.namespace != ev.namespace:
            return Verdict(None, "namespace_mismatch")
        pod = pod_lookup(inv.namespace, inv.name)
        if pod is None:
            return Verdict(None, "pod_not_found")
        if inv.uid and inv.uid != pod.uid:
            return Verdict(None, "uid_mismatch")
        return Verdict(model.Target(kind=model.TargetKind.POD, namespace=pod.namespace, name=pod.name,
                                    uid=pod.uid, node=pod.node), reporter_of(ev))
    if inv.kind == "Node":
        trusted = set(config.trusted_reporters)
        if ev.reporting_controller not in trusted and ev.source_component not in trusted:
            return Verdict(None, "untrusted_reporter")
        node = node_lookup(inv.name)
        if node is None:
            return Verdict(None, "node_not_found")
        if inv.uid and node.uid and inv.uid != node.uid:
            return Verdict(None, "uid_mismatch")
        return Verdict(model.Target(kind=model.TargetKind.NODE, name=node.name, node=node.name), reporter_of(ev))
    return Verdict(None, "unsupported_kind")


def revision(ev: proj.KubeEvent) -> tuple[int, int, str, str, str]:
    """What makes an update worth re-evaluating: counts and times, not unrelated metadata."""
    return (ev.event_count, ev.series_count, ev.series_last_observed, ev.last_timestamp, ev.event_time)


class EventWatcherDetector:
    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = EventWatcherConfig

    def __init__(self, name: str, config: BaseModel, context: contract.DetectorContext) -> None:
        assert isinstance(config, EventWatcherConfig)
        self.name = name
        self.config = config
        self._context = context
        handled = following.kept_state(context, name, dict, dict)
        self.handled: dict[str, tuple[int, int, str, str, str]] = handled
        """Event uid -> the revision last judged."""
        self._bus: bus_.Bus | None = None

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        cache = following.cache_of(self._context, self.name)
        self._bus = bus
        await following.follow(cache, stop, self._on_change)

    def _on_change(self, kind: caching.Kind, old: Any, new: Any) -> None:
        if kind is not caching.Kind.EVENT:
            return
        if new is None:
            self.handled.pop(old.uid, None)
            return
        rev = revision(new)
        if self.handled.get(new.uid) == rev:
            return
        self.handled[new.uid] = rev
        cache: caching.ClusterCache = self._context.cache
        verdict = judge(new, now=self._context.clock.now(), config=self.config,
                        pod_lookup=cache.pod_by_name, node_lookup=cache.node)
        decoded = codec.decode_annotations(dict(new.annotations))
        if verdict.target is not None and isinstance(decoded, codec.Refused):
            verdict = Verdict(None, decoded.reason)
            log.info("recovery_event_undecodable", k8s_event=f"{new.namespace}/{new.name}",
                     annotation=decoded.annotation, detail=decoded.detail)
        if verdict.target is None or isinstance(decoded, codec.Refused):
            log.info("recovery_event_rejected", k8s_event=f"{new.namespace}/{new.name}", reason=verdict.reason,
                     involved_kind=new.involved.kind, involved=f"{new.involved.namespace}/{new.involved.name}",
                     reporter=reporter_of(new))
            self._context.metrics.events_rejected.labels(reason=verdict.reason).inc()
            return
        for annotation, why in decoded.dropped:
            log.warning("recovery_event_detail_dropped", k8s_event=f"{new.namespace}/{new.name}",
                        annotation=annotation, why=why)
        self._publish(cache, new, verdict.target, decoded)

    def _publish(self, cache: caching.ClusterCache, ev: proj.KubeEvent, target: model.Target,
                 decoded: codec.Decoded) -> None:
        attributes: dict[str, Any] = {"event_namespace": ev.namespace, "event_name": ev.name, "event_uid": ev.uid,
                                      "event_reason": ev.reason, "event_type": ev.type, "reporter": reporter_of(ev),
                                      "count": max(ev.event_count, ev.series_count)}
        if decoded.detector:
            attributes["source_detector"] = decoded.detector
        if target.kind is model.TargetKind.POD:
            pod = cache.pod(target.uid)
            workload = cache.workload_ref(pod) if pod is not None else None
            if workload is not None:
                attributes["workload"] = workload
        event = model.CollectorEvent(
            detector=self.name, severity=model.Severity.INFO if decoded.cleared else model.Severity.ERROR,
            reason=REASON, message=ev.message or f"Event {ev.reason} asks for recovery", target=target,
            dedupe_key=f"{self.name}/{ev.uid}/{ev.event_count}/{ev.series_count}", fault=decoded.fault,
            recommended=decoded.recommended, cleared=decoded.cleared, occurrences=decoded.occurrences,
            window_seconds=decoded.window_seconds, attributes=attributes)
        log.info("recovery_event_accepted", k8s_event=f"{ev.namespace}/{ev.name}", target=target.describe(),
                 reporter=reporter_of(ev), recommended=decoded.recommended, cleared=decoded.cleared,
                 fault=decoded.fault.describe())
        assert self._bus is not None
        try:
            self._bus.publish_nowait(event)
        except bus_.BusClosedError:
            log.debug("bus_closed_event_dropped", detector=self.name)
