"""The fleet replay's figures: what each policy did to the fleet, side by side, and how they are printed.

Owns `Figures` (every number the report shows, computed from one finished `world.World`), the table
of all policies (`render`, text) and the `--report json` document (`document`). Definitions, in the
order the text prints them (docs/performance.md says the same):

* attribution: each fault that struck (interrupted a job or showed a signal) is counted by its truth
  (`blame`) and by what the policy did about it: *isolated* (the policy cordoned its node while it
  lasted, or for a fault that does not last, right after it), *restarted* (the policy restarted the
  job it stopped, and isolated nothing), or *nothing*; *right* when a lasting hardware fault (device,
  node) was isolated and any other (a transient one included) restarted and not isolated;
* hardware faults: persistent device or node faults that struck; isolated by the policy, by a person,
  or never; the time from their first signal to isolation; *repeat interruptions*: stops of a job by a
  persistent fault after its first one (the part left in service);
* cordons: *healthy* ones (no active fault on the node, Ready), by the truth of the fault that last
  struck the node, and the GPU-hours those nodes spent out of service and empty; *left for a person*:
  nodes the policy cordoned, which a person must return (no policy here un-cordons); *found by a
  person*: faults a person had to find;
* restarts: the policy's restarts per interruption; *not acted on*: interruptions the policy never
  restarted (Kubernetes' in-place restart or a person did); *unneeded*: restarts of a job running fine or
  already restarting; kcover's refusals by code and its breaker's (the engine's own counts);
* validations: the `dcgmi diag` runs kcover asked of suspect nodes (its agents' count), and how many of
  them ran on a node with no DCGM-visible fault (the cost of suspicion: a diagnostic, no cordon);
* effective training time: each job's training kept (run time less the work lost since the last
  checkpoint) over the replay's length, per job and GPU-weighted over the fleet; the GPU-hours lost, by
  part: waiting for a decision (fault to restart), restarting, waiting for nodes, work lost since the last
  checkpoint; and the *policy's part*: the waiting for decisions, every repeat interruption and every
  unneeded restart, which a better policy avoids and the restart cost and checkpoints do not.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kcover.sim.fleet import state as st
from kcover.sim.fleet import taxonomy as tax
from kcover.sim.fleet import world as world_

POLICIES = ("kcover", "kubernetes", "go", "oracle")
WINDOW = 3600.0
"""A cordon within this long after a fault that does not last is taken as the policy's answer to it."""
BREAKER_CODES = frozenset({"BreakerOpen", "BreakerLatched", "BreakerCooldown"})


