"""`kcover sim`: play a named scenario on the simulated cluster and report what happened.

Owns the command's arguments, running one scenario (`run_scenario`) under its timeout, the report
(a readable timeline with millisecond offsets plus a summary, or one JSON document with
`--report json`) and `--serve` (keep the cluster up for kubectl and `kcover sim inject`, whose
endpoint `control` installs, until Ctrl-C). Exit code 0 exactly when the scenario's expectations held. Scenarios live in `scenarios`, the cluster in `cluster`.

How it fails: a scenario step that times out is a failed check, not a crash; a scenario that cannot
run (a detector plugin it needs is not installed) is reported as not run, with the reason, and exits
`NOT_RUN` (3), never 0; errors starting the cluster propagate.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import datetime as dt
import json
import math
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

import structlog

from kcover import logs, settings
from kcover.aio import waiting
from kcover.detectors import registry
from kcover.sim import chaos as chaos_
from kcover.sim import cluster as cluster_
from kcover.sim import control, playing
from kcover.sim import scenarios as scenarios_
from kcover.sim.fleet import running as fleet_

log = structlog.get_logger()
NOT_RUN = 3
"""Exit code of a scenario that could not run (0 passed, 1 failed, 2 bad usage)."""


@dataclass
class Report:
    scenario: str
    passed: bool
    started: dt.datetime
    faults: list[playing.FaultRecord] = field(default_factory=list)
    checks: list[playing.Check] = field(default_factory=list)
    timeline: list[tuple[dt.datetime, str, str]] = field(default_factory=list)
    api_requests: dict[str, int] = field(default_factory=dict)
    skipped: str = ""
    size: cluster_.Size = field(default_factory=cluster_.Size)
    chaos: dict[str, Any] | None = None
    """`kcover sim chaos`: what was injected and how each fault ended (`chaos.Tally`)."""

    def ms(self, at: dt.datetime | None) -> float | None:
        return None if at is None else round((at - self.started).total_seconds() * 1000, 1)

    def latencies(self) -> dict[str, float | None]:
        detect = [(f.detected_at - f.injected_at).total_seconds() * 1000 for f in self.faults if f.detected_at]
        act = [(f.acted_at - f.injected_at).total_seconds() * 1000 for f in self.faults if f.acted_at]
        return {"detect_p50": percentile(detect, 50), "detect_p99": percentile(detect, 99),
                "act_p50": percentile(act, 50), "act_p99": percentile(act, 99)}

    def to_json(self) -> dict[str, Any]:
        """The `--report json` document; times are milliseconds from the scenario's start."""
        doc: dict[str, Any] = {
            "scenario": self.scenario, "passed": self.passed,
            "faults": [{"kind": f.kind, "target": f.target, "injected_at": self.ms(f.injected_at),
                        "detected_at": self.ms(f.detected_at), "acted_at": self.ms(f.acted_at),
                        "recovered_at": self.ms(f.recovered_at), "action": f.action or None} for f in self.faults],
            "latency_ms": self.latencies(),
            "api_requests": dict(sorted(self.api_requests.items())),
            "checks": [{"check": c.text, "ok": c.ok, **({"detail": c.detail} if c.detail else {})}
                       for c in self.checks],
            "cluster": {"nodes": self.size.nodes, "gpus_per_node": self.size.gpus_per_node, "jobs": self.size.jobs,
                        "seed": self.size.seed},
        }
        if self.skipped:
            doc["skipped"] = self.skipped
        if self.chaos is not None:
            doc["chaos"] = self.chaos
        return doc


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile, rounded to 0.1 ms; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return round(ordered[rank - 1], 1)


# ---------------------------------------------------------------------------------------------- running

