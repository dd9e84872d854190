"""`kcover bench --fleet NODESxPODS`: kcover at fleet size on a real API server, every figure against its target.

Owns the fleet scenario's order and its report. It seeds, through the API, NODES GPU nodes (labelled for
kwok, `type=kwok`, so kwok heartbeats them and plays their pods' lifecycle as kubelets would) and PODS
worker pods of 32-pod background jobs (run by kwok with `operator`, their status written by the bench
otherwise) (`background_kind`, a Kubeflow kind whose operator the
tests' cluster does not run, so nothing but the stated churn changes them), then measures, in order:

1. **sync**: a fresh controller worker process (`scale.Worker`) syncs the fleet: seconds, synced and peak
   RSS (`VmHWM`), bytes per cached pod, the worker's CPU over the sync and each reflector's list time;
2. **relist** (only given `expire`, a callable that expires every watch, as the fleet script's forced etcd
   compaction and API server restart do): the same worker's time to list everything again, and its RSS
   peak meanwhile;
3. **latency under churn**: `latency.measure` (a whole controller in this process, pod errors, DRA health,
   agent XIDs, the watch floor, the cost of one fault in a 4-pod job) while `churning.Churn` flips the
   readiness of background pods at `churn_rate` writes a second in a process of its own;
4. **restarts**: one restart of a `restart_pods`-pod job per `restart_kinds`, through `restarts.measure`
   (with `operator`, the pods are the workload's real controllers', who recreate them; without, first the
   server's own floor at this size: one DeleteCollection of as many bound pods, and each restart followed by
   the same removals from a bare client; `before_restarts` may first change the cluster, as the fleet
   script stops the training operator, which would otherwise reconcile the bench's PyTorchJob meanwhile);
5. **failover**: `failover.measure` (two `kcover controller` processes, the leader killed);
6. **ledger**: `ledgering.measure` at `ledger_sizes` units.

It asserts nothing: figures are printed with their targets and ratios (measured / target; below 1 meets
it). API errors of the seeding and the sync propagate; each later scenario's failure is the report's
`errors` entry (and its log line) and the next still runs; what it created is deleted at the end (the fleet's namespaces and nodes),
unless `keep`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from kcover import errors
from kcover.bench import (
    churning,
    failover,
    latency,
    ledgering,
    objects,
    rawapi,
    reporting,
    restarts,
    scale,
    seeding,
)
from kcover.kube import client as client_

log = structlog.get_logger()

Expire = Callable[[], Awaitable[float]]
"""Expires every watch of the API server (a restart of the server, compacted past every resourceVersion
while it is down); returns when
(`time.time()`) it answers again."""

SYNC_TARGET_SECONDS = 30.0
LATENCY_P99_TARGET_MS = 1000.0
FLOOR_TARGET_RATIO = 1.5
"""Issue 30: fault to action p99 at most 1.5x the bench's floor (2 x watch-delivery p99 + one write's p99)."""
CHART_MEMORY_LIMIT_BYTES = 512 * 2**20
"""The chart's default `controller.resources.limits.memory` (helm/kcover/values.yaml)."""
WORKERS_PER_JOB = 32
TEAMS = 50


@dataclass
class Options:
    nodes: int
    pods: int
    churn_rate: float = 50.0
    """Background pod status writes per second during the latency samples."""
    samples: int = 30
    xid_samples: int = 10
    restart_pods: int = 2048
    restart_kinds: tuple[str, ...] = ("pytorchjob", "jobset")
    operator: bool = False
    """The workloads' controllers run in the cluster (training operator, Job controller), with kwok's nodes."""
    write_status: bool = False
    """With `operator`: the bench writes the background pods' Running status itself, as without one (kwok
    then finds them running and leaves them; on two loaded cores it starts about 3 pods a second)."""
    restart_operator: bool | None = None
    """The restarts' pods are their controllers' (None: as `operator`); False: created by the bench on nodes no
    kubelet runs, which times the removal and its requests but no recreation."""
    pod_labels: dict[str, str] = field(default_factory=dict)
    """Labels on the pods the operators create (the tests' kwok completes a Job's pods without one)."""
    concurrencies: tuple[int | None, ...] = (None,)
    """`recovery.delete_concurrency` and `evict_concurrency` for the restarts, each measured in turn (None: the
    product's defaults)."""
    failover: bool = True
    failover_units: int = 10_000
    """Restart units in the failover's ledger (a new leader lists them all before it acts)."""
    ledger_sizes: tuple[int, ...] = (100, 1000, 10_000)
    background_kind: str = "XGBoostJob"
    controller_kubeconfig: str = ""
    """kcover's credentials where not the bench's (a ServiceAccount: the API server's priority and fairness
    then treats kcover as it treats an installed one)."""
    keep: bool = False


