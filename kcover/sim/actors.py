"""Simulated cluster actors: a scheduler-plus-kubelet for every node and Kubeflow v1 job operators.

Owns the behaviour the API server alone lacks: binding Pending pods to schedulable nodes, running
bound pods (phase Running, containerStatuses, Ready condition, a log line), finishing graceful
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
from kcover.sim import behaviour, podlogs, status
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


def _schedulable(node: Obj, pod: Obj) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    return all(t.get("effect") == "PreferNoSchedule" or _tolerated(t, tolerations)
               for t in (node.get("spec") or {}).get("taints") or [])


class Kubelets:
    """Scheduler and kubelet of every simulated node, driven by one watch on pods."""

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
        watcher = self.store.watch("pods", stores.Filter(), None)
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                change = watcher.initial.popleft() if watcher.initial else None
                if change is None:
                    getter = asyncio.ensure_future(watcher.queue.get())
                    await asyncio.wait({getter, stopping}, return_when=asyncio.FIRST_COMPLETED)
                    if not getter.done():
                        getter.cancel()
                        break
                    change = getter.result()
                    if change is None:
                        watcher = self.store.watch("pods", stores.Filter(), None)
                        continue
                if change.type != "DELETED":
                    self._react(change.new.obj())
        finally:
            stopping.cancel()
            watcher.close()
            for task in list(self._pending):
                task.cancel()
            await asyncio.gather(*self._pending, return_exceptions=True)

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
        nodes = [n for n in self.store.iter_objects("nodes") if _schedulable(n, pod)]
        if not nodes:
            return
        node = nodes[self._next_node % len(nodes)]["metadata"]["name"]
        self._next_node += 1
        meta = pod["metadata"]
        with contextlib.suppress(status.ApiError):
            self.store.mutate("pods", meta["namespace"], meta["name"],
                              lambda o: o["spec"].update(nodeName=node) if not o["spec"].get("nodeName") else None)

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
        """Report KEP-4680 health of one allocated device in containerStatuses[].allocatedResourcesStatus."""
        def change(obj: Obj) -> None:
            obj["status"] = behaviour.device_health_status(obj, container, resource_name=resource_name,
                                                           resource_id=resource_id, health=health, message=message)

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
