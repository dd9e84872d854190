"""What the restart bench sets up, and what taking it away costs without kcover.

Owns a restart scenario's cluster side: its namespace (`scenario_namespace`, numbered per run), the bench
nodes `kcover-bench-node-<i>` (no kubelet, so a pod taken away stays Terminating), a JobSet, batch/v1 Job
or PyTorchJob with its pods bound to them as their controller would create them (`workload`,
`workload_pods`), or, where the workloads' real controllers and kwok run, the workload alone for them
(`operated`), and the scenario's clean-up (`drop`). And the two baselines `restarts` sets kcover's restart
against, neither of which uses kcover's cache, engine or ledger:

* `measure_floor`: the server's own DeleteCollection of as many bound pods (what the Go controller sends),
  timed to its answer. The API server removes a collection's pods one by one itself
  (`--delete-collection-workers`, 1 by default), so the floor grows with the pods as a restart does.
* `measure_bare`: the same workload and pods, left as long after their creation as kcover's scenario was,
  then taken away by the same uid-preconditioned deletes or evictions at the same concurrency, over plain
  HTTP. The server's work is the same as for kcover's restart, so kcover's time over it is what kcover adds.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from typing import Any

import orjson

from kcover import errors, kinds
from kcover.bench import objects
from kcover.kube import client as client_
from kcover.kube import projections as proj

NODES = 16
CREATE_CONCURRENCY = 32


def pod_labels(kind: str, name: str, uid: str, owner_uid: str) -> dict[str, str]:
    """The labels the kind's controller gives its pods. A JobSet's pods carry their child Job's
    controller-uid too: where a real Job controller runs (the fleet cluster), that is its selector, and it
    releases an owned pod that does not match it: without the label a restart at fleet size found 1,823 of
    2,048 pods, with it all 2,048."""
    if kind == "jobset":
        return {kinds.JOBSET_NAME: name, kinds.JOBSET_UID: uid, kinds.BATCH_JOB_NAME: f"{name}-w",
                kinds.BATCH_CONTROLLER_UID: owner_uid}
    if kind == "job":
        return {kinds.BATCH_JOB_NAME: name, kinds.BATCH_CONTROLLER_UID: uid}
    return {kinds.KUBEFLOW_JOB_NAME: name, kinds.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}


async def workload(kube: client_.KubeClient, ns: str, kind: str, name: str,
                   pods: int = 1) -> tuple[dict[str, Any], dict[str, Any]]:
    """The workload object and the controller ownerReference its pods carry. A JobSet's child Job asks for
    as many pods as the bench creates and tolerates their failures: where a real Job controller runs (the
    fleet cluster) it resolves the bench's pods by that ownerReference, and a Job of parallelism 1 and
    backoffLimit 0 would delete all but one of them before the restart. It replaces a pod only once it has
    failed (`podReplacementPolicy: Failed`): no kubelet finishes the evicted pods, so none is replaced, and
    the removal is timed without 2,048 creations beside it, as the PyTorchJob's is."""
    opt = {proj.OPT_IN_LABEL: "true"}
    pod_spec = {"restartPolicy": "Never", "containers": [{"name": "c", "image": "trainer"}]}
    if kind == "job":
        job = await kube.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", body={
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns, "labels": opt},
            "spec": {"backoffLimit": 6, "template": {"spec": pod_spec}}})
        return job, {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job["metadata"]["uid"],
                     "controller": True}
    if kind == "pytorchjob":
        job = await kube.request("POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", body={
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": ns, "labels": opt},
            "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "restartPolicy": "OnFailure",
                                                        "template": {"spec": pod_spec}}}}})
        return job, {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": name,
                     "uid": job["metadata"]["uid"], "controller": True}
    js = await kube.request("POST", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets", body={
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name, "namespace": ns,
                                                                                 "labels": opt},
        "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {"template": {"spec": pod_spec}}}}]}})
    uid = js["metadata"]["uid"]
    child = await kube.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", body={
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"{name}-w", "namespace": ns, "labels": {kinds.JOBSET_NAME: name, kinds.JOBSET_UID: uid},
                     "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": name,
                                          "uid": uid, "controller": True}]},
        "spec": {"backoffLimit": 2 * pods + 6, "parallelism": pods, "completions": pods,
                 "podReplacementPolicy": "Failed", "template": {"spec": pod_spec}}})
    return js, {"apiVersion": "batch/v1", "kind": "Job", "name": f"{name}-w", "uid": child["metadata"]["uid"],
                "controller": True}


