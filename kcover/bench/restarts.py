"""`kcover bench --restarts 8,128,1024`: how long one restart of a large job takes, and what it costs.

Owns one scenario per (kind, size): a namespace `kcover-bench-restart-<run>` holding an opted-in JobSet,
batch/v1 Job or PyTorchJob of N pods (the pods created through the API, bound to bench nodes
`kcover-bench-node-<i>`, as their operator would create them), the controller's recovery built as the
controller builds it (`controller.recovering.build`) over a watching cache, and one container fault on
one pod. It measures the time from handing the fault to the engine to the restart's outcome (every pod
taken away: each eviction or delete answered by the API server), the requests made meanwhile, by
verb and resource, and the 429s retried, then deletes what it created. No kubelet runs, so a pod taken
away would stay Terminating: each scenario's pods are removed at once (grace 0) before its namespace.

Per size it also measures the server's own floor: the same number of bound pods, in a namespace of their
own, taken away by one DeleteCollection (what the Go controller sends), timed to its answer. The API
server removes a collection's pods one by one itself (`--delete-collection-workers`, 1 by default), so the
floor grows with the pods as kcover's time does. Per kind, size and concurrency, after kcover's restart,
it also measures a bare client (`measure_bare`): the same workload and pods, set up the same way, left
as long after their creation as kcover's scenario left its pods before the fault (its cache's sync), then
taken away by the same uid-preconditioned requests at the same concurrency, from plain HTTP with no cache,
engine, ledger or client layers. The server's work is then the same as for kcover's restart, so kcover's
time over the bare client's is what kcover itself adds; over the DeleteCollection it also counts the
server working on several pods at once.

With `operator=True` (a cluster with real controllers and kwok nodes: the fleet bench) the pods are the
workload's controller's: a PyTorchJob with a pod template for the training operator, a batch Job for
kube-controller-manager's Job controller, and for a JobSet (whose controller the tests' cluster does not
run) the child Job the JobSet controller would create, owned by the JobSet, for the Job controller. The
scheduler binds them to kwok's nodes and kwok runs them. Then it also measures, from the fault, when the
last replacement pod was created (seen by the cache) and when the last one was Running.

The kinds' CRDs must be served (JobSet, Kubeflow's PyTorchJob, and kcover's LedgerEntry and Recovery):
the simulated server and the tests' control plane have them. It decides nothing; figures are printed,
never asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog

from kcover import errors, kinds, metrics, model, settings
from kcover.aio import clock as clock_
from kcover.bench import reporting
from kcover.controller import recovering
from kcover.kube import caching, indexing, watching
from kcover.kube import client as client_
from kcover.kube import projections as proj
from kcover.recovery import steps as st

log = structlog.get_logger()

KINDS = ("jobset", "job", "pytorchjob")
NODES = 16
CREATE_CONCURRENCY = 32


@dataclass
class Row:
    kind: str
    pods: int
    seconds: float
    """From the fault handed to the engine to the restart's outcome (every pod taken away)."""
    removed: int
    requests: dict[str, int] = field(default_factory=dict)
    recreated_seconds: float | None = None
    """From the fault to the last replacement pod created by the workload's controller (operator mode)."""
    running_seconds: float | None = None
    """From the fault to the last replacement pod Running (operator mode)."""
    recreated: int | None = None
    """Replacement pods the workload's controller created (operator mode)."""
    throttled: int = 0
    """429 answers the client retried during the restart (priority and fairness, or max-inflight)."""
    concurrency: int = 0
    bare_seconds: float | None = None
    """The same removals from a bare client (`measure_bare`), measured just after, at the same concurrency."""
    settled_seconds: float = 0.0
    """From the last of the bench's pods created to the fault (the cache's sync, mostly): the server's
    controllers settle meanwhile, and the bare client waits as long."""
    cpu_seconds: float | None = None
    """CPU the process running kcover's engine and cache spent from the fault to the outcome (user + system):
    on cores shared with the API server and etcd, what kcover takes from them."""

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())


