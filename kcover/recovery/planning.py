"""The plan: `plan(event, snapshot, history, settings, now) -> list[Step]`. Pure and total.

Owns what kcover does about one fault, every step of it, and every refusal that can be known before a
write: which rule applies (`rules.decide`), the namespace allow/deny lists, owner resolution and opt-in
(`ownership`), the workload's own restart policy (`kinds.forbidden`), the operator controls (a pause:
`controls.paused_scope`), and, through `admission`, replays, cooldowns, budgets and the breaker (with
what is in flight). A restart refused for a blocker that lifts (a pause, a cooldown, the budget window,
the breaker) becomes a `Hold`, planned again when the blocker lifts; a fault on a DRA device is answered
at device level (`TaintDevice` and the holders' restarts, the node left schedulable) where the API
server serves DeviceTaintRules, at node level otherwise; a cleared fault returns what kcover took (its
own device taint; its own cordon, through validation when `recovery.return_validation` asks).

It sees the cluster only through `planinputs.Snapshot` (the cache), the ledger only through
`planinputs.History`, and does no I/O. Does not own what it reads (`planinputs`), which pods a restart
takes away and the key it counts under (`restartunits`), what the breaker counts (`breakerload`), the
references its steps carry (`targets`), the evidence against a node or GPU (`judging`), or a link-down's
(`linking`). It never raises on odd events: unknown targets become `Refuse` steps.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field

from kcover import kinds, model, settings, validationcodec
from kcover.kube import ownership
from kcover.kube import projections as proj
from kcover.recovery import (
    admission,
    breakerload,
    controls,
    cordoning,
    judging,
    ledgerentries,
    linking,
    planinputs,
    restartunits,
    rules,
    targets,
)
from kcover.recovery import steps as st
from kcover.recovery.steps import Code

AK = model.Action


HOLDABLE = frozenset({Code.PAUSED, Code.COOLDOWN, Code.BUDGET_EXHAUSTED, Code.THROTTLED, Code.BREAKER_OPEN,
                      Code.BREAKER_LATCHED, Code.BREAKER_COOLDOWN})
"""Refusals whose blocker lifts by itself or by a person: the restart is held and planned again."""


@dataclass
class _Planner:
    event: model.CollectorEvent
    snapshot: planinputs.Snapshot
    history: planinputs.History
    rs: settings.RecoverySettings
    now: float
    blame: model.Blame = model.Blame.UNKNOWN
    judged: bool = False
    """The event's restarts waited for a verdict already (`steps.Restart.judged`)."""
    planned_keys: set[str] = field(default_factory=set)
    held_keys: set[str] = field(default_factory=set)
    """Units this plan holds: a unit reached twice (the device's holder, then the node's sweep) is held once."""
    planned_cordons: set[str] = field(default_factory=set)
    awaited_cordons: set[str] = field(default_factory=set)
    """Nodes this plan would cordon whose cordon an earlier plan has in flight: its restarts for them wait."""

    def refuse(self, code: Code, text: str, about: st.ObjectRef | None) -> st.Refuse:
        return st.Refuse(code, text, self.event, about=about)

    def _load(self, *, exclude_node: str = "", key: str = "") -> admission.Load:
        return breakerload.load(self.history, self.snapshot, self.rs, self.now, planned_keys=self.planned_keys,
                                planned_cordons=self.planned_cordons, exclude_node=exclude_node, key=key)

    # ------------------------------------------------------------------------------------ restarts

    def restart_for_pod(self, pod: proj.Pod, *, sweep: bool = False, node: str = "") -> list[st.Step]:
        """Restart the unit `pod` belongs to. In a node sweep, pods kcover may not touch are passed over."""
        about = targets.pod_ref(pod)
        if not targets.namespace_allowed(pod.namespace, self.rs):
            return [] if sweep else [self.refuse(Code.NAMESPACE_DENIED, f"namespace {pod.namespace} is not acted "
                                                 "on (recovery.namespaces_allow/deny)", about)]
        resolved = ownership.resolve(self.snapshot, pod)
        if isinstance(resolved, ownership.Unresolved):
            if sweep:
                return []
            code = Code(resolved.problem.value)
            # audited only when the pod itself opted in: a crashing Deployment pod is not kcover's business
            return [st.Refuse(code, resolved.text, self.event, about=about, quiet=not ownership.labelled(pod.labels))]
        if not ownership.opted_in(pod, resolved, namespace=self.snapshot.namespace(pod.namespace)):
            return [] if sweep else [self.refuse(Code.NOT_OPTED_IN, f"neither Pod {pod.namespace}/{pod.name}, its "
                                                 f"{resolved.workload.kind} nor Namespace {pod.namespace} carries "
                                                 f"{proj.OPT_IN_LABEL}=true (or the pod or workload says false)", about)]
        w = resolved.workload
        unit = restartunits.unit_of(resolved, pod)
        if unit.key in self.planned_keys or unit.key in self.held_keys:
            return []
        wref = targets.workload_ref(w)
        what = wref.describe() + (f" {unit.description}" if unit.description else "")
        table = kinds.of(w.group, w.kind)
        assert table is not None
        forbidden = table.forbidden(restart_policies=[p for _, p in w.restart_policies],
                                    max_restarts=w.max_restarts, finished=w.finished)
        if forbidden:
            return [self.refuse(Code.RESTART_POLICY, f"{what} is not restarted: {forbidden}", wref)]
        exits = [(c.name, c.terminated.exit_code) for c in pod.containers
                 if c.terminated is not None and c.terminated.exit_code != 0]
        own = kinds.own_policy_restarts(w.own, pod_failed=pod.phase == "Failed", exits=exits)
        if own:
            return [] if sweep else [self.refuse(Code.OWN_POLICY, f"{what} is left to its own failure policy: {own}",
                                                 wref)]
        replay = admission.replayed(self.history.ledger.acted_on(self.event.signal, unit.key), self.event.signal, what)
        if replay is not None:
            return [self.refuse(replay.code, replay.text, wref)]
        if self.history.restarts_in_flight.get(unit.key):
            return [self.refuse(Code.COOLDOWN, f"a restart of {what} is in flight", wref)]
        # the members only once the restart is to run (below): every rank of a 1,024-pod job failing at once
        # plans a restart, most of them held for the cooldown, and each reading of the members looks at
        # every pod of the job; a held restart resolves them when it is planned again (`steps.Hold`)
        restart = st.Restart(workload=wref, unit_key=unit.key, unit=unit.description, selector=unit.selector,
                             members=(), removal=table.removal,
                             pod=st.PodRef(pod.namespace, pod.name, pod.uid), cause=self.event,
                             node=node or pod.node, blame=self.blame, rank=kinds.rank_of(dict(pod.labels)),
                             judged=self.judged)
        scope = controls.paused_scope(self.snapshot, workload_uid=w.uid, namespace=w.namespace, pod_uid=pod.uid)
        if scope:
            return [self._hold(restart, Code.PAUSED, f"kcover is paused for {scope} ({controls.PAUSED}=true)")]
        awaited = self._awaited_cordon(restart.node, pod.namespace, unit.selector)
        if awaited:
            return [self._hold(restart, Code.AWAITING_CORDON, f"Node {awaited} is being cordoned by an earlier "
                               f"recovery: {what} is restarted once it is, so that its pods are not recreated there")]
        entry = self.history.ledger.unit(unit.key)
        refused = admission.restart(entry, what=what, rs=self.rs, now=self.now,
                                    breaker_state=self.history.ledger.breaker(), load=self._load(key=unit.key),
                                    pod_created=targets.created_at(pod) if not sweep else None, pod_terminating=pod.deleting)
        if refused is not None:
            if refused.code in HOLDABLE:
                held = self._hold_for(restart, refused, entry)
                if held is not None:
                    return [held]
            return [self.refuse(refused.code, refused.text, wref)]
        waiting = self.await_verdict(restart)
        if waiting is not None:
            return [waiting]
        restart = dataclasses.replace(restart, members=restartunits.members(self.snapshot, w, unit.selector))
        if not restart.members:
            return [self.refuse(Code.NOTHING_TO_REMOVE, f"every pod of {what} is already terminal or terminating: "
                                "its controller recreates them and counts their failures itself", wref)]
        self.planned_keys.add(unit.key)
        return [restart]

    def _awaited_cordon(self, node: str, namespace: str, selector: st.Selector) -> str:
        """A node an earlier plan is cordoning where the unit has a live pod (its fault's node first), or "": a
        restart now would recreate that pod there, and the node's own restart of the unit would follow."""
        if node in self.awaited_cordons:
            return node
        for name in sorted(self.history.cordons_in_flight - self.history.cordons_written - self.planned_cordons):
            if any(p.namespace == namespace and not p.deleting and not p.terminal and selector.matches(p.labels)
                   for p in self.snapshot.pods_on_node(name)):
                return name
        return ""

    def await_verdict(self, restart: st.Restart, *, asked_now: bool = False) -> st.Hold | None:
        """The restart held while its fault's node is suspect and unanswered (`asked_now`: this plan asks; or an
        earlier plan of the batch did), for at most `judgement.verdict_wait_seconds` from the request; None
        when it runs now, and when the node shows no agent condition (`History.agent_condition`): no agent
        runs there to answer."""
        wait = self.rs.judgement.verdict_wait_seconds
        if wait <= 0 or not restart.node:
            return None
        node = self.snapshot.node(restart.node)
        if node is None or not any(c.type == self.history.agent_condition for c in node.conditions):
            return None
        since = self.now
        if not asked_now and restart.node not in self.history.suspects_in_flight:
            entry = self.history.ledger.node(restart.node)
            if entry is None or not entry.pending_suspicion() or entry.suspect_at is None:
                return None
            since = entry.suspect_at
        if self.now - since >= wait:
            return None
        return self._hold(dataclasses.replace(restart, members=()), Code.AWAITING_VERDICT,
                          f"Node {restart.node} is suspect and its validation not answered yet: {restart.what} is "
                          f"restarted after the verdict (at most {wait:g}s after the request), so that a failed "
                          "validation cordons the node before its pods are recreated")

    def _hold(self, restart: st.Restart, code: Code, text: str, until: float | None = None) -> st.Hold:
        limit = self.event.observed_at.timestamp() + self.rs.hold_seconds
        self.held_keys.add(restart.unit_key)
        return st.Hold(restart, code, text, until=min(until, limit) if until is not None else limit)

    def _hold_for(self, restart: st.Restart, refused: admission.Refusal, entry: ledgerentries.Unit | None) -> st.Hold | None:
        """A hold for a refusal whose blocker lifts, or None when it would not lift within `hold_seconds`."""
        if refused.code is Code.BUDGET_EXHAUSTED:
            frees = admission.until_budget_frees(entry, self.rs, self.now)
            if frees > self.event.observed_at.timestamp() + self.rs.hold_seconds:
                return None  # a crash loop: the budget frees too late; a person decides
        return self._hold(restart, refused.code, refused.text)

    def restart_workload(self, uid: str) -> list[st.Step]:
        pods = [p for p in self.snapshot.pods_of_workload(uid) if not p.deleting]
        if not pods:
            w = self.snapshot.workload(uid)
            return [self.refuse(Code.TARGET_UNKNOWN, f"workload {uid} has no pods in the cache",
                                targets.workload_ref(w) if w else None)]
        failing = [p for p in pods if targets.failing(p)]
        return self.restart_for_pod((failing or pods)[0])

    def restarts_on_device(self, node: str, pods: Sequence[str]) -> list[st.Step]:
        """Restart what holds the faulting device: the named pods' workloads, if they still run on `node`."""
        out: list[st.Step] = []
        for key in sorted(set(pods)):
            namespace, _, name = key.partition("/")
            pod = self.snapshot.pod_by_name(namespace, name)
            if pod is not None and pod.node == node and not pod.deleting:
                out += self.restart_for_pod(pod, sweep=True, node=node)
        return out

    def restarts_using_device(self, node: str, resource_id: str) -> list[st.Step]:
        """Restart the workloads whose pods on `node` report the DRA device in `allocatedResourcesStatus`."""
        out: list[st.Step] = []
        for pod in sorted(self.snapshot.pods_on_node(node), key=lambda p: (p.namespace, p.name)):
            if not pod.deleting and any(r.resource_id == resource_id for c in pod.containers for r in c.resources):
                out += self.restart_for_pod(pod, sweep=True, node=node)
        return out

    def sweeping(self, steps: list[st.Step], node: str) -> list[st.Step]:
        """`steps` with the node's cordon marked as one that restarts the node's workloads, with the pods seen
        there now (`steps.Cordon.swept`: after the cordon, `latearrivals` looks for those it did not see)."""
        seen = frozenset(pod.uid for pod in self.snapshot.pods_on_node(node))
        return [dataclasses.replace(s, swept=seen) if isinstance(s, st.Cordon) and s.node == node else s for s in steps]

    def restarts_on_node(self, node: str, *, skip: frozenset[str] = frozenset()) -> list[st.Step]:
        out: list[st.Step] = []
        for pod in sorted(self.snapshot.pods_on_node(node), key=lambda p: (p.namespace, p.name)):
            if not pod.deleting and not pod.terminal and pod.uid not in skip:
                out += self.restart_for_pod(pod, sweep=True, node=node)
        return out

    # ------------------------------------------------------------------------------------ nodes and devices

    def _reason(self) -> str:
        return f"{self.event.reason}: {self.event.message}" if self.event.message else self.event.reason

    def cordon(self, name: str, *, reason: str = "") -> list[st.Step]:
        node = self.snapshot.node(name)
        if node is None:
            return [self.refuse(Code.TARGET_UNKNOWN, f"Node {name} is not in the cache", st.node_ref(name))]
        about = st.node_ref(name, node.uid)
        if name in self.planned_cordons:
            return []
        refused = cordoning.refusal(cordoned_by_kcover=node.cordoned_by_kcover, unschedulable=node.unschedulable,
                                    kcover_tainted=any(t.key == self.rs.taint_key for t in node.taints), node=name)
        if refused is not None:
            return [self.refuse(refused[0], refused[1], about)]
        if name in self.history.cordons_in_flight:
            self.awaited_cordons.add(name)
            return [self.refuse(Code.ALREADY_CORDONED, f"a cordon of Node {name} is in flight", about)]
        replay = admission.replayed(self.history.ledger.acted_on(self.event.signal, f"n.{name}"), self.event.signal,
                                    f"Node {name}")
        if replay is not None:
            return [self.refuse(replay.code, replay.text, about)]
        scope = controls.paused_scope(self.snapshot, node=name)
        if scope:
            return [self.refuse(Code.PAUSED, f"kcover is paused for {scope} ({controls.PAUSED}=true): Node {name} is "
                                "not cordoned", about)]
        refusal = admission.cordon(self.history.ledger.node(name), name, rs=self.rs, now=self.now,
                                   breaker_state=self.history.ledger.breaker(), load=self._load(exclude_node=name))
        if refusal is not None:
            return [self.refuse(refusal.code, refusal.text, about)]
        self.planned_cordons.add(name)
        return [st.Cordon(node=name, reason=reason or self._reason(), cause=self.event, blame=self.blame)]

    def isolate_device(self, dra: model.DraDevice, node: str, kind: model.Action, pod: proj.Pod | None) -> list[st.Step]:
        """Device-level isolation under DRA: taint the device (not the node) and restart what holds it; where
        DeviceTaintRules are not served, the node-level answer. An application error on the device (a
        restart-workload for a fault naming an XID) restarts the holders and taints nothing."""
        if kind is AK.RESTART_WORKLOAD and self.event.fault.xid is not None:
            return self._holders(dra, node, kind, pod) or [
                self.refuse(Code.NO_WORKLOADS, f"no opted-in workload holds device {dra.resource_id} on Node {node}",
                            st.node_ref(node))]
        if not self.history.device_taints_served:  # the node-level answer (said once by the engine)
            # the cordon planned before the holders: one in flight from an earlier plan holds them (AwaitingCordon)
            out = [] if kind is AK.RESTART_WORKLOAD else self.cordon(node)
            out += self._holders(dra, node, kind, pod)
            if kind is AK.CORDON_NODE_AND_RESTART:
                out = self.sweeping(out, node) + self.restarts_on_node(node)
            return out
        holders = self._holders(dra, node, kind, pod)
        scope = controls.paused_scope(self.snapshot, node=node)
        if scope:
            return [self.refuse(Code.PAUSED, f"kcover is paused for {scope} ({controls.PAUSED}=true): device "
                                f"{dra.resource_id} is not tainted", st.node_ref(node)), *holders]
        refused = self._device_refusal(dra, node)
        if refused is not None:
            return [self.refuse(refused.code, refused.text, st.node_ref(node)), *holders]
        return [st.TaintDevice(device=dra, node=node, reason=self._reason(), cause=self.event), *holders]

    def _holders(self, dra: model.DraDevice, node: str, kind: model.Action, pod: proj.Pod | None) -> list[st.Step]:
        """The restarts of what holds the device, for a kind that restarts: the pod the fault names, the pods the
        agent named, or else the pods whose `allocatedResourcesStatus` names the device."""
        if kind not in (AK.RESTART_WORKLOAD, AK.CORDON_NODE_AND_RESTART):
            return []
        if pod is not None:
            return self.restart_for_pod(pod)
        if self.event.fault.pods:
            return self.restarts_on_device(node, self.event.fault.pods)
        return self.restarts_using_device(node, dra.resource_id)

    def _device_refusal(self, dra: model.DraDevice, node: str) -> admission.Refusal | None:
        flying = {rid: n for rid, n in self.history.device_taints_in_flight.items() if rid != dra.resource_id}
        load = admission.DeviceLoad(on_node=sum(1 for n in flying.values() if n == node), total=len(flying))
        recent = self.history.ledger.device_taints_since(self.now - self.rs.device_taints.window_seconds)
        return admission.device_taint(self.history.ledger.node(node), dra.resource_id, node, rs=self.rs,
                                      now=self.now, breaker_state=self.history.ledger.breaker(), recent=recent,
                                      load=load)

    def give_back(self, name: str) -> list[st.Step]:
        """Return a node kcover cordoned to service (an admin's cordon is never undone), through its validation
        when `recovery.return_validation` asks for one."""
        node = self.snapshot.node(name)
        if node is None or cordoning.refusal_to_return(cordoned_by_kcover=node.cordoned_by_kcover, node=name):
            return []
        scope = controls.paused_scope(self.snapshot, node=name)
        if scope:
            return [self.refuse(Code.PAUSED, f"kcover is paused for {scope}: Node {name} stays cordoned",
                                st.node_ref(name, node.uid))]
        if self.rs.return_validation.enabled:
            return [st.RequestValidation(node=name, cause=self.event)]
        return [st.Uncordon(node=name, cause=self.event)]


