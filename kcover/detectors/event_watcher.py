"""Event watcher (controller): Events annotated `kcover.io/need-recovery: "true"` ask for recovery.

Owns the trust decision on such Events, read from the cluster cache (which keeps only annotated
core/v1 Events; events.k8s.io Events are the same store). Anyone who may create Events somewhere can
write one, so an Event is a request, judged against who could have written it. It is accepted when it
is fresh (its latest of `series.lastObservedTime`, `lastTimestamp`, `eventTime` within
`staleness_seconds`, and none more than `max_clock_skew_seconds` in the future) and:
* for a Pod: it lives in the Pod's namespace (an Event with `eventTime` may name an object of another
  namespace; such a one is refused), the Pod exists, and the Event's uid (if any) is the live Pod's —
  so an Event can only ask for a restart in its own namespace, and never of a recreated pod;
* for a Node: it lives in one of `node_event_namespaces` (default: kcover's own namespace, where the
  chart lets only the agent create Events), its reporter (`reportingController`/`reportingComponent`
  or `source.component`) is in `trusted_reporters`, the identity it names (`reportingInstance`, else
  `source.host`) is the Node it is about, and (`require_agent_pod`) a running agent pod — the chart's
  labels, `agent_pod_labels` — sits on that Node in the Event's namespace. So only a principal that
  can already write Events where the agent does, for a node that runs an agent, can move a node.
Events about any other kind are refused. An Event that names a DRA device (`kcover.io/dra-*`) is
accepted only when a ResourceSlice whose `spec.nodeName` is the node the Event is about (the Node's,
or the Pod's node) publishes that driver, pool and device (`device_not_on_node` otherwise, logged as
`recovery_event_device_refused`): an agent speaks for the devices of its own node only. An Event about a
Pod that names a device is accepted only when that pod holds the device, as its kubelet reports in the
pod's `allocatedResourcesStatus` (`device_not_held` otherwise), and is opted in
(`device_holder_not_opted_in`): a tenant may ask kcover to isolate a GPU its own opted-in job uses, never
another tenant's GPU on the same node. An Event
annotated `kcover.io/device-healthy: "true"` (the agent's word that a device it reported has stayed
healthy for its hold, `kcover.codec`) is kept and judged by the same rules and published cleared, so
the policy removes kcover's DeviceTaintRule; one about anything but a Node, and any cleared Event
naming a device without that annotation, is refused (`device_healthy_untrusted`). An Event carrying
`kcover.io/evidence` (the agent's one link-down of an RDMA port, `model.Evidence`) is kept and judged by the
same rules too and published with its `evidence`, so the controller records it for the judgement; one about
anything but a Node, or asking for an action or a fault's end beside it, is refused (`evidence_untrusted`). Updates are re-evaluated when the Event's count, series count
or time moved. Refusals are logged with their reason, counted in `kcover_events_rejected{reason}`
once per Event revision, and handed to `context.refusals` (the controller answers them with a
rate-limited warning Event in the refused Event's namespace: at most one per namespace and reason per
`refusal_event_dedupe_seconds`, `refusal_events_per_minute` in all).

What the Event says about the fault is read with `kcover.codec.decode_annotations` into the published
event's typed fields (`fault`, `recommended`, `cleared`, `occurrences`, `window_seconds`); an Event
whose recommended action, cleared flag or pod list cannot be read is refused with the codec's reason
(`bad_recommended_action`, `bad_fault_cleared`, `bad_pods`), and unreadable detail is dropped and
logged. A cleared Event is published as an Info with `cleared=True`. Every published event carries
`signal` (the Event's uid and count): recovery acts at most once per signal, across restarts and
failovers (the ledger remembers).

It never writes to the API. Without a cache it raises `DetectorUnavailableError`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import structlog
from pydantic import BaseModel, ConfigDict, Field, field_validator

from kcover import bus as bus_
from kcover import codec, model
from kcover.aio import clock as clock_
from kcover.aio import limiting
from kcover.detectors import contract, following
from kcover.kube import projections as proj

log = structlog.get_logger()

REASON = "RecoveryRequested"


AGENT_POD_LABELS = {"app.kubernetes.io/name": "kcover", "app.kubernetes.io/component": "agent"}
"""The chart's labels on agent pods."""


class EventWatcherConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    staleness_seconds: float = Field(180.0, gt=0, description="Seconds: Events last observed longer ago are ignored; the Go project's 3 minutes.")
    max_clock_skew_seconds: float = Field(60.0, ge=0, description="Seconds an Event's time may lie in the future (clock skew between writer and controller); later ones are refused, since an Event dated ahead would never go stale.")
    trusted_reporters: list[str] = Field(default_factory=lambda: ["kcover.io/agent"],
                                         description="reportingController / source.component values allowed to target Nodes: kcover's own agent by default. A label the writer chooses, checked on top of the namespace and identity checks, never instead of them.")
    node_event_namespaces: list[str] | None = Field(None, description="Namespaces whose Events may name a Node. Unset: kcover's own namespace (the release namespace, `recovery.ledger_namespace`), where the chart lets only the agent create Events. Add `default` only if every principal that may create Events there may also cordon nodes.")
    require_agent_pod: bool = Field(True, description="Accept an Event about a Node only when an agent pod (`agent_pod_labels`) runs on that Node in the Event's namespace, and the Event's reportingInstance (or source.host) names that Node. Turn off only for trusted Node Events from elsewhere (node-problem-detector writing to an allowed namespace).")
    agent_pod_labels: dict[str, str] = Field(default_factory=lambda: dict(AGENT_POD_LABELS), description="Labels that mark kcover's agent pods: the chart's `app.kubernetes.io/name` and `app.kubernetes.io/component` (keys limited to those two, the ones the cache keeps).")
    refusal_events_per_minute: int = Field(30, ge=0, description="Warning Events kcover may write per minute answering refused Events (token bucket, 0 = none): a flood of forgeries must not make kcover flood the API.")
    refusal_event_dedupe_seconds: float = Field(300.0, ge=0, description="Seconds: one answering Event per namespace and refusal reason within this window; repeats are only counted.")

    @field_validator("agent_pod_labels")
    @classmethod
    def _kept_keys(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - proj.IDENTITY_LABELS)
        if unknown:
            raise ValueError(f"only {sorted(proj.IDENTITY_LABELS)} are kept on cached pods; not {unknown}")
        return value


REFUSALS = ("no_timestamp", "future_timestamp", "stale", "namespace_mismatch", "pod_not_found", "uid_mismatch",
            "namespace_not_allowed", "untrusted_reporter", "identity_mismatch", "no_agent_on_node", "node_not_found",
            "unsupported_kind", "device_not_on_node", "device_not_held", "device_holder_not_opted_in",
            "device_healthy_untrusted", "evidence_untrusted",
            codec.REFUSED_RECOMMENDED_ACTION, codec.REFUSED_FAULT_CLEARED, codec.REFUSED_PODS,
            codec.REFUSED_DEVICE_HEALTHY, codec.REFUSED_EVIDENCE)
"""Every reason a Verdict or the codec refuses an Event for: `kcover_events_rejected{reason}` starts at 0 for
each, so an alert on its increase fires on the first forgery."""


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


def identity_of(ev: proj.KubeEvent) -> str:
    """The instance the writer says it is: `reportingInstance`, else `source.host` (the agent: its node)."""
    return ev.reporting_instance or ev.source_host


def signal_of(ev: proj.KubeEvent) -> str:
    """What identifies this Event revision as a signal: its uid (namespace/name when it has none) and count."""
    who = ev.uid or f"{ev.namespace}/{ev.name}"
    return f"event/{who}/{max(ev.event_count, ev.series_count)}"


@dataclass(frozen=True)
class Lookups:
    """What `judge` reads of the cluster (the cache's answers)."""

    pod: Callable[[str, str], proj.Pod | None]
    """(namespace, name) -> the cached Pod."""
    node: Callable[[str], proj.Node | None]
    agent_on_node: Callable[[str, str], bool] = lambda namespace, node: False
    """(namespace, node) -> an agent pod (the configured labels, not terminating) runs there."""
    namespace: str = ""
    """kcover's own namespace: the default of `node_event_namespaces`."""