def timeline(run: playing.Run) -> list[tuple[dt.datetime, str, str]]:
    """Scenario notes, first detections (per detector, reason and target) and every API Event since the start."""
    entries = list(run.notes)
    seen: set[tuple[str, str, str]] = set()
    for d in run.cluster.detections:
        ev = d.event
        key = (ev.detector, ev.reason, ev.target.describe())
        if ev.observed_at < run.started or key in seen:
            continue
        seen.add(key)
        extra = f" [class {ev.attributes['class']}]" if "class" in ev.attributes else ""
        entries.append((ev.observed_at, "detect", f"{ev.detector} {ev.reason} ({ev.severity.value}) on "
                        f"{ev.target.describe()}{extra}, seen by the {d.where}"))
    for e in run.cluster.api_events:
        if e.at < run.started:
            continue
        tag = "act" if e.reason.startswith("Kcover") else "event"
        about = f"{e.kind} {e.namespace + '/' if e.namespace else ''}{e.name}"
        who = e.instance or e.reporter
        entries.append((e.at, tag, f"Event {e.reason} on {about} by {who}: {playing.clip(e.message, 140)}"))
    return sorted(entries, key=lambda item: item[0])


async def run_scenario(scenario: playing.Scenario, size: cluster_.Size | None = None, *,
                       serve: bool = False, kubeconfig_out: str = "", out: TextIO | None = None,
                       report_format: str = "text") -> Report:
    """Start a cluster, play `scenario`, check its expectations, stop the cluster.

    With `serve`, the report is printed to `out` and the cluster kept running until SIGINT or SIGTERM (or
    until cancelled)."""
    size = size or cluster_.Size()
    if scenario.nodes > size.nodes:
        size = dataclasses.replace(size, nodes=scenario.nodes)
    if scenario.plugin and scenario.plugin not in registry.discover().names():
        return Report(scenario.name, False, dt.datetime.now(dt.UTC),
                      skipped=f"detector plugin {scenario.plugin!r} is not installed "
                              f"(pip install -e plugins/kcover-{scenario.plugin}); the scenario cannot run", size=size)
    made = cluster_.SimCluster(size, overrides=scenario.overrides, agent_overrides=scenario.agent_overrides)
    control.install(made)  # `kcover sim inject` against the served cluster
    async with made as cluster:
        if kubeconfig_out:
            cluster.srv.write_kubeconfig(kubeconfig_out)
        run = playing.Run(cluster)
        before = dict(cluster.srv.request_counts)
        try:
            async with asyncio.timeout(scenario.timeout):
                await scenario.play(run)
        except cluster_.WaitTimeout as exc:
            run.check(str(exc), False)
        except TimeoutError:
            run.check(f"scenario finished within {scenario.timeout:g}s", False)
        requests = {k: v - before.get(k, 0) for k, v in cluster.srv.request_counts.items() if v - before.get(k, 0)}
        report = Report(scenario.name, bool(run.checks) and all(c.ok for c in run.checks), run.started,
                        run.faults, run.checks, timeline(run), requests, size=size, chaos=run.results.get("chaos"))
        if serve:
            # the handlers are set before it says it serves: a signal sent on that line is heard
            with waiting.process_stop_signals() as stopped:
                if out is not None:
                    print(json.dumps(report.to_json(), indent=2) if report_format == "json" else render(report),
                          file=out, flush=True)
                    print(f"\nserving the simulated cluster at {cluster.srv.url}"
                          + (f" (kubeconfig: {kubeconfig_out})" if kubeconfig_out else "") + "; Ctrl-C stops it",
                          file=sys.stderr, flush=True)
                await stopped.wait()  # SIGINT or SIGTERM; then the cluster's teardown runs
    return report


