"""Reading what `kcover status` shows from the cluster, with the controllers' settings (`deployed`).

Owns the reads and turning them into a `report.Report`: what the settings hold back from acting (dry run,
record-only classes, judgement rules not acting), the Lease, the Nodes (GPU nodes by `kube.gpu_resources`
capacity or `kube.gpu_dra_drivers` ResourceSlices, as the controller's cache counts them; kcover's cordons,
paused nodes), the controls ConfigMap, Namespaces and the workloads of `kube.workload_kinds` (pauses; a paused
pod is seen in the restart it holds, as pods are too many to list), the Recovery resources of the last 24 h,
and the ledger (read only, through `gateway.Http` and `ledger.Ledger`): the breaker, held restarts, suspect
nodes, and each limit's use (cordons and workloads restarted within `recovery.breaker_window_seconds`) beside
the limit admission applies (`admission.held_cordon_limit`, `admission.window_cordon_limit`). Restarts in
flight are counted in the leader's memory alone (a ledger intent stays until its unit's next write, so it
counts nothing): their limit is shown without a use. Writes nothing. A read that fails raises
`errors.KubeError`, except a missing optional object (no Lease yet, no controls ConfigMap, no Recovery or
LedgerEntry CRD, a workload kind not installed), which reads as absent.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from kcover import errors, kinds, settings
from kcover.aio import clock as clock_
from kcover.kube import caching, gateway, gpus, leasing, projecting
from kcover.kube import client as kube_client
from kcover.kube import projections as proj
from kcover.recovery import admission, controls, ledger, ledgerentries, recoveries
from kcover.status import deployed
from kcover.status import report as report_

WINDOW_SECONDS = 24 * 3600
"""Recoveries shown: those of the last 24 hours."""


async def _optional(kube: kube_client.KubeClient, path: str, query: dict[str, str] | None = None) -> Any:
    try:
        return await kube.request("GET", path, query=query)
    except errors.NotFoundError:
        return None


async def _items(kube: kube_client.KubeClient, path: str, query: dict[str, str] | None = None) -> list[Any] | None:
    """Every item of a list, page by page; None when the resource is not served."""
    out: list[Any] = []
    query = {**(query or {}), "limit": "500"}
    while True:
        page = await _optional(kube, path, query)
        if page is None:
            return None
        out += page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return out
        query = {**query, "continue": token}


# ---------------------------------------------------------------------------------------------- reading

async def gather(kube: kube_client.KubeClient, cfg: settings.Settings, *, now: dt.datetime,
                 source: deployed.Source | None = None) -> report_.Report:
    """Read what `kcover status` shows with the settings `cfg` (`deployed.read`'s, from `source`); nothing written."""
    rs = cfg.recovery
    lease = await _optional(kube, leasing.lease_path(cfg.lease.namespace, cfg.lease.name))
    leader = report_.Leader()
    if lease is not None:
        record = leasing.Record.from_lease(lease)
        leader = report_.Leader(holder=record.holder, renewed_seconds_ago=report_.age(record.renew_time, now),
                                held_seconds=report_.age(record.acquire_time, now),
                                duration_seconds=record.duration_seconds, transitions=record.transitions)
    report = report_.Report(lease=f"{cfg.lease.namespace}/{cfg.lease.name}", leader=leader,
                            settings=source or deployed.Source("", problem="not read from the cluster"))
    report.held_back = _held_back(rs)
    rule = gpus.GpuRule.of(cfg.kube.gpu_resources, cfg.kube.gpu_dra_drivers)
    drivers = await _slice_drivers(kube) if cfg.kube.gpu_dra_drivers else {}
    paused_nodes = []
    for raw in await _items(kube, "/api/v1/nodes") or []:
        node = projecting.node(raw)
        report.gpu_nodes += rule.is_gpu_node(node, drivers.get(node.name, ()))  # as the controller's cache counts
        if node.kcover_cordon_in_effect(rs.taint_key):  # as the breaker counts it: the marks alone are no cordon
            report.cordoned.append(report_.Cordon(node.name, proj.get(node.annotations, proj.CORDON_REASON),
                                                  proj.get(node.annotations, proj.CORDONED_AT)))
        if controls.paused(node.annotations):
            paused_nodes.append(f"Node {node.name}")
    report.paused = [*await _paused(kube, cfg), *paused_nodes]
    book = await _ledger(kube, rs)
    report.ledger_available = book is not None
    if book is not None:
        report.held = [_held(book, key, h) for key, h in sorted(book.held().items(), key=lambda kv: kv[1].at)]
    report.breaker = _breaker(book.breaker() if book is not None else ledgerentries.Breaker(), rs, now.timestamp())
    report.suspects = _suspects(book, rs, now.timestamp()) if book is not None else []
    report.limits = _limits(book, rs, report, now.timestamp())
    report.recoveries, report.recoveries_available = await _recoveries(kube, now)
    report.out_of_budget = _out_of_budget(book, rs, now) if book is not None else []
    return report


def _held_back(rs: settings.RecoverySettings) -> list[str]:
    """What the settings keep kcover from carrying out (`Report.held_back`)."""
    out = []
    if rs.dry_run:
        out.append("recovery.dry_run: every action is decided and recorded (Events, Recoveries), none carried out")
    if rs.record_only:
        out.append(f"recovery.record_only: {', '.join(c.value for c in rs.record_only)}: decided and recorded, "
                   "not carried out")
    j = rs.judgement
    for name, mode in (("workload_blame", j.workload_blame), ("suspect_node", j.suspect_node),
                       ("suspect_device", j.suspect_device)):
        if mode is not settings.JudgementMode.ACT:
            out.append(f"recovery.judgement.{name}: {mode.value}" + (
                " (decides and says so; kcover acts as without it)" if mode is settings.JudgementMode.RECORD
                else " (not applied)"))
    return out


async def _slice_drivers(kube: kube_client.KubeClient) -> dict[str, set[str]]:
    """Node -> the drivers of the DRA ResourceSlices naming it ({} where ResourceSlices are not served)."""
    out: dict[str, set[str]] = {}
    for raw in await _items(kube, caching.RESOURCE_SLICES_PATH) or []:
        rs = projecting.resource_slice(raw)
        if rs.node:
            out.setdefault(rs.node, set()).add(rs.driver)
    return out


async def _paused(kube: kube_client.KubeClient, cfg: settings.Settings) -> list[str]:
    """The scopes paused now, but for nodes (read with the Nodes) and pods (too many to list)."""
    rs = cfg.recovery
    out = []
    cm = await gateway.Http(kube).get_config_map(rs.ledger_namespace, rs.controls_name)
    if cm is not None and controls.paused(projecting.config_map(cm).annotations):
        out.append(f"every target ({controls.PAUSED}=true on ConfigMap {rs.ledger_namespace}/{rs.controls_name})")
    for raw in await _items(kube, "/api/v1/namespaces") or []:
        ns = projecting.namespace(raw)
        if controls.paused(ns.labels) or controls.paused(ns.annotations):
            out.append(f"namespace {ns.name}")
    for wk in map(kinds.by_key, cfg.kube.workload_kinds):
        for raw in await _items(kube, wk.path) or []:
            meta = raw.get("metadata") or {}
            if controls.paused((meta.get("annotations") or {}).items()):
                out.append(f"{wk.kind} {meta.get('namespace')}/{meta.get('name')}")
    return out


async def _ledger(kube: kube_client.KubeClient, rs: settings.RecoverySettings) -> ledger.Ledger | None:
    """The recovery ledger as the cluster holds it (read only), or None where its kind is not served."""
    book = ledger.Ledger(gateway.Http(kube), namespace=rs.ledger_namespace, name=rs.ledger_name,
                         retention_seconds=rs.memory_seconds)
    try:
        await book.load()
    except errors.LedgerUnavailable:
        return None
    return book


def _breaker(state: ledgerentries.Breaker, rs: settings.RecoverySettings, now: float) -> report_.Breaker:
    left = 0.0
    if not state.latched and state.closed_at is not None:
        left = max(0.0, rs.breaker_cooldown_seconds - (now - state.closed_at))
    return report_.Breaker(latched=state.latched, since=report_.when(state.opened_at), reason=state.reason,
                           latch=rs.breaker_latch, cooldown_seconds=rs.breaker_cooldown_seconds,
                           reset_at=report_.when(state.closed_at), cooling_seconds_left=round(left, 1))


def _held(book: ledger.Ledger, key: str, hold: ledgerentries.HeldRestart) -> report_.Held:
    unit = book.unit(key)
    return report_.Held(key, (unit.note if unit is not None else "") or key, hold.code, hold.text,
                        report_.when(hold.at), report_.when(hold.until))


def _suspects(book: ledger.Ledger, rs: settings.RecoverySettings, now: float) -> list[report_.Suspect]:
    """Nodes suspect now, and those whose suspicion was settled within the judgement's window."""
    out = []
    for key in sorted(k for k in book.entry_keys() if k.startswith("n.")):
        node = book.node(key[2:])
        if node is None or node.suspect_at is None:
            continue
        settled = not node.pending_suspicion()
        if settled and (node.judged_at is None or now - node.judged_at > rs.judgement.window_seconds):
            continue
        out.append(report_.Suspect(key[2:], report_.when(node.suspect_at), node.suspicion,
                                   node.verdict.value if settled and node.verdict is not None else "",
                                   report_.when(node.judged_at) if settled else ""))
    return out


def _limits(book: ledger.Ledger | None, rs: settings.RecoverySettings, report: report_.Report,
            now: float) -> list[report_.Limit]:
    window = rs.breaker_window_seconds
    since = admission.window_start(rs, book.breaker(), now) if book is not None else now - window
    span = f"in {window:g}s" if since <= now - window else f"since the breaker's reset {now - since:.0f}s ago"
    gpu = report.gpu_nodes
    cordons = book.cordons_since(since) if book is not None else 0
    units = book.units_restarted_since(since) if book is not None else 0
    return [
        report_.Limit("nodes cordoned at once", len(report.cordoned), admission.held_cordon_limit(rs, gpu),
              f"recovery.max_cordoned_fraction {rs.max_cordoned_fraction:g} of {gpu} GPU nodes, "
              f"recovery.max_cordoned_nodes {rs.max_cordoned_nodes}"),
        report_.Limit(f"cordons {span}", cordons, admission.window_cordon_limit(rs, gpu),
              f"recovery.max_cordons_per_window {rs.max_cordons_per_window}, "
              f"max_cordons_per_window_fraction {rs.max_cordons_per_window_fraction:g} of {gpu} GPU nodes"),
        report_.Limit(f"workloads restarted {span}", units, rs.max_restarted_workloads_per_window,
              f"recovery.max_restarted_workloads_per_window {rs.max_restarted_workloads_per_window}"),
        report_.Limit("restarts in flight", None, rs.max_concurrent_restarts,  # a ledger intent outlives its restart
              f"recovery.max_concurrent_restarts {rs.max_concurrent_restarts}: past it a restart waits; the leader "
              "counts them in its memory", trips=False),
    ]


async def _recoveries(kube: kube_client.KubeClient, now: dt.datetime) -> tuple[list[report_.Row], bool]:
    items = await _items(kube, f"/apis/{recoveries.API_VERSION}/{recoveries.PLURAL}",
                         {"labelSelector": "app.kubernetes.io/managed-by=kcover"})
    if items is None:
        return [], False
    rows: list[report_.Row] = []
    for item in items:
        meta, spec, status = item.get("metadata") or {}, item.get("spec") or {}, item.get("status") or {}
        seen = report_.age(status.get("detectedAt") or meta.get("creationTimestamp"), now)
        if seen is not None and seen > WINDOW_SECONDS:
            continue
        target = spec.get("target") or {}
        where = f"{target.get('namespace')}/{target.get('name')}" if target.get("namespace") else target.get("name")
        rows.append(report_.Row(str(meta.get("namespace")), str(meta.get("name")), str(status.get("phase") or ""),
                                str((spec.get("decision") or {}).get("action") or ""), f"{target.get('kind')} {where}",
                                str((spec.get("fault") or {}).get("reason") or ""), str(status.get("cause") or ""),
                                str(status.get("detectedAt") or ""), status.get("mttrSeconds"),
                                str(status.get("message") or "")))
    rows.sort(key=lambda r: r.detected)
    return rows, True


def _out_of_budget(book: ledger.Ledger, rs: settings.RecoverySettings,
                   now: dt.datetime) -> list[report_.OutOfBudget]:
    out = []
    horizon = now.timestamp() - rs.restart_window_seconds
    for key in book.entry_keys():
        unit = book.unit(key)
        if unit is None:
            continue
        recent = sorted(t for t in unit.restarts if t >= horizon)
        if len(recent) >= rs.max_restarts_per_window:
            frees = dt.datetime.fromtimestamp(recent[-rs.max_restarts_per_window] + rs.restart_window_seconds, dt.UTC)
            out.append(report_.OutOfBudget(key, unit.note or key, len(recent), clock_.rfc3339(frees)))
    return out


