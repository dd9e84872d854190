"""Node condition detector (controller): configured NodeConditions in a bad status for long enough.

Owns the decisions "this node's condition says its GPUs are bad" and "they are good again", read
from the cluster cache. A rule names a condition type and its bad status. Defaults, each set by a
component that watches GPUs:
* `KcoverGPUHealthy=False` — kcover's own agent (the type is `agent.condition_type`, handed over as
  `context.agent_condition_type`: the default rule follows it, and so does the codec's reading,
  `kcover.codec.condition_recommendation`, of its bad status as the agent's judgement that the node
  must be cordoned, `recommended=cordon-node`);
* `AcceleratedHardwareReady=False` — the Amazon EKS node monitoring agent (NVIDIA XIDs, DCGM checks);
  it recommends nothing, so the controller's rules decide.
node-problem-detector custom plugins set `<Problem>=True` conditions of the operator's choosing: add a
rule with `bad_status: "True"` for each.
A condition must have been bad for `min_duration_seconds`, counted from its `lastTransitionTime` so a
controller restart does not reset it; it is reported once per bad spell (Error, `fault.check` = the
condition type). When a condition it reported is good again (present, neither bad nor `Unknown`)
and has stayed good for `recovered_hold_seconds`, again counted from `lastTransitionTime`, one
`cleared=True` Info is published, so the policy may un-cordon a node kcover cordoned; while any
configured condition of the node is still bad, nothing is cleared. A controller
that restarted has no memory of what it reported: a node carrying kcover's cordon annotation whose
configured conditions (at least one present) are all good for the hold gets one cleared event too.
Conditions still inside either duration are re-checked every `tick_seconds`. The detector's memory
is its `context.state` so a supervisor restart does not repeat it.

It never writes to the API. Without a cache it raises `DetectorUnavailableError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from typing import ClassVar, NamedTuple

import structlog
from pydantic import BaseModel, ConfigDict, Field

from kcover import bus as bus_
from kcover import codec, model
from kcover.aio import clock as clock_
from kcover.detectors import contract, following
from kcover.kube import projections as proj

log = structlog.get_logger()

BAD = "NodeConditionBad"
RECOVERED = "NodeConditionRecovered"


class ConditionRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str = Field(min_length=1, description="NodeCondition type, e.g. `KcoverGPUHealthy`.")
    bad_status: str = Field("True", pattern="^(True|False|Unknown)$", description="The status that means a fault.")
    min_duration_seconds: float | None = Field(None, ge=0, description="Seconds; overrides the detector's `min_duration_seconds` for this rule.")


EKS_CONDITION_TYPE = "AcceleratedHardwareReady"
"""The condition the Amazon EKS node monitoring agent sets on GPU nodes."""


def default_rules(agent_condition_type: str = codec.AGENT_CONDITION_TYPE) -> list[ConditionRule]:
    """The rules used when `conditions` is not set: the agent's condition and EKS's, each bad when False."""
    return [ConditionRule(type=agent_condition_type, bad_status="False"),
            ConditionRule(type=EKS_CONDITION_TYPE, bad_status="False")]


class NodeConditionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    conditions: list[ConditionRule] = Field(default_factory=default_rules, description="Condition rules. Unset: kcover's agent's condition and `AcceleratedHardwareReady`, each bad when `False`; the agent's rule then follows `agent.condition_type` (`KcoverGPUHealthy` by default). See the module docstring for why each.")
    min_duration_seconds: float = Field(10.0, ge=0, description="Seconds a condition must stay bad before it is reported: rides out a flap without delaying recovery much.")
    recovered_hold_seconds: float = Field(600.0, ge=0, description="Seconds a reported condition must stay good before its end is published (and a node kcover cordoned may be un-cordoned): ten minutes rides out a GPU that recovers and fails again.")
    tick_seconds: float = Field(2.0, gt=0, description="Seconds between checks of conditions waiting out their minimum duration or recovery hold.")


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


def is_good(cond: proj.Condition, rule: ConditionRule) -> bool:
    """A condition is good when present with a definite status that is not its bad one."""
    return cond.status in ("True", "False") and cond.status != rule.bad_status


def held_good(node: proj.Node, rules: list[ConditionRule], types: set[str] | None, *, now: dt.datetime,
              hold: float, good_since: dict[str, dt.datetime]) -> tuple[set[str], bool]:
    """Of the configured conditions of `node` (only `types`, if given), those good for `hold` seconds,
    and whether some good one is still inside the hold (pure). `good_since` gives when a good
    condition without lastTransitionTime was first seen good."""
    by_type = {r.type: r for r in rules}
    out: set[str] = set()
    waiting = False
    for cond in node.conditions:
        rule = by_type.get(cond.type)
        if rule is None or (types is not None and cond.type not in types) or not is_good(cond, rule):
            continue
        since = good_since.get(cond.type, now)
        if cond.last_transition:
            with contextlib.suppress(ValueError):
                since = clock_.parse_time(cond.last_transition)
        if (now - since).total_seconds() >= hold:
            out.add(cond.type)
        else:
            waiting = True
    return out, waiting


class _NodeState:
    __slots__ = ("cleared_cordon", "first_seen", "good_since", "reported")

    def __init__(self) -> None:
        self.reported: set[str] = set()
        self.first_seen: dict[str, dt.datetime] = {}
        self.good_since: dict[str, dt.datetime] = {}
        self.cleared_cordon = False
        """A cleared event was published while kcover's cordon is on the node: not again for it."""


