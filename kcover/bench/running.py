"""`kcover bench`: latency, scale, throughput and API cost in one run, reported against the targets.

    kcover bench                      # the simulated cluster, full sizes (several minutes)
    kcover bench --quick              # 1,000 nodes / 10,000 pods, fewer samples: under a minute
    kcover bench --report json
    kcover bench --kubeconfig PATH    # a real cluster: seeds through its API, cleans up after
    kcover bench --restarts 8,128,1024 [--kubeconfig PATH]   # only: one restart of a large job, per kind
    kcover bench --fleet 2000x60000 --kubeconfig PATH --operator  # only: kcover at fleet size (kwok nodes)
    kcover bench --ledger 100,1000,10000 [--kubeconfig PATH]  # only: ledger writes as the ledger grows

Owns the options, the order of the scenarios and the report. The roles' own figures come first, on a
cluster that is still empty (`footprint`: start-up to leading, idle RSS, CPU per fault), then latency,
scale and throughput. By default it starts the simulated API
server in a child process (`simproc`); with `--kubeconfig` it uses that cluster, seeds only the
latency objects (label `kcover.io/bench=true`, namespaces `kcover-bench-*`), measures the sync of
what the cluster already holds, skips throughput (it writes pod statuses), and deletes what it
created. Exit code 0 with a report, 1 if the bench itself failed (never because a target was missed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import structlog

from kcover import errors
from kcover.bench import fleet as fleet_
from kcover.bench import footprint, latency, ledgering, rawapi, reporting, restarts, scale, seeding, simproc
from kcover.kube import client as client_

log = structlog.get_logger()

FULL_SIZES = (scale.Size(1000, 10_000), scale.Size(5000, 50_000), scale.Size(5000, 150_000))
QUICK_SIZES = (scale.Size(1000, 10_000),)


@dataclass
class Options:
    kubeconfig: str = ""
    samples: int = 50
    xid_samples: int = 20
    starts: int = 5
    """`kcover controller` start-ups timed to leading (the last one is measured idle and over faults)."""
    cpu_faults: int = 20
    sizes: list[scale.Size] = field(default_factory=lambda: list(FULL_SIZES))
    throughput_rate: float = 1000.0
    throughput_seconds: float = 5.0
    seed_scale: bool = True
    raw: bool = False
    """Keep the raw samples (seconds) in the report, for plots."""
    restarts: list[int] = field(default_factory=list)
    """Pod counts of the restart scenario (`restarts`); set, it is the only scenario run."""
    fleet: fleet_.Options | None = None
    """The fleet scenario (`fleet`); set, it is the only scenario run."""
    ledger: list[int] = field(default_factory=list)
    """Ledger sizes of the ledger scenario (`ledgering`); set (without `fleet`), it is the only scenario run."""

    @classmethod
    def quick(cls, **overrides: Any) -> Options:
        base: dict[str, Any] = {"samples": 10, "xid_samples": 4, "sizes": list(QUICK_SIZES),
                                "throughput_seconds": 2.0, "starts": 3, "cpu_faults": 10}
        return cls(**{**base, **overrides})


def parse_sizes(text: str) -> list[scale.Size]:
    """`1000x10000,5000x150000` -> sizes (nodes x pods)."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        nodes, sep, pods = part.partition("x")
        if not sep:
            raise ValueError(f"size {part!r}: expected NODESxPODS")
        out.append(scale.Size(int(nodes), int(pods)))
    return out


@asynccontextmanager
async def _cluster(kubeconfig: str) -> AsyncIterator[str]:
    if kubeconfig:
        yield kubeconfig
        return
    async with simproc.running() as sim:
        yield sim.kubeconfig


def _load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


async def run_restarts(options: Options) -> dict[str, Any]:
    """Only the restart scenario (`restarts`): its report (JSON-able)."""
    environment: dict[str, Any] = {"cluster": "real (kubeconfig)" if options.kubeconfig else "simulated (child process)",
                                   "cpus": os.cpu_count(), "python": platform.python_version(),
                                   "load_average_at_start": _load()}
    started = time.perf_counter()
    async with _cluster(options.kubeconfig) as kubeconfig:
        kube = await client_.connect(kubeconfig)
        try:
            floors: dict[int, float] = {}
            rows = await restarts.measure(kube, options.restarts, run_id=uuid.uuid4().hex[:6], floors=floors)
        finally:
            await kube.close()
    environment["load_average_at_end"] = _load()
    environment["seconds"] = round(time.perf_counter() - started, 1)
    return {"restarts": restarts.section(rows, floors), "environment": environment}