def template(labels: dict[str, str], *, container: str, never: bool) -> dict[str, Any]:
    """A pod template the scheduler places on kwok's nodes (their label `type=kwok`)."""
    return {"metadata": {"labels": {objects.BENCH_LABEL: "true", **labels}},
            "spec": {"restartPolicy": "Never" if never else "OnFailure", "nodeSelector": {"type": "kwok"},
                     "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
                     "terminationGracePeriodSeconds": 30,
                     "containers": [{"name": container, "image": "registry.example.com/ml/trainer:2026.01"}]}}


def batch_job(ns: str, name: str, pods: int, labels: dict[str, str], *, owner: dict[str, Any] | None) -> dict[str, Any]:
    """An Indexed Job of `pods` pods whose evictions its podFailurePolicy ignores (the pods are replaced)."""
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if owner is not None:
        meta["ownerReferences"] = [owner]
        meta["labels"] = {k: v for k, v in labels.items() if k.startswith("jobset.")}
    else:
        meta["labels"] = {proj.OPT_IN_LABEL: "true"}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
            "spec": {"parallelism": pods, "completions": pods, "completionMode": "Indexed", "backoffLimit": 6,
                     "podFailurePolicy": {"rules": [{"action": "Ignore",
                                                     "onPodConditions": [{"type": "DisruptionTarget"}]}]},
                     "template": template(labels, container="c", never=True)}}


async def operated(kube: client_.KubeClient, ns: str, kind: str, name: str, pods: int,
                    labels: dict[str, str]) -> dict[str, Any]:
    """The workload, for its real controller to create its `pods` pods; `labels` go on every pod."""
    opt = {proj.OPT_IN_LABEL: "true"}
    if kind == "job":
        job: dict[str, Any] = await kube.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs",
                                                 body=batch_job(ns, name, pods, labels, owner=None))
        return job
    if kind == "pytorchjob":
        job = await kube.request("POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", body={
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": ns, "labels": opt},
            "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": pods, "restartPolicy": "OnFailure",
                                                        "template": template(labels, container="pytorch",
                                                                              never=False)}}}})
        return job
    js: dict[str, Any] = await kube.request("POST", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets", body={
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name, "namespace": ns,
                                                                                 "labels": opt},
        "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {
            "parallelism": pods, "completions": pods, "completionMode": "Indexed",
            "template": template(labels, container="c", never=True)}}}]}})
    uid = js["metadata"]["uid"]
    owner = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": name, "uid": uid, "controller": True,
             "blockOwnerDeletion": True}
    child_labels = {**labels, kinds.JOBSET_NAME: name, kinds.JOBSET_UID: uid, "jobset.sigs.k8s.io/replicatedjob-name": "w",
                    "jobset.sigs.k8s.io/job-index": "0"}
    await kube.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs",
                       body=batch_job(ns, f"{name}-w-0", pods, child_labels, owner=owner))
    return js


async def bound_pods(kube: client_.KubeClient, ns: str, count: int, *, prefix: str, labels: dict[str, str],
                     owner: dict[str, Any] | None = None) -> None:
    """`count` pods `<prefix>-<i>` bound to the bench nodes (no scheduler, no kubelet), `CREATE_CONCURRENCY`
    created at once."""
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)
    meta: dict[str, Any] = {"namespace": ns, "labels": labels}
    if owner is not None:
        meta["ownerReferences"] = [owner]

    async def one(i: int) -> None:
        async with gate:
            await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body={
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{prefix}-{i}", **meta},
                "spec": {"nodeName": f"kcover-bench-node-{i % NODES}", "restartPolicy": "Never",
                         "containers": [{"name": "c", "image": "trainer"}]}})

    async with asyncio.TaskGroup() as tg:
        for i in range(count):
            tg.create_task(one(i))


async def workload_pods(kube: client_.KubeClient, ns: str, kind: str, name: str, workload_: dict[str, Any],
                        owner: dict[str, Any], count: int) -> None:
    """`count` pods of the `kind` workload `workload_` (as `workload` made it), labelled and owned as its
    controller would label and own them."""
    await bound_pods(kube, ns, count, prefix=name, owner=owner,
                     labels=pod_labels(kind, name, workload_["metadata"]["uid"], str(owner["uid"])))


async def nodes(kube: client_.KubeClient) -> None:
    for i in range(NODES):
        with contextlib.suppress(errors.ConflictError):
            await kube.request("POST", "/api/v1/nodes", body={
                "apiVersion": "v1", "kind": "Node", "metadata": {"name": f"kcover-bench-node-{i}",
                                                                 "labels": {objects.BENCH_LABEL: "true"}},
                "status": {"capacity": {"nvidia.com/gpu": "8", "pods": "1100"}}})


