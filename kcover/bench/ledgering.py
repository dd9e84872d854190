"""`kcover bench --ledger 100,1000,10000`: what one ledger write costs as the ledger grows, and a new leader's load.

Owns one scenario against any API server that serves LedgerEntries: a ledger of its own (name
`kcover-bench-ledger-<run>`, in a namespace `kcover-bench-ledger-<run>`) grown to each size (objects created
in the ledger's own encoding, `ledgerentries.entry_body`, through the HTTP gateway), every unit holding what a busy hour leaves
(three restarts inside the budget window, where each fault was, a note and the signal each answered).
At each size it times a restart's ledger write (`Ledger.update`: the budget check, the entry recorded
with its intent, one fenced write with the resourceVersion as precondition) through the product's
`recovery.ledger.Ledger` on random units, and a fresh `Ledger.load()` (one paginated list: what a new leader pays once per term). The target: a write's
p50 at 10,000 units at most twice its p50 at 100.

It decides nothing and asserts nothing; API errors propagate. The namespace is deleted afterwards (what
it holds first, so a server without kube-controller-manager is left clean too).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import structlog

from kcover import errors
from kcover.bench import reporting
from kcover.kube import client as client_
from kcover.kube import gateway
from kcover.recovery import ledger, ledgerentries

log = structlog.get_logger()

RESTARTS = 3
RETENTION_SECONDS = 3600.0
SEED_CONCURRENCY = 32
TARGET_RATIO = 2.0
"""A write's p50 at the largest size over its p50 at the smallest: at most 2 (constant cost)."""


@dataclass
class Row:
    units: int
    seed_seconds: float
    write_seconds: list[float] = field(default_factory=list)
    load_seconds: float = 0.0
    loaded: int = 0
    """Units a fresh ledger knew after its load (every one seeded)."""


def _key(i: int) -> str:
    return f"w.{i:08d}-7f3c-4b1e-9a2d-{i:012d}"


def _seeded(i: int, now: float) -> tuple[ledgerentries.Unit, dict[str, float]]:
    """Unit `i` as a busy hour leaves it: three restarts in the window, where each fault was, a note, a signal."""
    entry = ledgerentries.Unit(note=f"PyTorchJob team-{i % 50}/pretrain-{i}")
    for r in range(RESTARTS):
        entry.record(now - 3000 + 900 * r + i % 60, f"gpu-{i % 2000:05d}/gpu-{r}")
    return entry, {f"ev-{i:08d}:1|{_key(i)}": now - 100}


def _restart(key: str, at: float, w: int) -> Any:
    def mutate(entry: ledgerentries.Entry, signals: dict[str, float]) -> None:
        assert isinstance(entry, ledgerentries.Unit)
        entry.trim(at - RETENTION_SECONDS)
        entry.record(at, "gpu-00001/gpu-0")
        entry.note = "bench restart"
        entry.intent = ledgerentries.Intent(id=uuid.uuid4().hex[:12], fault=f"bench-{w}", leader="kcover-bench", epoch=1,
                                            at=at, workload=("PyTorchJob", "kubeflow.org/v1", "team-0", "pretrain", key[2:]),
                                            selector="training.kubeflow.org/job-name=pretrain", uids=("a", "b", "c", "d"),
                                            complete=True, message="bench")
        signals[f"bench-{w}|{key}"] = at
        return None
    return mutate


async def grow(gw: gateway.Http, ns: str, name: str, have: int, units: int) -> None:
    """Create units `have`..`units` as LedgerEntry objects (the ledger's own encoding), many at once."""
    now = time.time()
    gate = asyncio.Semaphore(SEED_CONCURRENCY)

    async def one(i: int) -> None:
        entry, signals = _seeded(i, now)
        async with gate:
            await gw.create_ledger_entry(ledgerentries.entry_body(name, ns, _key(i), entry, signals))

    async with asyncio.TaskGroup() as tg:
        for i in range(have, units):
            tg.create_task(one(i), name=f"bench:ledger-seed-{i}")