def _load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def namespaces(count: int = TEAMS) -> list[str]:
    return [f"kcover-fleet-{t}" for t in range(count)]


async def seed(api: rawapi.RawApi, options: Options, *, concurrency: int = 48) -> list[tuple[str, str]]:
    """The fleet's nodes and background jobs with their running pods; (namespace, name) of every pod."""
    await seeding.namespaces(api, namespaces())
    nodes = [f"kcover-fleet-{i:05d}" for i in range(options.nodes)]
    await seeding.nodes(api, nodes, concurrency=concurrency, kwok=True)
    specs = []
    left, index = options.pods, 0
    while left > 0:
        workers = min(WORKERS_PER_JOB, left)
        specs.append((namespaces()[index % TEAMS], f"fleet-{index:05d}", workers))
        index += 1
        left -= workers
    made = await seeding.jobs(api, specs, node_names=nodes, concurrency=concurrency, kind=options.background_kind,
                              write_status=options.write_status or not options.operator,
                              addresses=not options.operator)
    if options.operator and not options.write_status:
        await _until_running(api)
    return [(j.namespace, p) for j in made for p in j.pods]


async def _until_running(api: rawapi.RawApi, timeout: float = 1800.0) -> None:
    """Wait until kwok has run every fleet pod (none Pending): the cache then holds what kubelets report."""
    async with asyncio.timeout(timeout):
        while True:
            pending = 0
            for ns in namespaces():
                listed = await api.request("GET", seeding.pods_path(ns),
                                           query={"fieldSelector": "status.phase=Pending", "limit": "1"})
                pending += len(listed.get("items") or [])
            if not pending:
                return
            await asyncio.sleep(2.0)


async def _sync_and_relist(kubeconfig: str, workload_kinds: tuple[str, ...],
                           expire: Expire | None) -> tuple[dict[str, Any], dict[str, Any]]:
    w = await scale.Worker.start(kubeconfig, workload_kinds=workload_kinds)
    try:
        synced = await w.line(900)
        row = {"nodes": synced["nodes"], "pods": synced["pods"], "sync_seconds": round(synced["sync_seconds"], 3),
               "rss_delta_bytes": synced["rss_after"] - synced["rss_before"], "rss_bytes": synced["rss_after"],
               "peak_rss_bytes": synced["peak_rss"], "cpu_seconds": round(synced["sync_cpu_seconds"], 2),
               "lists": synced["lists"]}
        row["bytes_per_pod"] = round(row["rss_delta_bytes"] / max(1, row["pods"]))
        relist: dict[str, Any] = {}
        if expire is not None:
            armed = await w.ask("arm", 60)
            started = time.time()
            ready = await expire()
            answer = await w.ask("relisted 900", 960)
            done = answer["relisted"]
            pods = done.get("pods") or {}
            relist = {"expire_seconds": round(ready - started, 2),
                      "relist_seconds": pods.get("list_seconds"), "relisted_objects": pods.get("objects"),
                      "all_relisted_after_expire_seconds": round(max(d["at"] for d in done.values()) - started, 2)
                      if done else None,
                      "reflectors": {name: d["list_seconds"] for name, d in done.items()},
                      "resumed_without_relist": answer["not_relisted"], "rss_before_bytes": armed["rss"],
                      "peak_rss_bytes": answer["peak_rss"], "sampled_max_rss_bytes": answer["sampled_max_rss"],
                      "rss_after_bytes": answer["rss"]}
        await w.report(120)
    finally:
        await w.kill()
    return row, relist


Progress = Callable[[dict[str, Any]], None]
"""Given the report so far (its `figures` of what was measured, `partial` true) after each section: a run stopped
at a time limit keeps what it measured."""