_scenarios = itertools.count(1)
"""Numbers each scenario's namespace: the same kind and size may be measured more than once in a run."""


async def scenario_namespace(kube: client_.KubeClient, prefix: str) -> str:
    """Create a namespace `<prefix>-<n>` for one scenario (n counts the run's scenarios); its name."""
    ns = f"{prefix}-{next(_scenarios)}"
    await kube.request("POST", "/api/v1/namespaces", body=objects.namespace(ns))
    return ns


async def drop(kube: client_.KubeClient, ns: str) -> None:
    """Remove a scenario's namespace and, first, its pods at once (grace 0): no kubelet finishes the
    bench's Terminating pods, and left to the namespace controller they would still be in the server while
    the next scenario is timed (on a small cluster such leftovers doubled the DeleteCollection floor)."""
    with contextlib.suppress(errors.KubeError):
        await kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods",
                           body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
    with contextlib.suppress(errors.KubeError):
        await kube.request("DELETE", f"/api/v1/namespaces/{ns}")


FLOOR_LABEL = "kcover.io/bench-floor"


async def measure_floor(kube: client_.KubeClient, *, pods: int, run_id: str) -> float:
    """Seconds the API server takes to answer one DeleteCollection of `pods` bound pods (see the module
    docstring)."""
    ns = await scenario_namespace(kube, f"kcover-bench-restart-{run_id}-floor-{pods}")
    try:
        await nodes(kube)
        await bound_pods(kube, ns, pods, prefix="floor", labels={FLOOR_LABEL: "true"})
        started = time.perf_counter()
        await kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods", query={"labelSelector": f"{FLOOR_LABEL}=true"})
        return time.perf_counter() - started
    finally:
        await drop(kube, ns)


def removal(kind: str) -> kinds.Removal:
    table = kinds.by_key(KIND_KEYS[kind])
    assert table is not None, kind
    return table.removal


KIND_KEYS = {"jobset": "jobsets.jobset.x-k8s.io", "job": "jobs.batch", "pytorchjob": "pytorchjobs.kubeflow.org"}


async def measure_bare(kube: client_.KubeClient, *, kind: str, pods: int, run_id: str, concurrency: int,
                       settle: float = 0.0) -> float:
    """Seconds a bare client takes to take away every pod of one `kind` workload of `pods` pods, set up as
    `restarts.measure_one` sets it up (without an operator) and left `settle` seconds after the last is created (what
    kcover's scenario waited: the real Job controller adopting 2,048 pods loads the server meanwhile): each
    pod evicted or deleted as kcover's restart would (`kinds.Removal`), its uid as precondition,
    `concurrency` in flight, over plain HTTP on the same connection pool, answers read but not decoded.
    Every answer must be a success."""
    ns = await scenario_namespace(kube, f"kcover-bench-restart-{run_id}-bare-{kind}-{pods}")
    try:
        await nodes(kube)
        made, owner = await workload(kube, ns, kind, "big", pods)
        await workload_pods(kube, ns, kind, "big", made, owner, pods)
        await asyncio.sleep(settle)
        listed = await kube.request("GET", f"/api/v1/namespaces/{ns}/pods")
        todo = [(p["metadata"]["name"], p["metadata"]["uid"]) for p in listed.get("items") or []
                if not p["metadata"].get("deletionTimestamp")]
        evict = removal(kind) is kinds.Removal.EVICT
        failures: list[str] = []
        send = kube.sender.send
        headers = {"Accept": client_.JSON, "Content-Type": client_.JSON}

        async def worker() -> None:
            while todo:
                name, uid = todo.pop()
                if evict:
                    method, path = "POST", f"/api/v1/namespaces/{ns}/pods/{name}/eviction"
                    body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                            "metadata": {"name": name, "namespace": ns},
                                            "deleteOptions": {"preconditions": {"uid": uid}}}
                else:
                    method, path = "DELETE", f"/api/v1/namespaces/{ns}/pods/{name}"
                    body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
                response = await send(method, path, query=[], headers=headers, body=orjson.dumps(body), timeout=None)
                async with response:
                    await response.read()
                    if response.status >= 300:
                        failures.append(f"{name}: HTTP {response.status}")

        started = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for _ in range(max(1, concurrency)):
                tg.create_task(worker())
        seconds = time.perf_counter() - started
        if failures:
            raise errors.KcoverError(f"bench bare removal: {len(failures)} failed, first {failures[0]}")
        return seconds
    finally:
        await drop(kube, ns)