def plan(event: model.CollectorEvent, snapshot: planinputs.Snapshot, history: planinputs.History,
         rs: settings.RecoverySettings, now: dt.datetime, *,
         rules_: Sequence[rules.Rule] | None = None, judged: bool = False) -> list[st.Step]:
    """Every step answering one event. `rules_` defaults to `rules.parse_rules(rs.rules)`; `judged`: the event's
    restart was held for its node's verdict, which answered it (`steps.Restart.judged`).

    The fault is attributed first (`judging.attribute`): a fault blamed on the workload moves no node
    (`recovery.judgement.workload_blame`), and its restart may make the node suspect (`judging.suspects`):
    then the restart waits for the verdict (`judgement.verdict_wait_seconds`). A matching rule in `record`
    mode turns the actions into `RecordOnly` steps."""
    configured = rules.parse_rules(rs.rules) if rules_ is None else rules_
    blame = judging.attribute(event)
    p = _Planner(event, snapshot, history, rs, now.timestamp(), blame=blame, judged=judged)
    if event.cleared:
        return _returns(p)
    if event.evidence is not None:
        return linking.note(event, rs.judgement)
    kind = rules.decide(event, configured, rs.node_judgement)
    mode = rs.judgement.workload_blame
    spared = judging.spared(kind, blame) if mode is not settings.JudgementMode.OFF else kind
    steps = _actions(p, spared if mode is settings.JudgementMode.ACT else kind)
    if spared is not kind and mode is settings.JudgementMode.RECORD:
        about = targets.about_event(event, snapshot)
        if about is not None:
            steps.append(st.RecordOnly(st.Report(f"{p._reason()}: blamed on the workload; the judgement would "
                                                 f"{spared.value} where the rules say {kind.value}", event,
                                                 about=about),
                                       "recovery.judgement.workload_blame: record"))
    links = linking.cordons(steps, snapshot, history.ledger, rs.judgement, p.cordon)
    blamed = {s.node for s in links if isinstance(s, st.Cordon)}
    asks = [a for a in judging.suspects(steps, snapshot, history.ledger, rs, p.now) if _node_of(a) not in blamed]
    asked = {s.node for s in asks if isinstance(s, st.RequestValidation) and s.purpose is st.Purpose.SUSPECT}
    steps = links + [_awaiting(p, s) if isinstance(s, st.Restart) and s.node in asked else s for s in steps] + asks
    rule = rules.matching(event, configured)
    if rule is not None and rule.mode is rules.Mode.RECORD:
        steps = [st.RecordOnly(s, f"{rule.describe()} mode: record") if _acts(s) else s for s in steps]
    return steps


