"""Simulated cluster actors: a scheduler-plus-kubelet for every node and Kubeflow v1 job operators.

Owns the behaviour the API server alone lacks: binding Pending pods to schedulable nodes, running
bound pods (phase Running, containerStatuses, Ready condition, a log line), the node lifecycle
controller's NoSchedule taints for a node's Ready condition (dropping the `node.kubernetes.io/not-ready`
taint kube-apiserver puts on every Node created through the API once the node is Ready, and binding
pods left pending meanwhile), finishing graceful
deletions after a short delay, failing containers and reporting DRA device health on request
(`fail_container`, `set_device_health`), and recreating the pods of Kubeflow v1 jobs (PyTorchJob,
TFJob, MPIJob, XGBoostJob, PaddleJob, JAXJob) with the labels and controller ownerReference the
real training-operator uses. Actors write through the `Store` (the simulated cluster's storage),
so their writes reach watchers exactly like API writes. Each `run` loop ends when `stop` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, Protocol

from kcover.aio import clock as clocks
from kcover.sim import behaviour, podlogs, status, strategy, tables
from kcover.sim import store as stores

Obj = dict[str, Any]
REPLICA_SPECS = behaviour.REPLICA_SPECS


class Cluster(Protocol):
    store: stores.Store
    logs: podlogs.LogBuffers


def _tolerated(taint: Obj, tolerations: list[Obj]) -> bool:
    for tol in tolerations:
        if tol.get("operator") == "Exists" and not tol.get("key"):
            return True
        same = tol.get("key") == taint.get("key") and tol.get("effect") in (None, "", taint.get("effect"))
        if same and (tol.get("operator") == "Exists" or tol.get("value") == taint.get("value")):
            return True
    return False


def _selected(node: Obj, pod: Obj) -> bool:
    """The pod's `nodeSelector` matches the node's labels (node affinity is not simulated)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in ((pod.get("spec") or {}).get("nodeSelector") or {}).items())


def _schedulable(node: Obj, pod: Obj) -> bool:
    if (node.get("spec") or {}).get("unschedulable") or not _selected(node, pod):
        return False
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    return all(t.get("effect") == "PreferNoSchedule" or _tolerated(t, tolerations)
               for t in (node.get("spec") or {}).get("taints") or [])


def _scheduling(node: Obj) -> tuple[Any, Any]:
    spec = node.get("spec") or {}
    return bool(spec.get("unschedulable")), spec.get("taints") or []


