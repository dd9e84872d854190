"""Workload adapters: which kinds kcover can restart, how to find a pod's workload, how to select its pods.

Owns, per supported kind (Kubeflow v1 jobs, Kubeflow Trainer TrainJob, JobSet, Volcano Job,
LeaderWorkerSet, batch/v1 Job): the membership labels, the uid-bearing label where the operator sets
one, whether the kind's own spec forbids a restart, and owner resolution through controller
ownerReferences with uid checks. Pure: it reads views through `OwnerLookup` and does no I/O.

Choices, documented because they decide what gets deleted:
* A pod with no controller (a bare pod) is never deleted: nothing would recreate it.
* An owner kind not listed here (ReplicaSet, DaemonSet, ...) is refused with `UnsupportedOwner`.
* Kubeflow v1, Volcano and TrainJob-less JobSets from old releases set no uid label on pods. The
  selector is then narrowed with every identifying label the faulting pod carries (the Kubeflow
  operator-name label tells kinds apart), and `verify_members()` resolves every pod the labels select
  back to the workload uid. If any selected pod belongs elsewhere, the restart deletes exactly the
  verified pods one by one with `preconditions.uid` instead of one DeleteCollection.
* Kubeflow v1: a job whose replicas all say `restartPolicy: Never` is not restarted (the operator
  would not recreate failed replicas; the job is meant to fail). A missing restartPolicy is allowed.
* batch/v1 Job: deleting a pod counts as a pod failure towards `backoffLimit`; the Job controller
  recreates the pod while the limit allows. So a Job is restartable unless `backoffLimit` is 0, where
  a delete fails the Job instead of restarting it.
* LeaderWorkerSet: the restart unit is the faulting pod's group (`group-index`), not the whole set.
* TrainJob: restarted through the JobSet of the same name it owns (pods carry the JobSet labels).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kcover.recovery import actions, views

KUBEFLOW_GROUP = "kubeflow.org"
KUBEFLOW_KINDS = frozenset({"PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob"})
KUBEFLOW_JOB_NAME = "training.kubeflow.org/job-name"
KUBEFLOW_OPERATOR_NAME = "training.kubeflow.org/operator-name"
TRAINER_GROUP = "trainer.kubeflow.org"
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"
VOLCANO_GROUP = "batch.volcano.sh"
VOLCANO_JOB_NAME = "volcano.sh/job-name"
VOLCANO_JOB_NAMESPACE = "volcano.sh/job-namespace"
LWS_GROUP = "leaderworkerset.x-k8s.io"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
BATCH_JOB_NAME = "batch.kubernetes.io/job-name"
BATCH_CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
LEGACY_CONTROLLER_UID = "controller-uid"

MAX_OWNER_DEPTH = 6
"""Longest controller chain followed (LWS worker pod -> StatefulSet -> leader Pod -> StatefulSet -> LWS)."""


class Family(enum.StrEnum):
    KUBEFLOW_V1 = "kubeflow-v1"
    TRAINJOB = "trainjob"
    JOBSET = "jobset"
    VOLCANO = "volcano"
    LWS = "leaderworkerset"
    BATCH_JOB = "batch-job"


def family(group: str, kind: str) -> Family | None:
    """The restartable family of a (group, kind), or None."""
    if group == KUBEFLOW_GROUP and kind in KUBEFLOW_KINDS:
        return Family.KUBEFLOW_V1
    return {
        (TRAINER_GROUP, "TrainJob"): Family.TRAINJOB,
        (JOBSET_GROUP, "JobSet"): Family.JOBSET,
        (VOLCANO_GROUP, "Job"): Family.VOLCANO,
        (LWS_GROUP, "LeaderWorkerSet"): Family.LWS,
        ("batch", "Job"): Family.BATCH_JOB,
    }.get((group, kind))


_INTERMEDIATE = frozenset({("apps", "StatefulSet"), ("", "Pod")})
"""Kinds followed upwards but never restarted themselves (the LWS chain)."""


def followable(group: str, kind: str) -> bool:
    return family(group, kind) is not None or (group, kind) in _INTERMEDIATE


class OwnerLookup(Protocol):
    """The part of `policy.ClusterSnapshot` that owner resolution needs."""

    def pod(self, uid: str) -> views.PodView | None: ...

    def workload(self, uid: str) -> views.WorkloadView | None: ...

    def pods_with_label(self, namespace: str, key: str, value: str) -> Sequence[views.PodView]: ...

    def workload_by_name(self, group: str, kind: str, namespace: str, name: str) -> views.WorkloadView | None: ...


SELECTOR_LABELS = frozenset({KUBEFLOW_JOB_NAME, KUBEFLOW_OPERATOR_NAME, JOBSET_NAME, JOBSET_UID, VOLCANO_JOB_NAME,
                             VOLCANO_JOB_NAMESPACE, LWS_NAME, LWS_GROUP_INDEX, BATCH_JOB_NAME,
                             BATCH_CONTROLLER_UID, LEGACY_CONTROLLER_UID})
"""Pod labels the restart selectors use; a cache must keep these (and the opt-in label) on its pod views."""


# ------------------------------------------------------------------------------------------ projection

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


def restart_forbidden(obj: Mapping[str, Any]) -> str:
    """`forbidden_by()` read from a raw object."""
    api_version = str(obj.get("apiVersion", ""))
    group = api_version.rpartition("/")[0] if "/" in api_version else ""
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        return ""
    policies: list[str] = []
    for key, replicas in spec.items():
        if key.endswith("ReplicaSpecs") and isinstance(replicas, Mapping):
            policies += [str((r or {}).get("restartPolicy", "")) for r in replicas.values()]
    limit = spec.get("backoffLimit")
    conditions = (obj.get("status") or {}).get("conditions") or []
    finished = any(isinstance(c, Mapping) and c.get("type") in _TERMINAL and c.get("status") == "True"
                   for c in conditions)
    return forbidden_by(group, str(obj.get("kind", "")), replica_policies=policies,
                        backoff_limit=limit if isinstance(limit, int) else None, finished=finished)


_TERMINAL = frozenset({"Succeeded", "Failed", "Complete", "Completed"})


def workload_view(obj: Mapping[str, Any]) -> views.WorkloadView:
    """The view the cache should keep for a workload or intermediate controller object."""
    return views.workload_view(obj, restart_forbidden=restart_forbidden(obj))


# ------------------------------------------------------------------------------------------ resolution

@dataclass(frozen=True)
class Resolved:
    workload: views.WorkloadView
    family: Family
    chain: tuple[views.WorkloadView | views.PodView, ...]
    """Controllers from the pod's direct owner up to `workload`, inclusive."""


