"""The workload kinds kcover restarts: one table, and everything else derived from it.

Owns, per kind: its API coordinates (group, version, plural), its family, the pod labels that name
it (membership), carry its uid (a uid-bearing selector no other workload can match) or narrow a
selector (a Kubeflow operator's name, a Volcano job's namespace, a LeaderWorkerSet group), how a
restart removes its pods (`Removal`), what of its spec forbids a restart, and its restart unit (the
whole workload, or one LeaderWorkerSet group). The cache's watched kinds and label indexes, the
projections' kept labels and restart fields, owner resolution's families and the recovery plan's
selectors and removals all read this table: adding a kind is one `WorkloadKind` entry.

Why each removal is what it is: the batch/v1 Job controller counts a *deleted* pod towards
`backoffLimit` (observed on a real kube-controller-manager 1.36: `status.failed` +1), while an
*evicted* pod gets the `DisruptionTarget` condition first, which a `podFailurePolicy` rule `Ignore`
on `DisruptionTarget` keeps out of the count; JobSet and TrainJob run their pods in child Jobs, so
the same holds. Kubeflow v1, Volcano and LeaderWorkerSet recreate deleted pods without counting them:
plain deletes with a uid precondition. Pods already terminal are never removed by a restart (their
controller counts them; the Eviction API would mark even a terminal pod `DisruptionTarget` and so
hide its real failure from the Job's backoffLimit).

Pure data and pure functions of plain values; no I/O, no Kubernetes client.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Pairs = tuple[tuple[str, str], ...]


class Family(enum.StrEnum):
    KUBEFLOW_V1 = "kubeflow-v1"
    TRAINJOB = "trainjob"
    JOBSET = "jobset"
    VOLCANO = "volcano"
    LWS = "leaderworkerset"
    BATCH_JOB = "batch-job"


class Removal(enum.StrEnum):
    """How a restart takes a pod away."""

    EVICT = "evict"
    """`POST pods/<name>/eviction` with a uid precondition (PodDisruptionBudgets honoured; `DisruptionTarget`)."""
    DELETE = "delete"
    """`DELETE pods/<name>` with a uid precondition."""


def _d(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _batch_fields(spec: Mapping[str, Any]) -> tuple[Pairs, int | None]:
    policy = _str(_d(_d(_d(spec.get("template")).get("spec"))).get("restartPolicy"))
    return ((("template", policy),) if policy else ()), _int(spec.get("backoffLimit"))


def _kubeflow_fields(spec: Mapping[str, Any]) -> tuple[Pairs, int | None]:
    out = []
    for key, value in spec.items():
        if key.endswith("ReplicaSpecs") and isinstance(value, dict):
            for replica, rspec in value.items():  # "" = unset, which the operator defaults
                out.append((str(replica), _str(_d(rspec).get("restartPolicy"))))
    out.sort()
    return tuple(out), _int(_d(spec.get("runPolicy")).get("backoffLimit"))


def _jobset_fields(spec: Mapping[str, Any]) -> tuple[Pairs, int | None]:
    return (), _int(_d(spec.get("failurePolicy")).get("maxRestarts"))


def _volcano_fields(spec: Mapping[str, Any]) -> tuple[Pairs, int | None]:
    return (), _int(spec.get("maxRetry"))


def _lws_fields(spec: Mapping[str, Any]) -> tuple[Pairs, int | None]:
    policy = _str(_d(spec.get("leaderWorkerTemplate")).get("restartPolicy"))
    return ((("group", policy),) if policy else ()), None


def _none_fields(spec: Mapping[str, Any]) -> tuple[Pairs, int | None]:
    return (), None


_FIELDS = {
    Family.BATCH_JOB: _batch_fields, Family.KUBEFLOW_V1: _kubeflow_fields, Family.JOBSET: _jobset_fields,
    Family.TRAINJOB: _none_fields, Family.VOLCANO: _volcano_fields, Family.LWS: _lws_fields,
}


@dataclass(frozen=True)
class ExitRule:
    """A batch/v1 Job `podFailurePolicy` rule with action `FailJob` on exit codes."""

    container: str
    """The container it applies to ("" any)."""
    operator: str
    """`In` or `NotIn`."""
    values: tuple[int, ...]

    def matches(self, container: str, exit_code: int) -> bool:
        if self.container and self.container != container:
            return False
        return (exit_code in self.values) is (self.operator == "In")


@dataclass(frozen=True)
class OwnPolicy:
    """What a workload's own failure policy does about a pod failure, as far as kcover must know it."""

    restarts_left: int = 0
    """A JobSet's `failurePolicy.maxRestarts` less its `status.restarts`: it restarts itself when a child
    Job fails, this many times more."""
    child_backoff: int | None = None
    """The smallest `backoffLimit` of a JobSet's child Job templates (None: unset, the Job default of 6)."""
    fail_job: tuple[ExitRule, ...] = ()
    """A Job's `podFailurePolicy` rules failing the Job on exit codes."""


