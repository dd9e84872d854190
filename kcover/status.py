"""`kcover status`: what kcover is doing, read from the cluster through a kubeconfig, for a person.

Owns reading and judging, not acting: `gather()` makes a handful of reads (the Lease, the controls
ConfigMap, the Nodes, the Recovery resources, the ledger in either layout) and builds a `Report`; `Report.problems()`
says what needs a person (no leader or a stale Lease, the breaker latched or open, a recovery Stalled
or Failed in the last 24 h, a workload out of its restart budget); `render()` prints it for a terminal
and `Report.to_json()` for a program. Nothing here writes. A read that fails raises
`errors.KubeError`, except a missing optional object (no Lease yet, no controls ConfigMap, no Recovery
CRD), which reads as absent.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from kcover import errors, settings
from kcover.aio import clock as clock_
from kcover.kube import client as kube_client
from kcover.kube import gateway, gpus, leasing
from kcover.kube import projections as proj
from kcover.recovery import ledger, recording

WINDOW_SECONDS = 24 * 3600
"""Recoveries shown: those of the last 24 hours."""
NEEDS_A_PERSON = frozenset({recording.Phase.STALLED.value, recording.Phase.FAILED.value})


@dataclass
class Leader:
    holder: str = ""
    renewed_seconds_ago: float | None = None
    held_seconds: float | None = None
    duration_seconds: int = 0
    transitions: int = 0

    @property
    def stale(self) -> bool:
        """No holder, or the holder has not renewed within the Lease's duration (a dead leader)."""
        return not self.holder or self.renewed_seconds_ago is None or self.renewed_seconds_ago > self.duration_seconds


@dataclass
class Cordon:
    node: str
    reason: str
    since: str


@dataclass
class Row:
    namespace: str
    name: str
    phase: str
    action: str
    target: str
    fault: str
    cause: str = ""
    detected: str = ""
    mttr_seconds: float | None = None
    message: str = ""


@dataclass
class OutOfBudget:
    key: str
    what: str
    restarts: int
    next_at: str
    """When the oldest restart leaves the window, in RFC 3339."""


@dataclass
class Report:
    lease: str
    leader: Leader
    breaker_latched: bool = False
    breaker_reason: str = ""
    gpu_nodes: int = 0
    max_cordoned_fraction: float = 0.0
    cordoned: list[Cordon] = field(default_factory=list)
    recoveries: list[Row] = field(default_factory=list)
    recoveries_available: bool = True
    out_of_budget: list[OutOfBudget] = field(default_factory=list)

    @property
    def breaker_open(self) -> bool:
        """Latched, or kcover's cordons at the fraction past which the policy refuses to cordon more
        (`recovery.max_cordoned_fraction`, the policy's own comparison)."""
        return self.breaker_latched or (self.gpu_nodes > 0
                                        and len(self.cordoned) / self.gpu_nodes >= self.max_cordoned_fraction)

    def problems(self) -> list[str]:
        """What needs a person, one line each; empty when nothing does."""
        out = []
        if self.leader.stale:
            out.append(f"no controller leads: Lease {self.lease} " + (
                f"last renewed by {self.leader.holder} {_ago(self.leader.renewed_seconds_ago)} ago"
                if self.leader.holder else "has no holder"))
        if self.breaker_latched:
            out.append(f"the breaker is latched open ({self.breaker_reason}); `kcover breaker reset` closes it")
        elif self.breaker_open:
            out.append(f"the breaker is open: kcover holds {len(self.cordoned)} of {self.gpu_nodes} GPU nodes "
                       f"cordoned (limit {self.max_cordoned_fraction:.0%}) and cordons no more")
        for row in self.recoveries:
            if row.phase in NEEDS_A_PERSON:
                out.append(f"recovery {row.namespace}/{row.name} is {row.phase}: {row.target} "
                           f"({row.cause or 'see its message'})")
        for w in self.out_of_budget:
            out.append(f"{w.what} is out of its restart budget ({w.restarts} restarts) until {w.next_at}")
        if not self.recoveries_available:
            out.append("the Recovery CRD (recoveries.kcover.io) is not installed: no record of what kcover did")
        return out

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["breaker_open"] = self.breaker_open
        doc["leader"]["stale"] = self.leader.stale
        doc["recoveries_by_phase"] = dict(Counter(r.phase for r in self.recoveries))
        doc["problems"] = self.problems()
        doc["needs_a_person"] = bool(doc["problems"])
        return doc


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60}m"


