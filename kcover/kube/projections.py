"""Slim projections: raw API dicts in, small immutable records of only the fields kcover uses out.

Owns the shape of what the cluster cache keeps (pods, nodes, workloads, annotated Events, DRA
ResourceSlices) and the pure functions that build it. These records are kcover's one cluster model:
the detectors, the recovery policy and its executors all read them (through `caching.ClusterCache`),
and tests build them from raw API objects through the same functions. Records are `NamedTuple`s
(tuples with empty `__slots__`: small, fast to build, immutable); strings repeated across objects
(namespaces, node names, label values, reasons, owner names) are interned, so 150,000 cached pods stay
under a few hundred MiB. Each name it reads is defined once: the Event annotations and the `kcover.io/`
prefix in `kcover.codec`, the workload labels in `kcover.kinds`, the opt-in label and the annotations
kcover writes on the Nodes it cordons here.

It does no I/O and never raises on odd input: a missing or mistyped field becomes its empty value.
A projection returns None for an object kcover does not keep (an Event without the recovery
annotation), which the reflector treats as "not in the store".
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from kcover import codec, kinds

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

_intern = sys.intern
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
        return get(self.annotations, CORDONED_BY) == "kcover"


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
    """A core/v1 Event carrying `kcover.io/need-recovery: "true"` or `kcover.io/device-healthy: "true"`."""

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


# --------------------------------------------------------------------------------------- helpers

def _d(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _s(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _i(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _l(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def group_of(api_version: str) -> str:
    """`kubeflow.org/v1` -> `kubeflow.org`; `v1` -> `` (core)."""
    return api_version.rpartition("/")[0]


def get(pairs: Pairs, key: str, default: str = "") -> str:
    """Look a key up in a projected label or annotation tuple."""
    for k, v in pairs:
        if k == key:
            return v
    return default


def _kept(mapping: Any, keep: frozenset[str] | None = None, prefix: str = "") -> Pairs:
    if not isinstance(mapping, dict) or not mapping:
        return ()
    out = []
    for key, value in mapping.items():
        if (keep is not None and key in keep) or (prefix and key.startswith(prefix)):
            out.append((_intern(key), _intern(value if isinstance(value, str) else "")))
    if not out:
        return ()
    out.sort()
    return tuple(out)


def controller_of(meta: Mapping[str, Any]) -> OwnerRef | None:
    refs = meta.get("ownerReferences")
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if isinstance(ref, dict) and ref.get("controller") is True:
            return OwnerRef(_intern(_s(ref.get("kind"))), _intern(_s(ref.get("name"))),
                            _intern(_s(ref.get("uid"))), _intern(_s(ref.get("apiVersion"))))
    return None


def _terminated(state: Any) -> Terminated | None:
    term = state.get("terminated") if isinstance(state, dict) else None
    if not isinstance(term, dict):
        return None
    return Terminated(_intern(_s(term.get("reason"))), _i(term.get("exitCode")), _s(term.get("finishedAt")))


def _resources(status: Mapping[str, Any]) -> tuple[ResourceHealth, ...]:
    entries = status.get("allocatedResourcesStatus")
    if not isinstance(entries, list) or not entries:
        return ()
    out = []
    for entry in entries:
        entry = _d(entry)
        claim = _intern(_s(entry.get("name")))
        for res in _l(entry.get("resources")):
            res = _d(res)
            out.append(ResourceHealth(claim, _intern(_s(res.get("resourceID"))),
                                      _intern(_s(res.get("health")) or "Unknown"), _s(res.get("message"))))
    return tuple(out)


def _container(status: Any, init: bool) -> ContainerState:
    if not isinstance(status, dict):
        status = _NOTHING
    state = status.get("state")
    waiting = state.get("waiting") if isinstance(state, dict) else None
    return ContainerState(_intern(_s(status.get("name"))), init, _i(status.get("restartCount")),
                          _terminated(state), _terminated(status.get("lastState")),
                          _resources(status),
                          (_intern(_s(waiting.get("reason"))), _s(waiting.get("message")))
                          if isinstance(waiting, dict) and waiting else None)


def _unschedulable(status: Mapping[str, Any]) -> str:
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        return ""
    for cond in conditions:
        if isinstance(cond, dict) and cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return _s(cond.get("message")) or _s(cond.get("reason")) or "Unschedulable"
    return ""


_NOTHING: Mapping[str, Any] = MappingProxyType({})
"""What a missing or mistyped object reads as (never written to)."""


# ------------------------------------------------------------------------------------ projections

def pod(raw: Mapping[str, Any]) -> Pod:
    # the reflector projects every pod change: the helpers `_d`/`_s`/`_l` are inlined on the common path
    meta = raw.get("metadata")
    if not isinstance(meta, dict):
        meta = _NOTHING
    spec = raw.get("spec")
    if not isinstance(spec, dict):
        spec = _NOTHING
    status = raw.get("status")
    if not isinstance(status, dict):
        status = _NOTHING
    inits, regular = status.get("initContainerStatuses"), status.get("containerStatuses")
    containers = [_container(c, True) for c in inits] if isinstance(inits, list) else []
    if isinstance(regular, list):
        containers += [_container(c, False) for c in regular]
    return Pod(
        uid=_s(meta.get("uid")),
        rv=_s(meta.get("resourceVersion")),
        namespace=_intern(_s(meta.get("namespace"))),
        name=_s(meta.get("name")),
        node=_intern(_s(spec.get("nodeName"))),
        phase=_intern(_s(status.get("phase"))),
        labels=_kept(meta.get("labels"), KEPT_POD_LABELS),
        annotations=_kept(meta.get("annotations"), prefix=codec.PREFIX),
        owner=controller_of(meta),
        deletion_timestamp=_s(meta.get("deletionTimestamp")),
        restart_policy=_intern(_s(spec.get("restartPolicy")) or "Always"),
        containers=tuple(containers),
        unschedulable=_unschedulable(status),
        created=_s(meta.get("creationTimestamp")),
        devices=_devices(spec),
    )


DRA_CLAIMS = "resource.k8s.io/claims"
"""`Pod.devices` entry of a pod with DRA resource claims (`spec.resourceClaims`)."""


def _devices(spec: Mapping[str, Any]) -> tuple[str, ...]:
    names: set[str] = set()
    for group in (spec.get("initContainers"), spec.get("containers")):
        if not isinstance(group, list):
            continue
        for c in group:
            resources = c.get("resources") if isinstance(c, dict) else None
            if not isinstance(resources, dict):
                continue
            for part in (resources.get("limits"), resources.get("requests")):
                if isinstance(part, dict):
                    for name, value in part.items():
                        if "/" in name and _quantity(value) > 0:
                            names.add(name)
    claims = spec.get("resourceClaims")
    if isinstance(claims, list) and claims:
        names.add(DRA_CLAIMS)
    return tuple(sorted(_intern(n) for n in names)) if names else ()


def _quantity(value: Any) -> int:
    if isinstance(value, int):
        return value
    try:
        return int(str(value))
    except ValueError:
        return 0


def _extended(capacity: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    out = []
    for name, value in capacity.items():
        if "/" in name:
            count = _quantity(value)
            if count > 0:
                out.append((_intern(name), count))
    out.sort()
    return tuple(out)


def node(raw: Mapping[str, Any]) -> Node:
    meta = _d(raw.get("metadata"))
    spec = _d(raw.get("spec"))
    status = _d(raw.get("status"))
    capacity = _d(status.get("capacity"))
    return Node(
        uid=_s(meta.get("uid")),
        rv=_s(meta.get("resourceVersion")),
        name=_intern(_s(meta.get("name"))),
        unschedulable=spec.get("unschedulable") is True,
        taints=tuple(Taint(_intern(_s(t.get("key"))), _intern(_s(t.get("value"))), _intern(_s(t.get("effect"))))
                     for t in map(_d, _l(spec.get("taints")))),
        conditions=tuple(Condition(_intern(_s(c.get("type"))), _intern(_s(c.get("status"))),
                                   _intern(_s(c.get("reason"))), _s(c.get("message")),
                                   _s(c.get("lastTransitionTime")))
                         for c in map(_d, _l(status.get("conditions")))),
        annotations=_kept(meta.get("annotations"), prefix=codec.PREFIX),
        extended_resources=_extended(capacity),
        addresses=tuple(_s(a.get("address")) for a in map(_d, _l(status.get("addresses")))
                        if a.get("type") in ("InternalIP", "ExternalIP") and a.get("address")),
    )


_TERMINAL = frozenset(("Succeeded", "Failed", "Complete", "Completed"))


def workload(raw: Mapping[str, Any]) -> Workload:
    meta = _d(raw.get("metadata"))
    kind = _intern(_s(raw.get("kind")))
    api_version = _intern(_s(raw.get("apiVersion")))
    table = kinds.of(group_of(api_version), kind)
    policies, max_restarts = table.restart_fields(_d(raw.get("spec"))) if table is not None else ((), None)
    policies = tuple((_intern(k), _intern(v)) for k, v in policies)
    conditions = _l(_d(raw.get("status")).get("conditions"))
    finished = any(_d(c).get("type") in _TERMINAL and _d(c).get("status") == "True" for c in conditions)
    return Workload(
        uid=_s(meta.get("uid")),
        rv=_s(meta.get("resourceVersion")),
        kind=kind,
        api_version=api_version,
        namespace=_intern(_s(meta.get("namespace"))),
        name=_intern(_s(meta.get("name"))),
        labels=_kept(meta.get("labels"), frozenset((OPT_IN_LABEL,))),
        annotations=_kept(meta.get("annotations"), prefix=codec.PREFIX),
        owner=controller_of(meta),
        restart_policies=policies,
        max_restarts=max_restarts,
        finished=finished,
        own=table.own_policy(_d(raw.get("spec")), _d(raw.get("status"))) if table is not None else kinds.NO_POLICY,
    )


def namespace(raw: Mapping[str, Any]) -> Namespace:
    meta = _d(raw.get("metadata"))
    return Namespace(uid=_s(meta.get("uid")), rv=_s(meta.get("resourceVersion")), name=_intern(_s(meta.get("name"))),
                     labels=_kept(meta.get("labels"), prefix=codec.PREFIX),
                     annotations=_kept(meta.get("annotations"), prefix=codec.PREFIX))


def config_map(raw: Mapping[str, Any]) -> ConfigMap:
    meta = _d(raw.get("metadata"))
    return ConfigMap(uid=_s(meta.get("uid")), rv=_s(meta.get("resourceVersion")),
                     namespace=_s(meta.get("namespace")), name=_s(meta.get("name")),
                     annotations=_kept(meta.get("annotations"), prefix=codec.PREFIX))


def resource_slice(raw: Mapping[str, Any]) -> ResourceSlice:
    meta = _d(raw.get("metadata"))
    spec = _d(raw.get("spec"))
    return ResourceSlice(
        uid=_s(meta.get("uid")),
        rv=_s(meta.get("resourceVersion")),
        name=_s(meta.get("name")),
        driver=_intern(_s(spec.get("driver"))),
        node=_intern(_s(spec.get("nodeName"))),
        pool=_intern(_s(_d(spec.get("pool")).get("name"))),
        devices=frozenset(_intern(name) for d in _l(spec.get("devices"))
                          if isinstance(d, Mapping) and (name := _s(d.get("name")))),
    )


def recovery_event(raw: Mapping[str, Any]) -> KubeEvent | None:
    """Project a core/v1 Event, or None unless it carries `kcover.io/need-recovery: "true"` or
    `kcover.io/device-healthy: "true"` (the event watcher judges both)."""
    meta = _d(raw.get("metadata"))
    annotations = _d(meta.get("annotations"))
    if _s(annotations.get(codec.NEED_RECOVERY)).lower() != "true" \
            and _s(annotations.get(codec.DEVICE_HEALTHY)).lower() != "true":
        return None
    involved = _d(raw.get("involvedObject"))
    series = _d(raw.get("series"))
    return KubeEvent(
        uid=_s(meta.get("uid")),
        rv=_s(meta.get("resourceVersion")),
        namespace=_intern(_s(meta.get("namespace"))),
        name=_s(meta.get("name")),
        involved=InvolvedObject(_intern(_s(involved.get("kind"))), _intern(_s(involved.get("namespace"))),
                                _s(involved.get("name")), _s(involved.get("uid"))),
        reason=_intern(_s(raw.get("reason"))),
        message=_s(raw.get("message")),
        type=_intern(_s(raw.get("type"))),
        reporting_controller=_intern(_s(raw.get("reportingComponent") or raw.get("reportingController"))),
        source_component=_intern(_s(_d(raw.get("source")).get("component"))),
        event_count=_i(raw.get("count")),
        series_count=_i(series.get("count")),
        last_timestamp=_s(raw.get("lastTimestamp")),
        event_time=_s(raw.get("eventTime")),
        series_last_observed=_s(series.get("lastObservedTime")),
        first_timestamp=_s(raw.get("firstTimestamp")),
        reporting_instance=_s(raw.get("reportingInstance")),
        source_host=_s(_d(raw.get("source")).get("host")),
        annotations=_kept(meta.get("annotations"), prefix=codec.PREFIX),
    )
