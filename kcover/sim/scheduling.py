"""What kube-scheduler's default profile decides for one pod, as pure functions over plain manifests.

Owns the filters the simulated scheduler runs on each node, in the default profile's order, each
node stopping at its first failure: NodeUnschedulable (a cordon), TaintToleration (NoSchedule and
NoExecute taints the pod does not tolerate), NodeAffinity (`nodeSelector` only; affinity terms are
not simulated) and NodeResourcesFit (the pod's requests, `nvidia.com/gpu` and any other extended
resource included, against the node's `status.allocatable` less what the pods already bound there
request; the pod count against `allocatable.pods`). Requests are what kube-scheduler computes: per
resource the larger of the containers' sum and any one init container, a container's request
defaulting to its limit (kube-apiserver's defaulting; objects seeded through the store skip it), plus
`spec.overhead`. Pods bound to a node count until they are gone or terminal (Succeeded, Failed),
terminating ones included.

When no node fits, `Verdict.message` is kube-scheduler 1.36's FitError text, checked against its
source (pkg/scheduler/framework/types.go, plugins/noderesources/fit.go, preemption): "0/N nodes are
available: " and the sorted histogram of the nodes' reasons, then the DynamicResources and
DefaultPreemption post-filters' verdicts. Every simulated pod has the same priority, so preemption
finds no victims on a node that failed only for resources ("No preemption victims found for incoming
pod") and is not helpful where a node failed for anything else, or for a request larger than the
node's allocatable. Quantities that do not parse count as zero. It does no I/O (`actors.Kubelets`
binds and writes the PodScheduled condition and the FailedScheduling Event).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

Obj = dict[str, Any]
_SUFFIXES = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
             "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
             "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
             "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
             "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$")
TERMINAL = ("Succeeded", "Failed")
UNSCHEDULABLE = "node(s) were unschedulable"
UNTOLERATED = "node(s) had untolerated taint(s)"
SELECTOR = "node(s) didn't match Pod's node affinity/selector"
TOO_MANY_PODS = "Too many pods"
NO_VICTIMS = "No preemption victims found for incoming pod"
NOT_HELPFUL = "Preemption is not helpful for scheduling"
NO_CLAIMS = "no new claims to deallocate"


def quantity(value: Any) -> Decimal:
    """A resource.Quantity ("500m", "2Ti", "8", 4) as a number of base units; 0 when it does not parse."""
    if isinstance(value, bool):
        return Decimal(0)
    if isinstance(value, int | float):
        return Decimal(str(value))
    match = _QUANTITY.match(str(value).strip())
    if match is None:
        return Decimal(0)
    try:
        return Decimal(match[1]) * _SUFFIXES[match[2]]
    except InvalidOperation:
        return Decimal(0)


def _container_requests(container: Mapping[str, Any]) -> dict[str, Decimal]:
    resources = container.get("resources") or {}
    out = {str(k): quantity(v) for k, v in (resources.get("limits") or {}).items()}
    out.update({str(k): quantity(v) for k, v in (resources.get("requests") or {}).items()})
    return out


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """What the pod requests, per resource name (cpu in cores, memory in bytes, extended resources as counts)."""
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for c in spec.get("containers") or []:
        for name, amount in _container_requests(c).items():
            total[name] = total.get(name, Decimal(0)) + amount
    for c in spec.get("initContainers") or []:
        for name, amount in _container_requests(c).items():
            total[name] = max(total.get(name, Decimal(0)), amount)
    for name, amount in (spec.get("overhead") or {}).items():
        total[str(name)] = total.get(str(name), Decimal(0)) + quantity(amount)
    return {k: v for k, v in total.items() if v > 0}


def tolerated(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    for tol in tolerations:
        if tol.get("effect") not in (None, "", taint.get("effect")):
            continue
        if tol.get("operator") == "Exists" and not tol.get("key"):
            return True
        if tol.get("key") == taint.get("key") and (tol.get("operator") == "Exists"
                                                   or (tol.get("value") or "") == (taint.get("value") or "")):
            return True
    return False


def selected(node: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """The pod's `nodeSelector` matches the node's labels (node affinity is not simulated)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in ((pod.get("spec") or {}).get("nodeSelector") or {}).items())