def _age(text: str | None, now: dt.datetime) -> float | None:
    if not text:
        return None
    try:
        return (now - clock_.parse_time(text)).total_seconds()
    except ValueError:
        return None


async def _optional(kube: kube_client.KubeClient, path: str, query: dict[str, str] | None = None) -> Any:
    try:
        return await kube.request("GET", path, query=query)
    except errors.NotFoundError:
        return None


async def gather(kube: kube_client.KubeClient, cfg: settings.Settings, *, now: dt.datetime) -> Report:
    """Read what `kcover status` shows; a handful of GETs and LISTs, nothing written."""
    rs = cfg.recovery
    lease = await _optional(kube, leasing.lease_path(cfg.lease.namespace, cfg.lease.name))
    leader = Leader()
    if lease is not None:
        record = leasing.Record.from_lease(lease)
        leader = Leader(holder=record.holder, renewed_seconds_ago=_age(record.renew_time, now),
                        held_seconds=_age(record.acquire_time, now), duration_seconds=record.duration_seconds,
                        transitions=record.transitions)
    report = Report(lease=f"{cfg.lease.namespace}/{cfg.lease.name}", leader=leader,
                    max_cordoned_fraction=rs.max_cordoned_fraction)
    book = await _ledger(kube, rs)
    if book is not None:
        report.breaker_latched = book.breaker().latched
        report.breaker_reason = book.breaker().reason
    rule = gpus.GpuRule.of(cfg.kube.gpu_resources, cfg.kube.gpu_dra_drivers)
    nodes = (await kube.request("GET", "/api/v1/nodes")).get("items") or []
    for raw in nodes:
        report.gpu_nodes += rule.is_gpu_node(proj.node(raw))  # capacity only: DRA-only nodes are not counted
        meta = raw.get("metadata") or {}
        marks = meta.get("annotations") or {}
        if marks.get(proj.CORDONED_BY) == "kcover":
            report.cordoned.append(Cordon(str(meta.get("name")), str(marks.get(proj.CORDON_REASON) or ""),
                                          str(marks.get(proj.CORDONED_AT) or "")))
    report.recoveries, report.recoveries_available = await _recoveries(kube, now)
    report.out_of_budget = _out_of_budget(book, rs, now) if book is not None else []
    return report


async def _ledger(kube: kube_client.KubeClient, rs: settings.RecoverySettings) -> ledger.Ledger | None:
    """The recovery ledger as the cluster holds it (read only), or None where its kind is not served."""
    book = ledger.Ledger(gateway.Http(kube), namespace=rs.ledger_namespace, name=rs.ledger_name,
                         retention_seconds=rs.memory_seconds)
    try:
        await book.load()
    except errors.LedgerUnavailable:
        return None
    return book