@dataclass
class Figures:
    policy: str
    struck: dict[str, dict[str, int]] = field(default_factory=dict)
    """Truth (blame) -> {isolated, restarted, nothing, right, faults}."""
    by_class: dict[str, dict[str, int]] = field(default_factory=dict)
    """Class -> {faults, right, interruptions}."""
    hardware_faults: int = 0
    isolated_by_policy: int = 0
    isolated_by_person: int = 0
    never_isolated: int = 0
    isolation_minutes_median: float | None = None
    isolation_minutes_p90: float | None = None
    repeat_interruptions: int = 0
    interruptions: int = 0
    cordons: int = 0
    healthy_cordons: int = 0
    healthy_cordons_by_blame: dict[str, int] = field(default_factory=dict)
    healthy_gpu_hours_lost: float = 0.0
    left_for_person: int = 0
    found_by_person: int = 0
    restarts: int = 0
    restarts_per_interruption: float = 0.0
    not_acted_on: int = 0
    unneeded_restarts: int = 0
    refusals: dict[str, int] = field(default_factory=dict)
    breaker_refusals: int = 0
    validations: int | None = None
    """Validations (`dcgmi diag` on request) kcover asked of suspect nodes that ran; None for the others."""
    healthy_validations: int | None = None
    ettr_fleet: float = 0.0
    ettr_jobs: dict[str, float] = field(default_factory=dict)
    lost_gpu_hours: dict[str, float] = field(default_factory=dict)
    """decision, restart, waiting_for_nodes, rework, policy_part, all."""
    cordoned_series: list[tuple[float, int]] = field(default_factory=list)
    progress: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def compute(world: world_.World, *, refusals: Mapping[str, int] | None = None,
            validations: tuple[int, int] | None = None) -> Figures:
    p = world.params
    fig = Figures(world.policy.name)
    if validations is not None:
        fig.validations, fig.healthy_validations = validations
    struck = [f for f in world.faults if f.interruptions or f.first_signal is not None]
    cordon_of: dict[int, st.CordonRecord] = {}
    for record in world.cordons:
        if record.by == "policy" and record.fault is not None and record.fault.id not in cordon_of \
                and record.at - (record.fault.first_signal or record.fault.onset.time) <= WINDOW:
            cordon_of[record.fault.id] = record
    restarted = {i.fault.id for i in world.interruptions if i.fault is not None and i.by == "policy"}
    for blame in tax.Blame:
        fig.struck[blame.value] = {"faults": 0, "isolated": 0, "restarted": 0, "nothing": 0, "right": 0}
    for fault in struck:
        row = fig.struck[fault.cls.blame.value]
        cls_row = fig.by_class.setdefault(fault.cls.name, {"faults": 0, "right": 0, "interruptions": 0})
        isolated = fault.isolated_by == "policy" or fault.id in cordon_of
        what = "isolated" if isolated else "restarted" if fault.id in restarted else "nothing"
        right = isolated if fault.persistent and fault.cls.blame.hardware else what == "restarted"
        row["faults"] += 1
        row[what] += 1
        row["right"] += right
        cls_row["faults"] += 1
        cls_row["right"] += right
        cls_row["interruptions"] += fault.interruptions
    hardware = [f for f in struck if f.persistent and f.cls.blame.hardware]
    fig.hardware_faults = len(hardware)
    fig.isolated_by_policy = sum(f.isolated_by == "policy" for f in hardware)
    fig.isolated_by_person = sum(f.isolated_by == "person" for f in hardware)
    fig.never_isolated = sum(not f.isolated_by for f in hardware)
    waits = [(f.isolated_at - (f.first_signal or f.onset.time)) / 60 for f in hardware if f.isolated_at is not None]
    fig.isolation_minutes_median = statistics.median(waits) if waits else None
    fig.isolation_minutes_p90 = _pct(waits, 0.9)
    fig.interruptions = sum(i.fault is not None for i in world.interruptions)
    fig.repeat_interruptions = sum(i.repeat for i in world.interruptions)
    policy_cordons = [c for c in world.cordons if c.by == "policy"]
    fig.cordons = len(policy_cordons)
    healthy = [c for c in policy_cordons if c.healthy]
    fig.healthy_cordons = len(healthy)
    for c in healthy:
        truth = c.fault.cls.blame.value if c.fault is not None else "none"
        fig.healthy_cordons_by_blame[truth] = fig.healthy_cordons_by_blame.get(truth, 0) + 1
    fig.healthy_gpu_hours_lost = sum(c.idle_seconds for c in healthy) * p.gpus_per_node / 3600
    fig.left_for_person = len(policy_cordons)
    fig.found_by_person = sum(c.by == "person" for c in world.cordons)
    fig.restarts = world.restarts["policy"]
    fig.restarts_per_interruption = fig.restarts / fig.interruptions if fig.interruptions else 0.0
    fig.not_acted_on = sum(1 for i in world.interruptions if i.fault is not None and i.by != "policy")
    fig.unneeded_restarts = world.unneeded_restarts + world.repeated_restarts
    fig.refusals = dict(sorted((refusals or {}).items()))
    fig.breaker_refusals = sum(n for code, n in fig.refusals.items() if code in BREAKER_CODES)
    horizon = p.horizon
    total_gpus = sum(j.size for j in world.jobs.values()) * p.gpus_per_node
    fig.ettr_jobs = {j.name: j.productive / horizon for j in world.jobs.values()}
    fig.ettr_fleet = sum(j.productive * j.size for j in world.jobs.values()) / (horizon * sum(
        j.size for j in world.jobs.values()))
    lost = {"decision": 0.0, "restart": 0.0, "waiting_for_nodes": 0.0, "rework": 0.0, "policy_part": 0.0}
    for i in world.interruptions:
        gpus = world.jobs[i.job].size * p.gpus_per_node
        end = i.resumed_at if i.resumed_at is not None else horizon
        decided = i.decided_at if i.decided_at is not None else end
        parts = {"decision": max(0.0, decided - i.at), "waiting_for_nodes": i.pending,
                 "restart": max(0.0, end - decided - i.pending), "rework": i.rework}
        for key, value in parts.items():
            lost[key] += value * gpus / 3600
        if i.repeat or i.fault is None:
            lost["policy_part"] += sum(parts.values()) * gpus / 3600
        else:
            lost["policy_part"] += parts["decision"] * gpus / 3600
    lost["all"] = total_gpus * horizon / 3600 * (1 - fig.ettr_fleet)
    fig.lost_gpu_hours = lost
    fig.cordoned_series = list(world.cordoned_series)
    fig.progress = {j.name: list(j.progress) for j in world.jobs.values()}
    return fig