async def run(kubeconfig: str, options: Options, *, expire: Expire | None = None,
              progress: Progress | None = None,
              before_restarts: Callable[[], Awaitable[str]] | None = None) -> dict[str, Any]:
    """The whole fleet scenario (see the module docstring); the report (JSON-able). `before_restarts`, when
    given, is awaited before the restarts section and what it returns (what it changed in the cluster) is
    the environment's `before_restarts`."""
    run_id = uuid.uuid4().hex[:6]
    controller_kubeconfig = options.controller_kubeconfig or kubeconfig
    kinds_ = ("pytorchjobs.kubeflow.org", f"{objects.plural(options.background_kind)}.kubeflow.org",
              "jobsets.jobset.x-k8s.io", "jobs.batch")
    env: dict[str, Any] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                           "load_average_at_start": _load(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "nodes": options.nodes, "pods": options.pods, "churn_per_second": options.churn_rate,
                           "operator": options.operator, "background_kind": options.background_kind}
    report: dict[str, Any] = {"environment": env}
    started = time.perf_counter()

    def done(section: str) -> None:
        log.info("bench_fleet_section_done", section=section, seconds=round(time.perf_counter() - started, 1))
        if progress is not None:
            progress({**report, "partial": True, "figures": figures(report)})
    async with await rawapi.open_api(kubeconfig) as api:
        try:
            t0 = time.perf_counter()
            fleet = await seed(api, options)
            env["seed_seconds"] = round(time.perf_counter() - t0, 1)
            env["load_after_seed"] = _load()
            log.info("bench_fleet_seeded", pods=len(fleet), seconds=env["seed_seconds"])
            report["sync"], report["relist"] = await _sync_and_relist(controller_kubeconfig, kinds_, expire)
            done("sync")
            env["load_before_latency"] = _load()
            async with _section(report, "latency"):
                async with churning.Churn.running(kubeconfig, fleet, rate=options.churn_rate) as churn:
                    lat = await latency.measure(kubeconfig, samples=options.samples, xid_samples=options.xid_samples,
                                                run_id=run_id, controller_kubeconfig=controller_kubeconfig,
                                                workload_kinds=kinds_, job_kind=options.background_kind)
                    report["churn"] = await churn.stop()
                kinds = {kind: {"detect": s.detect, **dict(s.extra), "act": s.act} for kind, s in lat.kinds.items()}
                report["latency_ms"] = reporting.latency_section(kinds, lat.floor, lat.floor_write)
                report["floor_ms"] = reporting.summary_ms(lat.floor)
                report["write_ms"] = reporting.summary_ms(lat.floor_write)
                report["api_requests_per_recovery"] = reporting.api_section(lat.api_requests)
            done("latency")
            if options.restart_pods and options.restart_kinds:
                if before_restarts is not None:
                    env["before_restarts"] = await before_restarts()
                env["load_before_restarts"] = _load()
                async with _section(report, "restarts"):
                    floors: dict[int, float] = {}
                    async with await client_.connect(controller_kubeconfig) as kube:
                        rows = await restarts.measure(kube, [options.restart_pods], run_id=run_id,
                                                      kinds_=options.restart_kinds, concurrencies=options.concurrencies,
                                                      operator=options.operator if options.restart_operator is None
                                                      else options.restart_operator, pod_labels=options.pod_labels,
                                                      floors=floors)
                    report["restarts"] = restarts.section(rows, floors)
            done("restarts")
            if options.failover:
                env["load_before_failover"] = _load()
                async with _section(report, "failover"):
                    report["failover"] = await failover.measure(kubeconfig, controller_kubeconfig, run_id=run_id,
                                                                ledger_units=options.failover_units,
                                                                workload_kinds=kinds_,
                                                                job_kind=options.background_kind)
            done("failover")
            if options.ledger_sizes:
                env["load_before_ledger"] = _load()
                async with _section(report, "ledger"):
                    async with await client_.connect(controller_kubeconfig) as kube:
                        rows_ = await ledgering.measure(kube, list(options.ledger_sizes), run_id=run_id)
                    report["ledger"] = ledgering.section(rows_)
        finally:
            if not options.keep:
                await cleanup(api, options, run_id)
    env["load_average_at_end"] = _load()
    env["seconds"] = round(time.perf_counter() - started, 1)
    report["figures"] = figures(report)
    return report


@contextlib.asynccontextmanager
async def _section(report: dict[str, Any], name: str) -> AsyncIterator[None]:
    """One scenario after the sync: a failure is the report's `errors[name]` (logged), and the scenarios after
    it still run, so a long run keeps what it measured."""
    try:
        yield
    except Exception as exc:  # any failure of one scenario, a TaskGroup's ExceptionGroup too, is its report's
        leaves = exc.exceptions if isinstance(exc, ExceptionGroup) else (exc,)
        text = "; ".join(f"{type(e).__name__}: {str(e)[:400]}" for e in leaves)
        log.error("bench_fleet_section_failed", section=name, error=text)
        report.setdefault("errors", {})[name] = text


