"""The agent's reporter: GPU faults from the bus become a Node condition and Events.

Owns what the agent writes to the API, and only that: the `KcoverGPUHealthy` condition on its own
Node (strategic-merge PATCH of nodes/{name}/status, conditions merge by type) and core/v1 Events
about the Node (reportingComponent `kcover.io/agent`, reportingInstance and source.host the node
name; the body is `kcover.kube.events`', which also gives the Node reference the release namespace
where the API server requires it) in `agent.event_namespace`, the release namespace, where the chart
lets only the agent create Events: the controller acts on Node Events only from there and only when an
agent pod runs on the node the Event names. Events of faults whose source recommends a restart or a cordon
carry `kcover.io/need-recovery: "true"` (`codec.needs_recovery`), so the controller's event watcher
acts on them; cleared faults never do (the controller learns the end from the condition). A DRA
device's faults end on their own clock (`devicehealth`, the same hold as the condition): when they
have, the reporter writes one Event saying the device is healthy again (`kcover.io/device-healthy`),
on which the controller removes kcover's DeviceTaintRule of the device.

Node-level faults (recommended action cordon-node or cordon-node-and-restart) set the condition
False (`codec.condition_status`), except a fault on a DRA device (`fault.dra`, which `devices`, the
agent's `dradevices.DraDevices.attach`, fills in for a GPU its node publishes through DRA): that is
the device's, isolated by the controller with a device taint, so it leaves the condition alone. A fault with a `check` (a health poll, a DCGM check, a plugin's
check) lasts until its detector publishes it `cleared`; one without (an XID) clears when it has not
recurred. Either way the condition returns to True only once every fault stayed cleared for
`agent.condition_hold_seconds`. With no fault, an agent that cannot see the node's GPUs (`sight`: a GPU
node where no GPU detector runs) writes the condition `Unknown` (reason `NoGPUDetector`, the message says
what is missing), not `True`; while its GPU detectors are still settling it writes nothing new. A fault
still sets it False: what another detector found outranks what the GPU detectors cannot see.
Condition writes happen only on change and at most once per
`agent.min_write_interval_seconds`; Events are deduplicated per (reason, GPU, action, cleared) within
`agent.event_dedupe_seconds` and limited to `agent.max_events_per_minute`. Everything is read from
the events' typed fields; their `attributes` are never consulted. The Event annotations are the
codec's (`kcover.codec`): `kcover.io/need-recovery` on faults whose source recommends a restart or
a cordon, and every typed field of the fault.

Failures: a failed write is logged and retried on the next tick (condition). An Event that asks for
recovery (`codec.needs_recovery`) is retried with backoff, oldest first, for `agent.event_retry_seconds`
(at most `MAX_PENDING_EVENTS` of them), since the condition alone recommends a cordon and never the
restarts; then it is dropped with an error log. So is one carrying evidence (`model.Evidence`: a
link-down the controller's judgement reads; nothing else carries it). Other Events are dropped at once. The device-healthy
Event is what un-isolates a device, so it is never dropped: a failed write is retried with backoff,
and one the dedupe window or the rate limit holds back waits for them. It is void if the device faults
again first. The reporter never stops the agent. Needs get on its Node, patch nodes/status, create Events.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from kcover import bus as bus_
from kcover import codec, errors, model, settings
from kcover.agent import devicehealth
from kcover.agent import sight as sight_
from kcover.aio import backoff, limiting
from kcover.aio import clock as clock_
from kcover.kube import client as client_
from kcover.kube import events

log = structlog.get_logger()

NODE_LEVEL = frozenset({model.Action.CORDON_NODE, model.Action.CORDON_NODE_AND_RESTART})
"""Recommendations that make a fault the node's: they set the condition False."""
HEALTHY_REASON = "GPUsHealthy"


@dataclass
class Fault:
    reason: str
    gpu: str
    message: str
    active: bool
    last_seen: float
    cleared_at: float | None = None
    """Monotonic seconds when the fault was last seen cleared (XID faults: when last seen)."""