@dataclass(frozen=True)
class Refused:
    code: actions.SkipCode
    text: str


def resolve(lookup: OwnerLookup, pod: views.PodView) -> Resolved | Refused:
    """Follow controller ownerReferences from `pod` to the top-most restartable workload."""
    ref = pod.owner
    if ref is None:
        return Refused(actions.SkipCode.NO_CONTROLLER,
                       f"Pod {pod.namespace}/{pod.name} has no controller: nothing would recreate it")
    chain: list[views.WorkloadView | views.PodView] = []
    for _ in range(MAX_OWNER_DEPTH):
        if not followable(ref.group, ref.kind):
            break
        found: views.WorkloadView | views.PodView | None
        found = lookup.pod(ref.uid) if (ref.group, ref.kind) == ("", "Pod") else lookup.workload(ref.uid)
        if found is None and (ref.group, ref.kind) == ("apps", "StatefulSet") and pod.labels.get(LWS_NAME):
            # Caches that do not watch StatefulSets: the LWS is named by its label; the owner kind
            # (StatefulSet, not another restartable kind) rules out a same-named job of another kind.
            lws = lookup.workload_by_name(LWS_GROUP, "LeaderWorkerSet", pod.namespace, pod.labels[LWS_NAME])
            if lws is not None:
                chain.append(lws)
                break
        if found is None:
            return Refused(actions.SkipCode.OWNER_NOT_CACHED,
                           f"owner {ref.kind} {pod.namespace}/{ref.name} (uid {ref.uid}) is not in the cache")
        if found.uid != ref.uid or found.name != ref.name or found.namespace != pod.namespace:
            return Refused(actions.SkipCode.OWNER_MISMATCH,
                           f"owner {ref.kind} {pod.namespace}/{ref.name} does not match uid {ref.uid}")
        if isinstance(found, views.WorkloadView) and found.kind != ref.kind:
            return Refused(actions.SkipCode.OWNER_MISMATCH,
                           f"uid {ref.uid} is a {found.kind}, the ownerReference says {ref.kind}")
        chain.append(found)
        if found.owner is None:
            break
        ref = found.owner
    top = chain[-1] if chain else None
    fam = family(top.group, top.kind) if isinstance(top, views.WorkloadView) else None
    if not isinstance(top, views.WorkloadView) or fam is None:
        return Refused(actions.SkipCode.UNSUPPORTED_OWNER,
                       f"Pod {pod.namespace}/{pod.name} is controlled by {ref.kind} {ref.name}"
                       f" ({ref.api_version}), not a kind kcover restarts")
    return Resolved(workload=top, family=fam, chain=tuple(chain))


