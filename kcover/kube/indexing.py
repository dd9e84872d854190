"""The cluster index: the cached records, their indexes, the reads over them and change subscriptions.

Owns the collections `caching.ClusterCache` keeps (pods, nodes, workloads, Events, DRA ResourceSlices,
Namespaces, the controls ConfigMap), the indexes the detectors and the recovery engine read (pods by uid,
by namespace/name, by node, by owner uid, by membership label; nodes by name; workloads by uid and by
(group, kind, namespace, name); ResourceSlice drivers by node; the nodes kcover cordoned and the count of
GPU nodes, kept as nodes change), the sinks that keep them as records come and go, the reads of
`recovery.planinputs.Snapshot`, and change subscriptions delivered in order, synchronously after the index was
updated. It does not own the reflectors that feed it, readiness or the settings (`caching`); owner
resolution and opt-in are `ownership`'s, "is this a GPU node" is `gpus`'.

It does no I/O and keeps no raw objects. A subscriber that raises is logged and skipped; it never stops
the index or other subscribers.
"""

from __future__ import annotations

import asyncio
import collections
import enum
from collections.abc import AsyncIterator, Callable
from typing import Any

import structlog

from kcover import kinds, model
from kcover.kube import gpus, ownership
from kcover.kube import projections as proj

log = structlog.get_logger()


class Kind(enum.StrEnum):
    POD = "Pod"
    NODE = "Node"
    WORKLOAD = "Workload"
    EVENT = "Event"
    RESOURCE_SLICE = "ResourceSlice"
    NAMESPACE = "Namespace"
    CONTROLS = "Controls"


Record = proj.Pod | proj.Node | proj.Workload | proj.KubeEvent | proj.ResourceSlice | proj.Namespace | proj.ConfigMap
Change = tuple[Kind, Any, Any]
"""(kind, old, new): old None on add, new None on delete."""
Callback = Callable[[Kind, Any, Any], None]


class ChangeStream:
    """An asyncio-friendly, unbounded, ordered stream of changes (from `ClusterIndex.stream()`)."""

    def __init__(self, cache: ClusterIndex) -> None:
        self._cache = cache
        self._queue: collections.deque[Change] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False

    def _push(self, kind: Kind, old: Any, new: Any) -> None:
        self._queue.append((kind, old, new))
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def close(self) -> None:
        self._closed = True
        self._cache.unsubscribe(self._push)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def __aiter__(self) -> AsyncIterator[Change]:
        while True:
            while self._queue:
                yield self._queue.popleft()
            if self._closed:
                return
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None


