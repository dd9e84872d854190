"""The kubelet and Kubeflow operator a bare API server lacks, played over HTTP by the tests.

Owns the writes a node and a job operator would make, sent through the Kubernetes API so they work
against any server (the simulated one, a real kube-apiserver, k3s): pod status through `/status`
(running, a container that exits with an error, DRA device health), finishing graceful deletions
(DELETE with gracePeriodSeconds=0 once a pod has a deletionTimestamp) and recreating the missing
replica pods of Kubeflow v1 jobs. What is written comes from `kcover.sim.behaviour`, the same pure
functions the simulated cluster's actors use, so both play the same cluster. It does not schedule
(pods name their node), keep logs, or run containers. API errors propagate, except a pod that went
or changed meanwhile (404, 409 on a finished deletion), which is expected churn.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from kcover import errors
from kcover.aio import clock as clock_
from kcover.kube import client
from kcover.sim import behaviour

Obj = dict[str, Any]
PLURALS = {key: key.split(".", 1)[0] for key in behaviour.REPLICA_SPECS}


def _pod_path(namespace: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{namespace}/pods"
    return f"{base}/{name}" if name else base


class Harness:
    """Kubelet and training-operator stand-ins writing through `kube` (a `client.KubeClient`)."""

    def __init__(self, kube: client.KubeClient, *, namespace: str = "") -> None:
        self.kube = kube
        self.namespace = namespace  # where reconcile/finish look by default ("" = every namespace)

    @staticmethod
    def now() -> str:
        return str(clock_.rfc3339(clock_.utcnow()))

    async def set_status(self, namespace: str, name: str, change: Callable[[Obj], Obj | None]) -> Obj:
        """GET the pod, `change(pod)` returns its new status (None: leave it), PUT `/status`; retried on 409."""
        for _ in range(20):
            pod: Obj = await self.kube.request("GET", _pod_path(namespace, name))
            new = change(pod)
            if new is None:
                return pod
            pod["status"] = new
            try:
                out: Obj = await self.kube.request("PUT", _pod_path(namespace, name) + "/status", body=pod)
            except errors.ConflictError:
                continue
            return out
        raise errors.ConflictError(f"pod {namespace}/{name}: status kept conflicting")

    async def run_pod(self, namespace: str, name: str, node: str = "") -> Obj:
        """Bind the pod to `node` if it has none, then write the running status a kubelet writes."""
        pod: Obj = await self.kube.request("GET", _pod_path(namespace, name))
        if not (pod.get("spec") or {}).get("nodeName"):
            if not node:
                raise ValueError(f"pod {namespace}/{name} has no node and none was given")
            await self.kube.request("POST", _pod_path(namespace, name) + "/binding", body={
                "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": namespace},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
        now = self.now()
        return await self.set_status(namespace, name, lambda p: behaviour.running_status(p, now))

    async def run_agent_pod(self, namespace: str, node: str) -> Obj:
        """Play the agent DaemonSet: its pod on `node`, labelled as the chart labels it, running. The
        controller accepts an Event about a Node only when such a pod runs there (in the Event's namespace)."""
        name = f"kcover-agent-{node}"[:63]
        try:
            await self.kube.request("POST", _pod_path(namespace), body={
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": {
                    "app.kubernetes.io/name": "kcover", "app.kubernetes.io/component": "agent"}},
                "spec": {"containers": [{"name": "agent", "image": "kcover-agent"}]}})
        except errors.ConflictError:
            pass
        return await self.run_pod(namespace, name, node)

    async def fail_container(self, namespace: str, pod: str, container: str, *, exit_code: int = 1,
                             reason: str = "Error", message: str = "", restart: bool | None = None) -> Obj:
        """The container exits with `exit_code` (see `behaviour.failed_container_status`)."""
        now = self.now()
        return await self.set_status(namespace, pod, lambda p: behaviour.failed_container_status(
            p, container, now, exit_code=exit_code, reason=reason, message=message, restart=restart))

    async def set_device_health(self, namespace: str, pod: str, container: str, *, resource_name: str,
                                resource_id: str, health: str = "Unhealthy", message: str = "") -> Obj:
        """One allocated device of the container reports `health` (KEP-4680)."""
        return await self.set_status(namespace, pod, lambda p: behaviour.device_health_status(
            p, container, resource_name=resource_name, resource_id=resource_id, health=health, message=message))

    async def finish_deletions(self, namespace: str | None = None) -> int:
        """Remove every pod with a deletionTimestamp (the kubelet's final DELETE); returns how many."""
        ns = self.namespace if namespace is None else namespace
        listed: Obj = await self.kube.request("GET", _pod_path(ns) if ns else "/api/v1/pods")
        done = 0
        for pod in listed.get("items") or []:
            meta = pod["metadata"]
            if not meta.get("deletionTimestamp"):
                continue
            try:
                await self.kube.request("DELETE", _pod_path(meta["namespace"], meta["name"]),
                                        query={"gracePeriodSeconds": 0},
                                        body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                                              "preconditions": {"uid": meta["uid"]}})
            except (errors.NotFoundError, errors.ConflictError):
                continue
            done += 1
        return done

    async def reconcile_jobs(self, namespace: str | None = None) -> int:
        """Create every missing replica pod of every Kubeflow v1 job; returns how many were created."""
        ns = self.namespace if namespace is None else namespace
        created = 0
        existing: set[tuple[str, str]] | None = None
        for key, plural in PLURALS.items():
            path = f"/apis/kubeflow.org/v1/namespaces/{ns}/{plural}" if ns else f"/apis/kubeflow.org/v1/{plural}"
            try:
                jobs: Obj = await self.kube.request("GET", path)
            except errors.NotFoundError:  # CRD not installed
                continue
            for job in jobs.get("items") or []:
                job.setdefault("apiVersion", "kubeflow.org/v1")
                wanted = behaviour.job_pods(job, key)
                if not wanted:
                    continue
                if existing is None:
                    pods: Obj = await self.kube.request("GET", _pod_path(ns) if ns else "/api/v1/pods")
                    existing = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods.get("items") or []}
                for pod in wanted:
                    meta = pod["metadata"]
                    if (meta["namespace"], meta["name"]) in existing:
                        continue
                    try:
                        await self.kube.request("POST", _pod_path(meta["namespace"]), body=pod)
                    except errors.ConflictError:  # still terminating, or created meanwhile
                        continue
                    existing.add((meta["namespace"], meta["name"]))
                    created += 1
        return created

    async def play(self, stop: asyncio.Event, *, interval: float = 0.1) -> None:
        """Finish deletions and reconcile jobs every `interval` seconds until `stop` is set."""
        while not stop.is_set():
            await self.finish_deletions()
            await self.reconcile_jobs()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    @contextlib.asynccontextmanager
    async def playing(self, *, interval: float = 0.1) -> AsyncIterator[Harness]:
        """`play` in a background task for the duration of the block."""
        stop = asyncio.Event()
        task = asyncio.create_task(self.play(stop, interval=interval), name="harness-play")
        try:
            yield self
        finally:
            stop.set()
            await task