class _Stopwatch:
    """A coordinator hook noting when the restart's outcome arrived."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.removed = 0

    def after(self, step: st.Step, outcome: st.Outcome) -> list[st.Step]:
        if isinstance(step, st.Restart) and self.at is None:
            self.at = time.perf_counter()
            self.removed = outcome.removed if isinstance(outcome, st.Done) else -1
        return []


def _labels(kind: str, name: str, uid: str, owner_uid: str) -> dict[str, str]:
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


async def _workload(kube: client_.KubeClient, ns: str, kind: str, name: str,
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


def _template(labels: dict[str, str], *, container: str, never: bool) -> dict[str, Any]:
    """A pod template the scheduler places on kwok's nodes (their label `type=kwok`)."""
    return {"metadata": {"labels": {"kcover.io/bench": "true", **labels}},
            "spec": {"restartPolicy": "Never" if never else "OnFailure", "nodeSelector": {"type": "kwok"},
                     "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
                     "terminationGracePeriodSeconds": 30,
                     "containers": [{"name": container, "image": "registry.example.com/ml/trainer:2026.01"}]}}


def _batch_job(ns: str, name: str, pods: int, labels: dict[str, str], *, owner: dict[str, Any] | None) -> dict[str, Any]:
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
                     "template": _template(labels, container="c", never=True)}}


async def _operated(kube: client_.KubeClient, ns: str, kind: str, name: str, pods: int,
                    labels: dict[str, str]) -> dict[str, Any]:
    """The workload, for its real controller to create its `pods` pods; `labels` go on every pod."""
    opt = {proj.OPT_IN_LABEL: "true"}
    if kind == "job":
        job: dict[str, Any] = await kube.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs",
                                                 body=_batch_job(ns, name, pods, labels, owner=None))
        return job
    if kind == "pytorchjob":
        job = await kube.request("POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", body={
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": ns, "labels": opt},
            "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": pods, "restartPolicy": "OnFailure",
                                                        "template": _template(labels, container="pytorch",
                                                                              never=False)}}}})
        return job
    js: dict[str, Any] = await kube.request("POST", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets", body={
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name, "namespace": ns,
                                                                                 "labels": opt},
        "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {
            "parallelism": pods, "completions": pods, "completionMode": "Indexed",
            "template": _template(labels, container="c", never=True)}}}]}})
    uid = js["metadata"]["uid"]
    owner = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": name, "uid": uid, "controller": True,
             "blockOwnerDeletion": True}
    child_labels = {**labels, kinds.JOBSET_NAME: name, kinds.JOBSET_UID: uid, "jobset.sigs.k8s.io/replicatedjob-name": "w",
                    "jobset.sigs.k8s.io/job-index": "0"}
    await kube.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs",
                       body=_batch_job(ns, f"{name}-w-0", pods, child_labels, owner=owner))
    return js


class _Replacements:
    """A cache subscriber noting when each pod of the namespace that is not one of `old` was first seen, and
    first seen Running."""

    def __init__(self, ns: str, old: set[str]) -> None:
        self.ns = ns
        self.old = old
        self.created: dict[str, float] = {}
        self.running: dict[str, float] = {}

    def __call__(self, kind: indexing.Kind, old: Any, new: Any) -> None:
        if kind is not indexing.Kind.POD or new is None or new.namespace != self.ns or new.uid in self.old:
            return
        now = time.perf_counter()
        self.created.setdefault(new.uid, now)
        if new.phase == "Running" and not new.deleting:
            self.running.setdefault(new.uid, now)


