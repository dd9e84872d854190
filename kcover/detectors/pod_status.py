"""Pod status detector (controller): containers that terminated with a configured reason or exit code.

Owns the decision "this container instance failed" for opted-in pods, read from the cluster cache:
`state.terminated` and `lastState.terminated` (after an in-place restart), init containers too. One
event per (pod uid, container, termination ordinal) — the ordinal is `restartCount` for the current
state and `restartCount - 1` for the last state, so the same termination seen in both is reported once,
and never again on resync, re-list or detector restart (the bounded seen-set is the detector's
`context.state`, which outlives restarts by the supervisor).
The event names the container in `fault.container`; its `dedupe_key` names the termination, so a
consumer (the logscan plugin) tells terminations apart without reading `attributes`.

It skips pods being deleted (`deletionTimestamp` set: a restart kcover or anyone else started) and
terminations older than `max_age_seconds` (history a new controller should not replay). It never
writes to the API. Without a cache it raises `DetectorUnavailableError`.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
from typing import Any, ClassVar, NamedTuple

import structlog
from pydantic import BaseModel, ConfigDict, Field

from kcover import bus as bus_
from kcover import model
from kcover.aio import clock as clock_
from kcover.detectors import contract, following
from kcover.kube import projections as proj

log = structlog.get_logger()


class PodStatusConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reasons: list[str] = Field(default_factory=lambda: ["Error"],
                               description="Termination reasons reported (with a non-zero exit code). `Error` is what the kubelet writes for a non-zero exit.")
    oom_killed: bool = Field(False, description="Also report reason `OOMKilled`: off by default, since a too-small memory limit is not a hardware fault.")
    exit_codes: list[int] = Field(default_factory=list, description="Non-zero exit codes reported whatever the reason; empty means none beyond `reasons`.")
    ignore_exit_codes: list[int] = Field(default_factory=list, description="Exit codes never reported (for example a job's own 'retry me' code).")
    init_containers: bool = Field(True, description="Also watch init containers.")
    opt_in_only: bool = Field(True, description="Only pods opted in with `kcover.io/cascading-recovery=true` on the pod, its workload or its Namespace.")
    max_age_seconds: float = Field(600.0, gt=0, description="Seconds: terminations that finished longer ago are history, not faults (a restarted controller must not replay them).")
    seen_capacity: int = Field(200_000, ge=1, description="Terminations remembered to avoid repeats: more than one per pod at 150,000 pods.")


class Failure(NamedTuple):
    container: str
    init: bool
    reason: str
    exit_code: int
    restart_count: int
    ordinal: int
    """Which instance of the container ended: restartCount for `state`, restartCount - 1 for `lastState`."""
    finished_at: str


def matches(term: proj.Terminated, config: PodStatusConfig) -> bool:
    if term.exit_code == 0 or term.exit_code in config.ignore_exit_codes:
        return False
    if term.reason in config.reasons or term.exit_code in config.exit_codes:
        return True
    return config.oom_killed and term.reason == "OOMKilled"


def _age(finished_at: str, now: dt.datetime) -> float:
    if not finished_at:
        return 0.0
    try:
        return (now - clock_.parse_time(finished_at)).total_seconds()
    except ValueError:
        return 0.0


def failures(pod: proj.Pod, config: PodStatusConfig, now: dt.datetime) -> list[Failure]:
    """The failed container instances of `pod` worth reporting (pure)."""
    if pod.deletion_timestamp:
        return []
    out = []
    for c in pod.containers:
        if c.init and not config.init_containers:
            continue
        for term, ordinal in ((c.terminated, c.restart_count), (c.last_terminated, c.restart_count - 1)):
            if term is None or not matches(term, config) or _age(term.finished_at, now) > config.max_age_seconds:
                continue
            out.append(Failure(c.name, c.init, term.reason, term.exit_code, c.restart_count, max(ordinal, 0),
                               term.finished_at))
    return out


class SeenSet:
    """A bounded set with least-recently-added eviction."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: collections.OrderedDict[tuple[str, ...], None] = collections.OrderedDict()

    def __contains__(self, key: tuple[str, ...]) -> bool:
        return key in self._items

    def add(self, key: tuple[str, ...]) -> bool:
        """Add `key`; False if it was there already."""
        if key in self._items:
            return False
        self._items[key] = None
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)
        return True

    def __len__(self) -> int:
        return len(self._items)


class PodStatusDetector:
    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = PodStatusConfig

    def __init__(self, name: str, config: PodStatusConfig, context: contract.DetectorContext) -> None:
        self.name = name
        self.config = config
        self._context = context
        self.seen = context.state(name, lambda: SeenSet(config.seen_capacity))
        self.seen.capacity = config.seen_capacity
        self._bus: bus_.Bus | None = None

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        cluster = contract.cluster_of(self._context, self.name)
        self._bus = bus
        await following.follow(cluster, stop, self._on_change)

    def _on_change(self, kind: contract.ChangeKind, old: contract.Record | None, new: contract.Record | None) -> None:
        cache = self._context.cluster
        if not isinstance(new, proj.Pod) or cache is None:
            return
        found = failures(new, self.config, self._context.clock.now())
        if not found:
            return
        opted = None
        for f in found:
            key = (new.uid, f.container, str(f.ordinal))
            if key in self.seen:
                continue
            if opted is None:
                opted = not self.config.opt_in_only or cache.opted_in(new)
            if not opted:
                return
            self.seen.add(key)
            self._publish(cache, new, f)

    def _publish(self, cache: contract.ClusterView, pod: proj.Pod, f: Failure) -> None:
        reason = "ContainerOOMKilled" if f.reason == "OOMKilled" else "ContainerError"
        kind_word = "init container" if f.init else "container"
        attributes: dict[str, Any] = {"init_container": f.init, "exit_code": f.exit_code,
                                      "termination_reason": f.reason, "restart_count": f.restart_count,
                                      "finished_at": f.finished_at}
        workload = cache.workload_ref(pod)
        if workload is not None:
            attributes["workload"] = dict(workload)
        event = model.CollectorEvent(
            detector=self.name, severity=model.Severity.ERROR, reason=reason,
            target=model.Target(kind=model.TargetKind.POD, namespace=pod.namespace, name=pod.name, uid=pod.uid,
                                node=pod.node),
            message=f"{kind_word} {f.container} terminated: {f.reason or 'no reason'}, exit code {f.exit_code}",
            dedupe_key=f"{self.name}/{pod.uid}/{f.container}/{f.ordinal}", fault=model.Fault(container=f.container),
            attributes=attributes, observed_at=self._context.clock.now())
        log.info("container_failure_detected", pod=f"{pod.namespace}/{pod.name}", container=f.container,
                 exit_code=f.exit_code, termination_reason=f.reason, restart_count=f.restart_count, cause=event.id)
        assert self._bus is not None
        try:
            self._bus.publish_nowait(event)
        except bus_.BusClosedError:
            log.debug("bus_closed_event_dropped", detector=self.name)
