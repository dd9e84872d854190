"""`kcover sim fleet`: replay weeks of a fleet's faults through kcover, Kubernetes alone, the Go policy and an oracle.

Owns the command's arguments (added to `kcover sim`'s parser as the "fleet" group), building the
parameters and the trace (generated from the taxonomy, or `--trace FILE`), running one `world.World`
per policy on a `virtualtime` loop, and printing the report (`report`: text, or `--report json`) and
`--plot FILE` (`plotting`). Every policy replays the same trace; kcover runs last, as it takes longest.
Exit code 0 with a report; 2 for bad arguments, a bad taxonomy or a bad trace (the problems on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import resource
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

import yaml

from kcover import errors, layering
from kcover.sim.fleet import baselines, kcoverpolicy, plotting, report, virtualtime
from kcover.sim.fleet import policy as pol
from kcover.sim.fleet import state as st
from kcover.sim.fleet import taxonomy as tax
from kcover.sim.fleet import trace as trace_
from kcover.sim.fleet import world as world_

DEFAULTS = st.Params()
FLEET_NODES = DEFAULTS.nodes


def add_arguments(p: argparse.ArgumentParser) -> None:
    f = p.add_argument_group("fleet (scenario `fleet`; --nodes defaults to 2048 there)")
    f.add_argument("--days", type=float, default=DEFAULTS.days, help=f"days replayed (default {DEFAULTS.days:g})")
    f.add_argument("--job-mix", default=",".join(f"{c}x{s}" for c, s in DEFAULTS.jobs), metavar="COUNTxNODES,...",
                   help="jobs by count and nodes each, one pod of all the node's GPUs per node (default "
                        f"{','.join(f'{c}x{s}' for c, s in DEFAULTS.jobs)}: the rest of the nodes are spare)")
    f.add_argument("--checkpoint-minutes", type=float, default=DEFAULTS.checkpoint_minutes,
                   help=f"a job checkpoints this often; a stop loses the work since (default {DEFAULTS.checkpoint_minutes:g})")
    f.add_argument("--restart-minutes", type=float, default=DEFAULTS.restart_minutes,
                   help="from a job's pods (re)starting to training again: scheduling, containers, NCCL, loading "
                        f"the checkpoint (default {DEFAULTS.restart_minutes:g})")
    f.add_argument("--nccl-timeout-minutes", type=float, default=DEFAULTS.nccl_timeout_minutes,
                   help=f"ranks waiting on a dead peer abort after this (default {DEFAULTS.nccl_timeout_minutes:g}, PyTorch's)")
    f.add_argument("--repair-hours", type=float, default=DEFAULTS.repair_hours,
                   help=f"a cordoned, empty node is back (repaired or found healthy) after this (default {DEFAULTS.repair_hours:g})")
    f.add_argument("--person-hours", type=float, default=DEFAULTS.person_hours,
                   help=f"a person finds a bad part left in service after this (default {DEFAULTS.person_hours:g})")
    f.add_argument("--taxonomy", default="", metavar="FILE", help="fault classes and rates (default: the shipped "
                   "Llama 3 405B Table 5 taxonomy, kcover/data/fleet-taxonomy.yaml)")
    f.add_argument("--trace", default="", metavar="FILE", help="replay these onsets (JSON lines; docs/performance.md) "
                   "instead of generating them")
    f.add_argument("--write-trace", default="", metavar="FILE", help="write the onsets replayed to FILE (JSON lines)")
    f.add_argument("--fault-rate-scale", type=float, default=1.0, help="multiply every class's rate (default 1)")
    f.add_argument("--policies", default=",".join(report.POLICIES), help="which to replay (default all: "
                   f"{','.join(report.POLICIES)})")
    f.add_argument("--plot", default="", metavar="FILE.png", help="draw cordoned nodes and the largest job's progress")
    f.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="fleet_set",
                   help="a kcover setting for the replay, e.g. --set recovery.workload_cooldown_seconds=120")


def job_mix(text: str) -> tuple[tuple[int, int], ...]:
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        count, _, size = part.partition("x")
        if not (count.isdigit() and size.isdigit() and int(count) > 0 and int(size) > 0):
            raise ValueError(f"--job-mix: {part!r} is not COUNTxNODES")
        out.append((int(count), int(size)))
    if not out:
        raise ValueError("--job-mix names no job")
    return tuple(out)


def overrides(pairs: list[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ValueError(f"--set {pair!r}: expected KEY=VALUE")
        values[key.strip()] = yaml.safe_load(raw)
    return layering.dotted_layer(values)


def params_of(args: argparse.Namespace) -> st.Params:
    return st.Params(nodes=args.nodes or FLEET_NODES, gpus_per_node=args.gpus_per_node, jobs=job_mix(args.job_mix),
                     days=args.days, checkpoint_minutes=args.checkpoint_minutes, restart_minutes=args.restart_minutes,
                     nccl_timeout_minutes=args.nccl_timeout_minutes, repair_hours=args.repair_hours,
                     person_hours=args.person_hours, seed=args.seed)


def problems(args: argparse.Namespace) -> list[str]:
    out = []
    try:
        params = params_of(args)
    except ValueError as exc:
        return [str(exc)]
    if params.job_nodes > params.nodes:
        out.append(f"--job-mix needs {params.job_nodes} nodes; the fleet has {params.nodes} (--nodes)")
    if params.days <= 0 or params.checkpoint_minutes <= 0 or params.restart_minutes < 0:
        out.append("--days and --checkpoint-minutes must be positive, --restart-minutes not negative")
    unknown = set(args.policies.split(",")) - set(report.POLICIES)
    if unknown:
        out.append(f"--policies: unknown {', '.join(sorted(unknown))}; known: {', '.join(report.POLICIES)}")
    return out


def policy_of(name: str, params: st.Params, kcover_overrides: Mapping[str, Any]) -> pol.Policy:
    if name == "kcover":
        return kcoverpolicy.KcoverPolicy(params, overrides=kcover_overrides)
    return {"kubernetes": baselines.KubernetesAlone, "go": baselines.GoController, "oracle": baselines.Oracle}[name]()


GC_THRESHOLD = 50_000
"""Python's generation-0 collection threshold while a policy replays (its default is 700). A replay
allocates in bursts that live a moment (a 1,024-pod job's restart: its pods' writes, watch events and
projections), and at the default the cyclic GC ran about 900 times a simulated week, a tenth of the
replay's CPU, to find a few cycles. When cycles are collected changes no figure (the same report, byte
for byte, at either threshold)."""


@contextlib.contextmanager
def _collecting_seldom() -> Iterator[None]:
    """`GC_THRESHOLD` for the replay; after it, the thresholds as they were and the GC unfrozen (kcover's
    cache freezes it after its first sync, as in the product: `kube.gc_freeze_after_sync`)."""
    before = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def replay(params: st.Params, taxonomy: tax.Taxonomy, onsets: list[trace_.Onset], policies: list[str], *,
           kcover_overrides: Mapping[str, Any] | None = None) -> tuple[dict[str, report.Figures], dict[str, Any]]:
    """Every policy on the same onsets: the figures, and what each replay took."""
    figs: dict[str, report.Figures] = {}
    timing: dict[str, Any] = {}
    for name in sorted(policies, key=lambda n: n == "kcover"):
        policy = policy_of(name, params, kcover_overrides or {})
        world = world_.World(params, taxonomy, onsets, policy)
        started, cpu = time.perf_counter(), time.process_time()
        with _collecting_seldom():
            virtualtime.run(world.run())
        timing[f"{name}_seconds"] = round(time.perf_counter() - started, 1)
        timing[f"{name}_cpu_seconds"] = round(time.process_time() - cpu, 1)
        refusals, validations = None, None
        if isinstance(policy, kcoverpolicy.KcoverPolicy):
            validations = (sum(a.validations for a in policy.agents.values()),
                           sum(a.healthy_validations for a in policy.agents.values()))
            refusals = {code: n for (step, code), n in policy.observer.outcomes.items()
                        if step in ("refuse", "hold") and code not in ("done", "failed")}
            timing["kcover_api_requests"] = sum(policy.srv.request_counts.values())
            timing["kcover_batches"] = policy.batches
            timing["kcover_passes"] = policy.passes
            timing.update({f"kcover_{k}_seconds": round(v, 1) for k, v in policy.seconds.items()})
        figs[name] = report.compute(world, refusals=refusals, validations=validations)
    timing["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return figs, timing


def main(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    bad = problems(args)
    if bad:
        for line in bad:
            print(f"kcover sim fleet: {line}", file=sys.stderr)
        return 2
    params = params_of(args)
    try:
        taxonomy = tax.load(args.taxonomy)
        if args.trace:
            onsets = trace_.read(args.trace, taxonomy, nodes=params.nodes, gpus_per_node=params.gpus_per_node)
        else:
            onsets = trace_.generate(taxonomy, nodes=params.nodes, gpus_per_node=params.gpus_per_node,
                                     days=params.days, seed=params.seed, scale=args.fault_rate_scale)
        kcover_overrides = overrides(args.fleet_set)
        kcoverpolicy.replay_settings(kcover_overrides)
    except (errors.ConfigError, ValueError) as exc:
        print(f"kcover sim fleet: {exc}", file=sys.stderr)
        return 2
    if args.write_trace:
        trace_.write(onsets, args.write_trace)
    policies = [p for p in report.POLICIES if p in args.policies.split(",")]
    figs, timing = replay(params, taxonomy, onsets, policies, kcover_overrides=kcover_overrides)
    meta = meta_of(params, args, len(onsets), timing)
    sizes = {f"{name}": size for name, size in job_sizes(params).items()}
    if args.report == "json":
        print(json.dumps(report.document(figs, meta), indent=2), file=out)
    else:
        print(report.render(figs, meta, sizes), file=out)
    if args.plot:
        largest = max(sizes, key=lambda n: sizes[n])
        plotting.plot(figs, args.plot, days=params.days, job=largest)
    return 0


def job_sizes(params: st.Params) -> dict[str, int]:
    """Job name -> nodes, as the world names them (`state.initial_jobs`)."""
    return {name: job.size for name, job in st.initial_jobs(params).items()}


def meta_of(params: st.Params, args: argparse.Namespace, onsets: int, timing: Mapping[str, Any]) -> dict[str, Any]:
    spare = params.nodes - params.job_nodes
    return {"nodes": params.nodes, "gpus_per_node": params.gpus_per_node, "days": params.days, "seed": params.seed,
            "jobs": [{"count": c, "nodes": s} for c, s in params.jobs], "spare_nodes": spare,
            "jobs_text": ", ".join(f"{c} x {s}-node" for c, s in params.jobs)
                         + f" jobs, {spare} spare nodes ({100 * spare / params.nodes:.1f} %)",
            "onsets": onsets, "trace_source": args.trace or f"the taxonomy ({args.taxonomy or 'Llama 3 405B Table 5'}, "
                                                             f"rates x {args.fault_rate_scale:g})",
            "checkpoint_minutes": params.checkpoint_minutes, "restart_minutes": params.restart_minutes,
            "nccl_timeout_minutes": params.nccl_timeout_minutes, "repair_hours": params.repair_hours,
            "person_hours": params.person_hours, "eviction_seconds": params.eviction_seconds,
            "timing": dict(timing)}
