"""Workload adapters: which kinds kcover can restart, how to find a pod's workload, how to select its pods.

Owns, per supported kind (Kubeflow v1 jobs, Kubeflow Trainer TrainJob, JobSet, Volcano Job,
LeaderWorkerSet, batch/v1 Job): the membership labels, the uid-bearing label where the operator sets
one, whether the kind's own spec or state forbids a restart, and which pods a restart selects. Owner
resolution and opt-in are `kube.ownership`'s (the detectors use the same); this module turns its
answers into the policy's skip codes. Pure: it reads the cache's projections through `OwnerLookup`
and does no I/O.

Choices, documented because they decide what gets deleted:
* A pod with no controller (a bare pod) is never deleted: nothing would recreate it.
* An owner kind not listed here (ReplicaSet, DaemonSet, ...) is refused with `UnsupportedOwner`.
* Deletes touch only the workload's pods. Where the operator puts the workload's uid in a pod label
  (batch/v1 Job `batch.kubernetes.io/controller-uid`, JobSet and so TrainJob `jobset.sigs.k8s.io/jobset-uid`)
  the selector carries it and the restart is ONE DeleteCollection: no other workload's pod can match,
  now or while the restart is in flight. Kubeflow v1, Volcano, LeaderWorkerSet and JobSets from
  releases without the uid label set no such label: any pod created with the same labels (by anyone
  who may create pods there) would match a label selector at the moment of the delete. Their
  restarts therefore delete exactly the pods the cache resolved to the workload uid, one by one, each
  with `preconditions.uid` (`members()`): a pod created meanwhile, or a recreated pod with a recorded
  name, is never deleted. The cost: one request per pod instead of one per restart (docs/security.md).
* Kubeflow v1: a job whose replicas all say `restartPolicy: Never` is not restarted (the operator
  would not recreate failed replicas; the job is meant to fail). A missing restartPolicy is allowed.
* batch/v1 Job: deleting a pod counts as a pod failure towards `backoffLimit`; the Job controller
  recreates the pod while the limit allows. So a Job is restartable unless `backoffLimit` is 0, where
  a delete fails the Job instead of restarting it.
* Evict, not delete, where the kind's controller counts a deleted pod as a failure (`evicts()`): the
  batch/v1 Job controller counts a deleted pod towards `backoffLimit` (observed on a real
  kube-controller-manager 1.36: `status.failed` +1), while an evicted pod gets the `DisruptionTarget`
  condition first, which a `podFailurePolicy` rule `Ignore` on `DisruptionTarget` keeps out of the
  count. JobSet (and TrainJob through it) run their pods in child batch/v1 Jobs: the same holds.
  Kubeflow v1, Volcano and LWS recreate deleted pods without counting them: plain deletes.
* LeaderWorkerSet: the restart unit is the faulting pod's group (`group-index`), not the whole set.
* TrainJob: restarted through the JobSet of the same name it owns (pods carry the JobSet labels).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kcover.kube import ownership
from kcover.kube import projections as proj
from kcover.recovery import actions

KUBEFLOW_GROUP = ownership.KUBEFLOW_GROUP
KUBEFLOW_JOB_NAME = "training.kubeflow.org/job-name"
KUBEFLOW_OPERATOR_NAME = "training.kubeflow.org/operator-name"
TRAINER_GROUP = ownership.TRAINER_GROUP
JOBSET_GROUP = ownership.JOBSET_GROUP
JOBSET_NAME = ownership.JOBSET_NAME
JOBSET_UID = ownership.JOBSET_UID
VOLCANO_GROUP = ownership.VOLCANO_GROUP
VOLCANO_JOB_NAME = "volcano.sh/job-name"
VOLCANO_JOB_NAMESPACE = "volcano.sh/job-namespace"
LWS_GROUP = ownership.LWS_GROUP
LWS_NAME = ownership.LWS_NAME
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
BATCH_JOB_NAME = "batch.kubernetes.io/job-name"
BATCH_CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
LEGACY_CONTROLLER_UID = "controller-uid"

Family = ownership.Family
family = ownership.family
Resolved = ownership.Resolved


class OwnerLookup(ownership.Lookup, Protocol):
    """The part of `policy.ClusterSnapshot` that owner resolution and member selection need."""

    def pods_with_label(self, namespace: str, key: str, value: str) -> Sequence[proj.Pod]: ...


SELECTOR_LABELS = frozenset({KUBEFLOW_JOB_NAME, KUBEFLOW_OPERATOR_NAME, JOBSET_NAME, JOBSET_UID, VOLCANO_JOB_NAME,
                             VOLCANO_JOB_NAMESPACE, LWS_NAME, LWS_GROUP_INDEX, BATCH_JOB_NAME,
                             BATCH_CONTROLLER_UID, LEGACY_CONTROLLER_UID})
"""Pod labels the restart selectors use; the cache keeps these (and the opt-in label) on its pods."""


# ------------------------------------------------------------------------------------------ restart policy

def forbidden_by(group: str, kind: str, *, replica_policies: Sequence[str], backoff_limit: int | None,
                 finished: bool = False) -> str:
    """Why a workload's own spec or state forbids a restart, or ''."""
    if finished:
        return "it has finished (a terminal condition is True): its operator would not recreate pods"
    fam = family(group, kind)
    if fam is Family.KUBEFLOW_V1 and replica_policies and all(p == "Never" for p in replica_policies):
        return "every replica has restartPolicy Never: the operator would not recreate deleted replicas"
    if fam is Family.BATCH_JOB and backoff_limit == 0:
        return "backoffLimit is 0: deleting its pods would fail the Job instead of restarting it"
    return ""


