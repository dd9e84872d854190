"""The controller's cluster cache: slim pods, nodes, workloads and recovery Events, indexed and observable.

Owns one reflector per watched collection (pods, nodes, Events, and each configured workload kind),
the indexes the detectors and the recovery engine read (pods by uid, by namespace/name, by node, by
owner uid; nodes by name; workloads by uid and by (group, kind, namespace, name)), readiness (every
reflector finished its first list), owner resolution (pod -> controller owner -> JobSet -> TrainJob,
UID-checked), and change subscriptions delivered in order, synchronously after the cache was updated.

It does not write to the API and keeps no raw objects. Reflectors retry on their own (see
`watching.py`); a workload kind whose CRD is missing is logged once and counts as synced (empty). A
subscriber that raises is logged and skipped; it never stops the cache or other subscribers.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import gc
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from kcover import settings as settings_
from kcover.kube import client as client_
from kcover.kube import projections as proj
from kcover.kube import watching

log = structlog.get_logger()


class Kind(enum.StrEnum):
    POD = "Pod"
    NODE = "Node"
    WORKLOAD = "Workload"
    EVENT = "Event"


@dataclass(frozen=True)
class WorkloadKind:
    kind: str
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def path(self) -> str:
        return f"/apis/{self.group}/{self.version}/{self.plural}"

    @property
    def key(self) -> str:
        """`plural.group`, as settings name it: `pytorchjobs.kubeflow.org`, `jobs.batch`."""
        return f"{self.plural}.{self.group}"


WORKLOAD_KINDS: tuple[WorkloadKind, ...] = (
    WorkloadKind("Job", "batch", "v1", "jobs"),
    WorkloadKind("PyTorchJob", "kubeflow.org", "v1", "pytorchjobs"),
    WorkloadKind("TFJob", "kubeflow.org", "v1", "tfjobs"),
    WorkloadKind("MPIJob", "kubeflow.org", "v1", "mpijobs"),
    WorkloadKind("PaddleJob", "kubeflow.org", "v1", "paddlejobs"),
    WorkloadKind("XGBoostJob", "kubeflow.org", "v1", "xgboostjobs"),
    WorkloadKind("JAXJob", "kubeflow.org", "v1", "jaxjobs"),
    WorkloadKind("JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets"),
    WorkloadKind("TrainJob", "trainer.kubeflow.org", "v1alpha1", "trainjobs"),
    WorkloadKind("Job", "batch.volcano.sh", "v1alpha1", "jobs"),
    WorkloadKind("LeaderWorkerSet", "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
)
"""Every workload kind DESIGN.md names (storage versions of the CRDs kcover is tested with)."""

DEFAULT_WORKLOAD_KINDS: tuple[str, ...] = tuple(k.key for k in WORKLOAD_KINDS)

Record = proj.Pod | proj.Node | proj.Workload | proj.KubeEvent
Change = tuple[Kind, Any, Any]
"""(kind, old, new): old None on add, new None on delete."""
Callback = Callable[[Kind, Any, Any], None]


def workload_kinds(keys: Iterable[str]) -> tuple[WorkloadKind, ...]:
    """Resolve `plural.group` keys against the known kinds; unknown keys raise ValueError."""
    known = {k.key: k for k in WORKLOAD_KINDS}
    out = []
    for key in keys:
        if key not in known:
            raise ValueError(f"unknown workload kind {key!r}; known: {sorted(known)}")
        out.append(known[key])
    return tuple(out)


class ChangeStream:
    """An asyncio-friendly, unbounded, ordered stream of changes (from `ClusterCache.stream()`)."""

    def __init__(self, cache: ClusterCache) -> None:
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


class ClusterCache:
    """Slim, indexed, observable copies of the cluster objects kcover reads."""

    def __init__(self, kube: client_.KubeClient, *, workload_kinds: Sequence[WorkloadKind] = WORKLOAD_KINDS,
                 watch_events: bool = True, options: watching.ReflectorOptions | None = None,
                 freeze_gc: bool = False) -> None:
        self.freeze_gc = freeze_gc
        """After the first full sync, `gc.freeze()` the process: the cyclic GC then never rescans the
        cached objects (they hold no cycles), which at 150,000 pods removes pauses of a second that
        otherwise stall watch delivery. A process-wide effect: the controller opts in by setting."""
        self._subscribers: list[Callback] = []
        self.pods: dict[str, proj.Pod] = {}
        self.nodes: dict[str, proj.Node] = {}
        self.workloads: dict[str, proj.Workload] = {}
        self.events: dict[str, proj.KubeEvent] = {}
        self._pod_by_name: dict[tuple[str, str], str] = {}
        self._pods_by_node: dict[str, set[str]] = {}
        self._pods_by_owner: dict[str, set[str]] = {}
        self._workload_by_name: dict[tuple[str, str, str, str], str] = {}
        self._workloads_by_owner: dict[str, set[str]] = {}
        self._node_uid: dict[str, str] = {}
        self.reflectors: list[watching.Reflector[Any]] = []
        self.pod_reflector = watching.Reflector(kube, "/api/v1/pods", proj.pod, sink=self._on_pod,
                                                name="pods", options=options)
        self.node_reflector = watching.Reflector(kube, "/api/v1/nodes", proj.node, sink=self._on_node,
                                                 name="nodes", options=options)
        self.reflectors += [self.pod_reflector, self.node_reflector]
        if watch_events:
            self.reflectors.append(watching.Reflector(kube, "/api/v1/events", proj.recovery_event,
                                                      sink=self._on_event, name="events", options=options))
        for wk in workload_kinds:
            self.reflectors.append(watching.Reflector(kube, wk.path, proj.workload, sink=self._on_workload,
                                                      name=wk.key, options=options))

    @classmethod
    def from_settings(cls, kube: client_.KubeClient, kube_settings: settings_.KubeSettings) -> ClusterCache:
        s = kube_settings
        options = watching.ReflectorOptions(
            page_size=s.page_size, watch_timeout_seconds=s.watch_timeout_seconds,
            inactivity_timeout_seconds=s.inactivity_timeout_seconds,
            backoff_initial_seconds=s.backoff_initial_seconds, backoff_max_seconds=s.backoff_max_seconds,
            missing_retry_seconds=s.missing_kind_retry_seconds,
            request_timeout_seconds=max(s.request_timeout_seconds, 60.0))
        return cls(kube, workload_kinds=workload_kinds(s.workload_kinds), watch_events=s.watch_events,
                   options=options, freeze_gc=s.gc_freeze_after_sync)

    # --------------------------------------------------------------------------------- lifecycle

    async def run(self, stop: asyncio.Event) -> None:
        """Run every reflector until `stop` is set."""
        async with asyncio.TaskGroup() as tg:
            for reflector in self.reflectors:
                tg.create_task(reflector.run(stop), name=f"reflector:{reflector.name}")
            started = asyncio.get_running_loop().time()
            if await self.wait_synced(stop):
                log.info("cache_synced", pods=len(self.pods), nodes=len(self.nodes), workloads=len(self.workloads),
                         seconds=round(asyncio.get_running_loop().time() - started, 3))
                if self.freeze_gc:
                    gc.collect()
                    gc.freeze()

    @property
    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self.reflectors)

    async def wait_synced(self, stop: asyncio.Event | None = None) -> bool:
        """Wait until every reflector listed once; False if `stop` was set first."""
        for reflector in self.reflectors:
            if stop is None:
                await reflector.synced.wait()
                continue
            waiter = asyncio.ensure_future(reflector.synced.wait())
            stopper = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait((waiter, stopper), return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                stopper.cancel()
            if not reflector.synced.is_set():
                return False
        return True

    # ------------------------------------------------------------------------------ subscriptions

    def subscribe(self, callback: Callback, *, replay: bool = True) -> Callable[[], None]:
        """Call `callback(kind, old, new)` for every change from now on, synchronously after the cache
        was updated. With `replay`, first call it with (kind, None, obj) for everything cached now.
        Returns a function that unsubscribes."""
        if replay:
            for kind, store in ((Kind.NODE, self.nodes), (Kind.WORKLOAD, self.workloads),
                                (Kind.POD, self.pods), (Kind.EVENT, self.events)):
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
        if new is not None:
            self.pods[new.uid] = new
            self._pod_by_name[(new.namespace, new.name)] = new.uid
            if new.node:
                self._pods_by_node.setdefault(new.node, set()).add(new.uid)
            if new.owner is not None:
                self._pods_by_owner.setdefault(new.owner.uid, set()).add(new.uid)
        self._notify(Kind.POD, old, new)

    def _on_node(self, old: proj.Node | None, new: proj.Node | None) -> None:
        if old is not None:
            self.nodes.pop(old.name, None)
        if new is not None:
            self.nodes[new.name] = new
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

    def pods_of_workload(self, workload_uid: str) -> list[proj.Pod]:
        """Pods under a workload, through owned workloads (a JobSet's Jobs, a TrainJob's JobSet)."""
        out: list[proj.Pod] = []
        seen: set[str] = set()
        todo = [workload_uid]
        while todo:
            uid = todo.pop()
            if uid in seen:
                continue
            seen.add(uid)
            out.extend(self.pods_of_owner(uid))
            todo.extend(self._workloads_by_owner.get(uid, ()))
        return out

    def node(self, name: str) -> proj.Node | None:
        return self.nodes.get(name)

    def workload(self, uid: str) -> proj.Workload | None:
        return self.workloads.get(uid)

    def workload_by_name(self, kind: str, namespace: str, name: str, *, group: str | None = None) -> proj.Workload | None:
        """Look a workload up by kind and name; pass `group` where kinds collide (batch vs Volcano Job)."""
        if group is not None:
            uid = self._workload_by_name.get((group, kind, namespace, name))
            return self.workloads.get(uid) if uid is not None else None
        for wk in WORKLOAD_KINDS:
            if wk.kind == kind:
                found = self.workload_by_name(kind, namespace, name, group=wk.group)
                if found is not None:
                    return found
        return None

    def owner_chain(self, pod: proj.Pod) -> list[proj.Workload]:
        """The pod's workloads, nearest first: controller owner, then JobSet above a Job, then TrainJob
        above a JobSet. Every step checks the ownerReference's uid. Falls back to the membership
        labels (LWS pods are owned by a StatefulSet kcover does not watch)."""
        chain: list[proj.Workload] = []
        ref = pod.owner
        first = self.workloads.get(ref.uid) if ref is not None else None
        if first is None:
            first = self._by_membership_label(pod)
        current = first
        while current is not None and len(chain) < 4:
            chain.append(current)
            ref = current.owner
            if ref is None or (current.kind, current.group, ref.kind) not in _PARENTS:
                break
            parent = self.workloads.get(ref.uid)
            if parent is None or parent.kind != ref.kind:
                break
            current = parent
        return chain

    def _by_membership_label(self, pod: proj.Pod) -> proj.Workload | None:
        for label, (group, kind) in proj.MEMBERSHIP_LABELS.items():
            name = proj.get(pod.labels, label)
            if not name or not kind:  # Kubeflow v1 labels do not say the kind: only the owner ref does
                continue
            found = self.workload_by_name(kind, pod.namespace, name, group=group)
            owner = pod.owner
            if found is not None and (owner is None or owner.kind != found.kind or owner.uid == found.uid):
                return found
        return None

    def workload_of(self, pod: proj.Pod) -> proj.Workload | None:
        """The top of the pod's owner chain: the unit kcover restarts."""
        chain = self.owner_chain(pod)
        return chain[-1] if chain else None

    def workload_ref(self, pod: proj.Pod) -> dict[str, str] | None:
        """`{kind, name, uid, apiVersion}` of the pod's top workload, for event attributes; None if unresolved."""
        w = self.workload_of(pod)
        if w is None:
            return None
        return {"kind": w.kind, "name": w.name, "uid": w.uid, "apiVersion": w.api_version}

    def opted_in(self, pod: proj.Pod) -> bool:
        """The opt-in label is `true` on the pod or on any workload of its owner chain."""
        if proj.get(pod.labels, proj.OPT_IN_LABEL).lower() == "true":
            return True
        return any(proj.get(w.labels, proj.OPT_IN_LABEL).lower() == "true" for w in self.owner_chain(pod))


_PARENTS = frozenset({("Job", "batch", "JobSet"), ("JobSet", "jobset.x-k8s.io", "TrainJob")})
"""(child kind, child group, parent kind) steps the owner chain climbs."""


def _unindex(index: dict[str, set[str]], key: str, uid: str) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(uid)
        if not members:
            del index[key]


def _drop(index: dict[Any, str], key: Any, uid: str) -> None:
    if index.get(key) == uid:
        del index[key]