async def _until(predicate: Any, timeout: float, poll: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(poll)
    return True


STALL_SECONDS = 60.0
"""Operator mode: the wait for the replacements ends after this long without a new one created or Running (a
controller that does not replace what was taken away; the row says how many it did)."""


async def _until_or_stalled(predicate: Any, progress: Any, timeout: float, stall: float, poll: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    seen, moved = progress(), time.monotonic()
    while not predicate():
        now = time.monotonic()
        if progress() != seen:
            seen, moved = progress(), now
        if now > deadline or now - moved > stall:
            return False
        await asyncio.sleep(poll)
    return True


async def _pods(kube: client_.KubeClient, ns: str, kind: str, name: str, uid: str, owner: dict[str, Any],
                count: int) -> None:
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)
    labels = _labels(kind, name, uid, str(owner["uid"]))

    async def one(i: int) -> None:
        async with gate:
            await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body={
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{name}-{i}", "namespace": ns, "labels": labels, "ownerReferences": [owner]},
                "spec": {"nodeName": f"kcover-bench-node-{i % NODES}", "restartPolicy": "Never",
                         "containers": [{"name": "c", "image": "trainer"}]}})

    async with asyncio.TaskGroup() as tg:
        for i in range(count):
            tg.create_task(one(i))


async def _nodes(kube: client_.KubeClient) -> None:
    for i in range(NODES):
        with contextlib.suppress(errors.ConflictError):
            await kube.request("POST", "/api/v1/nodes", body={
                "apiVersion": "v1", "kind": "Node", "metadata": {"name": f"kcover-bench-node-{i}",
                                                                 "labels": {"kcover.io/bench": "true"}},
                "status": {"capacity": {"nvidia.com/gpu": "8", "pods": "1100"}}})


_scenarios = itertools.count(1)
"""Numbers each scenario's namespace: the same kind and size may be measured more than once in a run."""


async def _drop(kube: client_.KubeClient, ns: str) -> None:
    """Remove a scenario's namespace and, first, its pods at once (grace 0): no kubelet finishes the
    bench's Terminating pods, and the namespace controller retrying them would load the server during the
    next measurement (which a measurement taken after another's would pay for, and not the one before)."""
    with contextlib.suppress(errors.KubeError):
        await kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods",
                           body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
    with contextlib.suppress(errors.KubeError):
        await kube.request("DELETE", f"/api/v1/namespaces/{ns}")


FLOOR_LABEL = "kcover.io/bench-floor"


async def measure_floor(kube: client_.KubeClient, *, pods: int, run_id: str) -> float:
    """Seconds the API server takes to answer one DeleteCollection of `pods` bound pods (see the module
    docstring)."""
    ns = f"kcover-bench-restart-{run_id}-floor-{pods}-{next(_scenarios)}"
    await kube.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                           "metadata": {"name": ns, "labels": {"kcover.io/bench": "true"}}})
    try:
        await _nodes(kube)
        gate = asyncio.Semaphore(CREATE_CONCURRENCY)

        async def one(i: int) -> None:
            async with gate:
                await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body={
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"floor-{i}", "namespace": ns, "labels": {FLOOR_LABEL: "true"}},
                    "spec": {"nodeName": f"kcover-bench-node-{i % NODES}", "restartPolicy": "Never",
                             "containers": [{"name": "c", "image": "trainer"}]}})

        async with asyncio.TaskGroup() as tg:
            for i in range(pods):
                tg.create_task(one(i))
        started = time.perf_counter()
        await kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods", query={"labelSelector": f"{FLOOR_LABEL}=true"})
        return time.perf_counter() - started
    finally:
        await _drop(kube, ns)


def _removal(kind: str) -> kinds.Removal:
    table = kinds.by_key(_KIND_KEYS[kind])
    assert table is not None, kind
    return table.removal


_KIND_KEYS = {"jobset": "jobsets.jobset.x-k8s.io", "job": "jobs.batch", "pytorchjob": "pytorchjobs.kubeflow.org"}


