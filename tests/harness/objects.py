"""Raw Kubernetes API objects for tests, shaped as the API server returns them.

Tests build the product's own model from these: `caching.ClusterCache.offline(objects)` runs them
through the reflectors' projections, exactly as a list from a server would. Every builder returns a
plain dict; uids default to a name-based value so tables can refer to them.
"""

from __future__ import annotations

from typing import Any

from kcover import codec

Obj = dict[str, Any]


def ref(obj: Obj) -> Obj:
    """A controller ownerReference to `obj`."""
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True}


def owner(api_version: str, kind: str, name: str, uid: str) -> Obj:
    """A stand-in for an owner object that is not itself in the cache (a ReplicaSet, a StatefulSet)."""
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "uid": uid}}


def workload(api_version: str, kind: str, name: str, *, uid: str = "", namespace: str = "ml",
             labels: dict[str, str] | None = None, owner: Obj | None = None, spec: Obj | None = None,
             status: Obj | None = None, rv: str = "1") -> Obj:
    meta: Obj = {"name": name, "namespace": namespace, "uid": uid or f"{kind.lower()}-{name}",
                 "resourceVersion": rv, "labels": dict(labels or {})}
    if owner is not None:
        meta["ownerReferences"] = [ref(owner)]
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": dict(spec or {}),
            "status": dict(status or {})}


def pod(name: str, *, uid: str = "", namespace: str = "ml", node: str = "", labels: dict[str, str] | None = None,
        owner: Obj | None = None, deleting: bool = False, phase: str = "Running", rv: str = "1") -> Obj:
    meta: Obj = {"name": name, "namespace": namespace, "uid": uid or f"pod-{name}", "resourceVersion": rv,
                 "labels": dict(labels or {})}
    if owner is not None:
        meta["ownerReferences"] = [ref(owner)]
    if deleting:
        meta["deletionTimestamp"] = "2025-06-01T12:00:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "trainer"}]},
            "status": {"phase": phase}}


def node(name: str, *, uid: str = "", capacity: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
         unschedulable: bool = False, rv: str = "1", agent: bool = False) -> Obj:
    """A Node; `capacity` defaults to eight NVIDIA GPUs; `agent`: kcover's agent runs there (the Node shows
    its healthy condition)."""
    spec: Obj = {"unschedulable": True} if unschedulable else {}
    status: Obj = {"capacity": {"cpu": "96", **({"nvidia.com/gpu": "8"} if capacity is None else capacity)}}
    if agent:
        status["conditions"] = [{"type": codec.AGENT_CONDITION_TYPE, "status": "True", "reason": "GPUsHealthy",
                                 "message": "all GPUs healthy", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": uid or f"node-{name}", "resourceVersion": rv,
                         "annotations": dict(annotations or {}), "labels": dict(labels or {})},
            "spec": spec, "status": status}


def resource_slice(name: str, *, driver: str, node: str, uid: str = "", devices: int = 8, rv: str = "1") -> Obj:
    """A resource.k8s.io/v1 ResourceSlice publishing `devices` devices of `driver` on `node`."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name, "uid": uid or f"slice-{name}", "resourceVersion": rv},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}"} for i in range(devices)]}}