@dataclass
class Usage:
    """What the pods bound to one node take: summed requests and a pod count."""

    requested: dict[str, Decimal] = field(default_factory=dict)
    pods: int = 0

    def add(self, pod: Mapping[str, Any]) -> None:
        self.pods += 1
        for name, amount in pod_requests(pod).items():
            self.requested[name] = self.requested.get(name, Decimal(0)) + amount


def usage(pods: Iterable[Mapping[str, Any]], *, skip_uid: str = "") -> dict[str, Usage]:
    """Node name -> what its bound, non-terminal pods take (the pod being scheduled, `skip_uid`, left out)."""
    out: dict[str, Usage] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in TERMINAL:
            continue
        if skip_uid and (pod.get("metadata") or {}).get("uid") == skip_uid:
            continue
        out.setdefault(str(node), Usage()).add(pod)
    return out


@dataclass(frozen=True)
class NodeResult:
    reasons: tuple[str, ...] = ()
    resolvable: bool = True
    """Whether preemption could help here (only a NodeResourcesFit failure within the node's allocatable)."""

    @property
    def fits(self) -> bool:
        return not self.reasons


def filter_node(node: Mapping[str, Any], pod: Mapping[str, Any], used: Usage | None) -> NodeResult:
    """The default profile's filters on one node, stopping at the first that fails."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return NodeResult((UNSCHEDULABLE,), False)
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    if any(t.get("effect") in ("NoSchedule", "NoExecute") and not tolerated(t, tolerations)
           for t in spec.get("taints") or []):
        return NodeResult((UNTOLERATED,), False)
    if not selected(node, pod):
        return NodeResult((SELECTOR,), False)
    used = used or Usage()
    allocatable = {str(k): quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
    reasons: list[str] = []
    unresolvable = False
    if "pods" in allocatable and used.pods + 1 > allocatable["pods"]:
        reasons.append(TOO_MANY_PODS)
    for name, amount in sorted(pod_requests(pod).items()):
        if name == "pods":
            continue
        have = allocatable.get(name, Decimal(0))
        if amount > have - used.requested.get(name, Decimal(0)):
            reasons.append(f"Insufficient {name}")
            unresolvable = unresolvable or amount > have
    return NodeResult(tuple(reasons), not unresolvable)


@dataclass(frozen=True)
class Verdict:
    """Where the pod may go (node names, in the given order), or why it may not (`message`)."""

    feasible: tuple[str, ...]
    message: str = ""


def schedule(nodes: Sequence[Mapping[str, Any]], pod: Mapping[str, Any], used: Mapping[str, Usage]) -> Verdict:
    """Filter every node for `pod`; with none left, kube-scheduler's FitError message."""
    results = {str(n["metadata"]["name"]): filter_node(n, pod, used.get(str(n["metadata"]["name"]))) for n in nodes}
    feasible = tuple(name for name, r in results.items() if r.fits)
    if feasible:
        return Verdict(feasible)
    return Verdict((), fit_error(pod, list(results.values())))


def _histogram(reasons: Iterable[str]) -> str:
    counts: dict[str, int] = {}
    for reason in reasons:
        counts[reason] = counts.get(reason, 0) + 1
    return ", ".join(sorted(f"{n} {why}" for why, n in counts.items()))


def fit_error(pod: Mapping[str, Any], results: Sequence[NodeResult]) -> str:
    """FitError.Error(): the filters' histogram, then the post-filters (DynamicResources, DefaultPreemption)."""
    n = len(results)
    if not n:
        return "0/0 nodes are available: no nodes available to schedule pods."
    message = f"0/{n} nodes are available: {_histogram(r for res in results for r in res.reasons)}."
    # DynamicResources: the sim deallocates no claims (a pod without claims gets the same answer)
    preemption = [NO_VICTIMS if r.resolvable else NOT_HELPFUL for r in results]
    return f"{message} {NO_CLAIMS}, preemption: 0/{n} nodes are available: {_histogram(preemption)}."