async def run_alone(options: Options) -> dict[str, Any]:
    """Only the fleet or only the ledger scenario: its report (JSON-able)."""
    environment: dict[str, Any] = {"cluster": "real (kubeconfig)" if options.kubeconfig else "simulated (child process)"}
    async with _cluster(options.kubeconfig) as kubeconfig:
        if options.fleet is not None:
            report = await fleet_.run(kubeconfig, options.fleet)
            report["environment"] = {**environment, **report["environment"]}
            return report
        environment.update(cpus=os.cpu_count(), load_average_at_start=_load())
        section = await ledgering.run(kubeconfig, options.ledger, writes=100)
        environment["load_average_at_end"] = _load()
        return {"ledger": section, "environment": environment}


async def run(options: Options) -> dict[str, Any]:
    """Run every scenario and return the report (JSON-able)."""
    if options.restarts:
        return await run_restarts(options)
    if options.fleet is not None or options.ledger:
        return await run_alone(options)
    environment: dict[str, Any] = {"cluster": "real (kubeconfig)" if options.kubeconfig else "simulated (child process)",
                                   "cpus": os.cpu_count(), "python": platform.python_version(),
                                   "load_average_at_start": _load()}
    started = time.perf_counter()
    run_id = uuid.uuid4().hex[:6]
    async with _cluster(options.kubeconfig) as kubeconfig:
        try:
            roles = await footprint.measure(kubeconfig, starts=options.starts, faults=options.cpu_faults,
                                            run_id=run_id)
            lat = await latency.measure(kubeconfig, samples=options.samples, xid_samples=options.xid_samples,
                                        run_id=run_id)
            rows, throughput = await scale.measure(
                kubeconfig, options.sizes if (options.seed_scale or not options.kubeconfig) else options.sizes[:1],
                seed=options.seed_scale and not options.kubeconfig,
                throughput_rate=options.throughput_rate if not options.kubeconfig else 0.0,
                throughput_seconds=options.throughput_seconds)
        finally:
            if options.kubeconfig:
                async with await rawapi.open_api(kubeconfig) as api:
                    await seeding.cleanup(api, [latency.namespace_of(run_id), footprint.namespace_of(run_id)])
    environment["load_average_at_end"] = _load()
    environment["seconds"] = round(time.perf_counter() - started, 1)
    kinds = {kind: {"detect": s.detect, **dict(s.extra), "act": s.act} for kind, s in lat.kinds.items()}
    report: dict[str, Any] = {
        "footprint": reporting.footprint_section(roles.startup_to_leading,
                                                 controller_rss=roles.controller_idle_rss_bytes,
                                                 agent_rss=roles.agent_idle_rss_bytes,
                                                 cpu_per_fault=roles.cpu_seconds_per_fault, faults=roles.faults),
        "latency_ms": reporting.latency_section(kinds, lat.floor, lat.floor_write),
        "floor_ms": reporting.summary_ms(lat.floor),
        "write_ms": reporting.summary_ms(lat.floor_write),
        "scale": reporting.scale_rows(rows),
        "throughput": reporting.throughput_section(throughput),
        "api_requests_per_recovery": reporting.api_section(lat.api_requests),
        "environment": environment,
    }
    report["ratios"] = reporting.ratios(report)
    if options.raw:
        report["raw_seconds"] = {"latency": kinds, "floor": lat.floor,
                                 "throughput_lag": throughput.get("lag_seconds", [])}
    return report


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", default="", help="measure a real cluster (default: a simulated one in a child process)")
    p.add_argument("--quick", action="store_true", help="1,000 nodes / 10,000 pods and fewer samples: under a minute")
    p.add_argument("--report", choices=["markdown", "json"], default="markdown")
    p.add_argument("--samples", type=int, help="pod-error, DRA and floor samples (default 50, quick 10)")
    p.add_argument("--xid-samples", type=int, help="XID samples, one agent and node each (default 20, quick 4)")
    p.add_argument("--sizes", help="scale sizes as NODESxPODS,... (default 1000x10000,5000x50000,5000x150000)")
    p.add_argument("--rate", type=float, help="throughput: pod updates offered per second (default 1000)")
    p.add_argument("--seconds", type=float, help="throughput: seconds of updates (default 5, quick 2)")
    p.add_argument("--starts", type=int, help="controller start-ups timed to leading (default 5, quick 3)")
    p.add_argument("--cpu-faults", type=int, help="pod errors the CPU per fault is measured over (default 20, quick 10)")
    p.add_argument("--raw", action="store_true", help="include the raw samples in the JSON report")
    p.add_argument("--restarts", help="only one restart of a JobSet, a batch Job and a PyTorchJob of each of these "
                                      "pod counts (e.g. 8,128,1024): time to every pod taken away, requests made")
    p.add_argument("--fleet", help="only kcover at fleet size, NODESxPODS (e.g. 2000x60000): sync, re-list, latency "
                                   "under churn, a large restart, failover and ledger writes (docs/performance.md)")
    p.add_argument("--churn", type=float, default=50.0, help="fleet: background pod status writes per second (50)")
    p.add_argument("--restart-pods", type=int, default=2048, help="fleet: pods of the restarted jobs (2048; 0 none)")
    p.add_argument("--failover-units", type=int, default=10_000,
                   help="fleet: restart units in the failover's ledger (10000; 0 skips the failover)")
    p.add_argument("--operator", action="store_true",
                   help="fleet: the cluster runs the workloads' controllers and kwok manages nodes labelled type=kwok")
    p.add_argument("--controller-kubeconfig", default="", help="fleet: kcover's own credentials (default: --kubeconfig)")
    p.add_argument("--ledger", help="only (or, with --fleet, at) these ledger sizes, e.g. 100,1000,10000: a write's "
                                    "p50 and p99 and a new leader's load")