class ClusterIndex:
    """Slim, indexed, observable copies of the cluster objects kcover reads (fed by `caching.ClusterCache`)."""

    def __init__(self, *, gpu_rule: gpus.GpuRule = gpus.DEFAULT, controls: tuple[str, str] | None = None) -> None:
        """`controls`: (namespace, name) of the controls ConfigMap kept (the recovery's pause and reset
        requests); None keeps none."""
        self.gpu_rule = gpu_rule
        self._subscribers: list[Callback] = []
        self.pods: dict[str, proj.Pod] = {}
        self.nodes: dict[str, proj.Node] = {}
        self._kcover_cordoned: set[str] = set()
        """Names of the nodes carrying kcover's cordon annotation: recovery asks for them with every fault."""
        self._gpu_nodes: int | None = None
        """How many cached nodes are GPU nodes; None until asked again after a node or slice changed."""
        self.workloads: dict[str, proj.Workload] = {}
        self.events: dict[str, proj.KubeEvent] = {}
        self.resource_slices: dict[str, proj.ResourceSlice] = {}
        self.namespaces: dict[str, proj.Namespace] = {}
        """Namespace name -> its projection (pause and opt-in labels and annotations)."""
        self.controls_map: proj.ConfigMap | None = None
        self.controls_ref = controls
        self._pod_by_name: dict[tuple[str, str], str] = {}
        self._pods_by_node: dict[str, set[str]] = {}
        self._pods_by_owner: dict[str, set[str]] = {}
        self._pods_by_label: dict[tuple[str, str, str], set[str]] = {}
        self._workload_by_name: dict[tuple[str, str, str, str], str] = {}
        self._workloads_by_owner: dict[str, set[str]] = {}
        self._slices_by_node: dict[str, dict[str, str]] = {}
        """Node name -> ResourceSlice uid -> driver."""

    # ------------------------------------------------------------------------------ subscriptions

    def subscribe(self, callback: Callback, *, replay: bool = True) -> Callable[[], None]:
        """Call `callback(kind, old, new)` for every change from now on, synchronously after the cache
        was updated. With `replay`, first call it with (kind, None, obj) for everything cached now.
        Returns a function that unsubscribes."""
        if replay:
            for kind, store in ((Kind.NODE, self.nodes), (Kind.RESOURCE_SLICE, self.resource_slices),
                                (Kind.WORKLOAD, self.workloads), (Kind.POD, self.pods), (Kind.EVENT, self.events)):
                for obj in list(store.values()):
                    callback(kind, None, obj)
        self._subscribers.append(callback)
        return lambda: self.unsubscribe(callback)

    def unsubscribe(self, callback: Callback) -> None:
        if callback in self._subscribers:
            self._subscribers.remove(callback)

    def stream(self, *, replay: bool = True) -> ChangeStream:
        """An async iterator of (kind, old, new); close() it when done."""
        stream = ChangeStream(self)
        self.subscribe(stream._push, replay=replay)
        return stream

    def _notify(self, kind: Kind, old: Any, new: Any) -> None:
        for callback in tuple(self._subscribers):
            try:
                callback(kind, old, new)
            except Exception:
                log.exception("cache_subscriber_failed", subscriber=getattr(callback, "__qualname__", "?"),
                              kind=kind.value)

    # ------------------------------------------------------------------------------------- sinks

    def _on_pod(self, old: proj.Pod | None, new: proj.Pod | None) -> None:
        if old is not None:
            del self.pods[old.uid]
            _drop(self._pod_by_name, (old.namespace, old.name), old.uid)
            _unindex(self._pods_by_node, old.node, old.uid)
            if old.owner is not None:
                _unindex(self._pods_by_owner, old.owner.uid, old.uid)
            for key, value in old.labels:
                if key in INDEXED_LABELS:
                    _unindex(self._pods_by_label, (old.namespace, key, value), old.uid)
        if new is not None:
            self.pods[new.uid] = new
            self._pod_by_name[(new.namespace, new.name)] = new.uid
            if new.node:
                self._pods_by_node.setdefault(new.node, set()).add(new.uid)
            if new.owner is not None:
                self._pods_by_owner.setdefault(new.owner.uid, set()).add(new.uid)
            for key, value in new.labels:
                if key in INDEXED_LABELS:
                    self._pods_by_label.setdefault((new.namespace, key, value), set()).add(new.uid)
        self._notify(Kind.POD, old, new)

    def _on_node(self, old: proj.Node | None, new: proj.Node | None) -> None:
        count = self._gpu_nodes  # kept as nodes change: every agent's condition write is a node change
        if old is not None:
            gone = self.nodes.pop(old.name, None)
            self._kcover_cordoned.discard(old.name)
            if gone is not None and count is not None:
                count -= self.is_gpu_node(gone)
        if new is not None:
            before = self.nodes.get(new.name)
            if before is not None and count is not None:
                count -= self.is_gpu_node(before)
            self.nodes[new.name] = new
            if new.cordoned_by_kcover:
                self._kcover_cordoned.add(new.name)
            if count is not None:
                count += self.is_gpu_node(new)
        self._gpu_nodes = count
        self._notify(Kind.NODE, old, new)

    def _on_workload(self, old: proj.Workload | None, new: proj.Workload | None) -> None:
        if old is not None:
            del self.workloads[old.uid]
            _drop(self._workload_by_name, (old.group, old.kind, old.namespace, old.name), old.uid)
            if old.owner is not None:
                _unindex(self._workloads_by_owner, old.owner.uid, old.uid)
        if new is not None:
            self.workloads[new.uid] = new
            self._workload_by_name[(new.group, new.kind, new.namespace, new.name)] = new.uid
            if new.owner is not None:
                self._workloads_by_owner.setdefault(new.owner.uid, set()).add(new.uid)
        self._notify(Kind.WORKLOAD, old, new)

    def _on_event(self, old: proj.KubeEvent | None, new: proj.KubeEvent | None) -> None:
        if old is not None:
            del self.events[old.uid]
        if new is not None:
            self.events[new.uid] = new
        self._notify(Kind.EVENT, old, new)

    def _on_namespace(self, old: proj.Namespace | None, new: proj.Namespace | None) -> None:
        if old is not None:
            self.namespaces.pop(old.name, None)
        if new is not None:
            self.namespaces[new.name] = new
        self._notify(Kind.NAMESPACE, old, new)

    def _on_controls(self, old: proj.ConfigMap | None, new: proj.ConfigMap | None) -> None:
        if (new or old) is not None and ((new or old).namespace, (new or old).name) != self.controls_ref:  # type: ignore[union-attr]
            return  # an offline load of another ConfigMap (the server-side field selector keeps these out)
        self.controls_map = new
        self._notify(Kind.CONTROLS, old, new)

    def _on_slice(self, old: proj.ResourceSlice | None, new: proj.ResourceSlice | None) -> None:
        self._gpu_nodes = None
        if old is not None:
            del self.resource_slices[old.uid]
            on_node = self._slices_by_node.get(old.node)
            if on_node is not None:
                on_node.pop(old.uid, None)
                if not on_node:
                    del self._slices_by_node[old.node]
        if new is not None:
            self.resource_slices[new.uid] = new
            if new.node:
                self._slices_by_node.setdefault(new.node, {})[new.uid] = new.driver
        self._notify(Kind.RESOURCE_SLICE, old, new)

    # ------------------------------------------------------------------------------------ reads

    def pod(self, uid: str) -> proj.Pod | None:
        return self.pods.get(uid)

    def pod_by_name(self, namespace: str, name: str) -> proj.Pod | None:
        uid = self._pod_by_name.get((namespace, name))
        return self.pods.get(uid) if uid is not None else None

    def pods_on_node(self, node: str) -> list[proj.Pod]:
        return [self.pods[u] for u in self._pods_by_node.get(node, ())]

    def pods_of_owner(self, owner_uid: str) -> list[proj.Pod]:
        """Pods whose controller ownerReference has this uid (direct children only)."""
        return [self.pods[u] for u in self._pods_by_owner.get(owner_uid, ())]

    def pods_with_label(self, namespace: str, key: str, value: str) -> list[proj.Pod]:
        """Pods of `namespace` whose (kept) label `key` is `value`; indexed for `INDEXED_LABELS`."""
        if key in INDEXED_LABELS:
            return [self.pods[u] for u in self._pods_by_label.get((namespace, key, value), ())]
        return [p for p in self.pods.values() if p.namespace == namespace and proj.get(p.labels, key) == value]

    def pods_of_workload(self, workload_uid: str) -> list[proj.Pod]:
        """Every pod belonging to the workload: the pods whose resolved owner chain (`ownership.resolve`)
        includes it. Found through the owner indexes (a TrainJob's JobSet, its Jobs, their pods) and,
        where an intermediate controller is not cached (an LWS's StatefulSets), its membership label."""
        out: dict[str, proj.Pod] = {}
        seen: set[str] = set()
        todo = [workload_uid]
        while todo:
            uid = todo.pop()
            if uid in seen:
                continue
            seen.add(uid)
            for p in self.pods_of_owner(uid):
                out[p.uid] = p
            todo.extend(self._workloads_by_owner.get(uid, ()))
        w = self.workloads.get(workload_uid)
        if w is not None:
            table = kinds.of(w.group, w.kind)
            if table is not None:
                for p in self.pods_with_label(w.namespace, table.membership_label, w.name):
                    if p.uid not in out and self._in_chain(p, workload_uid):
                        out[p.uid] = p
        return sorted(out.values(), key=lambda p: (p.namespace, p.name))

    def _in_chain(self, pod: proj.Pod, workload_uid: str) -> bool:
        resolved = ownership.resolve(self, pod)
        return isinstance(resolved, ownership.Resolved) and any(c.uid == workload_uid for c in resolved.chain)

    def node(self, name: str) -> proj.Node | None:
        return self.nodes.get(name)

    def namespace(self, name: str) -> proj.Namespace | None:
        return self.namespaces.get(name)

    def controls(self) -> proj.ConfigMap | None:
        """The controls ConfigMap (`recovery.controls_name`), or None when it does not exist or is not watched."""
        return self.controls_map

    def workload(self, uid: str) -> proj.Workload | None:
        return self.workloads.get(uid)

    def workload_by_name(self, group: str, kind: str, namespace: str, name: str) -> proj.Workload | None:
        """Look a workload up by group, kind and name (kinds collide across groups: batch vs Volcano Job)."""
        uid = self._workload_by_name.get((group, kind, namespace, name))
        return self.workloads.get(uid) if uid is not None else None

    def resolve(self, pod: proj.Pod) -> ownership.Resolved | ownership.Unresolved:
        """The pod's owner chain up to the workload kcover restarts (`ownership.resolve`)."""
        return ownership.resolve(self, pod)

    def owner_chain(self, pod: proj.Pod) -> list[proj.Workload]:
        """The workloads of the pod's resolved owner chain, nearest first; [] when it does not resolve."""
        resolved = ownership.resolve(self, pod)
        if not isinstance(resolved, ownership.Resolved):
            return []
        return [c for c in resolved.chain if isinstance(c, proj.Workload)]

    def workload_of(self, pod: proj.Pod) -> proj.Workload | None:
        """The top of the pod's owner chain: the unit kcover restarts."""
        resolved = ownership.resolve(self, pod)
        return resolved.workload if isinstance(resolved, ownership.Resolved) else None

    def workload_ref(self, pod: proj.Pod) -> dict[str, str] | None:
        """`{kind, name, uid, apiVersion}` of the pod's top workload, for event attributes; None if unresolved."""
        w = self.workload_of(pod)
        if w is None:
            return None
        return {"kind": w.kind, "name": w.name, "uid": w.uid, "apiVersion": w.api_version}

    def opted_in(self, pod: proj.Pod) -> bool:
        """`ownership.opted_in`: the opt-in label on the pod, on any controller of its owner chain, or on its
        Namespace."""
        return ownership.opted_in(pod, ownership.resolve(self, pod), namespace=self.namespace(pod.namespace))

    def slice_drivers(self, node: str) -> list[str]:
        """The drivers of the DRA ResourceSlices naming `node`."""
        return list(self._slices_by_node.get(node, {}).values())

    def publishes_device(self, node: str, device: model.DraDevice) -> bool:
        """Whether a DRA ResourceSlice naming `node` in `spec.nodeName` publishes `device` (its driver,
        pool and device name): the check an agent's report about a device of its node must pass."""
        for uid in self._slices_by_node.get(node, {}):
            found = self.resource_slices.get(uid)
            if found is not None and found.driver == device.driver and found.pool == device.pool \
                    and device.device in found.devices:
                return True
        return False

    def is_gpu_node(self, node: proj.Node) -> bool:
        return self.gpu_rule.is_gpu_node(node, self.slice_drivers(node.name))

    def holds_gpus(self, pod: proj.Pod) -> bool:
        """`gpus.GpuRule.holds_gpus`: the pod asks for GPUs (device-plugin resources or DRA claims)."""
        return self.gpu_rule.holds_gpus(pod)

    def gpu_node_count(self) -> int:
        """Cached nodes that are GPU nodes by `gpus.GpuRule` (capacity or DRA ResourceSlices); counted once,
        then kept as nodes change, and counted again only after a ResourceSlice changed (recovery asks with
        every fault: at 2,000 nodes a count per fault made a 1,000-pod job failing at once cost millions of
        checks, and a recount after each node change, each agent's condition write among them, 2 ms a fault)."""
        if self._gpu_nodes is None:
            self._gpu_nodes = sum(1 for n in self.nodes.values() if self.is_gpu_node(n))
        return self._gpu_nodes

    def cordoned_by_kcover(self) -> list[str]:
        """Names of nodes carrying kcover's cordon annotation (kept as nodes change, not searched for)."""
        return sorted(self._kcover_cordoned)

    def kcover_cordons(self, taint_key: str) -> list[str]:
        """Names of the nodes whose kcover cordon is in effect (`Node.kcover_cordon_in_effect`): of those carrying
        the annotation, the ones still unschedulable or tainted with `taint_key`."""
        return sorted(n for n in self._kcover_cordoned if self.nodes[n].kcover_cordon_in_effect(taint_key))


INDEXED_LABELS = kinds.INDEXED_LABELS
"""Pod labels with an index (namespace, key, value): those a restart selector starts with."""


def _unindex(index: dict[Any, set[str]], key: Any, uid: str) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(uid)
        if not members:
            del index[key]


def _drop(index: dict[Any, str], key: Any, uid: str) -> None:
    if index.get(key) == uid:
        del index[key]
