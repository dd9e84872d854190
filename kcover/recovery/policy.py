"""The recovery policy: `plan(event, snapshot, history, settings, now) -> list[Action]`. Pure.

Owns which fault leads to which action (rules by detector, reason glob, severity and target kind,
with built-in defaults), and every refusal: namespace allow/deny, opt-in, the workload's restart
policy, per-workload cooldown and restart budget, per-node cooldown, and the circuit breaker
(fraction of GPU nodes cordoned by kcover, restarts in flight). A fault on a DRA device (`fault.dra`)
is answered at device level (`isolate_device`: taint that device, restart its holders, leave the node
schedulable), with the node-level answer carried as the fallback; its end removes kcover's rule for
the device and nothing else (a node kcover cordoned is not un-cordoned on a device's word). It reads the cluster only through
`ClusterSnapshot` and the ledger only through `History`; it does no I/O and never raises on odd
events (unknown targets become `Skip`s). Invalid rules raise `errors.ConfigError` from `parse_rules`.

Audit: refusals a person needs to see (budget, breaker, restart policy, unsupported owner) carry
`audit=True` and become Events; routine ones (cooldown, not opted in, namespace denied, already
cordoned) are logged and counted only, so a 1,000-pod job failing at once writes one Event, not 1,000.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kcover import errors, model, settings
from kcover.kube import ownership
from kcover.kube import projections as proj
from kcover.recovery import actions, adapters

AK = actions.ActionKind
SC = actions.SkipCode


class ClusterSnapshot(Protocol):
    """What the policy and executors read from the controller's cache (`caching.ClusterCache`, by index)."""

    def pod(self, uid: str) -> proj.Pod | None: ...

    def pod_by_name(self, namespace: str, name: str) -> proj.Pod | None: ...

    def pods_of_workload(self, uid: str) -> Sequence[proj.Pod]:
        """Every pod belonging to the workload, through its owner chain (JobSet -> Job -> Pod, ...)."""
        ...

    def pods_on_node(self, name: str) -> Sequence[proj.Pod]: ...

    def pods_with_label(self, namespace: str, key: str, value: str) -> Sequence[proj.Pod]: ...

    def node(self, name: str) -> proj.Node | None: ...

    def workload(self, uid: str) -> proj.Workload | None: ...

    def workload_by_name(self, group: str, kind: str, namespace: str, name: str) -> proj.Workload | None: ...

    def gpu_node_count(self) -> int:
        """Nodes that are GPU nodes by the one rule (`kube.gpus`): the breaker's denominator."""
        ...

    def cordoned_by_kcover(self) -> Sequence[str]:
        """Names of nodes carrying kcover's cordon annotation."""
        ...


@dataclass(frozen=True)
class History:
    """What the ledger remembers (epoch seconds), plus restarts the engine has in flight now."""

    restarts: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """Ledger key (`w.<uid>` or `w.<uid>.g<group>`) -> times of its recorded restarts, oldest first."""
    cordons: Mapping[str, float] = field(default_factory=dict)
    """Node name -> time kcover last cordoned it."""
    in_flight_restarts: int = 0


@dataclass(frozen=True)
class Rule:
    action: actions.ActionKind
    detector: str = "*"
    reason: str = "*"
    severity: model.Severity | None = None
    target: model.TargetKind | None = None

    def matches(self, event: model.CollectorEvent) -> bool:
        return (fnmatch.fnmatchcase(event.detector, self.detector)
                and fnmatch.fnmatchcase(event.reason, self.reason)
                and (self.severity is None or self.severity is event.severity)
                and (self.target is None or self.target is event.target.kind))


_E = model.Severity.ERROR
DEFAULT_RULES: tuple[Rule, ...] = (
    Rule(AK.RESTART_WORKLOAD, detector="pod-status", severity=_E),
    Rule(AK.RESTART_WORKLOAD, detector="dra-health", severity=_E),
    Rule(AK.RESTART_WORKLOAD, detector="event-watcher", severity=_E, target=model.TargetKind.POD),
    Rule(AK.RESTART_WORKLOAD, detector="event-watcher", severity=_E, target=model.TargetKind.WORKLOAD),
    Rule(AK.CORDON_NODE_AND_RESTART, detector="event-watcher", severity=_E, target=model.TargetKind.NODE),
    Rule(AK.CORDON_NODE_AND_RESTART, detector="event-watcher", severity=_E, target=model.TargetKind.DEVICE),
    Rule(AK.CORDON_NODE_AND_RESTART, detector="node-condition", severity=_E),
    Rule(AK.REPORT, severity=_E),
)
"""Built-in rules, checked after `recovery.rules`. Anything unmatched (warnings, info) is ignored."""