def _node_of(step: st.Step) -> str:
    inner = step.step if isinstance(step, st.RecordOnly) else step
    return inner.node if isinstance(inner, st.RequestValidation) else ""


def _awaiting(p: _Planner, restart: st.Restart) -> st.Step:
    """A restart whose node this plan makes suspect: held for the verdict, unless the wait is off."""
    return p.await_verdict(restart, asked_now=True) or restart


def _acts(step: st.Step) -> bool:
    """A step that changes a workload, a node or a device (what a rule in `record` mode holds back)."""
    return isinstance(step, st.Restart | st.Hold | st.Cordon | st.TaintDevice | st.RequestValidation)


def _returns(p: _Planner) -> list[st.Step]:
    """A cleared fault: kcover's own device taint goes (the executor checks it is kcover's); a device's health
    says nothing of its node, so a node kcover cordoned stays cordoned; a node's fault cleared returns the
    node (`recovery.uncordon_enabled`)."""
    event, rs, target = p.event, p.rs, p.event.target
    node_name = target.node_name
    if event.fault.dra is not None:
        dra = event.fault.dra if rs.device_taints.enabled else None
        return [st.UntaintDevice(device=dra, node=node_name, cause=event)] if dra is not None else []
    if rs.uncordon_enabled and node_name and target.kind in (model.TargetKind.NODE, model.TargetKind.DEVICE):
        return p.give_back(node_name)
    return []