NO_POLICY = OwnPolicy()


def _own_policy(fam: Family, spec: Mapping[str, Any], status: Mapping[str, Any]) -> OwnPolicy:
    if fam is Family.JOBSET:
        most = _int(_d(spec.get("failurePolicy")).get("maxRestarts")) or 0
        done = _int(status.get("restarts")) or 0
        limits = [_int(_d(_d(_d(r).get("template")).get("spec")).get("backoffLimit"))
                  for r in spec.get("replicatedJobs") or () if isinstance(r, dict)]
        known = [x for x in limits if x is not None]
        return OwnPolicy(restarts_left=max(0, most - done), child_backoff=min(known) if known else None)
    if fam is Family.BATCH_JOB:
        rules = []
        for rule in map(_d, _d(spec.get("podFailurePolicy")).get("rules") or ()):
            codes = _d(rule.get("onExitCodes"))
            values = tuple(v for v in codes.get("values") or () if isinstance(v, int) and not isinstance(v, bool))
            if rule.get("action") == "FailJob" and codes.get("operator") in ("In", "NotIn") and values:
                rules.append(ExitRule(_str(codes.get("containerName")), _str(codes.get("operator")), values))
        return OwnPolicy(fail_job=tuple(rules)) if rules else NO_POLICY
    return NO_POLICY


def own_policy_restarts(policy: OwnPolicy, *, pod_failed: bool, exits: Sequence[tuple[str, int]]) -> str:
    """Why the workload's own failure policy already answers this pod failure (a second restart by kcover
    would cost it a retry, or undo its decision to fail), or "". `pod_failed`: the faulting pod is Failed;
    `exits`: (container, exit code) of its containers that terminated with an error."""
    for container, code in exits:
        for rule in policy.fail_job:
            if rule.matches(container, code):
                return (f"its podFailurePolicy fails the Job on exit code {code} of container {container}: the "
                        "Job's own decision, which a restart would undo")
    if pod_failed and policy.restarts_left > 0 and policy.child_backoff == 0:
        return (f"its failurePolicy restarts the JobSet when a child Job fails ({policy.restarts_left} restarts left) "
                "and the failed pod's Job has backoffLimit 0: the JobSet restarts itself for this failure")
    return ""


