"""The node ladder: what follows a cordon (a drain, a remediation request, a person), and its drains.

Owns the ladder's steps and the drains in progress:

* `Ladder`, a coordinator hook: after a cordon is done it returns the ladder's next steps: an optional
  `Drain` (`recovery.escalation.drain_mode`: `none`, `opted-in`, `all` but DaemonSet and mirror pods), an
  optional `RequestRemediation` (`recovery.escalation.remediation_enabled`: the label
  `kcover.io/remediation-requested=true` and the Node condition `KcoverRemediationRequested=True`, which
  medik8s NodeHealthCheck or a reboot or reimage controller selects on) and the last step, `CallPerson`;
  after an un-cordon it takes the remediation request back. Pure.
* `Drainer`: a drain evicts through the Eviction API, so PodDisruptionBudgets are honoured; an eviction a
  budget refuses (429) is tried again on every pass (`tick`) until `drain_timeout_seconds`.

Every step is a `KcoverEscalated` Event (its `action` names the step) and a count in
`kcover_escalation_steps_total{ladder,step}`. Which node a workload's faults move is the judgement's
business (`planning`), not the ladder's. How it fails: an eviction's API error is logged and that pod
tried again on the next pass; `errors.NotLeaderError` propagates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from kcover import errors, settings
from kcover.aio import clock as clock_
from kcover.kube import gateway, ownership
from kcover.kube import projections as proj
from kcover.recovery import planinputs
from kcover.recovery import steps as st

log = structlog.get_logger()

ESCALATED = "KcoverEscalated"
REMEDIATION_LABEL = "kcover.io/remediation-requested"
REMEDIATION_CONDITION = "KcoverRemediationRequested"
SKIPPED_OWNERS = frozenset({"DaemonSet", "Node"})
"""Pods a drain never evicts: DaemonSet pods (their controller ignores unschedulable) and mirror pods
(owned by their Node; the kubelet runs them from files)."""


def drain_candidates(snapshot: planinputs.Snapshot, node: str, mode: settings.DrainMode) -> list[proj.Pod]:
    """The pods a drain of `node` evicts in `mode` (none for `none`)."""
    if mode is settings.DrainMode.NONE:
        return []
    out = []
    for pod in snapshot.pods_on_node(node):
        if pod.deleting or pod.terminal:
            continue
        if pod.owner is not None and pod.owner.kind in SKIPPED_OWNERS:
            continue
        if mode is settings.DrainMode.OPTED_IN:
            resolved = ownership.resolve(snapshot, pod)
            if not ownership.opted_in(pod, None if isinstance(resolved, ownership.Unresolved) else resolved,
                                      namespace=snapshot.namespace(pod.namespace)):
                continue
        out.append(pod)
    return sorted(out, key=lambda p: (p.namespace, p.name))


class Ladder:
    """The coordinator hook that climbs the node ladder after a cordon and takes it down after a return."""

    def __init__(self, snapshot: planinputs.Snapshot, *, recovery: Callable[[], settings.RecoverySettings]) -> None:
        self._snapshot = snapshot
        self._recovery = recovery

    def after(self, step: st.Step, outcome: st.Outcome) -> list[st.Step]:
        if not isinstance(outcome, st.Done) or outcome.noop:
            return []
        esc = self._recovery().escalation
        if isinstance(step, st.Cordon):
            out: list[st.Step] = []
            done = ["cordoned"]
            if esc.drain_mode is not settings.DrainMode.NONE:
                pods = drain_candidates(self._snapshot, step.node, esc.drain_mode)
                out.append(st.Drain(node=step.node, pods=tuple(st.PodRef(p.namespace, p.name, p.uid) for p in pods),
                                    cause=step.cause))
                done.append(f"drain ({esc.drain_mode.value}) started")
            if esc.remediation_enabled:
                out.append(st.RequestRemediation(node=step.node, requested=True, cause=step.cause,
                                                 message=f"kcover cordoned the node: {step.reason}"))
                done.append("remediation requested")
            back = ("kcover returns it to service once its fault has stayed cleared"
                    if self._recovery().uncordon_enabled
                    else "recovery.uncordon_enabled is off: a person returns it to service")
            out.append(st.CallPerson(about=st.node_ref(step.node), cause=step.cause,
                                     message=f"Node {step.node}: {', '.join(done)}; a person should repair it ({back})"))
            return out
        if isinstance(step, st.Uncordon) and esc.remediation_enabled:
            return [st.RequestRemediation(node=step.node, requested=False, cause=step.cause,
                                          message="kcover returned the node to service")]
        return []


@dataclass
class Drain:
    node: str
    deadline: float
    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Pod uid -> (namespace, name) still to evict."""
    evicted: int = 0
    refused: str = ""
    """The last refusal (a PodDisruptionBudget's message)."""
    passing: bool = False
    """A pass over `waiting` is in progress (the drain step's first, or `tick`'s): another one waits its turn."""