_RANK: dict[actions.ActionKind, frozenset[actions.ActionKind]] = {
    AK.IGNORE: frozenset({AK.IGNORE}),
    AK.REPORT: frozenset({AK.IGNORE, AK.REPORT}),
    AK.RESTART_WORKLOAD: frozenset({AK.IGNORE, AK.REPORT, AK.RESTART_WORKLOAD}),
    AK.CORDON_NODE: frozenset({AK.IGNORE, AK.REPORT, AK.CORDON_NODE}),
    AK.CORDON_NODE_AND_RESTART: frozenset(AK),
}
"""Which actions each action covers: with `node_judgement: ceiling` a recommendation is honoured when
the rule's action covers it, e.g. a node rule allowing cordon-node-and-restart accepts a recommended
restart-workload (an application XID) or cordon-node."""


def parse_rules(raw: Sequence[Mapping[str, Any]]) -> tuple[Rule, ...]:
    """Validate `recovery.rules` entries: {detector, reason (glob), severity, target, action}."""
    out: list[Rule] = []
    problems: list[str] = []
    for i, entry in enumerate(raw):
        unknown = set(entry) - {"detector", "reason", "severity", "target", "action"}
        if unknown:
            problems.append(f"recovery.rules[{i}]: unknown keys {sorted(unknown)}")
            continue
        try:
            out.append(Rule(
                action=actions.ActionKind(entry["action"]),
                detector=str(entry.get("detector", "*")),
                reason=str(entry.get("reason", "*")),
                severity=model.Severity(entry["severity"]) if entry.get("severity") else None,
                target=model.TargetKind(entry["target"]) if entry.get("target") else None))
        except (KeyError, ValueError) as exc:
            problems.append(f"recovery.rules[{i}]: {type(exc).__name__}: {exc}")
    if problems:
        raise errors.ConfigError("invalid recovery rules", problems)
    return tuple(out)


def decide(event: model.CollectorEvent, rules: Sequence[Rule],
           judgement: settings.NodeJudgement = settings.NodeJudgement.CEILING) -> actions.ActionKind:
    """The action for an event: the first matching rule (configured, then built-in) combined with the
    source's recommendation as `judgement` says."""
    chosen = AK.IGNORE
    for rule in (*rules, *DEFAULT_RULES):
        if rule.matches(event):
            chosen = rule.action
            break
    wanted = event.recommended
    if wanted is None or judgement is settings.NodeJudgement.RULES:
        return chosen
    if judgement is settings.NodeJudgement.SOURCE:
        return wanted
    return wanted if wanted in _RANK[chosen] else chosen


# ------------------------------------------------------------------------------------------ helpers

def _epoch(moment: dt.datetime) -> float:
    return moment.timestamp()


def _pod_ref(pod: proj.Pod) -> actions.ObjectRef:
    return actions.ObjectRef("Pod", "v1", pod.name, pod.namespace, pod.uid)


def node_ref(name: str, uid: str = "") -> actions.ObjectRef:
    return actions.ObjectRef("Node", "v1", name, "", uid)


def _target_ref(target: model.Target) -> actions.ObjectRef | None:
    if target.kind is model.TargetKind.POD:
        return actions.ObjectRef("Pod", "v1", target.name, target.namespace, target.uid)
    if target.kind in (model.TargetKind.NODE, model.TargetKind.DEVICE):
        return node_ref(target.node or target.name)
    return None


def namespace_allowed(namespace: str, rs: settings.RecoverySettings) -> bool:
    if namespace in rs.namespaces_deny:
        return False
    return not rs.namespaces_allow or namespace in rs.namespaces_allow