def _actions(p: _Planner, kind: model.Action) -> list[st.Step]:
    """The steps of `kind` for the planner's event."""
    event, snapshot, rs, target = p.event, p.snapshot, p.rs, p.event.target
    node_name = target.node_name
    dra = event.fault.dra if rs.device_taints.enabled else None
    if kind is AK.IGNORE:
        return []
    if kind is AK.REPORT:
        return [st.Report(p._reason(), event, about=targets.about_event(event, snapshot))]
    pod: proj.Pod | None = None
    if target.kind is model.TargetKind.POD:
        pod = snapshot.pod(target.uid) if target.uid else None
        if pod is None:
            return [p.refuse(Code.TARGET_UNKNOWN, f"{target.describe()} (uid {target.uid or 'unset'}) is not in the "
                             "cache", targets.target_ref(target))]
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
            return found or [p.refuse(Code.NO_WORKLOADS, f"no opted-in workload has pods on {where}",
                                      st.node_ref(node_name))]
        return [p.refuse(Code.TARGET_UNKNOWN, f"{target.describe()} names nothing kcover can restart", None)]
    if not node_name:
        return [p.refuse(Code.TARGET_UNKNOWN, f"{target.describe()} names no node to cordon", None)]
    out = p.cordon(node_name)
    if kind is AK.CORDON_NODE_AND_RESTART:
        out = p.sweeping(out, node_name) + p.restarts_on_node(node_name)
    return out