class Drainer:
    """Evicts a cordoned node's pods; `tick()` retries what a budget refused."""

    def __init__(self, gw: gateway.Gateway) -> None:
        self._gw = gw
        self.drains: dict[str, Drain] = {}

    def start(self, node: str, pods: Sequence[st.PodRef], deadline: float) -> Drain:
        drain = Drain(node, deadline, {p.uid: (p.namespace, p.name) for p in pods})
        self.drains[node] = drain
        return drain

    async def evict(self, drain: Drain) -> None:
        """One pass over the pods still waiting. The step's first pass and `tick`'s retries run on one loop and
        each awaits every eviction: a pass that finds another in progress leaves the drain to it (two passes at
        once evicted each pod twice and the second one's removal of a pod from `waiting` failed the step)."""
        if drain.passing:
            return
        drain.passing = True
        try:
            await self._pass(drain)
        finally:
            drain.passing = False

    async def _pass(self, drain: Drain) -> None:
        for uid, (namespace, name) in list(drain.waiting.items()):
            try:
                got = await self._gw.evict_pod(namespace, name, uid)
            except errors.NotLeaderError:
                raise
            except errors.KubeError as exc:
                drain.refused = str(exc)
                log.warning("drain_eviction_failed", node=drain.node, pod=f"{namespace}/{name}", error=str(exc))
                continue
            if got is gateway.Removal.HELD:
                drain.refused = f"a PodDisruptionBudget refused the eviction of {namespace}/{name}"
                continue
            if drain.waiting.pop(uid, None) is not None and got is gateway.Removal.REMOVED:
                drain.evicted += 1

    async def tick(self, now: float) -> list[Drain]:
        """Retry the drains in progress; returns those that ended (done or timed out), forgotten here. A drain
        whose pass is in progress is left to it, even past its deadline: the next tick ends it with every
        eviction of that pass counted."""
        ended = []
        for node, drain in list(self.drains.items()):
            if drain.passing:
                continue
            if drain.waiting and now < drain.deadline:
                await self.evict(drain)
            if not drain.waiting or now >= drain.deadline:
                del self.drains[node]
                ended.append(drain)
        return ended


def remediation_condition(requested: bool, message: str, now_text: str) -> gateway.NodeConditionBody:
    return {"type": REMEDIATION_CONDITION, "status": "True" if requested else "False",
            "reason": "KcoverRequested" if requested else "KcoverReturnedToService",
            "message": message[:1000], "lastTransitionTime": now_text, "lastHeartbeatTime": now_text}


async def set_remediation(gw: gateway.Gateway, node: str, *, requested: bool, message: str,
                          clock: clock_.Clock) -> None:
    """Write the remediation request's label and Node condition."""
    await gw.patch_node_labels(node, {REMEDIATION_LABEL: "true" if requested else None})
    await gw.patch_node_conditions(node, [remediation_condition(requested, message, clock_.rfc3339(clock.now()))])
