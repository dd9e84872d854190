"""Benchmark (not a test): the ledger's size and write cost at 100, 1,000 and 10,000 workloads.

Every workload has restarts inside its window (three, with a note and the signal each answered), as a
busy cluster's ledger holds after an hour. The probe seeds that state, then times what recovery pays:
a restart's ledger write (`Ledger.update`, the fencing write with its resourceVersion precondition,
over HTTP) and a new leader's `load()`. It prints, per scale: the objects the ledger uses, the largest
object's size (the API server refuses a ConfigMap past 1 MiB), the workloads a reload still knows
(entries the ledger had to drop to stay under its limit are budgets and cooldowns forgotten), and the
write and load latencies (p50/p95 over `--writes` restarts of random workloads).

    python tests/recovery/probe_ledger_scale.py                    # the simulated API server
    python tests/recovery/probe_ledger_scale.py --apiserver        # etcd + kube-apiserver (KCOVER_CONTROLPLANE_BIN)
    python tests/recovery/probe_ledger_scale.py --layout single    # the one-ConfigMap layout, for comparison
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import structlog

from kcover import errors
from kcover.kube import client as client_
from kcover.recovery import ledger
from kcover.sim import server as simserver

NS = "kcover-system"
NAME = "kcover-ledger"
RESTARTS = 3
RETENTION = 3600.0
CONTROLPLANE = str(Path(__file__).resolve().parents[1] / "controlplane")


def _state(n: int, now: float) -> ledger.State:
    state = ledger.State()
    for i in range(n):
        key = f"w.{i:08d}-7f3c-4b1e-9a2d-{i:012d}"
        state.restarts[key] = [now - 3000 + 900 * r + i % 60 for r in range(RESTARTS)]
        state.notes[key] = f"PyTorchJob team-{i % 50}/pretrain-{i}"
        state.remember(f"ev-{i:08d}-4b1e-9a2d:1", key, now - 100)
    return state


@contextlib.asynccontextmanager
async def _backend(apiserver: bool) -> AsyncIterator[client_.KubeClient]:
    if not apiserver:
        async with simserver.SimServer() as srv, client_.from_configuration(srv.kube_configuration()) as kube:
            yield kube
        return
    sys.path.insert(0, CONTROLPLANE)
    import server as controlplane  # tests/controlplane/server.py

    with controlplane.ControlPlane() as cp:  # with the test CRDs: LedgerEntry among them
        async with await client_.connect(cp.kubeconfig_path) as kube:
            await kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
            yield kube


def _layout_kwargs(layout: str) -> dict[str, Any]:
    """How the probe asks for a layout: the ledger grew the option with the per-unit layout."""
    return {} if layout == "single" else {"layout": layout}


async def _seed(kube: client_.KubeClient, layout: str, state: ledger.State, now: float) -> None:
    writer = ledger.Ledger(kube, namespace=NS, name=NAME, is_leader=lambda: True, retention_seconds=lambda: RETENTION,
                           **_layout_kwargs(layout))
    if layout != "single":  # what many restarts over an hour wrote, one object per unit, in parallel
        from kcover.recovery import sharding

        store = sharding.PerUnitStore(kube, namespace=NS, name=NAME)
        gate = asyncio.Semaphore(32)

        async def create(name: str, content: dict[str, str]) -> None:
            async with gate:
                await kube.request("POST", store.base, body=store._body(name, content, None))
        await asyncio.gather(*(create(n, c) for n, c in sharding.split(NAME, state.encode()).items()))
        return

    def put_all(target: ledger.State) -> None:
        target.restarts.update(state.restarts)
        target.notes.update(state.notes)
        target.signals.update(state.signals)
    await writer.update(put_all, now=now)


async def _objects(kube: client_.KubeClient) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    query: dict[str, str | int] = {"limit": 500}
    while True:
        page = await kube.request("GET", f"/api/v1/namespaces/{NS}/configmaps", query=query)
        items += page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return [i for i in items if str(i["metadata"]["name"]).startswith(NAME)]
        query = {"limit": 500, "continue": token}


async def _entries(kube: client_.KubeClient) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    query: dict[str, str | int] = {"limit": 500}
    while True:
        try:
            page = await kube.request("GET", f"/apis/kcover.io/v1alpha1/namespaces/{NS}/ledgerentries", query=query)
        except errors.NotFoundError:
            return []
        items += page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items
        query = {"limit": 500, "continue": token}


def _size(obj: dict[str, Any]) -> int:
    return sum(len(k.encode()) + len(v.encode()) for k, v in (obj.get("data") or {}).items())


def _pct(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered)) - 1))]


async def probe(n: int, *, layout: str, writes: int, apiserver: bool) -> dict[str, Any]:
    now = time.time()
    state = _state(n, now)
    keys = sorted(state.restarts)
    async with _backend(apiserver) as kube:
        await _seed(kube, layout, state, now)
        objs = await _objects(kube) + await _entries(kube)
        largest = max((_size(o) for o in objs), default=0)
        leader = ledger.Ledger(kube, namespace=NS, name=NAME, is_leader=lambda: True,
                               retention_seconds=lambda: RETENTION, **_layout_kwargs(layout))
        loads = []
        for _ in range(3):
            t0 = time.perf_counter()
            await leader.load()
            loads.append(time.perf_counter() - t0)
        known = len(leader.history().restarts)
        rng = random.Random(n)
        latencies = []
        for w in range(writes):
            key = rng.choice(keys)
            at = time.time()

            def restart(s: ledger.State, key: str = key, at: float = at, w: int = w) -> None:
                s.restarts.setdefault(key, []).append(at)
                s.remember(f"probe-{w}", key, at)
            t0 = time.perf_counter()
            await leader.update(restart, now=at)
            latencies.append(time.perf_counter() - t0)
        after = [o for o in await _objects(kube) + await _entries(kube) if o.get("data")]
    return {"workloads": n, "objects": len(after), "largest_bytes": max((_size(o) for o in after), default=largest),
            "known_after_reload": known, "write_p50_ms": statistics.median(latencies) * 1000,
            "write_p95_ms": _pct(latencies, 95) * 1000, "load_ms": statistics.median(loads) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", default="100,1000,10000")
    parser.add_argument("--writes", type=int, default=50)
    parser.add_argument("--layout", default="per-unit", choices=["single", "per-unit"])
    parser.add_argument("--apiserver", action="store_true")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    print(f"layout {args.layout} on {'kube-apiserver' if args.apiserver else 'the simulated API server'}")
    print(f"{'workloads':>9}  {'objects':>7}  {'largest object':>14}  {'known after reload':>18}  "
          f"{'write p50':>9}  {'write p95':>9}  {'load':>9}")
    for n in (int(s) for s in args.scales.split(",")):
        r = asyncio.run(probe(n, layout=args.layout, writes=args.writes, apiserver=args.apiserver))
        print(f"{r['workloads']:>9}  {r['objects']:>7}  {r['largest_bytes'] / 1024:>11.1f} KiB  "
              f"{r['known_after_reload']:>18}  {r['write_p50_ms']:>7.1f}ms  {r['write_p95_ms']:>7.1f}ms  "
              f"{r['load_ms']:>7.1f}ms", flush=True)


if __name__ == "__main__":
    main()