@dataclass(frozen=True)
class WorkloadKind:
    """One restartable kind. See the module docstring for what each field decides."""

    kind: str
    group: str
    version: str
    """The version kcover lists and watches (the storage version of the CRDs it is tested with)."""
    plural: str
    family: Family
    membership_label: str
    """The pod label naming the workload (`training.kubeflow.org/job-name`, ...)."""
    removal: Removal
    uid_labels: tuple[str, ...] = ()
    """Pod labels that carry the workload's uid, first found wins (the selector is then uid-bearing)."""
    narrowing_labels: tuple[str, ...] = ()
    """Pod labels added to the selector when the pod carries them (a value copied from the pod)."""
    group_label: str = ""
    """The pod label naming the restart unit inside the workload (a LeaderWorkerSet group), or ""."""
    removal_concurrency: int | None = None
    """Removals of one restart in flight at once; None: `recovery.evict_concurrency` or `delete_concurrency`."""

    @property
    def key(self) -> str:
        """`plural.group`, as settings name it: `pytorchjobs.kubeflow.org`, `jobs.batch`."""
        return f"{self.plural}.{self.group}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def path(self) -> str:
        return f"/apis/{self.group}/{self.version}/{self.plural}"

    def restart_fields(self, spec: Mapping[str, Any]) -> tuple[Pairs, int | None]:
        """(replica or template name, restartPolicy) pairs and the kind's own restart limit, from its spec."""
        return _FIELDS[self.family](spec)

    def own_policy(self, spec: Mapping[str, Any], status: Mapping[str, Any]) -> OwnPolicy:
        """What its own failure policy does about a pod failure (`own_policy_restarts`)."""
        return _own_policy(self.family, spec, status)

    def forbidden(self, *, restart_policies: Sequence[str], max_restarts: int | None, finished: bool) -> str:
        """Why the workload's own spec or state forbids a restart, or ''."""
        return forbidden(self.family, restart_policies=restart_policies, max_restarts=max_restarts,
                         finished=finished)


def forbidden(fam: Family, *, restart_policies: Sequence[str], max_restarts: int | None, finished: bool) -> str:
    """Why a workload of family `fam` must not be restarted, or ''."""
    if finished:
        return "it has finished (a terminal condition is True): its operator would not recreate pods"
    if fam is Family.KUBEFLOW_V1 and restart_policies and all(p == "Never" for p in restart_policies):
        return "every replica has restartPolicy Never: the operator would not recreate deleted replicas"
    if fam is Family.BATCH_JOB and max_restarts == 0:
        return "backoffLimit is 0: removing its pods would fail the Job instead of restarting it"
    return ""


KUBEFLOW_GROUP = "kubeflow.org"
KUBEFLOW_JOB_NAME = "training.kubeflow.org/job-name"
KUBEFLOW_OPERATOR_NAME = "training.kubeflow.org/operator-name"
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"
TRAINER_GROUP = "trainer.kubeflow.org"
VOLCANO_GROUP = "batch.volcano.sh"
VOLCANO_JOB_NAME = "volcano.sh/job-name"
VOLCANO_JOB_NAMESPACE = "volcano.sh/job-namespace"
LWS_GROUP = "leaderworkerset.x-k8s.io"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
BATCH_JOB_NAME = "batch.kubernetes.io/job-name"
BATCH_CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
LEGACY_CONTROLLER_UID = "controller-uid"
"""batch/v1 Job's uid label before Kubernetes 1.27."""


def _kubeflow(kind: str, plural: str) -> WorkloadKind:
    return WorkloadKind(kind, KUBEFLOW_GROUP, "v1", plural, Family.KUBEFLOW_V1, KUBEFLOW_JOB_NAME, Removal.DELETE,
                        narrowing_labels=(KUBEFLOW_OPERATOR_NAME,))


KINDS: tuple[WorkloadKind, ...] = (
    WorkloadKind("Job", "batch", "v1", "jobs", Family.BATCH_JOB, BATCH_JOB_NAME, Removal.EVICT,
                 uid_labels=(BATCH_CONTROLLER_UID, LEGACY_CONTROLLER_UID)),
    _kubeflow("PyTorchJob", "pytorchjobs"),
    _kubeflow("TFJob", "tfjobs"),
    _kubeflow("MPIJob", "mpijobs"),
    _kubeflow("PaddleJob", "paddlejobs"),
    _kubeflow("XGBoostJob", "xgboostjobs"),
    _kubeflow("JAXJob", "jaxjobs"),
    WorkloadKind("JobSet", JOBSET_GROUP, "v1alpha2", "jobsets", Family.JOBSET, JOBSET_NAME, Removal.EVICT,
                 uid_labels=(JOBSET_UID,)),
    WorkloadKind("TrainJob", TRAINER_GROUP, "v1alpha1", "trainjobs", Family.TRAINJOB, JOBSET_NAME, Removal.EVICT,
                 uid_labels=(JOBSET_UID,)),
    WorkloadKind("Job", VOLCANO_GROUP, "v1alpha1", "jobs", Family.VOLCANO, VOLCANO_JOB_NAME, Removal.DELETE,
                 narrowing_labels=(VOLCANO_JOB_NAMESPACE,)),
    WorkloadKind("LeaderWorkerSet", LWS_GROUP, "v1", "leaderworkersets", Family.LWS, LWS_NAME, Removal.DELETE,
                 group_label=LWS_GROUP_INDEX),
)
"""Every workload kind kcover restarts. A TrainJob's pods carry its JobSet's labels (it is restarted through
the JobSet of the same name it owns)."""