# ------------------------------------------------------------------------------------------ selection

@dataclass(frozen=True)
class Unit:
    selector: actions.MemberSelector
    ledger_key: str
    description: str = ""


def restart_unit(resolved: Resolved, pod: views.PodView) -> Unit:
    """The labels selecting the restart unit's pods, its ledger key and, for LWS, which group."""
    w = resolved.workload
    labels: list[tuple[str, str]] = []
    uid_bearing = False
    key = f"w.{w.uid}"
    description = ""
    fam = resolved.family
    pl = pod.labels
    if fam is Family.KUBEFLOW_V1:
        labels.append((KUBEFLOW_JOB_NAME, w.name))
        if pl.get(KUBEFLOW_OPERATOR_NAME):
            labels.append((KUBEFLOW_OPERATOR_NAME, pl[KUBEFLOW_OPERATOR_NAME]))
    elif fam in (Family.JOBSET, Family.TRAINJOB):
        jobset = w if fam is Family.JOBSET else _jobset_in(resolved.chain)
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


def _jobset_in(chain: Sequence[views.WorkloadView | views.PodView]) -> views.WorkloadView | None:
    for item in chain:
        if isinstance(item, views.WorkloadView) and (item.group, item.kind) == (JOBSET_GROUP, "JobSet"):
            return item
    return None


@dataclass(frozen=True)
class Members:
    verified: tuple[views.PodView, ...]
    foreign: tuple[views.PodView, ...]


def members(lookup: OwnerLookup, selector: actions.MemberSelector, namespace: str,
            workload_uid: str) -> Members:
    """The pods the selector's labels match in `namespace`, split by whether they resolve to the workload."""
    if not selector.labels:
        return Members((), ())
    first_key, first_value = selector.labels[0]
    verified: list[views.PodView] = []
    foreign: list[views.PodView] = []
    for pod in lookup.pods_with_label(namespace, first_key, first_value):
        if not selector.matches(pod.labels):
            continue
        if selector.uid_bearing:
            verified.append(pod)
            continue
        resolved = resolve(lookup, pod)
        if isinstance(resolved, Resolved) and resolved.workload.uid == workload_uid:
            verified.append(pod)
        else:
            foreign.append(pod)
    return Members(tuple(verified), tuple(foreign))


def safe_selector(lookup: OwnerLookup, selector: actions.MemberSelector, namespace: str,
                  workload_uid: str) -> actions.MemberSelector:
    """`selector` if its labels select only the workload's pods, else one naming the verified pods."""
    if selector.uid_bearing:
        return selector
    found = members(lookup, selector, namespace, workload_uid)
    if not found.foreign:
        return actions.MemberSelector(selector.labels, uid_bearing=False)
    pods = tuple(actions.PodRef(p.namespace, p.name, p.uid) for p in found.verified)
    return actions.MemberSelector(selector.labels, uid_bearing=False, pods=pods)


def opted_in_pod(pod: views.PodView) -> bool:
    return pod.labels.get(views.OPT_IN_LABEL) == "true"


def opted_in(pod: views.PodView, resolved: Resolved) -> bool:
    """Opt-in label on the pod, its workload, or any controller between them."""
    if opted_in_pod(pod):
        return True
    return any(item.labels.get(views.OPT_IN_LABEL) == "true" for item in resolved.chain)


def workload_ref(w: views.WorkloadView) -> actions.WorkloadRef:
    return actions.WorkloadRef(kind=w.kind, api_version=w.api_version, name=w.name, namespace=w.namespace,
                               uid=w.uid)