def restart_forbidden(w: proj.Workload) -> str:
    """`forbidden_by()` read from the cached workload: why its spec or state forbids a restart, or ''."""
    return forbidden_by(w.group, w.kind, replica_policies=[p for _, p in w.restart_policies],
                        backoff_limit=w.max_restarts if (w.group, w.kind) == ("batch", "Job") else None,
                        finished=w.finished)


# ------------------------------------------------------------------------------------------ resolution

@dataclass(frozen=True)
class Refused:
    code: actions.SkipCode
    text: str


def resolve(lookup: ownership.Lookup, pod: proj.Pod) -> Resolved | Refused:
    """`ownership.resolve`, its problems as the policy's skip codes."""
    found = ownership.resolve(lookup, pod)
    if isinstance(found, ownership.Unresolved):
        return Refused(actions.SkipCode(found.problem.value), found.text)
    return found


# ------------------------------------------------------------------------------------------ selection

@dataclass(frozen=True)
class Unit:
    selector: actions.MemberSelector
    ledger_key: str
    description: str = ""


def restart_unit(resolved: Resolved, pod: proj.Pod) -> Unit:
    """The labels selecting the restart unit's pods, its ledger key and, for LWS, which group."""
    w = resolved.workload
    labels: list[tuple[str, str]] = []
    uid_bearing = False
    key = f"w.{w.uid}"
    description = ""
    fam = resolved.family
    pl = dict(pod.labels)
    if fam is Family.KUBEFLOW_V1:
        labels.append((KUBEFLOW_JOB_NAME, w.name))
        if pl.get(KUBEFLOW_OPERATOR_NAME):
            labels.append((KUBEFLOW_OPERATOR_NAME, pl[KUBEFLOW_OPERATOR_NAME]))
    elif fam in (Family.JOBSET, Family.TRAINJOB):
        jobset = w if fam is Family.JOBSET else ownership.jobset_in(resolved.chain)
        labels.append((JOBSET_NAME, jobset.name if jobset else w.name))
        if jobset is not None and pl.get(JOBSET_UID) == jobset.uid:
            labels.append((JOBSET_UID, jobset.uid))
            uid_bearing = True
    elif fam is Family.VOLCANO:
        labels.append((VOLCANO_JOB_NAME, w.name))
        if pl.get(VOLCANO_JOB_NAMESPACE) == w.namespace:
            labels.append((VOLCANO_JOB_NAMESPACE, w.namespace))
    elif fam is Family.LWS:
        labels.append((LWS_NAME, w.name))
        group = pl.get(LWS_GROUP_INDEX, "")
        if group:
            labels.append((LWS_GROUP_INDEX, group))
            key = f"w.{w.uid}.g{group}"
            description = f"group {group}"
    elif fam is Family.BATCH_JOB:
        if pl.get(BATCH_CONTROLLER_UID) == w.uid:
            labels.append((BATCH_CONTROLLER_UID, w.uid))
            uid_bearing = True
        elif pl.get(LEGACY_CONTROLLER_UID) == w.uid:
            labels.append((LEGACY_CONTROLLER_UID, w.uid))
            uid_bearing = True
        else:
            labels.append((BATCH_JOB_NAME, w.name))
    return Unit(actions.MemberSelector(tuple(labels), uid_bearing=uid_bearing), key, description)


@dataclass(frozen=True)
class Members:
    verified: tuple[proj.Pod, ...]
    foreign: tuple[proj.Pod, ...]


def members(lookup: OwnerLookup, selector: actions.MemberSelector, namespace: str,
            workload_uid: str) -> Members:
    """The pods the selector's labels match in `namespace`, split by whether they resolve to the workload."""
    if not selector.labels:
        return Members((), ())
    first_key, first_value = selector.labels[0]
    verified: list[proj.Pod] = []
    foreign: list[proj.Pod] = []
    for pod in lookup.pods_with_label(namespace, first_key, first_value):
        if not selector.matches(pod.labels):
            continue
        if selector.uid_bearing:
            verified.append(pod)
            continue
        resolved = ownership.resolve(lookup, pod)
        if isinstance(resolved, Resolved) and resolved.workload.uid == workload_uid:
            verified.append(pod)
        else:
            foreign.append(pod)
    return Members(tuple(verified), tuple(foreign))


def safe_selector(lookup: OwnerLookup, selector: actions.MemberSelector, namespace: str,
                  workload_uid: str) -> actions.MemberSelector:
    """`selector` when a label carries the workload's uid (one DeleteCollection), else one naming the pods
    the cache verified as the workload's, for uid-preconditioned deletes (see the module docstring)."""
    if selector.uid_bearing:
        return selector
    found = members(lookup, selector, namespace, workload_uid)
    pods = tuple(actions.PodRef(p.namespace, p.name, p.uid)
                 for p in sorted(found.verified, key=lambda p: p.name) if not p.deleting)
    return actions.MemberSelector(selector.labels, uid_bearing=False, pods=pods)


def workload_ref(w: proj.Workload) -> actions.WorkloadRef:
    return actions.WorkloadRef(kind=w.kind, api_version=w.api_version, name=w.name, namespace=w.namespace,
                               uid=w.uid)


_EVICTED = frozenset({Family.BATCH_JOB, Family.JOBSET, Family.TRAINJOB})


def evicts(group: str, kind: str) -> bool:
    """Restart this kind's pods through the Eviction API (its controller counts deletes as failures)."""
    return family(group, kind) in _EVICTED