INTERMEDIATE: frozenset[tuple[str, str]] = frozenset({("apps", "StatefulSet"), ("", "Pod")})
"""Kinds owner resolution follows upwards but never restarts (a LeaderWorkerSet's StatefulSets and leader Pod)."""

DEFAULT_KEYS: tuple[str, ...] = tuple(k.key for k in KINDS)
"""`kube.workload_kinds`' default: every kind of the table."""

_BY_KEY = {k.key: k for k in KINDS}
_BY_GROUP_KIND = {(k.group, k.kind): k for k in KINDS}

MEMBERSHIP_LABELS: tuple[str, ...] = tuple(dict.fromkeys(
    k.membership_label for k in sorted(KINDS, key=lambda k: k.family is Family.BATCH_JOB)))
"""Pod labels naming a workload, the outermost first: a JobSet's pods carry their child Job's name too."""
UID_LABELS: frozenset[str] = frozenset(label for k in KINDS for label in k.uid_labels)
SELECTOR_LABELS: frozenset[str] = frozenset(
    {*MEMBERSHIP_LABELS, *UID_LABELS, *(label for k in KINDS for label in k.narrowing_labels),
     *(k.group_label for k in KINDS if k.group_label)})
"""Every pod label a restart selector may use: the cache keeps these on its pods."""
INDEXED_LABELS: frozenset[str] = frozenset(MEMBERSHIP_LABELS) | UID_LABELS
"""Pod labels the cache indexes (namespace, key, value): those a restart selector starts with."""
RANK_LABELS: tuple[str, ...] = (
    "jobset.sigs.k8s.io/replicatedjob-name", "jobset.sigs.k8s.io/job-index",
    "training.kubeflow.org/replica-type", "training.kubeflow.org/replica-index",
    "volcano.sh/task-spec", "volcano.sh/task-index",
    "leaderworkerset.sigs.k8s.io/worker-index",
    "batch.kubernetes.io/job-completion-index",
)
"""Pod labels the operators set to say which member a pod is (its replica, index or rank): the same rank
failing wherever it runs is the workload's, different ranks failing on one node the node's."""


def rank_of(labels: Mapping[str, str]) -> str:
    """Which member of its workload a pod is, from `RANK_LABELS` ("" when it carries none)."""
    return ",".join(f"{k.rpartition('/')[2]}={labels[k]}" for k in RANK_LABELS if labels.get(k))


def by_key(key: str) -> WorkloadKind:
    """The kind of a `plural.group` key; ValueError for an unknown key."""
    try:
        return _BY_KEY[key]
    except KeyError:
        raise ValueError(f"unknown workload kind {key!r}; known: {sorted(_BY_KEY)}") from None


def of(group: str, kind: str) -> WorkloadKind | None:
    """The table's entry for (group, kind), or None: not a kind kcover restarts."""
    return _BY_GROUP_KIND.get((group, kind))


def family(group: str, kind: str) -> Family | None:
    found = _BY_GROUP_KIND.get((group, kind))
    return found.family if found is not None else None


def followable(group: str, kind: str) -> bool:
    """Owner resolution may step through (group, kind): a restartable kind or an intermediate one."""
    return (group, kind) in _BY_GROUP_KIND or (group, kind) in INTERMEDIATE


def named_by(label: str) -> tuple[WorkloadKind, ...]:
    """The kinds whose membership label is `label` (several Kubeflow kinds share one)."""
    return tuple(k for k in KINDS if k.membership_label == label)
