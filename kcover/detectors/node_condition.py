"""Node condition detector (controller): configured NodeConditions in a bad status for long enough.

Owns the decision "this node's condition says its GPUs are bad", read from the cluster cache. A rule
names a condition type and its bad status. Defaults, each set by a component that watches GPUs:
* `KcoverGPUHealthy=False` — kcover's own agent;
* `AcceleratedHardwareReady=False` — the Amazon EKS node monitoring agent (NVIDIA XIDs, DCGM checks).
node-problem-detector custom plugins set `<Problem>=True` conditions of the operator's choosing: add a
rule with `bad_status: "True"` for each.
A condition must have been bad for `min_duration_seconds`, counted from its `lastTransitionTime` so a
controller restart does not reset it; it is reported once per bad spell (Error), and its end is an
Info. The reported set lives in `context.extras["detector_state"][name]` so a supervisor restart
does not repeat it.

It never writes to the API. Without a cache it raises `DetectorUnavailableError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from typing import Any, ClassVar, NamedTuple

import structlog
from pydantic import BaseModel, ConfigDict, Field

from kcover import bus as bus_
from kcover import model
from kcover.aio import clock as clock_
from kcover.detectors import contract, following
from kcover.kube import caching
from kcover.kube import projections as proj

log = structlog.get_logger()

BAD = "NodeConditionBad"
RECOVERED = "NodeConditionRecovered"


class ConditionRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str = Field(min_length=1, description="NodeCondition type, e.g. `KcoverGPUHealthy`.")
    bad_status: str = Field("True", pattern="^(True|False|Unknown)$", description="The status that means a fault.")
    min_duration_seconds: float | None = Field(None, ge=0, description="Seconds; overrides the detector's `min_duration_seconds` for this rule.")


def _default_rules() -> list[ConditionRule]:
    return [ConditionRule(type="KcoverGPUHealthy", bad_status="False"),
            ConditionRule(type="AcceleratedHardwareReady", bad_status="False")]


class NodeConditionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    conditions: list[ConditionRule] = Field(default_factory=_default_rules, description="Condition rules; see the module docstring for why each default.")
    min_duration_seconds: float = Field(10.0, ge=0, description="Seconds a condition must stay bad before it is reported: rides out a flap without delaying recovery much.")
    tick_seconds: float = Field(2.0, gt=0, description="Seconds between checks of conditions waiting out their minimum duration.")


class Finding(NamedTuple):
    condition: proj.Condition
    rule: ConditionRule


def bad_conditions(node: proj.Node, rules: list[ConditionRule], *, now: dt.datetime, default_min: float,
                   first_seen: dict[str, dt.datetime]) -> tuple[dict[str, Finding], bool]:
    """Conditions of `node` that are bad long enough, and whether some bad one is still waiting (pure).
    `first_seen` gives when a bad condition without lastTransitionTime was first observed."""
    by_type = {r.type: r for r in rules}
    out: dict[str, Finding] = {}
    waiting = False
    for cond in node.conditions:
        rule = by_type.get(cond.type)
        if rule is None or cond.status != rule.bad_status:
            continue
        since = first_seen.get(cond.type, now)
        if cond.last_transition:
            with contextlib.suppress(ValueError):
                since = clock_.parse_time(cond.last_transition)
        needed = rule.min_duration_seconds if rule.min_duration_seconds is not None else default_min
        if (now - since).total_seconds() >= needed:
            out[cond.type] = Finding(cond, rule)
        else:
            waiting = True
    return out, waiting


class _NodeState:
    __slots__ = ("first_seen", "reported")

    def __init__(self) -> None:
        self.reported: set[str] = set()
        self.first_seen: dict[str, dt.datetime] = {}


class NodeConditionDetector:
    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = NodeConditionConfig

    def __init__(self, name: str, config: BaseModel, context: contract.DetectorContext) -> None:
        assert isinstance(config, NodeConditionConfig)
        self.name = name
        self.config = config
        self._context = context
        nodes = following.kept_state(context, name, dict, dict)
        self.nodes: dict[str, _NodeState] = nodes
        self._waiting: set[str] = set()
        self._types = frozenset(r.type for r in config.conditions)
        self._bus: bus_.Bus | None = None

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        cache = following.cache_of(self._context, self.name)
        self._bus = bus
        await following.follow(cache, stop, self._on_change, tick_seconds=self.config.tick_seconds,
                               on_tick=lambda: self._recheck_waiting(cache))

    def _recheck_waiting(self, cache: caching.ClusterCache) -> None:
        """Conditions still inside their minimum duration are looked at again on each tick."""
        for name in list(self._waiting):
            node = cache.node(name)
            if node is None:
                self._waiting.discard(name)
            else:
                self._evaluate(node)

    def _on_change(self, kind: caching.Kind, old: Any, new: Any) -> None:
        if kind is not caching.Kind.NODE:
            return
        if new is None:
            self.nodes.pop(old.name, None)
            self._waiting.discard(old.name)
            return
        if old is not None and old.conditions == new.conditions:
            return
        self._evaluate(new)

    def _evaluate(self, node: proj.Node) -> None:
        state = self.nodes.get(node.name)
        relevant = any(c.type in self._types for c in node.conditions)
        if state is None:
            if not relevant:
                return
            state = self.nodes[node.name] = _NodeState()
        now = self._context.clock.now()
        bad_now = {c.type for r in self.config.conditions for c in node.conditions
                   if c.type == r.type and c.status == r.bad_status}
        for t in bad_now:
            state.first_seen.setdefault(t, now)
        for t in list(state.first_seen):
            if t not in bad_now:
                del state.first_seen[t]
        found, waiting = bad_conditions(node, self.config.conditions, now=now,
                                        default_min=self.config.min_duration_seconds, first_seen=state.first_seen)
        if waiting:
            self._waiting.add(node.name)
        else:
            self._waiting.discard(node.name)
        for t, finding in found.items():
            if t not in state.reported:
                state.reported.add(t)
                self._publish(node, finding.condition, bad=True)
        for t in list(state.reported):
            if t not in bad_now:
                state.reported.discard(t)
                cond = next((c for c in node.conditions if c.type == t), proj.Condition(t, "", "", "", ""))
                self._publish(node, cond, bad=False)
        if not state.reported and not state.first_seen:
            del self.nodes[node.name]

    def _publish(self, node: proj.Node, cond: proj.Condition, *, bad: bool) -> None:
        reason = BAD if bad else RECOVERED
        word = "reports a fault" if bad else "recovered"
        event = model.CollectorEvent(
            detector=self.name, severity=model.Severity.ERROR if bad else model.Severity.INFO, reason=reason,
            target=model.Target(kind=model.TargetKind.NODE, name=node.name, node=node.name),
            message=f"condition {cond.type}={cond.status or 'absent'} {word}" + (f": {cond.message}" if cond.message else ""),
            dedupe_key=f"{self.name}/{reason}/{node.name}/{cond.type}/{cond.last_transition}",
            attributes={"condition": cond.type, "status": cond.status, "condition_reason": cond.reason,
                        "condition_message": cond.message, "since": cond.last_transition})
        log.info("node_condition_changed", node=node.name, condition=cond.type, status=cond.status, emitted=reason)
        assert self._bus is not None
        try:
            self._bus.publish_nowait(event)
        except bus_.BusClosedError:
            log.debug("bus_closed_event_dropped", detector=self.name)