def restart_refusal(key: str, history: History, rs: settings.RecoverySettings, now: float,
                    *, what: str = "this workload") -> tuple[actions.SkipCode, str, bool] | None:
    """Cooldown, budget and concurrency check for one restart unit: (code, text, audit) or None."""
    times = [t for t in history.restarts.get(key, ()) if t > now - rs.restart_window_seconds]
    if times and now - times[-1] < rs.workload_cooldown_seconds:
        ago = now - times[-1]
        return (SC.COOLDOWN, f"{what} was restarted {ago:.0f}s ago; cooldown is "
                f"{rs.workload_cooldown_seconds:.0f}s", False)
    if len(times) >= rs.max_restarts_per_window:
        until = dt.datetime.fromtimestamp(times[0] + rs.restart_window_seconds, dt.UTC)
        return (SC.BUDGET_EXHAUSTED, f"restart budget exhausted: {what} was restarted {len(times)} times in "
                f"the last {rs.restart_window_seconds:.0f}s (max {rs.max_restarts_per_window}); kcover "
                f"will not restart it again before {until:%Y-%m-%dT%H:%M:%SZ}", True)
    if history.in_flight_restarts >= rs.max_concurrent_restarts:
        return (SC.BREAKER_OPEN, f"breaker open: {history.in_flight_restarts} restarts already in flight "
                f"(max {rs.max_concurrent_restarts})", True)
    return None