def judge(ev: proj.KubeEvent, *, now: dt.datetime, config: EventWatcherConfig,
          lookups: Lookups) -> Verdict:
    """Accept or refuse one annotated Event (pure but for the lookups)."""
    seen = observed_at(ev)
    if seen is None:
        return Verdict(None, "no_timestamp")
    if (seen - now).total_seconds() > config.max_clock_skew_seconds:
        return Verdict(None, "future_timestamp")
    if (now - seen).total_seconds() > config.staleness_seconds:
        return Verdict(None, "stale")
    inv = ev.involved
    if inv.kind == "Pod":
        if inv.namespace != ev.namespace:
            return Verdict(None, "namespace_mismatch")
        pod = lookups.pod(inv.namespace, inv.name)
        if pod is None:
            return Verdict(None, "pod_not_found")
        if inv.uid and inv.uid != pod.uid:
            return Verdict(None, "uid_mismatch")
        return Verdict(model.Target(kind=model.TargetKind.POD, namespace=pod.namespace, name=pod.name,
                                    uid=pod.uid, node=pod.node), reporter_of(ev))
    if inv.kind == "Node":
        allowed = config.node_event_namespaces
        if allowed is None:
            allowed = [lookups.namespace] if lookups.namespace else []
        if ev.namespace not in allowed:
            return Verdict(None, "namespace_not_allowed")
        if inv.namespace and inv.namespace != ev.namespace:
            return Verdict(None, "namespace_mismatch")
        trusted = set(config.trusted_reporters)
        if ev.reporting_controller not in trusted and ev.source_component not in trusted:
            return Verdict(None, "untrusted_reporter")
        if config.require_agent_pod:
            if identity_of(ev) != inv.name:
                return Verdict(None, "identity_mismatch")
            if not lookups.agent_on_node(ev.namespace, inv.name):
                return Verdict(None, "no_agent_on_node")
        node = lookups.node(inv.name)
        if node is None:
            return Verdict(None, "node_not_found")
        if inv.uid and node.uid and inv.uid != node.uid:
            return Verdict(None, "uid_mismatch")
        return Verdict(model.Target(kind=model.TargetKind.NODE, name=node.name, node=node.name), reporter_of(ev))
    return Verdict(None, "unsupported_kind")


def device_verdict(verdict: Verdict, device: model.DraDevice,
                   publishes: Callable[[str, model.DraDevice], bool]) -> Verdict:
    """An accepted Event that names a DRA device stays accepted only if a ResourceSlice of the node it
    is about (the Node's, or the Pod's node) publishes that device (pure but for `publishes`, the
    cache's `publishes_device`). An agent may speak for the devices of its own node, never for another's:
    the device taint and the restarts it leads to are answered on the node the report came from."""
    target = verdict.target
    if target is None or (target.node and publishes(target.node, device)):
        return verdict
    return Verdict(None, "device_not_on_node")


def holder_verdict(verdict: Verdict, device: model.DraDevice, pod: proj.Pod | None,
                   opted_in: Callable[[proj.Pod], bool]) -> Verdict:
    """An accepted Event about a Pod that names a DRA device stays accepted only if that pod holds the device,
    as its kubelet reports in the pod's `allocatedResourcesStatus` (a status no tenant can write), and is
    opted in: anyone who may write Events in a namespace can name any device of the pod's node, and a
    device taint keeps every tenant off that GPU (pure but for `opted_in`). A Node's Event is the agent's
    word for its own node's devices (`device_verdict`)."""
    target = verdict.target
    if target is None or target.kind is not model.TargetKind.POD:
        return verdict
    if pod is None or pod.uid != target.uid or not any(
            r.resource_id == device.resource_id for c in pod.containers for r in c.resources):
        return Verdict(None, "device_not_held")
    if not opted_in(pod):
        return Verdict(None, "device_holder_not_opted_in")
    return verdict


def return_verdict(verdict: Verdict, decoded: codec.Decoded) -> Verdict:
    """An Event that says a DRA device is well again (cleared, naming a device) stays accepted only as the
    agent's word (`kcover.io/device-healthy`) about a Node: so it passed the Node rules (the agent's
    namespace, reporter and identity, an agent pod on that node), and `device_verdict` then checks the
    device is that node's. A Pod's Event, which anyone who may write Events in the pod's namespace can
    forge, never un-isolates a device (pure)."""
    target = verdict.target
    if target is None or not (decoded.device_healthy or (decoded.cleared and decoded.fault.dra is not None)):
        return verdict
    if decoded.device_healthy and target.kind is model.TargetKind.NODE:
        return verdict
    return Verdict(None, "device_healthy_untrusted")


