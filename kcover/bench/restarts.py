"""`kcover bench --restarts 8,128,1024`: how long one restart of a large job takes, and what it costs.

Owns one scenario per (kind, size): a namespace `kcover-bench-restart-<run>` holding an opted-in JobSet,
batch/v1 Job or PyTorchJob of N pods (the pods created through the API, bound to bench nodes
`kcover-bench-node-<i>`, as their operator would create them), the controller's recovery built as the
controller builds it (`controller.recovering.build`) over a watching cache, and one container fault on
one pod. It measures the time from handing the fault to the engine to the restart's outcome (every pod
taken away: each eviction or delete answered by the API server) and the requests made meanwhile, by
verb and resource, then deletes what it created. No kubelet runs: a pod taken away stays Terminating
until the namespace goes.

The kinds' CRDs must be served (JobSet, Kubeflow's PyTorchJob, and kcover's LedgerEntry and Recovery):
the simulated server and the tests' control plane have them. It decides nothing; figures are printed,
never asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import structlog

from kcover import errors, kinds, metrics, model, settings
from kcover.aio import clock as clock_
from kcover.controller import recovering
from kcover.kube import caching, watching
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


def _labels(kind: str, name: str, uid: str) -> dict[str, str]:
    if kind == "jobset":
        return {kinds.JOBSET_NAME: name, kinds.JOBSET_UID: uid, kinds.BATCH_JOB_NAME: f"{name}-w"}
    if kind == "job":
        return {kinds.BATCH_JOB_NAME: name, kinds.BATCH_CONTROLLER_UID: uid}
    return {kinds.KUBEFLOW_JOB_NAME: name, kinds.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}


async def _workload(kube: client_.KubeClient, ns: str, kind: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The workload object and the controller ownerReference its pods carry."""
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
        "spec": {"backoffLimit": 0, "template": {"spec": pod_spec}}})
    return js, {"apiVersion": "batch/v1", "kind": "Job", "name": f"{name}-w", "uid": child["metadata"]["uid"],
                "controller": True}


async def _pods(kube: client_.KubeClient, ns: str, kind: str, name: str, uid: str, owner: dict[str, Any],
                count: int) -> None:
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)
    labels = _labels(kind, name, uid)

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


async def measure_one(kube: client_.KubeClient, *, kind: str, pods: int, run_id: str,
                      concurrency: int | None = None) -> Row:
    """One restart of one `kind` workload of `pods` pods; see the module docstring."""
    ns = f"kcover-bench-restart-{run_id}-{kind}-{pods}"
    await kube.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                           "metadata": {"name": ns, "labels": {"kcover.io/bench": "true"}}})
    try:
        await _nodes(kube)
        workload, owner = await _workload(kube, ns, kind, "big")
        await _pods(kube, ns, kind, "big", workload["metadata"]["uid"], owner, pods)
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
            await asyncio.wait_for(cache.wait_synced(), 120)
            for _ in range(600):  # the watch delivers the last pods created
                if len([p for p in cache.pods.values() if p.namespace == ns]) >= pods:
                    break
                await asyncio.sleep(0.05)
            leader = recovering.build(recovering.EngineDeps(
                settings=cfg, client=kube, cache=cache, metrics=metrics.Metrics(), clock=clock_.SystemClock(),
                is_leader=lambda: True, epoch=lambda: 1, identity="kcover-bench"))
            watch = _Stopwatch()
            leader.inner.coordinator.hooks.insert(0, watch)
            await leader.inner.ledger.ensure_loaded()
            pod = next(p for p in cache.pods.values() if p.namespace == ns)
            fault = model.CollectorEvent(detector="pod-status", severity=model.Severity.ERROR, reason="ContainerError",
                                         message="bench: exit 1",
                                         target=model.Target(kind=model.TargetKind.POD, namespace=ns, name=pod.name,
                                                             uid=pod.uid, node=pod.node))
            before = Counter(kube.request_counts)
            started = time.perf_counter()
            await leader.handle([fault])
            seconds = (watch.at or time.perf_counter()) - started
            spent = Counter(kube.request_counts)
            spent.subtract(before)
            requests = {k: v for k, v in spent.items() if v > 0 and not k.startswith(("WATCH", "LIST"))}
            return Row(kind, pods, seconds, watch.removed, requests)
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
    finally:
        with contextlib.suppress(errors.KubeError):
            await kube.request("DELETE", f"/api/v1/namespaces/{ns}")


async def measure(kube: client_.KubeClient, sizes: list[int], *, run_id: str,
                  kinds_: tuple[str, ...] = KINDS, concurrency: int | None = None) -> list[Row]:
    rows = []
    for kind in kinds_:
        for pods in sizes:
            row = await measure_one(kube, kind=kind, pods=pods, run_id=run_id, concurrency=concurrency)
            log.info("bench_restart", kind=kind, pods=pods, seconds=round(row.seconds, 3), removed=row.removed,
                     requests=row.total_requests)
            rows.append(row)
    return rows


def section(rows: list[Row]) -> dict[str, Any]:
    """The report's `restarts` section: each row, and per kind the largest size's time over the 128-pod one."""
    out: dict[str, Any] = {"rows": [{"kind": r.kind, "pods": r.pods, "seconds": round(r.seconds, 4),
                                     "removed": r.removed, "requests": r.total_requests,
                                     "by_request": dict(sorted(r.requests.items()))} for r in rows]}
    ratios = {}
    for kind in {r.kind for r in rows}:
        mine = {r.pods: r.seconds for r in rows if r.kind == kind}
        if 128 in mine and max(mine) > 128 and mine[128] > 0:
            ratios[kind] = {"pods": max(mine), "vs_128": round(mine[max(mine)] / mine[128], 2), "target": 3.0}
    out["ratios"] = ratios
    return out


def markdown(sec: dict[str, Any]) -> str:
    lines = ["## One restart of a large job", "", "| kind | pods | seconds | removed | requests | by request |",
             "|---|---:|---:|---:|---:|---|"]
    for r in sec["rows"]:
        by = ", ".join(f"{k} {v}" for k, v in r["by_request"].items())
        lines.append(f"| {r['kind']} | {r['pods']} | {r['seconds']:.3f} | {r['removed']} | {r['requests']} | {by} |")
    for kind, ratio in sorted(sec["ratios"].items()):
        lines.append(f"\n{kind}: {ratio['pods']} pods take {ratio['vs_128']}x the 128-pod time (target at most "
                     f"{ratio['target']:g}x)")
    return "\n".join(lines)