@dataclass
class _Planner:
    event: model.CollectorEvent
    snapshot: ClusterSnapshot
    history: History
    rs: settings.RecoverySettings
    now: float
    planned_keys: set[str] = field(default_factory=set)

    def skip(self, code: actions.SkipCode, text: str, about: actions.ObjectRef | None, *,
             audit: bool = True) -> actions.Skip:
        return actions.Skip(code, text, self.event, about=about, audit=audit)

    def restart_for_pod(self, pod: proj.Pod, *, sweep: bool = False) -> list[actions.Action]:
        """Restart the unit `pod` belongs to. In a node sweep, pods kcover may not touch are passed over."""
        about = _pod_ref(pod)
        if not namespace_allowed(pod.namespace, self.rs):
            return [] if sweep else [self.skip(SC.NAMESPACE_DENIED, f"namespace {pod.namespace} is not "
                                               "acted on (recovery.namespaces_allow/deny)", about, audit=False)]
        resolved = adapters.resolve(self.snapshot, pod)
        if isinstance(resolved, adapters.Refused):
            if sweep:
                return []
            # Audited only when the pod itself opted in: a crashing Deployment pod is not kcover's business.
            return [self.skip(resolved.code, resolved.text, about, audit=ownership.labelled(pod.labels))]
        if not ownership.opted_in(pod, resolved):
            return [] if sweep else [self.skip(SC.NOT_OPTED_IN, f"neither Pod {pod.namespace}/{pod.name} nor "
                                               f"its {resolved.workload.kind} carries "
                                               f"{proj.OPT_IN_LABEL}=true", about, audit=False)]
        w = resolved.workload
        wref = adapters.workload_ref(w)
        unit = adapters.restart_unit(resolved, pod)
        if unit.ledger_key in self.planned_keys:
            return []
        self.planned_keys.add(unit.ledger_key)
        what = wref.describe() + (f" {unit.description}" if unit.description else "")
        forbidden = adapters.restart_forbidden(w)
        if forbidden:
            return [self.skip(SC.RESTART_POLICY, f"{what} is not restarted: {forbidden}", wref)]
        pending = History(self.history.restarts, self.history.cordons,
                          self.history.in_flight_restarts + len(self.planned_keys) - 1)
        refusal = restart_refusal(unit.ledger_key, pending, self.rs, self.now, what=what)
        if refusal is not None:
            code, text, audit = refusal
            return [self.skip(code, text, wref, audit=audit)]
        selector = adapters.safe_selector(self.snapshot, unit.selector, w.namespace, w.uid)
        return [actions.RestartWorkload(workload=wref, selector=selector, ledger_key=unit.ledger_key,
                                        pod=actions.PodRef(pod.namespace, pod.name, pod.uid),
                                        cause=self.event, unit=unit.description)]

    def restart_workload(self, uid: str) -> list[actions.Action]:
        pods = [p for p in self.snapshot.pods_of_workload(uid) if not p.deleting]
        if not pods:
            w = self.snapshot.workload(uid)
            about = adapters.workload_ref(w) if w else None
            return [self.skip(SC.TARGET_UNKNOWN, f"workload {uid} has no pods in the cache", about)]
        return self.restart_for_pod(pods[0])

    def restarts_on_device(self, node: str, pods: Sequence[str]) -> list[actions.Action]:
        """Restart what holds the faulting device: the named pods' workloads, if they still run on `node`."""
        out: list[actions.Action] = []
        for key in sorted(set(pods)):
            namespace, _, name = key.partition("/")
            pod = self.snapshot.pod_by_name(namespace, name)
            if pod is not None and pod.node == node and not pod.deleting:
                out += self.restart_for_pod(pod, sweep=True)
        return out

    def restarts_using_device(self, node: str, resource_id: str) -> list[actions.Action]:
        """Restart the workloads whose pods on `node` report the DRA device `resource_id` in their
        `allocatedResourcesStatus` (the kubelet's view of who holds it)."""
        out: list[actions.Action] = []
        for pod in sorted(self.snapshot.pods_on_node(node), key=lambda p: (p.namespace, p.name)):
            if not pod.deleting and any(r.resource_id == resource_id for c in pod.containers for r in c.resources):
                out += self.restart_for_pod(pod, sweep=True)
        return out

    def isolate_device(self, dra: model.DraDevice, node: str, kind: actions.ActionKind,
                       pod: proj.Pod | None) -> list[actions.Action]:
        """Device-level isolation under DRA: taint the device (not the node) and restart what holds it.

        What the node-level answer would have been (a cordon, and for cordon-node-and-restart the
        restarts on the node) rides along as the taint's `fallback`, for API servers without
        DeviceTaintRules. A restart-workload for a fault that names an XID (an application error on
        the device) restarts the holders and taints nothing."""
        restart = kind in (AK.RESTART_WORKLOAD, AK.CORDON_NODE_AND_RESTART)
        holders: list[actions.Action] = []
        if restart:
            if pod is not None:
                holders = self.restart_for_pod(pod)
            elif self.event.fault.pods:
                holders = self.restarts_on_device(node, self.event.fault.pods)
            else:
                holders = self.restarts_using_device(node, dra.resource_id)
        if kind is AK.RESTART_WORKLOAD and self.event.fault.xid is not None:
            return holders or [self.skip(SC.NO_WORKLOADS, f"no opted-in workload holds device {dra.resource_id} "
                                         f"on Node {node}", node_ref(node), audit=False)]
        fallback: list[actions.Action] = []
        if kind is not AK.RESTART_WORKLOAD:
            fallback = self.cordon(node)
            if kind is AK.CORDON_NODE_AND_RESTART:
                fallback += self.restarts_on_node(node)
        reason = f"{self.event.reason}: {self.event.message}" if self.event.message else self.event.reason
        taint = actions.TaintDevice(device=dra, node=node, reason=reason, cause=self.event,
                                    fallback=tuple(a for a in fallback
                                                   if isinstance(a, actions.CordonNode | actions.RestartWorkload
                                                                 | actions.Skip)))
        return [taint, *holders]

    def restarts_on_node(self, node: str) -> list[actions.Action]:
        out: list[actions.Action] = []
        for pod in sorted(self.snapshot.pods_on_node(node), key=lambda p: (p.namespace, p.name)):
            if not pod.deleting:
                out += self.restart_for_pod(pod, sweep=True)
        return out

    def cordon(self, name: str) -> list[actions.Action]:
        node = self.snapshot.node(name)
        if node is None:
            return [self.skip(SC.TARGET_UNKNOWN, f"Node {name} is not in the cache", node_ref(name))]
        about = node_ref(name, node.uid)
        if node.cordoned_by_kcover:
            return [self.skip(SC.ALREADY_CORDONED, f"Node {name} is already cordoned by kcover", about,
                              audit=False)]
        if node.unschedulable:
            return [self.skip(SC.CORDONED_BY_OTHERS, f"Node {name} is already unschedulable (not by kcover); "
                              "kcover leaves it alone", about, audit=False)]
        last = self.history.cordons.get(name)
        if last is not None and self.now - last < self.rs.node_cooldown_seconds:
            return [self.skip(SC.COOLDOWN, f"Node {name} was cordoned {self.now - last:.0f}s ago; cooldown is "
                              f"{self.rs.node_cooldown_seconds:.0f}s", about, audit=False)]
        gpu = self.snapshot.gpu_node_count()
        cordoned = len(self.snapshot.cordoned_by_kcover())
        if gpu <= 0 or cordoned / gpu >= self.rs.max_cordoned_fraction:
            return [self.skip(SC.BREAKER_OPEN, f"breaker open: kcover holds {cordoned} of {gpu} GPU nodes "
                              f"cordoned (max fraction {self.rs.max_cordoned_fraction:g}); Node {name} is "
                              "not cordoned", about)]
        reason = f"{self.event.reason}: {self.event.message}" if self.event.message else self.event.reason
        return [actions.CordonNode(node=name, reason=reason, cause=self.event)]

    def uncordon(self, name: str) -> list[actions.Action]:
        """Return a node to service: only one kcover cordoned itself (an admin's cordon is never undone).
        The source says when the fault has stayed cleared long enough (the node-condition detector's
        `recovered_hold_seconds`), so a cleared event is acted on when it arrives."""
        node = self.snapshot.node(name)
        if node is None or not node.cordoned_by_kcover:
            return []
        return [actions.UncordonNode(node=name, cause=self.event)]