async def cleanup(api: rawapi.RawApi, options: Options, run_id: str) -> None:
    """Delete the fleet's namespaces (their pods at once) and the bench's nodes; log what failed."""
    for ns in [*namespaces(), latency.namespace_of(run_id), failover.namespace_of(run_id)]:
        for path in (seeding.pods_path(ns), seeding.jobs_path(ns, options.background_kind)):
            try:
                await api.request("DELETE", path, query={"gracePeriodSeconds": "0"})
            except errors.KubeError as exc:
                log.info("bench_fleet_cleanup", path=path, error=str(exc)[:200])
    try:
        await seeding.cleanup(api, [latency.namespace_of(run_id), failover.namespace_of(run_id), *namespaces()])
    except errors.KubeError as exc:
        log.warning("bench_fleet_cleanup_failed", error=str(exc)[:300])


def _figure(name: str, measured: float | None, target: float | None, unit: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"figure": name, "measured": measured, "target": target, "unit": unit}
    if measured is not None and target:
        out["ratio"] = reporting.ratio(measured, target)
    return out


def figures(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every figure of issue 30 with its target and ratio, flat (the table the docs keep)."""
    out = []
    sync = report.get("sync") or {}
    if sync:
        out.append(_figure(f"sync of {sync['pods']} pods, {sync['nodes']} nodes", sync["sync_seconds"],
                           SYNC_TARGET_SECONDS, "s"))
        out.append(_figure("peak / synced RSS during the sync", round(sync["peak_rss_bytes"] / sync["rss_bytes"], 3),
                           reporting.PEAK_TO_SYNCED_RSS))
        out.append(_figure("peak RSS within the chart's memory limit (MiB)", round(sync["peak_rss_bytes"] / 2**20, 1),
                           CHART_MEMORY_LIMIT_BYTES / 2**20, "MiB"))
        out.append(_figure("synced RSS (MiB)", round(sync["rss_bytes"] / 2**20, 1), None, "MiB"))
        if "cpu_seconds" in sync:
            out.append(_figure("kcover's CPU over the sync", sync["cpu_seconds"], None, "s"))
            out.append(_figure("the pod list's own time within the sync", sync["lists"].get("pods"), None, "s"))
        out.append(_figure("bytes per cached pod", sync["bytes_per_pod"], reporting.BYTES_PER_POD, "B"))
    relist = report.get("relist") or {}
    if relist:
        out.append(_figure(f"re-list of {relist['relisted_objects']} pods after compaction and watch expiry",
                           relist["relist_seconds"], None, "s"))
        out.append(_figure("compaction, API server restart and every re-list done",
                           relist["all_relisted_after_expire_seconds"], None, "s"))
        out.append(_figure("peak RSS during the re-list / synced RSS",
                           round(relist["peak_rss_bytes"] / sync["rss_bytes"], 3) if sync else None,
                           reporting.PEAK_TO_SYNCED_RSS))
    floor_target = None
    for kind, e in (report.get("latency_ms") or {}).items():
        act = e.get("act") or {}
        if not act.get("n"):
            continue
        floor_target = e.get("floor_target_p99_ms")
        out.append(_figure(f"{kind}: fault to action p50 under churn", act["p50"], None, "ms"))
        out.append(_figure(f"{kind}: fault to action p99 under churn", act["p99"], LATENCY_P99_TARGET_MS, "ms"))
        if floor_target:
            out.append(_figure(f"{kind}: p99 / (2 x floor p99 + write p99 = {floor_target} ms)",
                               reporting.ratio(act["p99"], floor_target), FLOOR_TARGET_RATIO))
    for scenario, shape in ((latency.COST_SCENARIO, "restartPolicy OnFailure"),
                            (latency.COST_SCENARIO_NEVER, "restartPolicy Never")):
        cost = (report.get("api_requests_per_recovery") or {}).get(scenario)
        if not cost:
            continue
        logs = sum(v for c in cost["requests"].values() for k, v in c.items() if k == "GET pods/log")
        out.append(_figure(f"requests per fault, 4-pod job, {shape} (log saving included)", cost["total"],
                           reporting.FAULT_REQUESTS))
        out.append(_figure(f"requests per fault, 4-pod job, {shape}, without the log saving's reads",
                           cost["total"] - logs, reporting.FAULT_REQUESTS))
    for r in (report.get("restarts") or {}).get("rows") or []:
        if r["removed"] < r["pods"]:  # the restart found fewer pods than the bench made: its time is no figure
            out.append(_figure(f"{r['kind']} of {r['pods']} pods: only {r['removed']} removed (the rest were gone "
                               "before the restart), not timed", None, restarts.REMOVED_TARGET_SECONDS, "s"))
        else:
            at = f" ({r['concurrency']} in flight)" if r.get("concurrency") else ""
            out.append(_figure(f"{r['kind']} of {r['pods']} pods{at}: fault to every pod removed", r["seconds"],
                               restarts.REMOVED_TARGET_SECONDS, "s"))
            if "bare_seconds" in r:
                out.append(_figure(f"{r['kind']} of {r['pods']} pods{at}: / the same removals from a bare client "
                                   f"({r['bare_seconds']} s)", r["vs_bare"], None))
            if "floor_seconds" in r:
                out.append(_figure(f"{r['kind']} of {r['pods']} pods{at}: / the server's own DeleteCollection of as "
                                   f"many pods ({r['floor_seconds']} s)", r["vs_floor"], None))
        if "recreated" in r:
            out.append(_figure(f"{r['kind']} of {r['pods']} pods: pods recreated by its controller", r["recreated"],
                               None))
        if "recreated_seconds" in r:
            out.append(_figure(f"{r['kind']} of {r['pods']} pods: fault to the last pod recreated",
                               r["recreated_seconds"], None, "s"))
            out.append(_figure(f"{r['kind']} of {r['pods']} pods: fault to the last pod Running",
                               r["running_seconds"], None, "s"))
        out.append(_figure(f"{r['kind']} of {r['pods']} pods: requests (429s retried: {r['throttled']})",
                           r["requests"], None))
    fo = report.get("failover") or {}
    if fo:
        out.append(_figure(f"failover: kill to the new leader's first action ({fo['ledger_units']} ledger units)",
                           fo["seconds"], fo["target_seconds"], "s"))
    growth = (report.get("ledger") or {}).get("p50_growth")
    for r in (report.get("ledger") or {}).get("rows") or []:
        out.append(_figure(f"ledger write p50 at {r['units']} units", r["write_ms"].get("p50"), None, "ms"))
        out.append(_figure(f"ledger write p99 at {r['units']} units", r["write_ms"].get("p99"), None, "ms"))
    if growth:
        out.append(_figure(f"ledger write p50 at {growth['to_units']} / at {growth['from_units']} units",
                           growth["ratio"], growth["target"]))
    return out


def markdown(report: dict[str, Any]) -> str:
    lines = ["## kcover at fleet size", ""]
    lines += ["| figure | measured | target | ratio |", "|---|---:|---:|---:|"]
    for f in report.get("figures") or []:
        unit = f" {f['unit']}" if f.get("unit") else ""
        target = f"{f['target']:g}{unit}" if f.get("target") is not None else ""
        lines.append(f"| {f['figure']} | {f['measured']}{unit if f['measured'] is not None else ''} | {target} | "
                     f"{f.get('ratio', '')} |")
    lines.append("")
    sub: dict[str, Any] = {k: report[k] for k in ("latency_ms", "floor_ms", "write_ms", "api_requests_per_recovery")
                           if k in report}
    if sub:
        lines.append(reporting.markdown(sub))
    if report.get("restarts"):
        lines += [restarts.markdown(report["restarts"]), ""]
    if report.get("failover"):
        lines += [failover.markdown(report["failover"]), ""]
    if report.get("ledger"):
        lines += [ledgering.markdown(report["ledger"]), ""]
    churn = report.get("churn") or {}
    if churn:
        lines.append(f"Churn: {churn['writes']} readiness flips of {churn['targets']} background pods in "
                     f"{churn['seconds']} s ({churn['achieved_per_second']}/s offered {churn['offered_per_second']}/s, "
                     f"{churn['errors']} errors, at most {churn['max_behind_seconds']} s behind).")
    for name, error in (report.get("errors") or {}).items():
        lines.append(f"Not measured: {name}: {error}")
    env = report.get("environment") or {}
    lines.append("Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    return "\n".join(lines) + "\n"