async def measure_bare(kube: client_.KubeClient, *, kind: str, pods: int, run_id: str, concurrency: int,
                       settle: float = 0.0) -> float:
    """Seconds a bare client takes to take away every pod of one `kind` workload of `pods` pods, set up as
    `measure_one` sets it up (without an operator) and left `settle` seconds after the last is created (what
    kcover's scenario waited: the real Job controller adopting 2,048 pods loads the server meanwhile): each
    pod evicted or deleted as kcover's restart would (`kinds.Removal`), its uid as precondition,
    `concurrency` in flight, over plain HTTP on the same connection pool, answers read but not decoded.
    Every answer must be a success."""
    ns = f"kcover-bench-restart-{run_id}-bare-{kind}-{pods}-{next(_scenarios)}"
    await kube.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                           "metadata": {"name": ns, "labels": {"kcover.io/bench": "true"}}})
    try:
        await _nodes(kube)
        workload, owner = await _workload(kube, ns, kind, "big", pods)
        await _pods(kube, ns, kind, "big", workload["metadata"]["uid"], owner, pods)
        await asyncio.sleep(settle)
        listed = await kube.request("GET", f"/api/v1/namespaces/{ns}/pods")
        todo = [(p["metadata"]["name"], p["metadata"]["uid"]) for p in listed.get("items") or []
                if not p["metadata"].get("deletionTimestamp")]
        evict = _removal(kind) is kinds.Removal.EVICT
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
        await _drop(kube, ns)


def _running(cache: caching.ClusterCache, ns: str) -> list[proj.Pod]:
    return [p for p in cache.pods.values() if p.namespace == ns and p.phase == "Running" and not p.deleting]


async def measure_one(kube: client_.KubeClient, *, kind: str, pods: int, run_id: str,
                      concurrency: int | None = None, operator: bool = False, pod_labels: dict[str, str] | None = None,
                      setup_timeout: float = 900.0, recreate_timeout: float = 900.0) -> Row:
    """One restart of one `kind` workload of `pods` pods; see the module docstring."""
    ns = f"kcover-bench-restart-{run_id}-{kind}-{pods}-{next(_scenarios)}"
    await kube.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                           "metadata": {"name": ns, "labels": {"kcover.io/bench": "true"}}})
    try:
        if not operator:
            await _nodes(kube)
            workload, owner = await _workload(kube, ns, kind, "big", pods)
            await _pods(kube, ns, kind, "big", workload["metadata"]["uid"], owner, pods)
        else:
            await _operated(kube, ns, kind, "big", pods, dict(pod_labels or {}))
        created = time.perf_counter()
        cfg = settings.Settings.model_validate({"lease": {"enabled": False}, "kube": {"watch_events": False},
                                                "recovery": {"ledger_namespace": ns, "save_logs": {"enabled": False},
                                                             "verify": {"enabled": False},
                                                             **({"delete_concurrency": concurrency}
                                                                if concurrency else {})}})
        cache = caching.ClusterCache(kube, watch_events=False, options=watching.ReflectorOptions(page_size=500),
                                     controls=(ns, "kcover-controls"))
        stop = asyncio.Event()
        task = asyncio.create_task(cache.run(stop), name="bench:cache")
        try:
            await asyncio.wait_for(cache.wait_synced(), 300)
            ready = await _until(lambda: len(_running(cache, ns) if operator else
                                             [p for p in cache.pods.values() if p.namespace == ns]) >= pods,
                                 setup_timeout if operator else 30.0)
            if not ready:
                raise errors.KcoverError(f"bench restart: {len(_running(cache, ns))} of {pods} pods of the {kind} ran "
                                         f"within {setup_timeout:g}s")
            leader = recovering.build(recovering.EngineDeps(
                settings=cfg, client=kube, cache=cache, metrics=metrics.Metrics(), clock=clock_.SystemClock(),
                is_leader=lambda: True, epoch=lambda: 1, identity="kcover-bench"))
            watch = _Stopwatch()
            leader.inner.coordinator.hooks.insert(0, watch)
            await leader.inner.ledger.ensure_loaded()
            members = [p for p in cache.pods.values() if p.namespace == ns]
            pod = next(p for p in members if not p.deleting)
            fault = model.CollectorEvent(detector="pod-status", severity=model.Severity.ERROR, reason="ContainerError",
                                         message="bench: exit 1",
                                         target=model.Target(kind=model.TargetKind.POD, namespace=ns, name=pod.name,
                                                             uid=pod.uid, node=pod.node))
            replacements = _Replacements(ns, {p.uid for p in members})
            unsubscribe = cache.subscribe(replacements, replay=False)
            before = Counter(kube.request_counts)
            throttled = kube.retry_stats.retries["throttled"]
            cpu = time.process_time()
            started = time.perf_counter()
            await leader.handle([fault])
            seconds = (watch.at or time.perf_counter()) - started
            cpu = time.process_time() - cpu
            spent = Counter(kube.request_counts)
            spent.subtract(before)
            requests = {k: v for k, v in spent.items() if v > 0 and not k.startswith(("WATCH", "LIST"))}
            table = kinds.by_key(_KIND_KEYS[kind])
            row = Row(kind, pods, seconds, watch.removed, requests,
                      throttled=kube.retry_stats.retries["throttled"] - throttled,
                      concurrency=table.removal_concurrency or cfg.recovery.delete_concurrency, cpu_seconds=cpu,
                      settled_seconds=started - created)
            if operator:
                await _until_or_stalled(lambda: len(replacements.running) >= pods,
                                        lambda: len(replacements.created) + len(replacements.running),
                                        recreate_timeout, STALL_SECONDS)
                row.recreated = len(replacements.created)
                if len(replacements.created) >= pods:
                    row.recreated_seconds = sorted(replacements.created.values())[pods - 1] - started
                if len(replacements.running) >= pods:
                    row.running_seconds = sorted(replacements.running.values())[pods - 1] - started
            unsubscribe()
            return row
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
    finally:
        await _drop(kube, ns)