async def _recoveries(kube: kube_client.KubeClient, now: dt.datetime) -> tuple[list[Row], bool]:
    rows: list[Row] = []
    query: dict[str, str] = {"labelSelector": "app.kubernetes.io/managed-by=kcover", "limit": "500"}
    while True:
        page = await _optional(kube, f"/apis/{recording.API_VERSION}/{recording.PLURAL}", query)
        if page is None:
            return [], False
        for item in page.get("items") or []:
            meta, spec, status = item.get("metadata") or {}, item.get("spec") or {}, item.get("status") or {}
            age = _age(status.get("detectedAt") or meta.get("creationTimestamp"), now)
            if age is not None and age > WINDOW_SECONDS:
                continue
            target = spec.get("target") or {}
            where = f"{target.get('namespace')}/{target.get('name')}" if target.get("namespace") else target.get("name")
            rows.append(Row(str(meta.get("namespace")), str(meta.get("name")), str(status.get("phase") or ""),
                            str((spec.get("decision") or {}).get("action") or ""), f"{target.get('kind')} {where}",
                            str((spec.get("fault") or {}).get("reason") or ""), str(status.get("cause") or ""),
                            str(status.get("detectedAt") or ""), status.get("mttrSeconds"),
                            str(status.get("message") or "")))
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            break
        query = {**query, "continue": token}
    rows.sort(key=lambda r: r.detected)
    return rows, True


def _out_of_budget(book: ledger.Ledger, rs: settings.RecoverySettings, now: dt.datetime) -> list[OutOfBudget]:
    out = []
    horizon = now.timestamp() - rs.restart_window_seconds
    for key in book.entry_keys():
        unit = book.unit(key)
        if unit is None:
            continue
        recent = sorted(t for t in unit.restarts if t >= horizon)
        if len(recent) >= rs.max_restarts_per_window:
            frees = dt.datetime.fromtimestamp(recent[-rs.max_restarts_per_window] + rs.restart_window_seconds, dt.UTC)
            out.append(OutOfBudget(key, unit.note or key, len(recent), clock_.rfc3339(frees)))
    return out


def render(report: Report) -> str:
    """The report for a terminal."""
    ld = report.leader
    lines = []
    if ld.holder:
        state = "STALE" if ld.stale else "leading"
        lines.append(f"leader:     {ld.holder} ({state}; Lease {report.lease} renewed {_ago(ld.renewed_seconds_ago)} "
                     f"ago, held {_ago(ld.held_seconds)}, {ld.transitions} transitions)")
    else:
        lines.append(f"leader:     none (Lease {report.lease} " + ("has no holder)" if report.lease else "absent)"))
    if report.breaker_latched:
        breaker = f"LATCHED OPEN: {report.breaker_reason}"
    else:
        breaker = "OPEN" if report.breaker_open else "closed"
    lines.append(f"breaker:    {breaker} ({len(report.cordoned)} of {report.gpu_nodes} GPU nodes cordoned by "
                 f"kcover, limit {report.max_cordoned_fraction:.0%})")
    lines.append(f"cordoned by kcover ({len(report.cordoned)}):" if report.cordoned else "cordoned by kcover: none")
    for c in report.cordoned:
        lines.append(f"  {c.node}  since {c.since or '?'}  {c.reason}")
    by_phase: dict[str, list[Row]] = defaultdict(list)
    for row in report.recoveries:
        by_phase[row.phase].append(row)
    if not report.recoveries_available:
        lines.append("recoveries, last 24h: the Recovery CRD is not installed")
    else:
        counts = ", ".join(f"{phase} {len(rows)}" for phase, rows in sorted(by_phase.items()))
        lines.append(f"recoveries, last 24h ({len(report.recoveries)}): {counts or 'none'}")
    for phase, rows in sorted(by_phase.items()):
        lines.append(f"  {phase}:")
        for r in rows:
            extra = f" mttr {r.mttr_seconds:.1f}s" if r.mttr_seconds is not None else ""
            extra += f" cause {r.cause}" if r.cause else ""
            lines.append(f"    {r.detected or '?':20}  {r.action:15}  {r.target}  ({r.fault}){extra}")
    lines.append(f"out of budget ({len(report.out_of_budget)}):" if report.out_of_budget else "out of budget: none")
    for w in report.out_of_budget:
        lines.append(f"  {w.what}: {w.restarts} restarts in the window, next allowed {w.next_at}")
    problems = report.problems()
    lines.append("needs a person:" if problems else "needs a person: no")
    lines += [f"  - {p}" for p in problems]
    return "\n".join(lines)