async def measure(kube: client_.KubeClient, sizes: list[int], *, writes: int = 100, run_id: str = "") -> list[Row]:
    """Grow one ledger to each of `sizes` (ascending) and time `writes` restart writes and a load at each."""
    run_id = run_id or uuid.uuid4().hex[:6]
    ns = f"kcover-bench-ledger-{run_id}"
    name = f"kcover-bench-ledger-{run_id}"
    await kube.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                           "metadata": {"name": ns, "labels": {"kcover.io/bench": "true"}}})
    gw = gateway.Http(kube)
    rows: list[Row] = []
    try:
        have = 0
        rng = random.Random(1)
        for units in sorted(sizes):
            t0 = time.perf_counter()
            await grow(gw, ns, name, have, units)
            have = units
            row = Row(units, time.perf_counter() - t0)
            fresh = ledger.Ledger(gw, namespace=ns, name=name, retention_seconds=lambda: RETENTION_SECONDS)
            t0 = time.perf_counter()
            await fresh.load()
            row.load_seconds = time.perf_counter() - t0
            row.loaded = len([k for k in fresh.entry_keys() if k.startswith("w.")])
            for w in range(writes):
                key = _key(rng.randrange(units))
                at = time.time()
                t0 = time.perf_counter()
                await fresh.update(key, _restart(key, at, w), now=at)
                row.write_seconds.append(time.perf_counter() - t0)
                fresh.complete(key, fresh.unit(key).intent.id)  # type: ignore[union-attr]
            log.info("bench_ledger", units=units, write_p50_ms=round(reporting.percentile(row.write_seconds, 0.5) * 1000, 2),
                     load_seconds=round(row.load_seconds, 3))
            rows.append(row)
    finally:
        await _cleanup(kube, ns)
    return rows


async def _cleanup(kube: client_.KubeClient, ns: str) -> None:
    """Delete the ledger's objects (one collection delete: 10,000 take a while), then the namespace."""
    for path in (f"/apis/{gateway.LEDGER_GROUP_VERSION}/namespaces/{ns}/ledgerentries", f"/api/v1/namespaces/{ns}"):
        try:
            await kube.request("DELETE", path, timeout=600)
        except errors.NotFoundError:
            pass
        except errors.KubeError as exc:
            log.warning("bench_ledger_cleanup_failed", path=path, error=str(exc)[:200])


def section(rows: list[Row]) -> dict[str, Any]:
    """The report's `ledger` section: per size the write summary and the load; the p50 ratio to the smallest."""
    out: dict[str, Any] = {"rows": [{"units": r.units, "seed_seconds": round(r.seed_seconds, 2),
                                     "write_ms": reporting.summary_ms(r.write_seconds),
                                     "load_seconds": round(r.load_seconds, 3), "loaded": r.loaded} for r in rows]}
    if len(rows) >= 2 and rows[0].write_seconds and rows[-1].write_seconds:
        small = reporting.percentile(rows[0].write_seconds, 0.5)
        large = reporting.percentile(rows[-1].write_seconds, 0.5)
        out["p50_growth"] = {"from_units": rows[0].units, "to_units": rows[-1].units,
                             "ratio": reporting.ratio(large, small), "target": TARGET_RATIO,
                             "ratio_to_target": reporting.ratio(large / small, TARGET_RATIO) if small else 0.0}
    return out


def markdown(sec: dict[str, Any]) -> str:
    lines = ["## Ledger writes as the ledger grows", "",
             "| units | write p50 (ms) | write p99 (ms) | n | a new leader's load (s) | units loaded |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in sec["rows"]:
        w = r["write_ms"]
        lines.append(f"| {r['units']} | {w.get('p50', '')} | {w.get('p99', '')} | {w.get('n', 0)} | "
                     f"{r['load_seconds']} | {r['loaded']} |")
    growth = sec.get("p50_growth")
    if growth:
        lines.append(f"\nwrite p50 at {growth['to_units']} units / at {growth['from_units']}: {growth['ratio']} "
                     f"(target at most {growth['target']:g}; ratio to target {growth['ratio_to_target']})")
    return "\n".join(lines)


async def run(kubeconfig: str, sizes: list[int], *, writes: int) -> dict[str, Any]:
    async with await client_.connect(kubeconfig) as kube:
        rows = await measure(kube, sizes, writes=writes)
    return section(rows)