def cordon_for(event: model.CollectorEvent, snapshot: ClusterSnapshot, history: History,
               rs: settings.RecoverySettings, now: dt.datetime, node: str) -> list[actions.Action]:
    """Cordon `node` for `event` with every check `plan` makes (an admin's cordon, cooldown, breaker):
    the escalation ladder's "cordon that node and restart elsewhere"."""
    return _Planner(event, snapshot, history, rs, _epoch(now)).cordon(node)


def plan(event: model.CollectorEvent, snapshot: ClusterSnapshot, history: History,
         rs: settings.RecoverySettings, now: dt.datetime, *,
         rules: Sequence[Rule] | None = None) -> list[actions.Action]:
    """Actions answering one event. `rules` defaults to `parse_rules(rs.rules)`."""
    p = _Planner(event, snapshot, history, rs, _epoch(now))
    target = event.target
    node_name = target.node or (target.name if target.kind is model.TargetKind.NODE else "")
    dra = event.fault.dra if rs.device_taints.enabled else None
    if event.cleared:
        out: list[actions.Action] = []
        if event.fault.dra is not None:
            # the device is healthy again: kcover's own rule goes (the executor checks it is); a device's
            # health says nothing of its node, so a node kcover cordoned stays cordoned
            return [actions.UntaintDevice(device=dra, node=node_name, cause=event)] if dra is not None else []
        if rs.uncordon_enabled and node_name and target.kind in (model.TargetKind.NODE, model.TargetKind.DEVICE):
            out += p.uncordon(node_name)
        return out
    kind = decide(event, parse_rules(rs.rules) if rules is None else rules, rs.node_judgement)
    if kind is AK.IGNORE:
        return []
    if kind is AK.REPORT:
        about = _target_ref(target)
        if about is None and target.kind is model.TargetKind.WORKLOAD and target.uid:
            workload = snapshot.workload(target.uid)
            about = adapters.workload_ref(workload) if workload is not None else None
        return [actions.RecordOnly(f"{event.reason}: {event.message}" if event.message else event.reason,
                                   event, about=about)]
    pod: proj.Pod | None = None
    if target.kind is model.TargetKind.POD:
        pod = snapshot.pod(target.uid) if target.uid else None
        if pod is None:
            return [p.skip(SC.TARGET_UNKNOWN, f"{target.describe()} (uid {target.uid or 'unset'}) is not in "
                           "the cache", _target_ref(target), audit=False)]
        node_name = node_name or pod.node
    if dra is not None and node_name:
        return p.isolate_device(dra, node_name, kind, pod)
    if kind is AK.RESTART_WORKLOAD:
        if pod is not None:
            return p.restart_for_pod(pod)
        if target.kind is model.TargetKind.WORKLOAD:
            return p.restart_workload(target.uid)
        if node_name:
            if event.fault.pods:  # the node knows which pods hold the faulting device: only those
                found = p.restarts_on_device(node_name, event.fault.pods)
                where = f"{event.fault.describe() or 'the faulting device'} on Node {node_name}"
            else:
                found = p.restarts_on_node(node_name)
                where = f"Node {node_name}"
            return found or [p.skip(SC.NO_WORKLOADS, f"no opted-in workload has pods on {where}",
                                    node_ref(node_name), audit=False)]
        return [p.skip(SC.TARGET_UNKNOWN, f"{target.describe()} names nothing kcover can restart", None,
                       audit=False)]
    if not node_name:
        return [p.skip(SC.TARGET_UNKNOWN, f"{target.describe()} names no node to cordon", None, audit=False)]
    out = p.cordon(node_name)
    if kind is AK.CORDON_NODE_AND_RESTART:
        out += p.restarts_on_node(node_name)
    return out
