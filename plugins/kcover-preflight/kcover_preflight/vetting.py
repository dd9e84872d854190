"""Which PreflightReports count, and for what: a report is trusted only as far as its writer.

A report's text comes from the workload's own init container, which runs the tenant's image, and
anyone who may create PreflightReports (the agents, admins) could write one. So before the verdict
reads a report (`vet`):

* its owner is a live pod in the report's namespace (a cross-namespace ownerReference is refused);
* the report is for the node that pod runs on: `spec.nodeName` is the pod's `spec.nodeName`, and the
  file's `node_name`, when set, names it too;
* the pod belongs to the workload the report names, in that workload's namespace: the pod resolves to a
  workload (`ownership.resolve`, controller ownerReferences with uids), the report's `workloadUID` is a
  controller of that chain, and its `workloadName` the pod's membership label. The report is grouped
  under the workload the pod resolves to, never under the names it states;
* its self-reported checks speak only for that node, and a failed `gpu_check` only where there are GPUs
  to check: on a GPU node, from a pod that holds GPUs (`gpus.GpuRule.holds_gpus`).

What a workload's reports can then say is about its own nodes: pair entries that are not a member's
`node_ip` (or node name) are dropped by the verdict (`judging`), and the `workload_size` a report states is
checked against the workload (`expected_size`: at least the workload's live pods that run the preflight
init container, so one rank cannot shrink the set to itself). Pure: reads the cluster cache, no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kcover.detectors import contract
from kcover_preflight import resources


class Refusal(enum.StrEnum):
    """Why a report does not count (`kcover_preflight_reports_refused_total{reason}`)."""

    UNREADABLE = "unreadable"
    OWNER_OTHER_NAMESPACE = "owner_in_another_namespace"
    NOT_OWNER_NODE = "not_the_owner_pods_node"
    OWNER_NOT_A_WORKLOAD = "owner_not_in_a_workload"
    WORKLOAD_MISMATCH = "workload_mismatch"


class Cache(Protocol):
    """What vetting reads of the controller's cluster cache (`kcover.kube.caching.ClusterCache`)."""

    def pod(self, uid: str) -> contract.Pod | None: ...

    def resolve(self, pod: contract.Pod) -> contract.Resolved | contract.Unresolved: ...

    def pods_of_workload(self, workload_uid: str) -> Sequence[contract.Pod]: ...

    def node(self, name: str) -> contract.Node | None: ...

    def is_gpu_node(self, node: contract.Node) -> bool: ...

    def holds_gpus(self, pod: contract.Pod) -> bool: ...


@dataclass(frozen=True)
class Vetted:
    """A report that counts: for `node`, from `pod`, of `workload`."""

    report: resources.Stored
    pod: contract.Pod
    workload: contract.Workload
    node: str
    gpu_node: bool
    """Whether `node` is a GPU node and `pod` holds GPUs there: only then does a failed `gpu_check` count."""


@dataclass(frozen=True)
class Refused:
    report: resources.Stored
    reason: Refusal
    text: str


def _gone(cache: Cache, r: resources.Stored) -> bool:
    pod = cache.pod(r.pod_uid) if r.pod_uid else None
    return pod is None or pod.deleting


def vet(r: resources.Stored, cache: Cache) -> Vetted | Refused | None:
    """Whether `r` counts; None when its owner pod is gone (a restarted job's history: not a refusal)."""
    if _gone(cache, r):
        return None
    pod = cache.pod(r.pod_uid)
    assert pod is not None
    if r.report is None:
        return Refused(r, Refusal.UNREADABLE, r.problem)
    if pod.namespace != r.namespace:
        return Refused(r, Refusal.OWNER_OTHER_NAMESPACE,
                       f"owned by pod {pod.namespace}/{pod.name}, another namespace than the report's {r.namespace}")
    if not r.node or pod.node != r.node or r.report.node_name not in ("", r.node):
        return Refused(r, Refusal.NOT_OWNER_NODE,
                       f"for node {r.node or r.report.node_name or '(none)'}, but its pod {pod.name} runs on "
                       f"{pod.node or '(no node)'}")
    resolved = cache.resolve(pod)
    if not isinstance(resolved, contract.Resolved):
        return Refused(r, Refusal.OWNER_NOT_A_WORKLOAD, f"pod {pod.name} belongs to no workload: {resolved.text}")
    workload = resolved.workload
    controllers = {c.uid for c in resolved.chain} | ({pod.owner.uid} if pod.owner is not None else set())
    labels = {value for key, value in pod.labels if key in contract.MEMBERSHIP_LABELS}
    if (r.workload_uid and r.workload_uid not in controllers) or r.workload not in labels | {workload.name} \
            or r.report.workload != r.workload:
        return Refused(r, Refusal.WORKLOAD_MISMATCH,
                       f"names workload {r.workload} ({r.workload_uid or 'no uid'}), but its pod {pod.name} belongs "
                       f"to {workload.kind} {workload.namespace}/{workload.name} ({workload.uid})")
    node = cache.node(r.node)
    return Vetted(r, pod, workload, r.node,
                  gpu_node=node is not None and cache.is_gpu_node(node) and cache.holds_gpus(pod))


def expected_size(vetted: Sequence[Vetted], cache: Cache, *, init_container: str) -> int:
    """How many ranks the workload's preflight runs over: what its reports state, but never fewer than
    its live pods that run the preflight init container (nor than the pods that reported)."""
    if not vetted:
        return 0
    workload = vetted[0].workload
    running = sum(1 for p in cache.pods_of_workload(workload.uid) if not p.deleting
                  and any(c.init and c.name == init_container for c in p.containers))
    stated = max(v.report.report.workload_size for v in vetted if v.report.report is not None)
    return max(stated, running, len({v.pod.uid for v in vetted}))


def describe(refused: Refused) -> dict[str, Any]:
    """Log fields of a refusal."""
    r = refused.report
    return {"namespace": r.namespace, "report": r.name, "reason": refused.reason.value, "why": refused.text}