def late_arrivals(event: model.CollectorEvent, node: str, seen: frozenset[str], snapshot: planinputs.Snapshot,
                  history: planinputs.History, rs: settings.RecoverySettings, now: dt.datetime) -> list[st.Step]:
    """The restarts a node's fault calls for of the units whose pods came to the node after the plan that
    cordoned it (`seen`: the pods that plan looked at) and before the cordon held: a restart for another fault
    recreating them there. The same sweep as the plan's, over the newcomers only."""
    p = _Planner(event, snapshot, history, rs, now.timestamp(), blame=judging.attribute(event))
    return p.restarts_on_node(node, skip=seen)


def verdict(node: str, outcome: validationcodec.ValidationOutcome | None, text: str, cause: model.CollectorEvent,
            snapshot: planinputs.Snapshot, history: planinputs.History, rs: settings.RecoverySettings,
            now: dt.datetime) -> list[st.Step]:
    """What follows a suspect node's validation: passed, it stays schedulable (the evidence before it no longer
    counts); failed, it is cordoned through the breaker; not run or not answered, it is cordoned only while
    it shows a hardware signal (`recovery.judgement.hardware_conditions`), else left schedulable."""
    p = _Planner(cause, snapshot, history, rs, now.timestamp(), blame=model.Blame.NODE)
    if outcome is validationcodec.ValidationOutcome.PASSED:
        return [st.Judge(node, ledgerentries.Verdict.HEALTHY, text, cause)]
    # the cordon before the verdict's record: a leader gone between them leaves the suspicion pending, and its
    # successor reads the answer again (`returning.Validations.adopt`) instead of a faulty node left in service
    if outcome is validationcodec.ValidationOutcome.FAILED:
        return [*p.cordon(node, reason=f"suspect, and failed validation: {text}"),
                st.Judge(node, ledgerentries.Verdict.FAULTY, text, cause)]
    found = snapshot.node(node)
    signal = judging.hardware_signal([(c.type, c.status) for c in found.conditions] if found else [], rs.judgement)
    if signal:
        why = f"{text}; its condition {signal} is False"
        return [*p.cordon(node, reason=f"suspect, not validated, and a hardware signal: {why}"),
                st.Judge(node, ledgerentries.Verdict.FAULTY, why, cause)]
    return [st.Judge(node, ledgerentries.Verdict.UNVALIDATED, text, cause)]