def evidence_verdict(verdict: Verdict, decoded: codec.Decoded) -> Verdict:
    """An Event carrying evidence (`kcover.io/evidence`, an agent's one link-down of an RDMA port) stays
    accepted only about a Node, so as the agent's word (its namespace, reporter and identity, an agent pod on
    that node), and only as evidence: asking for no action (`report` or none) and not a fault's end. A Pod's
    Event, which its tenant can write, never counts against a node (pure)."""
    target = verdict.target
    if target is None or decoded.evidence is None:
        return verdict
    if target.kind is model.TargetKind.NODE and not decoded.cleared and not decoded.need_recovery \
            and decoded.recommended in (None, model.Action.REPORT):
        return verdict
    return Verdict(None, "evidence_untrusted")


def agent_on_node(pods_on_node: Callable[[str], Sequence[proj.Pod]], labels: dict[str, str],
                  namespace: str, node: str) -> bool:
    """A pod carrying `labels`, in `namespace`, bound to `node` and not terminating (pure but for the lookup)."""
    for pod in pods_on_node(node):
        if pod.namespace != namespace or pod.deleting or pod.phase in ("Succeeded", "Failed"):
            continue
        if all(proj.get(pod.labels, k) == v for k, v in labels.items()):
            return True
    return False


def revision(ev: proj.KubeEvent) -> tuple[int, int, str, str, str]:
    """What makes an update worth re-evaluating: counts and times, not unrelated metadata."""
    return (ev.event_count, ev.series_count, ev.series_last_observed, ev.last_timestamp, ev.event_time)