@dataclass(frozen=True)
class Condition:
    status: str
    reason: str
    message: str


def fault_key(event: model.CollectorEvent) -> str | None:
    """The key of the node-level fault an event sets or clears, or None if it is not one (pure)."""
    fault = event.fault
    if fault.dra is not None and not event.cleared:
        return None  # a DRA device's fault is the device's: the controller taints it, the node stays schedulable
    if not event.cleared and (event.recommended not in NODE_LEVEL or event.severity is model.Severity.INFO):
        return None
    if event.cleared and not fault.check:
        return None  # only faults with a check last until cleared; XIDs clear by not recurring
    target = event.target.device_id or event.target.node or event.target.name
    what = fault.check or event.reason
    xid = "" if fault.xid is None else str(fault.xid)
    return f"{event.detector}/{what}/{xid}/{fault.gpu_uuid or fault.gpu_index or ''}/{target}"


def _gpu(event: model.CollectorEvent) -> str:
    fault = event.fault
    if fault.gpu_uuid:
        return fault.gpu_uuid
    return event.target.device_id or ("" if fault.gpu_index is None else f"GPU {fault.gpu_index}")


def apply(faults: dict[str, Fault], event: model.CollectorEvent, now: float) -> None:
    """Fold one event into the fault table (pure)."""
    key = fault_key(event)
    if key is None:
        return
    if event.cleared:
        known = faults.get(key)
        if known is not None and known.active:
            known.active, known.cleared_at = False, now
        return
    persistent = bool(event.fault.check)
    faults[key] = Fault(reason=event.reason, gpu=_gpu(event), message=event.message, active=persistent,
                        last_seen=now, cleared_at=None if persistent else now)


def condition(faults: dict[str, Fault], now: float, hold_seconds: float,
              sight: sight_.Sight | None = None) -> Condition | None:
    """The condition the faults and the agent's GPU sight call for; drops faults cleared for longer than the
    hold (pure, mutates). None: no fault and the GPU detectors still settling, so no judgement yet."""
    for key in [k for k, f in faults.items() if not f.active and f.cleared_at is not None
                and now - f.cleared_at > hold_seconds]:
        del faults[key]
    if not faults:
        seeing = sight.seeing if sight is not None else sight_.Seeing.SEES
        if seeing is sight_.Seeing.SETTLING:
            return None
        if seeing is sight_.Seeing.BLIND:
            assert sight is not None
            return Condition(codec.CONDITION_BLIND, sight_.BLIND_REASON, model.fit(sight.message, model.MESSAGE_MAX))
        return Condition(codec.condition_status(False), HEALTHY_REASON, "kcover agent sees no GPU fault on this node")
    ordered = sorted(faults.values(), key=lambda f: (not f.active, f.reason, f.gpu))
    reasons = sorted({f.reason for f in ordered})
    gpus = sorted({f.gpu for f in ordered if f.gpu})
    reason = reasons[0] if len(reasons) == 1 else "GPUFaults"
    detail = "; ".join(f.message + ("" if f.active else " (cleared, holding)") for f in ordered)
    message = f"affected GPUs: {', '.join(gpus) or 'node'}; {detail}"
    return Condition(codec.condition_status(True), reason, model.fit(message, model.MESSAGE_MAX))


TokenBucket = limiting.TokenBucket


@dataclass
class _Written:
    condition: Condition | None = None
    transition: dt.datetime | None = None
    at: float = float("-inf")


