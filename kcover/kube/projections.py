"""Slim projections: the small immutable records of only the fields kcover uses, and their vocabulary.

Owns the shape of what the cluster cache keeps (pods, nodes, workloads, annotated Events, DRA
ResourceSlices, Namespaces, the controls ConfigMap), the names kcover reads on them and writes on the
Nodes it cordons, and lookups in a record's kept pairs (`get`, `group_of`). These records are kcover's one
cluster model: the detectors, the recovery policy and its executors all read them (through
`caching.ClusterCache`), and tests build them from raw API objects through the same functions
(`projecting`, which builds them). Records are `NamedTuple`s (tuples with empty `__slots__`: small, fast
to build, immutable). Each name it reads is defined once: the Event annotations and the `kcover.io/`
prefix in `kcover.codec`, the workload labels in `kcover.kinds`, the opt-in label and the annotations
kcover writes on the Nodes it cordons here.

It does no I/O and builds no record from raw input (`projecting` does); nothing here raises.
"""

from __future__ import annotations

from typing import NamedTuple

from kcover import kinds

OPT_IN_LABEL = "kcover.io/cascading-recovery"
"""Pods or workloads labelled `true` opt in to recovery."""
CORDONED_BY = "kcover.io/cordoned-by"
"""Node annotation `kcover` on nodes kcover cordoned (kcover only ever un-cordons those)."""
CORDON_REASON = "kcover.io/cordon-reason"
CORDONED_AT = "kcover.io/cordoned-at"
CORDON_TAINTS = "kcover.io/cordon-taints"
"""The other scheduling taints (`key:effect,...`) a node had when kcover cordoned it (`recovery.cordoning`)."""
KEEP_CORDONED = "kcover.io/keep-cordoned"
"""`true` on a Node kcover cordoned: a person keeps it cordoned; kcover never makes it schedulable again."""

IDENTITY_LABELS = frozenset({"app.kubernetes.io/name", "app.kubernetes.io/component"})
"""Labels that tell kcover's own agent pods (the chart's) from others: the event watcher accepts an Event
about a Node only when an agent pod runs on that node."""

KEPT_POD_LABELS = frozenset((*kinds.SELECTOR_LABELS, *kinds.RANK_LABELS, *IDENTITY_LABELS, OPT_IN_LABEL))
"""Pod labels the cache keeps: those restart selectors use and those naming a pod's rank (`kinds`), the
identity labels and the opt-in label."""

Pairs = tuple[tuple[str, str], ...]


class OwnerRef(NamedTuple):
    kind: str
    name: str
    uid: str
    api_version: str

    @property
    def group(self) -> str:
        return group_of(self.api_version)


class Terminated(NamedTuple):
    reason: str
    exit_code: int
    finished_at: str


class ResourceHealth(NamedTuple):
    """One device of a container's `allocatedResourcesStatus` (KEP-4680)."""

    claim: str
    """`allocatedResourcesStatus[].name`, e.g. `claim:gpu-claim/gpu` or a device-plugin resource name."""
    resource_id: str
    health: str
    """Healthy | Unhealthy | Unknown."""
    message: str


class ContainerState(NamedTuple):
    name: str
    init: bool
    restart_count: int
    terminated: Terminated | None
    """`state.terminated`: the container is stopped now."""
    last_terminated: Terminated | None
    """`lastState.terminated`: how the previous instance ended (after an in-place restart)."""
    resources: tuple[ResourceHealth, ...]
    waiting: tuple[str, str] | None = None
    """`state.waiting` (reason, message) when the container waits: `ErrImagePull`, `CrashLoopBackOff`, ..."""


class Pod(NamedTuple):
    uid: str
    rv: str
    namespace: str
    name: str
    node: str
    phase: str
    labels: Pairs
    """Only the workload membership labels, the opt-in label and the identity labels (`IDENTITY_LABELS`)."""
    annotations: Pairs
    """Only annotations whose key starts with `kcover.io/`."""
    owner: OwnerRef | None
    """The controller ownerReference."""
    deletion_timestamp: str
    restart_policy: str
    containers: tuple[ContainerState, ...]
    """Init containers first (`init=True`), then regular ones."""
    unschedulable: str = ""
    """The scheduler's message while the pod's `PodScheduled` condition is False (reason `Unschedulable`)."""
    created: str = ""
    """`metadata.creationTimestamp`: a restart removes only pods created before it was recorded."""
    devices: tuple[str, ...] = ()
    """The extended resources its containers' limits or requests name (`nvidia.com/gpu`, ...), and
    `DRA_CLAIMS` when it has DRA resource claims: what devices it may hold (`gpus.GpuRule.holds_gpus`)."""

    @property
    def deleting(self) -> bool:
        """`deletionTimestamp` is set: the pod is terminating."""
        return bool(self.deletion_timestamp)

    @property
    def terminal(self) -> bool:
        """Phase Succeeded or Failed, or about to be: under `restartPolicy: Never` every regular container has
        terminated (the kubelet starts none again; the phase follows a moment later). Its controller counts
        it; a restart leaves it alone (an eviction would mark it `DisruptionTarget` and hide its failure)."""
        if self.phase in ("Succeeded", "Failed"):
            return True
        regular = [c for c in self.containers if not c.init]
        return self.restart_policy == "Never" and bool(regular) and all(c.terminated is not None for c in regular)


