"""Seeding a cluster for the bench through the API, and removing what was seeded.

Owns creating namespaces, GPU nodes, opted-in PyTorchJobs and their worker pods (create, then write
the pod's status, as a kubelet would) with a bounded number of requests in flight, so the same code
seeds the simulated cluster and a real one (kwok-style nodes without kubelets). It does not decide
sizes (`running.py`) and keeps only what the scenarios need: names and uids.

How it fails: API errors propagate (`errors.KubeError`); an object that already exists is reused
(`ConflictError` on create means a previous bench left it), so a rerun against a real cluster works.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from kcover import errors
from kcover.bench import objects, rawapi
from kcover.kube import client as client_

log = structlog.get_logger()


@dataclass
class Job:
    namespace: str
    name: str
    uid: str
    pods: list[str] = field(default_factory=list)
    """Pod names, worker index order."""


async def bounded(calls: Iterable[Callable[[], Awaitable[Any]]], *, concurrency: int) -> list[Any]:
    """Run the calls with at most `concurrency` in flight; results in order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(call: Callable[[], Awaitable[Any]]) -> Any:
        async with gate:
            return await call()

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(one(c)) for c in calls]
    return [t.result() for t in tasks]


async def create(api: rawapi.RawApi, path: str, body: objects.Obj) -> objects.Obj:
    """POST, or GET the existing object on 409."""
    try:
        created: objects.Obj = await api.request("POST", path, body=body)
        return created
    except errors.ConflictError:
        existing: objects.Obj = await api.request("GET", f"{path}/{body['metadata']['name']}")
        return existing


async def namespaces(api: rawapi.RawApi, names: Iterable[str]) -> None:
    for name in names:
        await create(api, "/api/v1/namespaces", objects.namespace(name))


async def nodes(api: rawapi.RawApi, names: list[str], *, concurrency: int = 32, kwok: bool = False) -> None:
    async def one(name: str) -> None:
        await create(api, "/api/v1/nodes", objects.node(name, kwok=kwok))  # a Node keeps its created status

    await bounded([lambda n=n: one(n) for n in names], concurrency=concurrency)  # type: ignore[misc]


async def running_pod(api: rawapi.RawApi, body: objects.Obj) -> None:
    """Create a pod and write its status (a create drops it), as the kubelet would."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    await create(api, pods_path(namespace), body)
    await write_pod_status(api, namespace, name, body["status"])


def pods_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


def jobs_path(namespace: str, kind: str = "PyTorchJob") -> str:
    return f"/apis/kubeflow.org/v1/namespaces/{namespace}/{objects.plural(kind)}"


async def write_pod_status(api: rawapi.RawApi, namespace: str, name: str, status: objects.Obj) -> None:
    """Merge-patch a pod's status, as the kubelet writes it (a create drops the status)."""
    await api.request("PATCH", f"{pods_path(namespace)}/{name}/status", body={"status": status},
                      content_type=client_.MERGE_PATCH)


ADDRESSES = ("hostIP", "hostIPs", "podIP", "podIPs")
"""Status fields a kwok node's kubelet writes too (the API server refuses a patch that leaves `hostIPs` and
`hostIP` apart): left out of the bench's write where kwok may have written them first."""


async def jobs(api: rawapi.RawApi, specs: list[tuple[str, str, int]], *, node_names: list[str],
               dra: bool = False, concurrency: int = 32, first_index: int = 0, kind: str = "PyTorchJob",
               write_status: bool = True, addresses: bool = True, restart_policy: str = "OnFailure") -> list[Job]:
    """Create (namespace, job name, workers) Kubeflow jobs of `kind` and their running pods, spread over
    `node_names`. `write_status` False leaves the status to the nodes' kubelet (kwok), which would otherwise
    race the bench's write; `addresses` False writes the status without `ADDRESSES` (kwok's, where it came
    first)."""
    def make(spec: tuple[str, str, int]) -> Callable[[], Awaitable[Any]]:
        return lambda: create(api, jobs_path(spec[0], kind), objects.pytorchjob(spec[0], spec[1], workers=spec[2],
                                                                                kind=kind,
                                                                                restart_policy=restart_policy))

    made = await bounded([make(s) for s in specs], concurrency=concurrency)
    out = [Job(s[0], s[1], m["metadata"]["uid"]) for s, m in zip(specs, made, strict=True)]
    calls: list[Callable[[], Awaitable[Any]]] = []
    slot = first_index
    for job, obj, (_, _, workers) in zip(out, made, specs, strict=True):
        owner = objects.owner_ref(obj)
        for index in range(workers):
            body = objects.pod(job.namespace, job.name, index, node_name=node_names[slot % len(node_names)],
                               owner=owner, dra=dra, restart_policy=objects.pod_restart_policy(restart_policy))
            job.pods.append(body["metadata"]["name"])
            slot += 1

            async def one(job: Job = job, body: objects.Obj = body) -> None:
                await create(api, pods_path(job.namespace), body)
                if write_status:
                    status = body["status"] if addresses else {k: v for k, v in body["status"].items()
                                                                 if k not in ADDRESSES}
                    await write_pod_status(api, job.namespace, body["metadata"]["name"], status)

            calls.append(one)
    await bounded(calls, concurrency=concurrency)
    return out


NAMESPACED = ("/api/v1/namespaces/{ns}/pods", "/api/v1/namespaces/{ns}/events", "/api/v1/namespaces/{ns}/configmaps",
              "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", "/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs",
              "/apis/kcover.io/v1alpha1/namespaces/{ns}/ledgerentries",
              "/apis/kcover.io/v1alpha1/namespaces/{ns}/recoveries")
"""What the bench (and the kcover it runs) leaves in its namespaces."""


async def cleanup(api: rawapi.RawApi, namespaces_: Iterable[str]) -> None:
    """Delete what the bench created in a real cluster: what its namespaces hold (pods at once, grace 0:
    without kubelets they would stay terminating; without kube-controller-manager a namespace's deletion
    never empties it), the namespaces, and its labelled nodes."""
    for ns in namespaces_:
        for collection in NAMESPACED:
            try:
                await api.request("DELETE", collection.format(ns=ns), query={"gracePeriodSeconds": "0"})
            except errors.NotFoundError:
                pass  # the kind is not served here (its CRD is absent)
        try:
            await api.request("DELETE", f"/api/v1/namespaces/{ns}")
        except errors.NotFoundError:
            pass
    await api.request("DELETE", "/api/v1/nodes", query={"labelSelector": f"{objects.BENCH_LABEL}=true"})