@dataclass
class Reporter:
    client: client_.KubeClient
    config: settings.AgentSettings
    node_name: str
    clock: clock_.Clock = field(default_factory=clock_.SystemClock)
    tick_seconds: float = 0.5
    faults: dict[str, Fault] = field(default_factory=dict)
    _written: _Written = field(default_factory=_Written)
    _sent: dict[str, float] = field(default_factory=dict)
    _bucket: TokenBucket | None = None
    _write_backoff: backoff.Backoff = field(default_factory=lambda: backoff.Backoff(initial=1.0, maximum=60.0))
    """A failing status write (node missing, API down) is retried at growing intervals, not every tick."""
    _retry_at: float = 0.0
    events_created: int = 0
    events_suppressed: int = 0
    devices: Callable[[model.CollectorEvent], Awaitable[list[model.CollectorEvent]]] | None = None
    """Maps a fault on a GPU to one report per DRA device that GPU is (`dradevices.DraDevices.attach`);
    None reports events as published."""
    device_faults: dict[str, devicehealth.Device] = field(default_factory=dict)
    """DRA device resource id -> its faults, until they have ended for the hold."""
    healthy_pending: dict[str, model.CollectorEvent] = field(default_factory=dict)
    """DRA device resource id -> its device-healthy report, until written."""
    _healthy_backoff: backoff.Backoff = field(default_factory=lambda: backoff.Backoff(initial=1.0, maximum=60.0))
    _healthy_retry_at: float = 0.0
    recovery_pending: list[tuple[float, model.CollectorEvent]] = field(default_factory=list)
    """Events asking for recovery whose write failed, oldest first: (monotonic time it first failed, event)."""
    _recovery_backoff: backoff.Backoff = field(default_factory=lambda: backoff.Backoff(initial=0.5, maximum=15.0))
    _recovery_retry_at: float = 0.0
    sight: Callable[[], sight_.Sight] | None = None
    """What the agent's GPU detectors see now (`sight.GpuSight.current`); None: they see (tests of the reporter alone)."""

    async def run(self, sub: bus_.Subscription, stop: asyncio.Event) -> None:
        await self._load_current()
        while not stop.is_set():
            batch = await sub.get_batch(stop=stop, timeout=self.tick_seconds)
            if batch or sub.drained:
                await self.handle(batch)
                if not batch:  # the bus closed and everything queued was handled
                    return
            elif not stop.is_set():  # a tick: nothing came
                await self.sync_condition()
                await self.sync_devices()
                await self.retry_events()

    async def handle(self, events: list[model.CollectorEvent]) -> None:
        if self.devices is not None:
            events = [mapped for event in events for mapped in await self.devices(event)]
        now = self.clock.monotonic()
        for event in events:
            apply(self.faults, event, now)
            if devicehealth.apply(self.device_faults, event, now) and event.fault.dra is not None:
                self.healthy_pending.pop(event.fault.dra.resource_id, None)  # faulty again: not healthy
        await self.sync_condition()
        for event in events:
            await self.post_event(event)
        await self.sync_devices()
        await self.retry_events()

    # ------------------------------------------------------------------ condition

    def _path(self) -> str:
        return f"/api/v1/nodes/{self.node_name}"

    async def _load_current(self) -> None:
        """Learn the condition already on the Node: a False one is held, not flipped at once."""
        try:
            node = await self.client.request("GET", self._path())
        except errors.KubeError as exc:
            log.warning("agent_node_read_failed", node=self.node_name, error=str(exc))
            return
        for cond in (node.get("status") or {}).get("conditions") or []:
            if cond.get("type") != self.config.condition_type:
                continue
            current = Condition(str(cond.get("status")), str(cond.get("reason", "")), str(cond.get("message", "")))
            transition = cond.get("lastTransitionTime")
            self._written = _Written(current, clock_.parse_time(transition) if transition else None)
            if current.status == codec.condition_status(True):
                now = self.clock.monotonic()
                self.faults["carried-over/node"] = Fault(reason=current.reason or "CarriedOver", gpu="",
                                                         message="fault reported before the agent restarted",
                                                         active=False, last_seen=now, cleared_at=now)

    async def sync_condition(self) -> None:
        now = self.clock.monotonic()
        want = condition(self.faults, now, self.config.condition_hold_seconds,
                         self.sight() if self.sight is not None else None)
        written = self._written
        if want is None or want == written.condition:
            return
        if now - written.at < self.config.min_write_interval_seconds or now < self._retry_at:
            return  # the next tick writes it
        wall = self.clock.now()
        transition = wall if written.condition is None or written.condition.status != want.status \
            else (written.transition or wall)
        body = {"status": {"conditions": [{
            "type": self.config.condition_type, "status": want.status, "reason": want.reason,
            "message": want.message, "lastHeartbeatTime": clock_.rfc3339(wall),
            "lastTransitionTime": clock_.rfc3339(transition)}]}}
        try:
            await self.client.request("PATCH", self._path() + "/status", body=body,
                                      content_type=client_.STRATEGIC_MERGE_PATCH)
        except errors.KubeError as exc:
            delay = self._write_backoff.next_delay()
            self._retry_at = now + delay
            log.warning("agent_condition_write_failed", node=self.node_name, error=str(exc),
                        retry_in_seconds=round(delay, 1))
            return
        self._write_backoff.reset()
        self._retry_at = 0.0
        self._written = _Written(want, transition, now)
        log.info("agent_condition_written", node=self.node_name, type=self.config.condition_type,
                 status=want.status, reason=want.reason)

    # ------------------------------------------------------------------ events

    def _event_key(self, event: model.CollectorEvent) -> str:
        dra = event.fault.dra.resource_id if event.fault.dra is not None else ""
        return f"{event.reason}/{_gpu(event)}/{dra}/{_action_word(event)}/{event.cleared}"

    def _deduped(self, key: str, now: float) -> bool:
        last = self._sent.get(key)
        return last is not None and now - last < self.config.event_dedupe_seconds

    def _take_token(self, now: float) -> bool:
        if self._bucket is None:
            per_second = self.config.max_events_per_minute / 60.0
            self._bucket = TokenBucket(per_second, float(self.config.max_events_per_minute))
        return self._bucket.take(now)

    def _mark_sent(self, key: str, now: float) -> None:
        self._sent = {k: t for k, t in self._sent.items() if now - t < self.config.event_dedupe_seconds}
        self._sent[key] = now

    async def _write_event(self, event: model.CollectorEvent, *, device_healthy: bool = False) -> bool:
        """POST the Event for `event`; False (logged) when the API server did not take it."""
        try:
            body = event_body(event, node=self.node_name, namespace=self.config.event_namespace,
                              reporter=self.config.reporting_controller, when=self.clock.now(),
                              device_healthy=device_healthy)
            await self.client.request("POST", events.path_of(body), body=body)
        except errors.KubeError as exc:
            log.warning("agent_event_write_failed", node=self.node_name, reason=event.reason, error=str(exc),
                        device_healthy=device_healthy)
            return False
        self.events_created += 1
        return True

    async def post_event(self, event: model.CollectorEvent) -> None:
        key = self._event_key(event)
        now = self.clock.monotonic()
        if self._deduped(key, now):
            self.events_suppressed += 1
            return
        if not self._take_token(now):
            self.events_suppressed += 1
            log.warning("agent_event_rate_limited", node=self.node_name, reason=event.reason)
            return
        self._mark_sent(key, now)
        if not await self._write_event(event) and (codec.needs_recovery(event) or event.evidence is not None):
            if len(self.recovery_pending) >= MAX_PENDING_EVENTS:
                _, oldest = self.recovery_pending.pop(0)
                log.error("agent_event_given_up", node=self.node_name, reason=oldest.reason,
                          why=f"more than {MAX_PENDING_EVENTS} Events asking for recovery are waiting")
            self.recovery_pending.append((now, event))
            if not self._recovery_retry_at:
                self._recovery_retry_at = now + self._recovery_backoff.next_delay()

    async def retry_events(self) -> None:
        """Write again the Events asking for recovery whose write failed, oldest first, with backoff; drop
        (with an error log) those that have waited past `agent.event_retry_seconds`."""
        now = self.clock.monotonic()
        if not self.recovery_pending or now < self._recovery_retry_at:
            return
        limit = self.config.event_retry_seconds
        for first, event in [p for p in self.recovery_pending if now - p[0] > limit]:
            log.error("agent_event_given_up", node=self.node_name, reason=event.reason,
                      why=f"not written within agent.event_retry_seconds ({limit:g}s)", waited=round(now - first, 1))
        self.recovery_pending = [p for p in self.recovery_pending if now - p[0] <= limit]
        while self.recovery_pending:
            first, event = self.recovery_pending[0]
            if not await self._write_event(event):
                delay = self._recovery_backoff.next_delay()
                self._recovery_retry_at = now + delay
                log.warning("agent_event_write_retrying", node=self.node_name, reason=event.reason,
                            retry_in_seconds=round(delay, 1), waited=round(now - first, 1))
                return
            self.recovery_pending.pop(0)
            log.info("agent_event_written_late", node=self.node_name, reason=event.reason,
                     waited=round(now - first, 1))
        self._recovery_backoff.reset()
        self._recovery_retry_at = 0.0

    async def sync_devices(self) -> None:
        """Write the device-healthy Event of each DRA device whose faults have all ended for the hold.
        Never dropped: one the dedupe window or the rate limit holds back waits for them, a failed write
        is retried with backoff."""
        now = self.clock.monotonic()
        hold = self.config.condition_hold_seconds
        for device in devicehealth.healthy(self.device_faults, now, hold):
            self.healthy_pending[device.dra.resource_id] = devicehealth.healthy_event(device, hold)
            log.info("agent_device_healthy", node=self.node_name, device=device.dra.resource_id,
                     gpu_uuid=device.gpu_uuid, hold_seconds=hold)
        if not self.healthy_pending or now < self._healthy_retry_at:
            return
        for device_id, event in sorted(self.healthy_pending.items()):
            key = self._event_key(event)
            if self._deduped(key, now):
                continue  # the same word was written within the dedupe window: it goes once that passes
            if not self._take_token(now):
                log.warning("agent_event_rate_limited", node=self.node_name, reason=event.reason,
                            device=device_id, will_retry=True)
                return
            if not await self._write_event(event, device_healthy=True):
                delay = self._healthy_backoff.next_delay()
                self._healthy_retry_at = now + delay
                log.warning("agent_device_healthy_write_retrying", node=self.node_name, device=device_id,
                            retry_in_seconds=round(delay, 1))
                return
            self._healthy_backoff.reset()
            self._mark_sent(key, now)
            del self.healthy_pending[device_id]


