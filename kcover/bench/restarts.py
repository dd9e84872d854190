"""`kcover bench --restarts 8,128,1024`: how long one restart of a large job takes, and what it costs.

Owns one scenario per (kind, size): a workload of N pods set up by `restartsetup` (an opted-in JobSet,
batch/v1 Job or PyTorchJob, its pods bound to bench nodes as their operator would create them), the
controller's recovery built as the controller builds it (`controller.recovering.build`) over a watching
cache, and one container fault on one pod. It measures the time from handing the fault to the engine to
the restart's outcome (every pod taken away: each eviction or delete answered by the API server), the
requests made meanwhile, by verb and resource, and the 429s retried, then drops the scenario. Beside it,
per size, the server's own DeleteCollection floor, and after each restart the same removals from a bare
client left as long after its pods' creation (`restartsetup.measure_floor`, `measure_bare`): kcover's
time over the bare client's is what kcover itself adds.

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
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from kcover import errors, kinds, metrics, model, settings
from kcover.aio import clock as clock_
from kcover.bench import reporting, restartsetup
from kcover.controller import recovering
from kcover.kube import caching, indexing, watching
from kcover.kube import client as client_
from kcover.kube import projections as proj
from kcover.recovery import restarting
from kcover.recovery import steps as st

log = structlog.get_logger()

KINDS = ("jobset", "job", "pytorchjob")


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


def _running(cache: caching.ClusterCache, ns: str) -> list[proj.Pod]:
    return [p for p in cache.pods.values() if p.namespace == ns and p.phase == "Running" and not p.deleting]


async def measure_one(kube: client_.KubeClient, *, kind: str, pods: int, run_id: str,
                      concurrency: int | None = None, operator: bool = False, pod_labels: dict[str, str] | None = None,
                      setup_timeout: float = 900.0, recreate_timeout: float = 900.0) -> Row:
    """One restart of one `kind` workload of `pods` pods; see the module docstring."""
    ns = await restartsetup.scenario_namespace(kube, f"kcover-bench-restart-{run_id}-{kind}-{pods}")
    try:
        if not operator:
            await restartsetup.nodes(kube)
            made, owner = await restartsetup.workload(kube, ns, kind, "big", pods)
            await restartsetup.workload_pods(kube, ns, kind, "big", made, owner, pods)
        else:
            await restartsetup.operated(kube, ns, kind, "big", pods, dict(pod_labels or {}))
        created = time.perf_counter()
        cfg = settings.Settings.model_validate({"lease": {"enabled": False}, "kube": {"watch_events": False},
                                                "recovery": {"ledger_namespace": ns, "save_logs": {"enabled": False},
                                                             "verify": {"enabled": False},
                                                             **({"delete_concurrency": concurrency,
                                                                 "evict_concurrency": concurrency}
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
            table = kinds.by_key(restartsetup.KIND_KEYS[kind])
            row = Row(kind, pods, seconds, watch.removed, requests,
                      throttled=kube.retry_stats.retries["throttled"] - throttled,
                      concurrency=table.removal_concurrency or restarting.in_flight(cfg.recovery, table.removal),
                      cpu_seconds=cpu,
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
        await restartsetup.drop(kube, ns)


async def measure(kube: client_.KubeClient, sizes: list[int], *, run_id: str,
                  kinds_: tuple[str, ...] = KINDS, concurrencies: Sequence[int | None] = (None,),
                  operator: bool = False, pod_labels: dict[str, str] | None = None,
                  floors: dict[int, float] | None = None) -> list[Row]:
    """One restart per kind, size and concurrency (`recovery.delete_concurrency` and `evict_concurrency`; None: the
    product's default for the kind's removal),
    in that order; with `floors` (a dict to fill) and not `operator`, the server's DeleteCollection floor per
    size too, and after each restart the same removals from a bare client (`measure_bare`), left as long after
    its pods' creation as the restart's scenario was."""
    rows = []
    defaults = settings.RecoverySettings()
    bare = floors is not None and not operator
    if bare:
        assert floors is not None
        for pods in sizes:
            floors[pods] = await restartsetup.measure_floor(kube, pods=pods, run_id=run_id)
            log.info("bench_restart_floor", pods=pods, seconds=round(floors[pods], 3))
    for kind in kinds_:
        for pods in sizes:
            for concurrency in concurrencies:
                row = await measure_one(kube, kind=kind, pods=pods, run_id=run_id, concurrency=concurrency,
                                        operator=operator, pod_labels=pod_labels)
                if bare:
                    row.bare_seconds = await restartsetup.measure_bare(kube, kind=kind, pods=pods, run_id=run_id,
                                                          concurrency=concurrency or restarting.in_flight(
                                                              defaults, kinds.by_key(restartsetup.KIND_KEYS[kind]).removal),
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