class NodeConditionDetector:
    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = NodeConditionConfig

    def __init__(self, name: str, config: NodeConditionConfig, context: contract.DetectorContext) -> None:
        self.name = name
        self.config = config
        self._context = context
        self.nodes: dict[str, _NodeState] = context.state(name, dict)
        self._waiting: set[str] = set()
        self.rules = (config.conditions if "conditions" in config.model_fields_set
                      else default_rules(context.agent_condition_type))
        """The configured rules, or the defaults for the agent's condition type."""
        self._types = frozenset(r.type for r in self.rules)
        self._bus: bus_.Bus | None = None

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        cluster = contract.cluster_of(self._context, self.name)
        self._bus = bus
        await following.follow(cluster, stop, self._on_change, tick_seconds=self.config.tick_seconds,
                               on_tick=lambda: self._recheck_waiting(cluster))

    def _recheck_waiting(self, cache: contract.ClusterView) -> None:
        """Conditions still inside their minimum duration are looked at again on each tick."""
        for name in list(self._waiting):
            node = cache.node(name)
            if node is None:
                self._waiting.discard(name)
            else:
                self._evaluate(node)

    def _on_change(self, kind: contract.ChangeKind, old: contract.Record | None, new: contract.Record | None) -> None:
        if new is None:
            if isinstance(old, proj.Node):
                self.nodes.pop(old.name, None)
                self._waiting.discard(old.name)
            return
        if not isinstance(new, proj.Node):
            return
        if isinstance(old, proj.Node) and old.conditions == new.conditions \
                and old.cordoned_by_kcover == new.cordoned_by_kcover:
            return
        self._evaluate(new)

    def _evaluate(self, node: proj.Node) -> None:
        state = self.nodes.get(node.name)
        relevant = any(c.type in self._types for c in node.conditions)
        if state is None:
            if not relevant:
                return
            state = self.nodes[node.name] = _NodeState()
        cfg = self.config
        now = self._context.clock.now()
        by_type = {r.type: r for r in self.rules}
        bad_now = {c.type for c in node.conditions if c.type in by_type and c.status == by_type[c.type].bad_status}
        good_now = {c.type for c in node.conditions if c.type in by_type and is_good(c, by_type[c.type])}
        for t in bad_now:
            state.first_seen.setdefault(t, now)
        for t in good_now:
            state.good_since.setdefault(t, now)
        state.first_seen = {t: v for t, v in state.first_seen.items() if t in bad_now}
        state.good_since = {t: v for t, v in state.good_since.items() if t in good_now}
        found, waiting = bad_conditions(node, self.rules, now=now, default_min=cfg.min_duration_seconds,
                                        first_seen=state.first_seen)
        for t, finding in found.items():
            if t not in state.reported:
                state.reported.add(t)
                self._publish(node, finding.condition, bad=True)
        if state.reported and not bad_now:
            # every reported condition must be good for the hold before any end is published: a node
            # with one condition still bad is not well, and a cleared event may un-cordon it
            held, still = held_good(node, self.rules, state.reported, now=now,
                                    hold=cfg.recovered_hold_seconds, good_since=state.good_since)
            waiting = waiting or still
            if held == state.reported:
                for t in sorted(held):
                    self._publish(node, next(c for c in node.conditions if c.type == t), bad=False)
                state.reported.clear()
                state.cleared_cordon = node.cordoned_by_kcover
        if not node.cordoned_by_kcover:
            state.cleared_cordon = False
        elif not state.reported and not bad_now and not state.cleared_cordon and good_now:
            # kcover's cordon with no bad condition on record (a restarted controller): clear it once
            # every configured condition present has been good for the hold.
            present = {c.type for c in node.conditions if c.type in by_type}
            held, still = held_good(node, self.rules, None, now=now, hold=cfg.recovered_hold_seconds,
                                    good_since=state.good_since)
            if present and held == present:
                state.cleared_cordon = True
                self._publish_cordon_cleared(node, sorted(present))
            waiting = waiting or (still and good_now == present)
        if waiting:
            self._waiting.add(node.name)
        else:
            self._waiting.discard(node.name)
        if not state.reported and not state.first_seen and not state.cleared_cordon \
                and not (node.cordoned_by_kcover and waiting):
            del self.nodes[node.name]

    def _publish(self, node: proj.Node, cond: proj.Condition, *, bad: bool) -> None:
        reason = BAD if bad else RECOVERED
        word = "reports a fault" if bad else f"recovered {self.config.recovered_hold_seconds:g}s ago or more"
        recommended = codec.condition_recommendation(cond.type, cond.status,
                                                     agent_condition_type=self._context.agent_condition_type)
        self._send(node, model.CollectorEvent(
            detector=self.name, severity=model.Severity.ERROR if bad else model.Severity.INFO, reason=reason,
            target=model.Target(kind=model.TargetKind.NODE, name=node.name, node=node.name),
            message=f"condition {cond.type}={cond.status or 'absent'} {word}" + (f": {cond.message}" if cond.message else ""),
            dedupe_key=f"{self.name}/{reason}/{node.name}/{cond.type}/{cond.last_transition}",
            fault=model.Fault(check=cond.type), recommended=recommended if bad else None, cleared=not bad,
            attributes={"status": cond.status, "condition_reason": cond.reason,
                        "condition_message": cond.message, "since": cond.last_transition},
            observed_at=self._context.clock.now()))
        log.info("node_condition_changed", node=node.name, condition=cond.type, status=cond.status, emitted=reason)

    def _publish_cordon_cleared(self, node: proj.Node, types: list[str]) -> None:
        self._send(node, model.CollectorEvent(
            detector=self.name, severity=model.Severity.INFO, reason=RECOVERED, cleared=True,
            target=model.Target(kind=model.TargetKind.NODE, name=node.name, node=node.name),
            message=f"conditions {', '.join(types)} good for {self.config.recovered_hold_seconds:g}s or more on a "
                    "node kcover cordoned",
            dedupe_key=f"{self.name}/{RECOVERED}/{node.name}/cordon",
            fault=model.Fault(check=",".join(types)[:128]), observed_at=self._context.clock.now()))
        log.info("node_condition_cordon_cleared", node=node.name, conditions=types)

    def _send(self, node: proj.Node, event: model.CollectorEvent) -> None:
        assert self._bus is not None
        try:
            self._bus.publish_nowait(event)
        except bus_.BusClosedError:
            log.debug("bus_closed_event_dropped", detector=self.name, node=node.name)