class EventWatcherDetector:
    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = EventWatcherConfig

    def __init__(self, name: str, config: EventWatcherConfig, context: contract.DetectorContext) -> None:
        self.name = name
        self.config = config
        self._context = context
        for reason in REFUSALS:
            context.metrics.events_rejected.labels(reason=reason)
        self.handled: dict[str, tuple[int, int, str, str, str]] = context.state(name, dict)
        """Event uid -> the revision last judged."""
        self._bus: bus_.Bus | None = None
        self._answer_bucket = limiting.TokenBucket(config.refusal_events_per_minute / 60.0,
                                                   float(config.refusal_events_per_minute))
        self._answered: dict[tuple[str, str], float] = {}
        """(namespace, reason) -> monotonic time of the last answer handed over."""

    def lookups(self, cache: contract.ClusterView) -> Lookups:
        labels = dict(self.config.agent_pod_labels)
        return Lookups(pod=cache.pod_by_name, node=cache.node, namespace=self._context.namespace,
                       agent_on_node=lambda ns, node: agent_on_node(cache.pods_on_node, labels, ns, node))

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        cluster = contract.cluster_of(self._context, self.name)
        self._bus = bus
        await following.follow(cluster, stop, self._on_change)

    def _on_change(self, kind: contract.ChangeKind, old: contract.Record | None, new: contract.Record | None) -> None:
        cache = self._context.cluster
        if cache is None:
            return
        if new is None:
            if isinstance(old, proj.KubeEvent):
                self.handled.pop(old.uid, None)
            return
        if not isinstance(new, proj.KubeEvent):
            return
        rev = revision(new)
        if self.handled.get(new.uid) == rev:
            return
        self.handled[new.uid] = rev
        verdict = judge(new, now=self._context.clock.now(), config=self.config, lookups=self.lookups(cache))
        decoded = codec.decode_annotations(dict(new.annotations))
        if verdict.target is not None and isinstance(decoded, codec.Refused):
            verdict = Verdict(None, decoded.reason)
            log.info("recovery_event_undecodable", k8s_event=f"{new.namespace}/{new.name}",
                     annotation=decoded.annotation, detail=decoded.detail)
        if verdict.target is not None and not isinstance(decoded, codec.Refused):
            verdict = evidence_verdict(return_verdict(verdict, decoded), decoded)
        if verdict.target is not None and not isinstance(decoded, codec.Refused) and decoded.fault.dra is not None:
            target = verdict.target
            verdict = device_verdict(verdict, decoded.fault.dra, cache.publishes_device)
            why = "no ResourceSlice of the node the Event is about publishes that device"
            if verdict.target is not None:
                verdict = holder_verdict(verdict, decoded.fault.dra, cache.pod(target.uid) if target else None,
                                         cache.opted_in)
                why = {"device_not_held": "the Pod does not hold that device (its allocatedResourcesStatus)",
                       "device_holder_not_opted_in": "the Pod holding that device is not opted in"}.get(
                           verdict.reason, why)
            if verdict.target is None:
                log.warning("recovery_event_device_refused", k8s_event=f"{new.namespace}/{new.name}",
                            device=decoded.fault.dra.resource_id, node=new.involved.name
                            if new.involved.kind == "Node" else "", involved_kind=new.involved.kind,
                            reason=verdict.reason, why=why)
        if verdict.target is None or isinstance(decoded, codec.Refused):
            log.info("recovery_event_rejected", k8s_event=f"{new.namespace}/{new.name}", reason=verdict.reason,
                     involved_kind=new.involved.kind, involved=f"{new.involved.namespace}/{new.involved.name}",
                     reporter=reporter_of(new))
            self._context.metrics.events_rejected.labels(reason=verdict.reason).inc()
            self._answer(new, verdict.reason)
            return
        for annotation, why in decoded.dropped:
            log.warning("recovery_event_detail_dropped", k8s_event=f"{new.namespace}/{new.name}",
                        annotation=annotation, why=why)
        self._publish(cache, new, verdict.target, decoded)

    def _answer(self, ev: proj.KubeEvent, reason: str) -> None:
        """Hand a refusal to the controller's answering Events, rate-limited here: a flood of forged Events
        costs at most one answer per namespace and reason per dedupe window, and the bucket's rate in all."""
        sink = self._context.refusals
        if sink is None or reason == "stale":
            return  # a stale Event is history, not a request worth answering
        now = self._context.clock.monotonic()
        key = (ev.namespace, reason)
        last = self._answered.get(key)
        if last is not None and now - last < self.config.refusal_event_dedupe_seconds:
            return
        if not self._answer_bucket.take(now):
            return
        window = self.config.refusal_event_dedupe_seconds
        self._answered = {k: t for k, t in self._answered.items() if now - t < window}
        self._answered[key] = now
        inv = ev.involved
        about = f"{inv.kind} {inv.namespace + '/' if inv.namespace else ''}{inv.name}"
        sink(contract.Refusal(namespace=ev.namespace, kind="Event", api_version="v1", name=ev.name, uid=ev.uid,
                              reason=reason, text=f"kcover refused Event {ev.namespace}/{ev.name} asking for recovery "
                                                  f"of {about} (reporter {reporter_of(ev) or 'none'}, instance "
                                                  f"{identity_of(ev) or 'none'}): {reason}; nothing was done. "
                                                  f"Repeats within {window:.0f}s are only counted "
                                                  f"(kcover_events_rejected)."))

    def _publish(self, cache: contract.ClusterView, ev: proj.KubeEvent, target: model.Target,
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
                attributes["workload"] = dict(workload)
        event = model.CollectorEvent(
            detector=self.name, severity=model.Severity.INFO if decoded.cleared else model.Severity.ERROR,
            reason=REASON, message=ev.message or f"Event {ev.reason} asks for recovery", target=target,
            dedupe_key=f"{self.name}/{ev.uid}/{ev.event_count}/{ev.series_count}", signal=signal_of(ev),
            fault=decoded.fault,
            recommended=decoded.recommended, cleared=decoded.cleared, occurrences=decoded.occurrences,
            window_seconds=decoded.window_seconds, evidence=decoded.evidence, attributes=attributes,
            observed_at=self._context.clock.now())
        log.info("recovery_event_accepted", k8s_event=f"{ev.namespace}/{ev.name}", target=target.describe(),
                 reporter=reporter_of(ev), recommended=decoded.recommended, cleared=decoded.cleared,
                 fault=decoded.fault.describe())
        assert self._bus is not None
        try:
            self._bus.publish_nowait(event)
        except bus_.BusClosedError:
            log.debug("bus_closed_event_dropped", detector=self.name)
