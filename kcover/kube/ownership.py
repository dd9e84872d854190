"""Who owns a pod, and whether it opted in: the one answer detectors, policy and executors share.

Owns owner resolution (the kinds themselves are `kcover.kinds`'), from a pod up through controller
ownerReferences with uid checks (`resolve`), the membership labels it may fall back on where an
intermediate controller is not cached, and the opt-in rule.

Resolution: from the pod's controller ownerReference, follow restartable kinds and the intermediate
kinds between them (an LWS's StatefulSets and leader Pod), each step checking the cached object's uid,
name, namespace and kind against the reference. The top is the restart unit's workload: a TrainJob
above its JobSet above its Jobs, a JobSet above its Jobs, an LWS above its StatefulSets. Two fallbacks
where the intermediate controller is not cached (kcover watches no StatefulSets; `jobs.batch` may
be left out of `kube.workload_kinds`): a pod owned by a StatefulSet resolves to the LeaderWorkerSet its
`leaderworkerset.sigs.k8s.io/name` label names, one owned by a batch Job to the JobSet its
`jobset.sigs.k8s.io/jobset-name` label names (and, when the pod carries `jobset-uid`, only to the JobSet
of that uid). The owner kind (not a restartable kind itself) rules out a same-named job of another kind.

Opt-in rule: the label `kcover.io/cascading-recovery` opts in when its value is `true` compared
case-insensitively (`true`, `True`, `TRUE`), on the pod or on any controller of its resolved chain.
Every other value (`yes`, `1`, empty) does not.

Pure: it reads projections through `Lookup` and does no I/O. Failures are values (`Unresolved`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kcover import kinds
from kcover.kube import projections as proj

KUBEFLOW_GROUP = kinds.KUBEFLOW_GROUP
TRAINER_GROUP = kinds.TRAINER_GROUP
JOBSET_GROUP = kinds.JOBSET_GROUP
JOBSET_NAME = kinds.JOBSET_NAME
JOBSET_UID = kinds.JOBSET_UID
VOLCANO_GROUP = kinds.VOLCANO_GROUP
LWS_GROUP = kinds.LWS_GROUP
LWS_NAME = kinds.LWS_NAME

MAX_OWNER_DEPTH = 6
"""Longest controller chain followed (LWS worker pod -> StatefulSet -> leader Pod -> StatefulSet -> LWS)."""


Family = kinds.Family
family = kinds.family
followable = kinds.followable


class Lookup(Protocol):
    """The cache reads resolution needs (`caching.ClusterCache` provides them)."""

    def pod(self, uid: str) -> proj.Pod | None: ...

    def workload(self, uid: str) -> proj.Workload | None: ...

    def workload_by_name(self, group: str, kind: str, namespace: str, name: str) -> proj.Workload | None: ...


class Problem(enum.StrEnum):
    """Why a pod has no workload kcover restarts (the values are the policy's skip codes)."""

    NO_CONTROLLER = "NoController"
    OWNER_NOT_CACHED = "OwnerNotCached"
    OWNER_MISMATCH = "OwnerMismatch"
    UNSUPPORTED_OWNER = "UnsupportedOwner"


@dataclass(frozen=True)
class Resolved:
    workload: proj.Workload
    family: Family
    chain: tuple[proj.Workload | proj.Pod, ...]
    """Controllers from the pod's direct owner up to `workload`, inclusive."""


@dataclass(frozen=True)
class Unresolved:
    problem: Problem
    text: str


def _by_label(lookup: Lookup, pod: proj.Pod, ref: proj.OwnerRef) -> proj.Workload | None:
    """The workload a membership label names, for a pod whose intermediate owner `ref` is not cached."""
    if (ref.group, ref.kind) == ("apps", "StatefulSet"):
        name = proj.get(pod.labels, LWS_NAME)
        return lookup.workload_by_name(LWS_GROUP, "LeaderWorkerSet", pod.namespace, name) if name else None
    if (ref.group, ref.kind) == ("batch", "Job"):
        name = proj.get(pod.labels, JOBSET_NAME)
        found = lookup.workload_by_name(JOBSET_GROUP, "JobSet", pod.namespace, name) if name else None
        uid = proj.get(pod.labels, JOBSET_UID)
        return found if found is not None and (not uid or uid == found.uid) else None
    return None


def resolve(lookup: Lookup, pod: proj.Pod) -> Resolved | Unresolved:
    """Follow controller ownerReferences from `pod` to the top-most restartable workload."""
    ref = pod.owner
    if ref is None:
        return Unresolved(Problem.NO_CONTROLLER,
                          f"Pod {pod.namespace}/{pod.name} has no controller: nothing would recreate it")
    chain: list[proj.Workload | proj.Pod] = []
    for _ in range(MAX_OWNER_DEPTH):
        if not followable(ref.group, ref.kind):
            break
        found: proj.Workload | proj.Pod | None
        found = lookup.pod(ref.uid) if (ref.group, ref.kind) == ("", "Pod") else lookup.workload(ref.uid)
        if found is None:
            named = _by_label(lookup, pod, ref)
            if named is None:
                return Unresolved(Problem.OWNER_NOT_CACHED,
                                  f"owner {ref.kind} {pod.namespace}/{ref.name} (uid {ref.uid}) is not in the cache")
            found = named
        elif found.uid != ref.uid or found.name != ref.name or found.namespace != pod.namespace:
            return Unresolved(Problem.OWNER_MISMATCH,
                              f"owner {ref.kind} {pod.namespace}/{ref.name} does not match uid {ref.uid}")
        elif isinstance(found, proj.Workload) and found.kind != ref.kind:
            return Unresolved(Problem.OWNER_MISMATCH,
                              f"uid {ref.uid} is a {found.kind}, the ownerReference says {ref.kind}")
        chain.append(found)
        if found.owner is None:
            break
        ref = found.owner
    top = chain[-1] if chain else None
    fam = family(top.group, top.kind) if isinstance(top, proj.Workload) else None
    if not isinstance(top, proj.Workload) or fam is None:
        return Unresolved(Problem.UNSUPPORTED_OWNER,
                          f"Pod {pod.namespace}/{pod.name} is controlled by {ref.kind} {ref.name}"
                          f" ({ref.api_version}), not a kind kcover restarts")
    return Resolved(workload=top, family=fam, chain=tuple(chain))


def jobset_in(chain: Sequence[proj.Workload | proj.Pod]) -> proj.Workload | None:
    for item in chain:
        if isinstance(item, proj.Workload) and (item.group, item.kind) == (JOBSET_GROUP, "JobSet"):
            return item
    return None


# ------------------------------------------------------------------------------------------ opt-in

def opt_in_value(value: str) -> bool:
    """The one comparison: `true` in any letter case opts in; anything else does not."""
    return value.lower() == "true"


def labelled(labels: proj.Pairs) -> bool:
    """These (projected) labels carry the opt-in label with an opting-in value."""
    return opt_in_value(proj.get(labels, proj.OPT_IN_LABEL))


def opts_out(value: str) -> bool:
    """`false` in any letter case: a pod or workload that says so stays out of its namespace's opt-in."""
    return value.lower() == "false"


def opted_in(pod: proj.Pod, resolved: Resolved | Unresolved | None, *, namespace: proj.Namespace | None) -> bool:
    """The opt-in label on the pod, or on any controller of its resolved chain (workload included); or on
    the pod's Namespace (`namespace`, None when not known), unless the pod or a controller of its chain
    carries the label with `false`. Who may set each: a Namespace's labels are written by whoever may patch
    Namespaces (cluster-scoped: the cluster's admins, not a namespace's tenants), a pod's or workload's by
    whoever may write them in that namespace (docs/security.md)."""
    own = [pod.labels, *(item.labels for item in resolved.chain)] if isinstance(resolved, Resolved) else [pod.labels]
    values = [proj.get(labels, proj.OPT_IN_LABEL) for labels in own]
    if any(opt_in_value(v) for v in values):
        return True
    return namespace is not None and namespace.name == pod.namespace and labelled(namespace.labels) \
        and not any(opts_out(v) for v in values)
