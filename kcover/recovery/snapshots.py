"""`CacheSnapshot`: the controller's `kube.caching.ClusterCache` seen as a `policy.ClusterSnapshot`.

Owns the translation from the cache's projections to recovery's views, on demand (nothing copied
up front). It does no I/O and holds no state of its own. Limits, inherited from what the cache keeps:
pod views carry only the labels the cache keeps (selectors narrow and verify by uid with what they
get; see `adapters.SELECTOR_LABELS` for what the cache should keep), node views carry no labels, and
`pods_with_label` scans the namespace's pods (the cache has no label index): O(pods) per restart.
"""

from __future__ import annotations

from kcover.kube import caching
from kcover.kube import projections as proj
from kcover.recovery import adapters, views


def _owner(ref: proj.OwnerRef | None) -> views.OwnerRef | None:
    if ref is None:
        return None
    return views.OwnerRef(kind=ref.kind, api_version=ref.api_version, name=ref.name, uid=ref.uid)


def pod_view(pod: proj.Pod) -> views.PodView:
    return views.PodView(uid=pod.uid, namespace=pod.namespace, name=pod.name, node=pod.node,
                         labels=dict(pod.labels), owner=_owner(pod.owner), phase=pod.phase,
                         restart_policy=pod.restart_policy, deleting=bool(pod.deletion_timestamp))


def node_view(node: proj.Node) -> views.NodeView:
    return views.NodeView(name=node.name, uid=node.uid, annotations=dict(node.annotations),
                          unschedulable=node.unschedulable,
                          taints=tuple(views.Taint(t.key, t.value, t.effect) for t in node.taints),
                          gpu=any(count > 0 for _, count in node.gpu_capacity))


def workload_view(w: proj.Workload) -> views.WorkloadView:
    forbidden = adapters.forbidden_by(w.group, w.kind, replica_policies=[p for _, p in w.restart_policies],
                                      backoff_limit=w.max_restarts if (w.group, w.kind) == ("batch", "Job") else None,
                                      finished=w.finished)
    return views.WorkloadView(kind=w.kind, api_version=w.api_version, namespace=w.namespace, name=w.name,
                              uid=w.uid, labels=dict(w.labels), owner=_owner(w.owner), restart_forbidden=forbidden)


class CacheSnapshot:
    def __init__(self, cache: caching.ClusterCache) -> None:
        self._cache = cache

    def pod(self, uid: str) -> views.PodView | None:
        found = self._cache.pod(uid)
        return pod_view(found) if found is not None else None

    def pod_by_name(self, namespace: str, name: str) -> views.PodView | None:
        found = self._cache.pod_by_name(namespace, name)
        return pod_view(found) if found is not None else None

    def pods_of_workload(self, uid: str) -> list[views.PodView]:
        return [pod_view(p) for p in self._cache.pods_of_owner(uid)]

    def pods_on_node(self, name: str) -> list[views.PodView]:
        return [pod_view(p) for p in self._cache.pods_on_node(name)]

    def pods_with_label(self, namespace: str, key: str, value: str) -> list[views.PodView]:
        return [pod_view(p) for p in self._cache.pods.values()
                if p.namespace == namespace and proj.get(p.labels, key) == value]

    def node(self, name: str) -> views.NodeView | None:
        found = self._cache.node(name)
        return node_view(found) if found is not None else None

    def workload(self, uid: str) -> views.WorkloadView | None:
        found = self._cache.workload(uid)
        return workload_view(found) if found is not None else None

    def workload_by_name(self, group: str, kind: str, namespace: str, name: str) -> views.WorkloadView | None:
        found = self._cache.workload_by_name(kind, namespace, name, group=group)
        return workload_view(found) if found is not None else None

    def gpu_node_count(self) -> int:
        return sum(1 for n in self._cache.nodes.values() if any(c > 0 for _, c in n.gpu_capacity))

    def cordoned_by_kcover(self) -> list[str]:
        return sorted(n.name for n in self._cache.nodes.values()
                      if proj.get(n.annotations, views.CORDONED_BY) == "kcover")
