"""The escalation ladder: what kcover does when a restart or a cordon is not enough.

Owns the ladder's steps and their memory; the `overseeing.Overseer` calls them around the executor.

* **Workload ladder.** restart -> when the same workload's faults keep coming back on one node
  (`recovery.escalation.repeat_count` restarts within `repeat_window_seconds`, this one included),
  cordon that node before the restart, so the job restarts elsewhere (`Repeats`) -> at the restart
  budget, stop and say so (the policy's `BudgetExhausted` refusal, audited as an Event).
* **Node ladder.** cordon -> optional drain (`recovery.escalation.drain_mode`: `none`, `opted-in`,
  `all` but DaemonSet and mirror pods), through the Eviction API so PodDisruptionBudgets are honoured:
  an eviction a budget refuses (429) is tried again on every pass until `drain_timeout_seconds`
  (`Drainer`) -> optional remediation request (`recovery.escalation.remediation_enabled`): the label
  `kcover.io/remediation-requested=true` and the Node condition `KcoverRemediationRequested=True`,
  which an external remediator (medik8s NodeHealthCheck, a reboot or reimage controller) selects on;
  both are taken back when kcover returns the node to service -> a person (an Event saying what was
  done and what is left).

Every step is a `KcoverEscalated` Event (its `action` names the step) and a count in
`kcover_escalation_steps_total{ladder,step}`. The repeat counts are kept in memory (a new leader
starts counting afresh; the restart budget, which lives in the ledger, still bounds the job).
How it fails: API errors of one eviction are logged and that pod is tried again on the next pass;
others propagate to the executor.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from kcover import errors, settings
from kcover.aio import clock as clock_
from kcover.kube import client as kube_client
from kcover.kube import ownership, retrying
from kcover.kube import projections as proj
from kcover.recovery import adapters, policy

log = structlog.get_logger()

REMEDIATION_LABEL = "kcover.io/remediation-requested"
REMEDIATION_CONDITION = "KcoverRemediationRequested"
SKIPPED_OWNERS = frozenset({"DaemonSet", "Node"})
"""Pods a drain never evicts: DaemonSet pods (their controller ignores unschedulable) and mirror pods
(owned by their Node; the kubelet runs them from files)."""


class Repeats:
    """Restart times of each (workload uid, node) pair: how often a job's faults came back on one node."""

    def __init__(self) -> None:
        self._times: dict[tuple[str, str], collections.deque[float]] = {}

    def record(self, workload_uid: str, node: str, now: float, window: float) -> int:
        """Count this restart; returns the restarts within `window` seconds, this one included."""
        times = self._times.setdefault((workload_uid, node), collections.deque(maxlen=64))
        times.append(now)
        while times and times[0] <= now - window:
            times.popleft()
        return len(times)

    def forget(self, workload_uid: str, node: str) -> None:
        self._times.pop((workload_uid, node), None)


def drain_candidates(snapshot: policy.ClusterSnapshot, node: str, mode: settings.DrainMode) -> list[proj.Pod]:
    """The pods a drain of `node` evicts in `mode` (none for `none`)."""
    if mode is settings.DrainMode.NONE:
        return []
    out = []
    for pod in snapshot.pods_on_node(node):
        if pod.deleting or pod.phase in ("Succeeded", "Failed"):
            continue
        if pod.owner is not None and pod.owner.kind in SKIPPED_OWNERS:
            continue
        if mode is settings.DrainMode.OPTED_IN:
            resolved = adapters.resolve(snapshot, pod)
            if not ownership.opted_in(pod, None if isinstance(resolved, adapters.Refused) else resolved):
                continue
        out.append(pod)
    return sorted(out, key=lambda p: (p.namespace, p.name))


@dataclass
class Drain:
    node: str
    deadline: float
    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Pod uid -> (namespace, name) still to evict."""
    evicted: int = 0
    refused: str = ""
    """The last refusal (a PodDisruptionBudget's message)."""


class Drainer:
    """Evicts a cordoned node's pods through the Eviction API; `tick()` retries what a budget refused."""

    def __init__(self, kube: kube_client.KubeClient, *, is_leader: Callable[[], bool],
                 fence: retrying.Fence | None = None) -> None:
        self._kube = kube
        self._is_leader = is_leader
        self._fence = fence
        self.drains: dict[str, Drain] = {}

    def start(self, node: str, pods: Sequence[proj.Pod], deadline: float) -> Drain:
        drain = Drain(node, deadline, {p.uid: (p.namespace, p.name) for p in pods})
        self.drains[node] = drain
        return drain

    async def evict(self, drain: Drain) -> None:
        """One pass over the pods still waiting."""
        for uid, (namespace, name) in list(drain.waiting.items()):
            if not self._is_leader():
                raise errors.NotLeaderError("not leading: eviction refused")
            body = {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": name, "namespace": namespace},
                    "deleteOptions": {"preconditions": {"uid": uid}}}
            try:
                await self._kube.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body=body,
                                         fence=self._fence, retry=False)
            except (errors.NotFoundError, errors.ConflictError):
                del drain.waiting[uid]  # gone, or the name is another pod's now
                continue
            except errors.TooManyRequestsError as exc:  # a PodDisruptionBudget says not now
                drain.refused = str(exc)
                continue
            except errors.KubeError as exc:
                drain.refused = str(exc)
                log.warning("drain_eviction_failed", node=drain.node, pod=f"{namespace}/{name}", error=str(exc))
                continue
            del drain.waiting[uid]
            drain.evicted += 1

    async def tick(self, now: float) -> list[Drain]:
        """Retry the drains in progress; returns those that ended (done or timed out), forgotten here."""
        ended = []
        for node, drain in list(self.drains.items()):
            if drain.waiting and now < drain.deadline:
                await self.evict(drain)
            if not drain.waiting or now >= drain.deadline:
                del self.drains[node]
                ended.append(drain)
        return ended


def remediation_condition(requested: bool, message: str, now_text: str) -> dict[str, Any]:
    return {"type": REMEDIATION_CONDITION, "status": "True" if requested else "False",
            "reason": "KcoverRequested" if requested else "KcoverReturnedToService",
            "message": message[:1000], "lastTransitionTime": now_text, "lastHeartbeatTime": now_text}


async def set_remediation(kube: kube_client.KubeClient, node: str, *, requested: bool, message: str,
                          clock: clock_.Clock, fence: retrying.Fence | None = None) -> None:
    """Write the remediation request's label (merge patch) and Node condition (strategic merge on /status)."""
    label: str | None = "true" if requested else None
    await kube.request("PATCH", f"/api/v1/nodes/{node}", body={"metadata": {"labels": {REMEDIATION_LABEL: label}}},
                       content_type="application/merge-patch+json", fence=fence)
    cond = remediation_condition(requested, message, clock_.rfc3339(clock.now()))
    await kube.request("PATCH", f"/api/v1/nodes/{node}/status", body={"status": {"conditions": [cond]}},
                       content_type="application/strategic-merge-patch+json", fence=fence)
