"""Simulated cluster actors: a scheduler-plus-kubelet for every node and Kubeflow v1 job operators.

Owns the behaviour the API server alone lacks: binding Pending pods to nodes that pass
kube-scheduler's filters (`scheduling`: cordons, taints, nodeSelector, and requests, GPUs included,
against what the node has left), or else the PodScheduled=False condition and a FailedScheduling
Event with the scheduler's message (pending pods are retried when a node changes or a pod goes),
running bound pods (phase Running, containerStatuses, Ready condition, a pod IP from the node's pod
CIDR and the node's host IP (`addressing`), a log line), giving nodes without one a pod CIDR (the
node IPAM controller), the node lifecycle
controller's NoSchedule taints for a node's Ready condition (dropping the `node.kubernetes.io/not-ready`
taint kube-apiserver puts on every Node created through the API once the node is Ready, and binding
pods left pending meanwhile), finishing graceful
deletions after a short delay (the kubelet first writes the terminal phase, Failed with exit code 137, as
kubelets since 1.27 do, so controllers see how the pod ended), failing containers and reporting DRA
device health on request
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
from kcover.sim import addressing, behaviour, informing, podlogs, scheduling, status, strategy, tables
from kcover.sim import store as stores

Obj = dict[str, Any]
REPLICA_SPECS = behaviour.REPLICA_SPECS


class Cluster(Protocol):
    store: stores.Store
    logs: podlogs.LogBuffers


def _frees(old: Obj, new: Obj) -> bool:
    """A bound pod that turned terminal: what it requested on its node is free again."""
    phase = (new.get("status") or {}).get("phase")
    return bool((new.get("spec") or {}).get("nodeName")) and phase in scheduling.TERMINAL \
        and (old.get("status") or {}).get("phase") != phase


def _scheduling(node: Obj) -> tuple[Any, Any, Any, Any]:
    spec = node.get("spec") or {}
    return (bool(spec.get("unschedulable")), spec.get("taints") or [], (node.get("status") or {}).get("allocatable"),
            (node.get("metadata") or {}).get("labels"))


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
        self._finishing: set[str] = set()

    def _now(self) -> str:
        return clocks.rfc3339(self.clock.now())

    async def run(self, stop: asyncio.Event) -> None:
        try:
            async for key, change in informing.follow(self.store, ("nodes", "pods"), stop):
                if key == "pods":
                    if change.type == "DELETED" or (change.old is not None and _frees(change.old.obj(),
                                                                                     change.new.obj())):
                        self._retry_pending()  # what it held on its node is free again
                    if change.type != "DELETED":
                        self._react(change.new.obj())
                elif change.type != "DELETED":
                    self._node_changed(change)
        finally:
            for task in list(self._pending):
                task.cancel()
            await asyncio.gather(*self._pending, return_exceptions=True)

    def _node_changed(self, change: tables.Change) -> None:
        """Node IPAM and lifecycle controllers, then the scheduler: give the node a pod CIDR, keep its Ready
        taints in line, then retry pending pods when what decides scheduling (taints, unschedulable,
        allocatable) changed."""
        node = change.new.obj()
        name = node["metadata"]["name"]
        if not (node.get("spec") or {}).get("podCIDR"):
            cidr = addressing.next_pod_cidr(self.store.iter_objects("nodes"))
            if cidr is not None:
                with contextlib.suppress(status.ApiError):
                    self.store.mutate("nodes", "", name, lambda o: o.setdefault("spec", {}).update(
                        podCIDR=cidr, podCIDRs=[cidr]) if not (o.get("spec") or {}).get("podCIDR") else None)
                return  # the write comes back as a change of its own
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
                self.store.mutate("nodes", "", name, retaint)
            return  # the write comes back as a change of its own
        if change.old is not None and _scheduling(change.old.obj()) == _scheduling(node):
            return
        self._retry_pending()

    def _retry_pending(self) -> None:
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
            if spec.get("nodeName") and uid not in self._finishing:
                self._finishing.add(uid)
                grace = min(float(meta.get("deletionGracePeriodSeconds", 0)), self.finish_delay)
                self._later(grace, lambda: self._finish(ns, name, uid), f"kubelet-finish-{ns}/{name}")
            return
        phase = (pod.get("status") or {}).get("phase", "Pending")
        if not spec.get("nodeName"):
            self._bind(pod)
        elif phase == "Pending":
            self._later(self.start_delay, lambda: self._start(ns, name, uid), f"kubelet-start-{ns}/{name}")

    def _bind(self, pod: Obj) -> None:
        if (pod.get("spec") or {}).get("schedulerName", "default-scheduler") != "default-scheduler":
            return  # another scheduler's pod
        every = list(self.store.iter_objects("nodes"))
        used = scheduling.usage(self.store.iter_objects("pods"), skip_uid=pod["metadata"]["uid"])
        verdict = scheduling.schedule(every, pod, used)
        if not verdict.feasible:
            self._unschedulable(pod, verdict.message)
            return
        node = verdict.feasible[self._next_node % len(verdict.feasible)]
        self._next_node += 1
        meta = pod["metadata"]
        with contextlib.suppress(status.ApiError):
            self.store.mutate("pods", meta["namespace"], meta["name"],
                              lambda o: o["spec"].update(nodeName=node) if not o["spec"].get("nodeName") else None)

    def _unschedulable(self, pod: Obj, message: str) -> None:
        """As kube-scheduler 1.36 does: PodScheduled=False, reason Unschedulable, with the FitError message
        (`scheduling.fit_error`), and a FailedScheduling Event when the message changed."""
        meta = pod["metadata"]
        current: Obj = next((c for c in (pod.get("status") or {}).get("conditions") or []
                             if c.get("type") == "PodScheduled"), {})
        if current.get("status") == "False" and current.get("message") == message:
            return

        def change(obj: Obj) -> None:
            status_ = obj.setdefault("status", {})
            conditions = [c for c in status_.get("conditions") or [] if c.get("type") != "PodScheduled"]
            status_["conditions"] = [*conditions, {"type": "PodScheduled", "status": "False",
                                                   "reason": "Unschedulable", "message": message,
                                                   "lastTransitionTime": self._now()}]
            status_.setdefault("phase", "Pending")

        with contextlib.suppress(status.ApiError):
            self.store.mutate("pods", meta["namespace"], meta["name"], change)
            self._event(pod, "FailedScheduling", message)

    def _event(self, pod: Obj, reason: str, message: str) -> None:
        """A Warning Event about `pod` as kube-scheduler's events.k8s.io/v1 recorder writes it."""
        meta = pod["metadata"]
        now = self.clock.now()
        self.store.create("events", {
            "metadata": {"name": f"{meta['name']}.{int(now.timestamp() * 1e9):x}", "namespace": meta["namespace"]},
            "involvedObject": {"kind": "Pod", "apiVersion": "v1", "namespace": meta["namespace"],
                               "name": meta["name"], "uid": meta["uid"]},
            "reason": reason, "message": message, "type": "Warning", "action": "Scheduling",
            "eventTime": clocks.micro_time(now), "reportingComponent": "default-scheduler",
            "reportingInstance": "default-scheduler-kcover-sim", "source": {}})

    def _start(self, ns: str, name: str, uid: str) -> None:
        now = self._now()
        current = self.store.get("pods", ns, name)
        node_name = current["spec"].get("nodeName") or ""
        try:
            node = self.store.get("nodes", "", node_name)
        except status.ApiError:
            node = {}
        host_ip = addressing.host_ip(node)
        pod_ip = host_ip if current["spec"].get("hostNetwork") else addressing.pod_ip(
            node, self.store.iter_objects("pods"))

        def change(pod: Obj) -> None:
            if pod["metadata"]["uid"] != uid:
                return
            st = behaviour.running_status(pod, now, host_ip=host_ip, pod_ip=pod_ip)
            if st is not None:
                pod["status"] = st

        pod = self.store.mutate("pods", ns, name, change)
        for c in pod["spec"].get("containers") or []:
            self.logs.append(ns, name, c["name"], f"{c['name']} started on {pod['spec'].get('nodeName')}")

    def _finish(self, ns: str, name: str, uid: str) -> None:
        """The kubelet kills the pod's containers, writes the terminal phase, then completes the deletion
        (finalizers, such as the Job controller's, may still hold the object)."""
        self._finishing.discard(uid)
        now = self._now()

        def terminal(pod: Obj) -> None:
            if pod["metadata"]["uid"] == uid:
                pod["status"] = behaviour.killed_status(pod, now)

        pod = self.store.get("pods", ns, name)
        if pod["metadata"]["uid"] == uid and (pod.get("status") or {}).get("phase") not in scheduling.TERMINAL:
            self.store.mutate("pods", ns, name, terminal)
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