class Taint(NamedTuple):
    key: str
    value: str
    effect: str


class Condition(NamedTuple):
    type: str
    status: str
    reason: str
    message: str
    last_transition: str


def kcover_cordon_holds(*, cordoned_by_kcover: bool, unschedulable: bool, kcover_tainted: bool) -> bool:
    """The one rule for "kcover's cordon is in effect": its annotation with `spec.unschedulable` or kcover's taint.
    Its annotation alone (a person un-cordoned the node and took the taint off, the marks left) is no cordon."""
    return cordoned_by_kcover and (unschedulable or kcover_tainted)


class Node(NamedTuple):
    uid: str
    rv: str
    name: str
    unschedulable: bool
    taints: tuple[Taint, ...]
    conditions: tuple[Condition, ...]
    annotations: Pairs
    """Only annotations whose key starts with `kcover.io/`."""
    extended_resources: tuple[tuple[str, int], ...]
    """(resource name, count > 0) of every extended resource in `status.capacity` (a name with a domain,
    `nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`, `amd.com/gpu`); `gpus.GpuRule` says which are GPUs."""
    addresses: tuple[str, ...] = ()
    """`status.addresses` of type InternalIP and ExternalIP, as the kubelet reports them: what a workload's
    own reports (the preflight plugin's) may name the node by."""

    @property
    def cordoned_by_kcover(self) -> bool:
        """kcover's cordon annotation is on the node (its cordon may have been undone by hand since)."""
        return get(self.annotations, CORDONED_BY) == "kcover"

    def kcover_cordon_in_effect(self, taint_key: str) -> bool:
        """`kcover_cordon_holds` for this node, kcover's taint being `taint_key`."""
        return kcover_cordon_holds(cordoned_by_kcover=self.cordoned_by_kcover, unschedulable=self.unschedulable,
                                   kcover_tainted=any(t.key == taint_key for t in self.taints))


class Workload(NamedTuple):
    uid: str
    rv: str
    kind: str
    api_version: str
    namespace: str
    name: str
    labels: Pairs
    """Only the opt-in label."""
    annotations: Pairs
    owner: OwnerRef | None
    restart_policies: Pairs
    """(replica or template name, restartPolicy) as the kind states them; () when it has none."""
    max_restarts: int | None
    """JobSet failurePolicy.maxRestarts, Job backoffLimit, Volcano maxRetry, LWS none."""
    finished: bool
    """A terminal condition (Succeeded, Failed, Complete, Completed) is True."""
    own: kinds.OwnPolicy = kinds.NO_POLICY
    """What its own failure policy does about a pod failure (a JobSet's restarts, a Job's FailJob rules)."""

    @property
    def group(self) -> str:
        return group_of(self.api_version)


class Namespace(NamedTuple):
    """A Namespace: its kcover.io/ labels and annotations (pause, opt-in)."""

    uid: str
    rv: str
    name: str
    labels: Pairs
    """Only labels whose key starts with `kcover.io/`."""
    annotations: Pairs
    """Only annotations whose key starts with `kcover.io/`."""


class ConfigMap(NamedTuple):
    """The controls ConfigMap: its kcover.io/ annotations (the global pause, a breaker reset request)."""

    uid: str
    rv: str
    namespace: str
    name: str
    annotations: Pairs


class ResourceSlice(NamedTuple):
    """A DRA `resource.k8s.io/v1` ResourceSlice: which driver publishes devices on which node."""

    uid: str
    rv: str
    name: str
    driver: str
    node: str
    """`spec.nodeName`; "" for slices of network-attached devices (`nodeSelector`, `allNodes`)."""
    pool: str
    devices: frozenset[str] = frozenset()
    """The names of the devices it publishes (`spec.devices[].name`): what an agent may name as a
    device of its node."""


class InvolvedObject(NamedTuple):
    kind: str
    namespace: str
    name: str
    uid: str


class KubeEvent(NamedTuple):
    """A core/v1 Event carrying `kcover.io/need-recovery: "true"`, `kcover.io/device-healthy: "true"` or
    `kcover.io/evidence`."""

    uid: str
    rv: str
    namespace: str
    name: str
    involved: InvolvedObject
    reason: str
    message: str
    type: str
    reporting_controller: str
    source_component: str
    event_count: int
    series_count: int
    last_timestamp: str
    event_time: str
    series_last_observed: str
    first_timestamp: str
    annotations: Pairs = ()
    """Only annotations whose key starts with `kcover.io/`: the fault the Event carries (`kcover.codec`)."""
    reporting_instance: str = ""
    source_host: str = ""
    """Who the writer says it is (the agent: its node's name); checked against the cluster, never trusted alone."""


DRA_CLAIMS = "resource.k8s.io/claims"
"""`Pod.devices` entry of a pod with DRA resource claims (`spec.resourceClaims`)."""


def group_of(api_version: str) -> str:
    """`kubeflow.org/v1` -> `kubeflow.org`; `v1` -> `` (core)."""
    return api_version.rpartition("/")[0]


def get(pairs: Pairs, key: str, default: str = "") -> str:
    """Look a key up in a projected label or annotation tuple."""
    for k, v in pairs:
        if k == key:
            return v
    return default