async def measure(kube: client_.KubeClient, sizes: list[int], *, run_id: str,
                  kinds_: tuple[str, ...] = KINDS, concurrencies: Sequence[int | None] = (None,),
                  operator: bool = False, pod_labels: dict[str, str] | None = None,
                  floors: dict[int, float] | None = None) -> list[Row]:
    """One restart per kind, size and concurrency (`recovery.delete_concurrency`; None: the product's default),
    in that order; with `floors` (a dict to fill) and not `operator`, the server's DeleteCollection floor per
    size too, and after each restart the same removals from a bare client (`measure_bare`), left as long after
    its pods' creation as the restart's scenario was."""
    rows = []
    default = settings.RecoverySettings().delete_concurrency
    bare = floors is not None and not operator
    if bare:
        assert floors is not None
        for pods in sizes:
            floors[pods] = await measure_floor(kube, pods=pods, run_id=run_id)
            log.info("bench_restart_floor", pods=pods, seconds=round(floors[pods], 3))
    for kind in kinds_:
        for pods in sizes:
            for concurrency in concurrencies:
                row = await measure_one(kube, kind=kind, pods=pods, run_id=run_id, concurrency=concurrency,
                                        operator=operator, pod_labels=pod_labels)
                if bare:
                    row.bare_seconds = await measure_bare(kube, kind=kind, pods=pods, run_id=run_id,
                                                          concurrency=concurrency or default,
                                                          settle=row.settled_seconds)
                log.info("bench_restart", kind=kind, pods=pods, concurrency=row.concurrency,
                         seconds=round(row.seconds, 3), bare=_secs(row.bare_seconds),
                         settled=round(row.settled_seconds, 1), removed=row.removed,
                         requests=row.total_requests, recreated=row.recreated_seconds, throttled=row.throttled)
                if row.removed < pods:
                    log.error("bench_restart_incomplete", kind=kind, pods=pods, removed=row.removed,
                              why="the restart found fewer of the bench's pods than it created")
                rows.append(row)
    return rows


REMOVED_TARGET_SECONDS = 5.0
"""Issue 30's target for a 2,048-pod job: every pod taken away within 5 s of the fault."""
TARGET_PODS = 2048