MAX_PENDING_EVENTS = 100
"""Events asking for recovery kept for a retry at most (the oldest goes first, with an error log)."""


def _action_word(event: model.CollectorEvent) -> str:
    return "cleared" if event.cleared else (event.recommended or model.Action.REPORT).value


NODE_KIND = "Node"


def event_body(event: model.CollectorEvent, *, node: str, reporter: str, when: dt.datetime,
               namespace: str = "kcover-system", device_healthy: bool = False) -> events.EventBody:
    """The core/v1 Event about this Node for one observation, its typed fields in the codec's
    annotations (pure; `device_healthy`: the word that the cleared event's DRA device is healthy again).
    Values the codec cannot carry are left out and logged. The body, its namespace rule and its limits
    are `kcover.kube.events`'."""
    encoded = codec.encode_annotations(event, device_healthy=device_healthy)
    if encoded.dropped:
        log.warning("agent_event_fields_dropped", node=node, reason=event.reason,
                    dropped=[f"{key}: {why}" for key, why in encoded.dropped])
    return events.body(events.About(NODE_KIND, "v1", node), namespace=namespace, reason=event.reason,
                       action=_action_word(event), message=event.message or event.reason,
                       warning=event.severity is not model.Severity.INFO, now=when, controller=reporter,
                       instance=node, annotations=encoded.annotations, generate_name=f"{node}.kcover-",
                       source_host=node)