class Kubelets:
    """Scheduler and kubelet of every simulated node plus the node lifecycle controller's Ready taints,
    driven by one watch on pods and one on nodes."""

    def __init__(self, cluster: Cluster, *, start_delay: float = 0.05, finish_delay: float = 0.2,
                 clock: clocks.Clock | None = None) -> None:
        self.store = cluster.store
        self.logs = cluster.logs
        self.start_delay = start_delay
        self.finish_delay = finish_delay
        self.clock: clocks.Clock = clock or clocks.SystemClock()
        self._next_node = 0
        self._pending: set[asyncio.Task[None]] = set()

    def _now(self) -> str:
        return clocks.rfc3339(self.clock.now())

    async def run(self, stop: asyncio.Event) -> None:
        watchers = {key: self.store.watch(key, tables.Filter(), None) for key in ("nodes", "pods")}
        getters: dict[str, asyncio.Future[tables.Change | None]] = {}
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                key = next((k for k, w in watchers.items() if w.initial), None)
                if key is not None:
                    change: tables.Change | None = watchers[key].initial.popleft()
                else:
                    for k, w in watchers.items():
                        if k not in getters:
                            getters[k] = asyncio.ensure_future(w.queue.get())
                    waiting: set[asyncio.Future[Any]] = {*getters.values(), stopping}
                    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                    if stop.is_set():
                        break
                    key = next(k for k, g in getters.items() if g.done())
                    change = getters.pop(key).result()
                    if change is None:  # closed (fell behind): start over from a full list
                        watchers[key] = self.store.watch(key, tables.Filter(), None)
                        continue
                assert change is not None
                if change.type == "DELETED":
                    continue
                if key == "pods":
                    self._react(change.new.obj())
                else:
                    self._node_changed(change)
        finally:
            stopping.cancel()
            for getter in getters.values():
                getter.cancel()
            for watcher in watchers.values():
                watcher.close()
            for task in list(self._pending):
                task.cancel()
            await asyncio.gather(*self._pending, return_exceptions=True)

    def _node_changed(self, change: tables.Change) -> None:
        """Node lifecycle controller and scheduler: keep the Ready taints in line, then retry pending pods
        when what decides scheduling (taints, unschedulable) changed."""
        node = change.new.obj()
        if behaviour.ready_taints(node) is not None:
            def retaint(obj: Obj) -> None:
                taints = behaviour.ready_taints(obj)
                if taints is None:
                    return
                if taints:
                    obj.setdefault("spec", {})["taints"] = taints
                else:
                    (obj.get("spec") or {}).pop("taints", None)

            with contextlib.suppress(status.ApiError):  # the node went meanwhile
                self.store.mutate("nodes", "", node["metadata"]["name"], retaint)
            return  # the write comes back as a change of its own
        if change.old is not None and _scheduling(change.old.obj()) == _scheduling(node):
            return
        for pod in self.store.iter_objects("pods"):
            if not pod["spec"].get("nodeName") and not pod["metadata"].get("deletionTimestamp"):
                self._bind(pod)

    def _later(self, delay: float, action: Callable[[], None], name: str) -> None:
        async def run() -> None:
            await asyncio.sleep(delay)
            with contextlib.suppress(status.ApiError):  # the pod changed or went meanwhile
                action()

        task = asyncio.get_running_loop().create_task(run(), name=name)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _react(self, pod: Obj) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        ns, name, uid = meta.get("namespace", ""), meta["name"], meta["uid"]
        if meta.get("deletionTimestamp"):
            if spec.get("nodeName"):
                grace = min(float(meta.get("deletionGracePeriodSeconds", 0)), self.finish_delay)
                self._later(grace, lambda: self._finish(ns, name, uid), f"kubelet-finish-{ns}/{name}")
            return
        phase = (pod.get("status") or {}).get("phase", "Pending")
        if not spec.get("nodeName"):
            self._bind(pod)
        elif phase == "Pending":
            self._later(self.start_delay, lambda: self._start(ns, name, uid), f"kubelet-start-{ns}/{name}")

    def _bind(self, pod: Obj) -> None:
        every = list(self.store.iter_objects("nodes"))
        nodes = [n for n in every if _schedulable(n, pod)]
        if not nodes:
            self._unschedulable(pod, every)
            return
        node = nodes[self._next_node % len(nodes)]["metadata"]["name"]
        self._next_node += 1
        meta = pod["metadata"]
        with contextlib.suppress(status.ApiError):
            self.store.mutate("pods", meta["namespace"], meta["name"],
                              lambda o: o["spec"].update(nodeName=node) if not o["spec"].get("nodeName") else None)

    def _unschedulable(self, pod: Obj, nodes: list[Obj]) -> None:
        """As kube-scheduler 1.36 does: PodScheduled=False, reason Unschedulable, and its message: each node's
        first failing filter (cordon, untolerated taint, nodeSelector), counted and sorted, then the
        DRA and preemption post-filters' verdicts."""
        reasons: dict[str, int] = {}
        for node in nodes:
            spec = node.get("spec") or {}
            tolerations = (pod.get("spec") or {}).get("tolerations") or []
            untolerated = [t for t in spec.get("taints") or []
                           if t.get("effect") != "PreferNoSchedule" and not _tolerated(t, tolerations)]
            if spec.get("unschedulable"):  # the default profile's filter order
                why = "node(s) were unschedulable"
            elif untolerated:
                why = "node(s) had untolerated taint(s)"
            elif not _selected(node, pod):
                why = "node(s) didn't match Pod's node affinity/selector"
            else:
                continue
            reasons[why] = reasons.get(why, 0) + 1
        n = len(nodes)
        if not n:
            message = "0/0 nodes are available: no nodes available to schedule pods."
        else:
            counted = ", ".join(sorted(f"{count} {why}" for why, count in reasons.items()))
            message = (f"0/{n} nodes are available: {counted}. no new claims to deallocate, preemption: 0/{n} nodes "
                       f"are available: {n} Preemption is not helpful for scheduling.")
        meta = pod["metadata"]

        def change(obj: Obj) -> None:
            status_ = obj.setdefault("status", {})
            conditions = [c for c in status_.get("conditions") or [] if c.get("type") != "PodScheduled"]
            status_["conditions"] = [*conditions, {"type": "PodScheduled", "status": "False",
                                                   "reason": "Unschedulable", "message": message,
                                                   "lastTransitionTime": self._now()}]
            status_.setdefault("phase", "Pending")

        current: Obj = next((c for c in (pod.get("status") or {}).get("conditions") or []
                        if c.get("type") == "PodScheduled"), {})
        if current.get("status") == "False" and current.get("message") == message:
            return
        with contextlib.suppress(status.ApiError):
            self.store.mutate("pods", meta["namespace"], meta["name"], change)

    def _start(self, ns: str, name: str, uid: str) -> None:
        now = self._now()

        def change(pod: Obj) -> None:
            if pod["metadata"]["uid"] != uid:
                return
            st = behaviour.running_status(pod, now)
            if st is not None:
                pod["status"] = st

        pod = self.store.mutate("pods", ns, name, change)
        for c in pod["spec"].get("containers") or []:
            self.logs.append(ns, name, c["name"], f"{c['name']} started on {pod['spec'].get('nodeName')}")

    def _finish(self, ns: str, name: str, uid: str) -> None:
        self.store.delete("pods", ns, name, grace_seconds=0, uid=uid)
        self.logs.forget_pod(ns, name)

    def fail_container(self, namespace: str, pod: str, container: str, *, exit_code: int = 1,
                       reason: str = "Error", message: str = "") -> Obj:
        """The container exits: terminated (restartPolicy Never) or restarted with lastState.terminated."""
        now = self._now()
        self.logs.append(namespace, pod, container, message or f"exited with code {exit_code}")

        def change(obj: Obj) -> None:
            obj["status"] = behaviour.failed_container_status(obj, container, now, exit_code=exit_code,
                                                              reason=reason, message=message)

        updated = self.store.mutate("pods", namespace, pod, change)
        if updated["spec"].get("restartPolicy") != "Never":
            self.logs.restart(namespace, pod, container)
        return updated

    def set_device_health(self, namespace: str, pod: str, container: str, *, resource_name: str,
                          resource_id: str, health: str = "Unhealthy", message: str = "") -> Obj:
        """Report KEP-4680 health of one allocated device in containerStatuses[].allocatedResourcesStatus.

        Refused (422 Invalid, as kube-apiserver refuses the kubelet's /status write) when
        `resource_name` is not a resource of the container: `claim:<claim>/<request>` (or
        `claim:<claim>`) of its resources.claims, or a resource name of its requests or limits."""
        def change(obj: Obj) -> None:
            obj["status"] = behaviour.device_health_status(obj, container, resource_name=resource_name,
                                                           resource_id=resource_id, health=health, message=message)
            strategy.check_pod_status(obj)

        return self.store.mutate("pods", namespace, pod, change)


class KubeflowOperators:
    """Kubeflow v1 training-operator stand-in: keeps every replica pod of every job present."""

    def __init__(self, cluster: Cluster, *, interval: float = 0.2) -> None:
        self.store = cluster.store
        self.interval = interval

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.reconcile()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)

    def reconcile(self) -> int:
        """Create every missing replica pod; returns how many were created."""
        created = 0
        for key in REPLICA_SPECS:
            for job in self.store.iter_objects(key):
                for pod in behaviour.job_pods(job, key):
                    created += self._ensure(pod)
        return created

    def _ensure(self, pod: Obj) -> int:
        meta = pod["metadata"]
        try:
            self.store.entry("pods", meta["namespace"], meta["name"])
            return 0
        except status.ApiError:
            pass
        try:
            self.store.create("pods", {**pod, "status": {"phase": "Pending"}})
        except status.ApiError:
            return 0
        return 1