def _secs(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None


def section(rows: list[Row], floors: dict[int, float] | None = None) -> dict[str, Any]:
    """The report's `restarts` section: each row (with the 5 s target at 2,048 pods and more, and its time over
    the server's DeleteCollection floor at its size), and per kind the largest size's time over the 128-pod
    one, beside the floor's own."""
    floors = floors or {}
    out_rows = []
    for r in rows:
        row: dict[str, Any] = {"kind": r.kind, "pods": r.pods, "seconds": round(r.seconds, 4), "removed": r.removed,
                               "requests": r.total_requests, "by_request": dict(sorted(r.requests.items())),
                               "throttled": r.throttled, "concurrency": r.concurrency,
                               "cpu_seconds": _secs(r.cpu_seconds)}
        if r.recreated is not None:
            row["recreated"] = r.recreated
        if r.recreated_seconds is not None or r.running_seconds is not None:
            row["recreated_seconds"] = _secs(r.recreated_seconds)
            row["running_seconds"] = _secs(r.running_seconds)
        if r.pods >= TARGET_PODS:
            row["target_seconds"] = REMOVED_TARGET_SECONDS
            row["ratio_to_target"] = reporting.ratio(r.seconds, REMOVED_TARGET_SECONDS)
        if r.pods in floors:
            row["floor_seconds"] = round(floors[r.pods], 4)
            row["vs_floor"] = reporting.ratio(r.seconds, floors[r.pods])
        if r.bare_seconds is not None:
            row["bare_seconds"] = round(r.bare_seconds, 4)
            row["vs_bare"] = reporting.ratio(r.seconds, r.bare_seconds)
            row["settled_seconds"] = round(r.settled_seconds, 3)
        out_rows.append(row)
    out: dict[str, Any] = {"rows": out_rows}
    if floors:
        out["floors"] = {str(k): round(v, 4) for k, v in sorted(floors.items())}
    ratios = {}
    for kind in {r.kind for r in rows}:
        mine = {r.pods: r.seconds for r in rows if r.kind == kind and r.concurrency == rows[0].concurrency}
        if 128 in mine and max(mine) > 128 and mine[128] > 0:
            ratios[kind] = {"pods": max(mine), "vs_128": round(mine[max(mine)] / mine[128], 2), "target": 3.0}
            if floors.get(128) and max(mine) in floors:
                ratios[kind]["floor_vs_128"] = round(floors[max(mine)] / floors[128], 2)
    out["ratios"] = ratios
    return out


def markdown(sec: dict[str, Any]) -> str:
    lines = ["## One restart of a large job", "",
             "| kind | pods | all removed (s) | / 5 s | removed | concurrency | 429s | recreated | last recreated (s) "
             "| last Running (s) | DeleteCollection floor (s) | / floor | bare client (s) | / bare | requests "
             "| by request |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in sec["rows"]:
        by = ", ".join(f"{k} {v}" for k, v in r["by_request"].items())
        lines.append(f"| {r['kind']} | {r['pods']} | {r['seconds']:.3f} | {r.get('ratio_to_target', '')} | "
                     f"{r['removed']} | {r['concurrency']} | {r['throttled']} | {r.get('recreated', '')} | "
                     f"{r.get('recreated_seconds', '')} | "
                     f"{r.get('running_seconds', '')} | {r.get('floor_seconds', '')} | {r.get('vs_floor', '')} | "
                     f"{r.get('bare_seconds', '')} | {r.get('vs_bare', '')} | {r['requests']} | {by} |")
    for kind, ratio in sorted(sec["ratios"].items()):
        floor = (f"; the server's own DeleteCollection of as many pods takes {ratio['floor_vs_128']}x its 128-pod "
                 "time" if "floor_vs_128" in ratio else "")
        lines.append(f"\n{kind}: {ratio['pods']} pods take {ratio['vs_128']}x the 128-pod time (target at most "
                     f"{ratio['target']:g}x){floor}")
    return "\n".join(lines)