# ---------------------------------------------------------------------------------------------- text

def _num(value: float | int | None, fmt: str = "{:,.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _jobs(fig: Figures, size: int, world_jobs: Mapping[str, int]) -> tuple[float | None, float | None]:
    values = [v for name, v in fig.ettr_jobs.items() if world_jobs[name] == size]
    return (statistics.mean(values), min(values)) if values else (None, None)


def rows(figs: Mapping[str, Figures], job_sizes: Mapping[str, int]) -> list[tuple[str, list[str]]]:
    order = [name for name in POLICIES if name in figs]
    out: list[tuple[str, list[str]]] = []

    def add(label: str, get: Any, fmt: str = "{:,.0f}") -> None:
        out.append((label, [_num(get(figs[n]), fmt) for n in order]))

    add("effective training time, fleet (%)", lambda f: 100 * f.ettr_fleet, "{:.2f}")
    for size in sorted(set(job_sizes.values()), reverse=True):
        count = sum(1 for s in job_sizes.values() if s == size)
        label = f"  {size}-node job (%)" if count == 1 else f"  {size}-node jobs, mean / worst (%)"
        cells = []
        for n in order:
            mean, worst = _jobs(figs[n], size, job_sizes)
            cells.append(_num(None if mean is None else 100 * mean, "{:.2f}") + (
                "" if count == 1 else " / " + _num(None if worst is None else 100 * worst, "{:.2f}")))
        out.append((label, cells))
    add("GPU-hours lost", lambda f: f.lost_gpu_hours["all"])
    add("  waiting for a decision", lambda f: f.lost_gpu_hours["decision"])
    add("  restarting", lambda f: f.lost_gpu_hours["restart"])
    add("  waiting for free nodes", lambda f: f.lost_gpu_hours["waiting_for_nodes"])
    add("  work since the last checkpoint", lambda f: f.lost_gpu_hours["rework"])
    add("  the policy's part", lambda f: f.lost_gpu_hours["policy_part"])
    add("interruptions", lambda f: f.interruptions)
    add("  repeats by a bad part left in service", lambda f: f.repeat_interruptions)
    add("hardware faults that struck", lambda f: f.hardware_faults)
    add("  isolated by the policy", lambda f: f.isolated_by_policy)
    add("  isolated by a person", lambda f: f.isolated_by_person)
    add("  never isolated", lambda f: f.never_isolated)
    add("  first signal to isolation, median (min)", lambda f: f.isolation_minutes_median, "{:.1f}")
    add("  first signal to isolation, p90 (min)", lambda f: f.isolation_minutes_p90, "{:.1f}")
    for blame in tax.Blame:
        add(f"{blame.value} faults: right / struck", lambda f, b=blame.value: None)
        out[-1] = (out[-1][0], [f"{figs[n].struck[blame.value]['right']} / {figs[n].struck[blame.value]['faults']}"
                                for n in order])
    add("nodes cordoned by the policy", lambda f: f.cordons)
    add("  healthy nodes cordoned", lambda f: f.healthy_cordons)
    add("    after a workload fault", lambda f: f.healthy_cordons_by_blame.get("workload", 0))
    add("    after an unknown fault", lambda f: f.healthy_cordons_by_blame.get("unknown", 0))
    add("  healthy GPU-hours lost to them", lambda f: f.healthy_gpu_hours_lost)
    add("  left for a person to return", lambda f: f.left_for_person)
    add("faults a person had to find", lambda f: f.found_by_person)
    add("restarts by the policy", lambda f: f.restarts)
    add("  per interruption", lambda f: f.restarts_per_interruption, "{:.2f}")
    add("  interruptions not acted on", lambda f: f.not_acted_on)
    add("  unneeded restarts", lambda f: f.unneeded_restarts)
    add("  breaker refusals", lambda f: f.breaker_refusals if f.policy == "kcover" else None)
    add("validations of suspect nodes", lambda f: f.validations)
    add("  of healthy nodes", lambda f: f.healthy_validations)
    return out


def render(figs: Mapping[str, Figures], meta: Mapping[str, Any], job_sizes: Mapping[str, int]) -> str:
    order = [name for name in POLICIES if name in figs]
    lines = [f"kcover sim fleet: {meta['nodes']:,} nodes x {meta['gpus_per_node']} GPUs, {meta['days']:g} days, "
             f"seed {meta['seed']}; {meta['jobs_text']}",
             f"trace: {meta['onsets']} onsets from {meta['trace_source']}",
             f"model: checkpoint every {meta['checkpoint_minutes']:g} min, restart {meta['restart_minutes']:g} min, "
             f"NCCL timeout {meta['nccl_timeout_minutes']:g} min, repair {meta['repair_hours']:g} h, a person "
             f"finds a bad part after {meta['person_hours']:g} h, NotReady pods evicted after "
             f"{meta['eviction_seconds']:g} s", ""]
    if "kcover" in figs and "oracle" in figs:
        gap = 100 * (figs["oracle"].ettr_fleet - figs["kcover"].ettr_fleet)
        lines.append(f"HEADLINE: kcover's effective training time is {100 * figs['kcover'].ettr_fleet:.2f} %, "
                     f"{gap:.2f} points below the oracle's {100 * figs['oracle'].ettr_fleet:.2f} %")
        lines.append("")
    table = rows(figs, job_sizes)
    width = max(len(label) for label, _ in table)
    cols = [max(len(name), *(len(values[i]) for _, values in table)) for i, name in enumerate(order)]
    lines.append(" " * width + "  " + "  ".join(name.rjust(w) for name, w in zip(order, cols, strict=True)))
    for label, values in table:
        lines.append(label.ljust(width) + "  " + "  ".join(v.rjust(w) for v, w in zip(values, cols, strict=True)))
    if "kcover" in figs and figs["kcover"].refusals:
        lines += ["", "kcover's refusals by code: " + ", ".join(f"{code} {n}" for code, n in figs["kcover"].refusals.items())]
    if "kcover" in figs:
        classes = figs["kcover"].by_class
        lines += ["", "kcover by fault class (right / struck, interruptions):"]
        lines += [f"  {name}: {row['right']} / {row['faults']}, {row['interruptions']}" for name, row in classes.items()]
    if meta.get("timing"):
        lines += ["", "replay: " + ", ".join(f"{k} {v}" for k, v in meta["timing"].items())]
    return "\n".join(lines)


def document(figs: Mapping[str, Figures], meta: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"meta": dict(meta), "policies": {}}
    for name, fig in figs.items():
        doc = asdict(fig)
        doc.pop("cordoned_series")
        doc.pop("progress")
        out["policies"][name] = doc
    if "kcover" in figs and "oracle" in figs:
        out["kcover_to_oracle_points"] = round(100 * (figs["oracle"].ettr_fleet - figs["kcover"].ettr_fleet), 4)
    return out
