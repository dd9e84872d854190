"""Slim, immutable views of the objects recovery decides on, and how to build them from raw JSON.

Owns `PodView`, `NodeView`, `WorkloadView`, `OwnerRef` and the projection functions (`pod_view`,
`node_view`, `workload_view`) that the kube cache can call on the dicts it receives, plus
`MemorySnapshot`, a small in-memory `policy.ClusterSnapshot` for tests and benchmarks.
It does no I/O. Projections never raise on odd input: missing fields become empty values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

CORDONED_BY = "kcover.io/cordoned-by"
CORDON_REASON = "kcover.io/cordon-reason"
CORDONED_AT = "kcover.io/cordoned-at"
OPT_IN_LABEL = "kcover.io/cascading-recovery"
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"


@dataclass(frozen=True)
class OwnerRef:
    """A controller ownerReference."""

    kind: str
    api_version: str
    name: str
    uid: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0] if "/" in self.api_version else ""


@dataclass(frozen=True)
class PodView:
    uid: str
    namespace: str
    name: str
    node: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    owner: OwnerRef | None = None
    """The controller ownerReference (the one with `controller: true`), if any."""
    phase: str = ""
    restart_policy: str = ""
    deleting: bool = False


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class NodeView:
    name: str
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    gpu: bool = False

    @property
    def cordoned_by_kcover(self) -> bool:
        return self.annotations.get(CORDONED_BY) == "kcover"


@dataclass(frozen=True)
class WorkloadView:
    """A workload or an intermediate controller (a JobSet's Job, an LWS StatefulSet)."""

    kind: str
    api_version: str
    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    owner: OwnerRef | None = None
    restart_forbidden: str = ""
    """Non-empty when the workload's own spec says a restart must not happen, and why."""

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0] if "/" in self.api_version else ""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def controller_ref(meta: Mapping[str, Any]) -> OwnerRef | None:
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return OwnerRef(kind=str(ref.get("kind", "")), api_version=str(ref.get("apiVersion", "")),
                            name=str(ref.get("name", "")), uid=str(ref.get("uid", "")))
    return None


def pod_view(obj: Mapping[str, Any]) -> PodView:
    meta = _meta(obj)
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return PodView(uid=str(meta.get("uid", "")), namespace=str(meta.get("namespace", "")),
                   name=str(meta.get("name", "")), node=str(spec.get("nodeName", "") or ""),
                   labels=_str_map(meta.get("labels")), owner=controller_ref(meta),
                   phase=str(status.get("phase", "") or ""),
                   restart_policy=str(spec.get("restartPolicy", "") or ""),
                   deleting=bool(meta.get("deletionTimestamp")))


def node_view(obj: Mapping[str, Any]) -> NodeView:
    meta = _meta(obj)
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    labels = _str_map(meta.get("labels"))
    capacity = _str_map(status.get("capacity"))
    gpu = labels.get(GPU_PRESENT_LABEL) == "true" or any(
        capacity.get(r, "0") not in ("", "0") for r in GPU_RESOURCES)
    taints = tuple(Taint(str(t.get("key", "")), str(t.get("value", "") or ""), str(t.get("effect", "")))
                   for t in spec.get("taints") or () if isinstance(t, Mapping))
    return NodeView(name=str(meta.get("name", "")), uid=str(meta.get("uid", "")), labels=labels,
                    annotations=_str_map(meta.get("annotations")),
                    unschedulable=bool(spec.get("unschedulable")), taints=taints, gpu=gpu)


def workload_view(obj: Mapping[str, Any], *, restart_forbidden: str = "") -> WorkloadView:
    """Project any controller object. `adapters.workload_view` adds the kind's restart-policy verdict."""
    meta = _meta(obj)
    return WorkloadView(kind=str(obj.get("kind", "")), api_version=str(obj.get("apiVersion", "")),
                        namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")),
                        uid=str(meta.get("uid", "")), labels=_str_map(meta.get("labels")),
                        owner=controller_ref(meta), restart_forbidden=restart_forbidden)


class MemorySnapshot:
    """A `policy.ClusterSnapshot` over plain dicts of views; for table tests and benchmarks."""

    def __init__(self, *, pods: Iterable[PodView] = (), nodes: Iterable[NodeView] = (),
                 workloads: Iterable[WorkloadView] = ()) -> None:
        self.pods = {p.uid: p for p in pods}
        self.nodes = {n.name: n for n in nodes}
        self.workloads = {w.uid: w for w in workloads}

    def workload_by_name(self, group: str, kind: str, namespace: str, name: str) -> WorkloadView | None:
        for w in self.workloads.values():
            if (w.group, w.kind, w.namespace, w.name) == (group, kind, namespace, name):
                return w
        return None

    def pod(self, uid: str) -> PodView | None:
        return self.pods.get(uid)

    def pod_by_name(self, namespace: str, name: str) -> PodView | None:
        for p in self.pods.values():
            if p.namespace == namespace and p.name == name:
                return p
        return None

    def pods_of_workload(self, uid: str) -> list[PodView]:
        return [p for p in self.pods.values() if p.owner is not None and p.owner.uid == uid]

    def pods_on_node(self, name: str) -> list[PodView]:
        return [p for p in self.pods.values() if p.node == name]

    def pods_with_label(self, namespace: str, key: str, value: str) -> list[PodView]:
        return [p for p in self.pods.values() if p.namespace == namespace and p.labels.get(key) == value]

    def node(self, name: str) -> NodeView | None:
        return self.nodes.get(name)

    def workload(self, uid: str) -> WorkloadView | None:
        return self.workloads.get(uid)

    def gpu_node_count(self) -> int:
        return sum(1 for n in self.nodes.values() if n.gpu)

    def cordoned_by_kcover(self) -> list[str]:
        return sorted(n.name for n in self.nodes.values() if n.cordoned_by_kcover)

    # mutation helpers for tests that play out a sequence
    def put_pod(self, pod: PodView) -> None:
        self.pods[pod.uid] = pod

    def drop_pod(self, uid: str) -> None:
        self.pods.pop(uid, None)

    def put_node(self, node: NodeView) -> None:
        self.nodes[node.name] = node

    def put_workload(self, workload: WorkloadView) -> None:
        self.workloads[workload.uid] = workload


def replace_pod(pod: PodView, **changes: Any) -> PodView:
    return dataclasses.replace(pod, **changes)