def options_from(args: argparse.Namespace) -> Options:
    overrides: dict[str, Any] = {"kubeconfig": args.kubeconfig or "", "raw": bool(args.raw)}
    for name, attr in (("samples", "samples"), ("xid_samples", "xid_samples"), ("throughput_rate", "rate"),
                       ("throughput_seconds", "seconds"), ("starts", "starts"), ("cpu_faults", "cpu_faults")):
        if getattr(args, attr, None) is not None:
            overrides[name] = getattr(args, attr)
    if args.sizes:
        overrides["sizes"] = parse_sizes(args.sizes)
    if getattr(args, "restarts", None):
        overrides["restarts"] = [int(x) for x in str(args.restarts).split(",") if x.strip()]
    ledger = [int(x) for x in str(getattr(args, "ledger", None) or "").split(",") if x.strip()]
    if ledger:
        overrides["ledger"] = ledger
    if getattr(args, "fleet", None):
        (size,) = parse_sizes(args.fleet)
        base = Options.quick() if args.quick else Options()
        fleet = fleet_.Options(
            nodes=size.nodes, pods=size.pods, churn_rate=args.churn, restart_pods=args.restart_pods,
            samples=args.samples if args.samples is not None else min(base.samples, 30),
            xid_samples=args.xid_samples if args.xid_samples is not None else min(base.xid_samples, 10),
            operator=bool(args.operator), failover=args.failover_units > 0, failover_units=args.failover_units,
            controller_kubeconfig=args.controller_kubeconfig or "")
        if ledger:
            fleet.ledger_sizes = tuple(ledger)
        overrides["fleet"] = fleet
    return Options.quick(**overrides) if args.quick else Options(**overrides)


def main(args: argparse.Namespace) -> int:
    """The `kcover bench` command: print the report; 1 if the bench failed."""
    try:
        options = options_from(args)
        report = asyncio.run(run(options))
    except (errors.KcoverError, ValueError, OSError) as exc:
        print(f"kcover bench: failed: {exc or type(exc).__name__ + ' (no message)'}", file=sys.stderr)
        return 1
    if args.report == "json":
        print(json.dumps(report, indent=2))
    elif "figures" in report:
        print(fleet_.markdown(report))
    elif "restarts" in report:
        print(restarts.markdown(report["restarts"]))
    elif "ledger" in report:
        print(ledgering.markdown(report["ledger"]))
    else:
        print(reporting.markdown(report))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m kcover.bench.running", description=__doc__.splitlines()[0])
    add_arguments(parser)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    sys.exit(main(parser.parse_args()))