def render(report: Report) -> str:
    known = scenarios_.catalogue().get(report.scenario)
    summary = CHAOS_SUMMARY if report.scenario == CHAOS else known.summary if known else ""
    lines = [f"scenario {report.scenario}: {summary}",
             f"cluster: {report.size.nodes} nodes x {report.size.gpus_per_node} GPUs, {report.size.jobs} PyTorchJobs, "
             "2 controller replicas, 1 agent per node", ""]
    if report.skipped:
        return "\n".join([*lines, f"NOT RUN: {report.skipped}", "result: NOT RUN"])
    for at, tag, text in report.timeline:
        lines.append(f"  +{report.ms(at) or 0.0:9.1f} ms  {tag:<8} {text}")
    lines.append("")
    for c in report.checks:
        lines.append(f"  [{'ok' if c.ok else 'FAILED'}] {c.text}" + (f" ({c.detail})" if c.detail and not c.ok else ""))
    lat = report.latencies()

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} ms"

    lines.append("")
    lines.append(f"latency: detect p50 {fmt(lat['detect_p50'])}, p99 {fmt(lat['detect_p99'])}; "
                 f"act p50 {fmt(lat['act_p50'])}, p99 {fmt(lat['act_p99'])}")
    writes = {k: v for k, v in report.api_requests.items() if not k.startswith(("GET", "LIST", "WATCH"))}
    lines.append(f"API requests: {sum(report.api_requests.values())} in all; writes: "
                 + (", ".join(f"{k} x{v}" for k, v in sorted(writes.items())) or "none"))
    if report.chaos is not None:
        t = report.chaos
        lines.append(f"chaos: {t['injected']} faults injected ({t['workload_faults']} workload, {t['node_faults']} node); "
                     f"recovered {t['recovered']}, refused {t['refused']}, lost {t['lost']}, duplicates "
                     f"{t['duplicates']}, wrongly touched pods {t['wrongly_touched_pods']}")
        lines.append(f"chaos: {t['restarts']} restarts seen; {t['leader_kills']} leader kills, {t['apiserver_restarts']} "
                     f"API server restarts, {t['watch_drops']} watch drops, {t['compactions']} compactions, "
                     f"{t['api_retries']} API retries")
    lines.append(f"result: {'PASSED' if report.passed else 'FAILED'}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- command

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", nargs="?", default=scenarios_.DEFAULT,
                   help=f"scenario to play (default {scenarios_.DEFAULT}; see --list); `kcover sim inject KIND ...` "
                        "instead injects a fault into a cluster served with --serve (see `kcover sim inject --help`)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--nodes", type=int, default=None, help=f"GPU nodes (default 4; {fleet_.FLEET_NODES} for `{FLEET}`)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--jobs", type=int, default=2, help="opted-in PyTorchJobs (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated cluster's randomness")
    p.add_argument("--report", choices=["text", "json"], default="text",
                   help="text: timeline and summary; json: one JSON document")
    p.add_argument("--serve", action="store_true", help="keep the cluster running after the scenario (Ctrl-C ends); "
                   "use it with kubectl and `kcover sim inject`")
    p.add_argument("--kubeconfig-out", metavar="PATH", default="", help="write a kubeconfig for kubectl here")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="error",
                   help="kcover's own logs, on stderr (default error)")
    c = p.add_argument_group("chaos (scenario `chaos`)")
    c.add_argument("--faults", type=int, default=200, help="faults to inject (default 200)")
    c.add_argument("--throttle-rate", type=float, default=0.05, help="share of API requests answered 429 (default 0.05)")
    c.add_argument("--error-rate", type=float, default=0.02, help="share of API requests answered 500 (default 0.02)")
    c.add_argument("--latency-ms", type=float, default=200.0, help="latency added to every API request (default 200)")
    c.add_argument("--kill-every", type=int, default=20, help="kill the leader with every N faults (default 20; 0 never)")
    c.add_argument("--apiserver-restart-every", type=int, default=50,
                   help="restart the API server with every N faults (default 50; 0 never)")
    fleet_.add_arguments(p)


def _usage_problems(args: argparse.Namespace) -> list[str]:
    problems = []
    known = scenarios_.catalogue()
    if args.scenario not in known and args.scenario not in (CHAOS, FLEET):
        problems.append(f"unknown scenario {args.scenario!r}; known: {', '.join([*known, CHAOS, FLEET])}")
    if args.nodes is not None and args.nodes < 2:
        problems.append("--nodes must be at least 2 (a cordoned node's pods need somewhere to go)")
    if args.gpus_per_node < 1 or args.jobs < 1:
        problems.append("--gpus-per-node and --jobs must be at least 1")
    return problems


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout  # looked up now: a caller may have replaced it since import
    if args.list:
        known = scenarios_.catalogue()
        width = max(len(n) for n in known)
        for name, scenario in known.items():
            default = " (default)" if name == scenarios_.DEFAULT else ""
            print(f"{name.ljust(width)}  {scenario.summary}{default}", file=out)
        print(f"{CHAOS.ljust(width)}  {CHAOS_SUMMARY}", file=out)
        print(f"{FLEET.ljust(width)}  {FLEET_SUMMARY}", file=out)
        return 0
    if args.scenario == FLEET:
        logs.configure(settings.LoggingSettings(level=args.log_level))
        return fleet_.main(args, out)
    problems = _usage_problems(args)
    if problems:
        for line in problems:
            print(f"kcover sim: {line}", file=sys.stderr)
        return 2
    logs.configure(settings.LoggingSettings(level=args.log_level))
    size = cluster_.Size(nodes=args.nodes or 4, gpus_per_node=args.gpus_per_node, jobs=args.jobs, seed=args.seed)
    scenario = chaos_scenario(args) if args.scenario == CHAOS else scenarios_.catalogue()[args.scenario]
    try:
        report = asyncio.run(_main(scenario, size, args, out))
    except KeyboardInterrupt:
        return 0 if args.serve else 130  # --serve printed its report before serving
    if args.serve and not report.skipped:
        return 0  # stopped by SIGINT or SIGTERM; its report was printed before serving
    if args.report == "json":
        print(json.dumps(report.to_json(), indent=2), file=out)
    else:
        print(render(report), file=out)
    if report.skipped:
        print(f"kcover sim: scenario {report.scenario} did not run: {report.skipped}", file=sys.stderr)
        return NOT_RUN
    return 0 if report.passed else 1


async def _main(scenario: playing.Scenario, size: cluster_.Size, args: argparse.Namespace,
                out: TextIO) -> Report:
    # every agent's NVML detector parks one worker thread in its event wait
    workers = 2 * size.nodes + 16
    asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(workers))
    return await run_scenario(scenario, size, serve=args.serve, kubeconfig_out=args.kubeconfig_out,
                              out=out if args.serve else None, report_format=args.report)


CHAOS = "chaos"
FLEET = "fleet"
FLEET_SUMMARY = ("weeks of a fleet's faults (default 2,048 nodes, the Llama 3 405B fault mix) replayed through kcover, "
                 "Kubernetes alone, the Go controller's policy and an oracle: training time, cordons, attribution")
CHAOS_SUMMARY = ("random workload and node faults while the API server throttles, fails, lags, drops watches, "
                 "compacts and restarts, and the leader is killed: counts what was lost")


def chaos_options(args: argparse.Namespace) -> chaos_.Options:
    return chaos_.Options(faults=args.faults, throttle_rate=args.throttle_rate, error_rate=args.error_rate,
                          latency_seconds=args.latency_ms / 1000, kill_every=args.kill_every,
                          apiserver_restart_every=args.apiserver_restart_every)


def chaos_scenario(args: argparse.Namespace) -> playing.Scenario:
    """The `chaos` scenario with the command line's options (not in the catalogue: it takes arguments)."""
    options = chaos_options(args)

    async def play(run: playing.Run) -> None:
        tally = await chaos_.play(run, options, args.seed)
        run.results["chaos"] = tally.as_dict()

    # a fault waits for a job at rest (its last restart older than the 10 s cooldown): with the default two
    # jobs that is about 6 s a fault on a quiet machine and more on a loaded one (a K=200 run on a loaded
    # machine injected 198 faults in 1,320 s), so the budget is twice the quiet figure
    return playing.Scenario(CHAOS, CHAOS_SUMMARY, play, overrides=chaos_.OVERRIDES,
                               timeout=180.0 + options.faults * 12.0)
