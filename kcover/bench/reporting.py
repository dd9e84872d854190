"""The bench's numbers as a report: percentiles, ratios to the targets, JSON and a Markdown table.

Owns the targets (issue 20, measured on a 2-core machine: fault-to-action p50 <= 9.5 ms and p99 <=
14 ms, and p99 within 2x the watch-delivery floor plus one write; start-up to leading <= 0.3 s; idle
RSS <= 50 MiB for the controller and <= 40 MiB for the agent; <= 6 ms of CPU per fault; initial sync
<= 2 s at 10,000 pods and <= 20 s at 150,000 (one pod per 133 us between); <= 1 KiB resident per
cached pod; peak RSS during the sync <= 1.5x the synced RSS; 1,000 pod updates per second absorbed
with change-to-bus lag p99 <= 1 s) and the arithmetic: pure functions of the raw samples, table-tested. Ratios are measured / target: below 1 meets a "<=" target; for the update
rate (a ">=" target) above 1 meets it. Nothing here asserts: the bench reports, people compare.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ACT_P50_MS = 9.5
ACT_P99_MS = 14.0
FLOOR_FACTOR = 2.0
STARTUP_TO_LEADING_SECONDS = 0.3
CONTROLLER_IDLE_RSS_BYTES = 50 * 2**20
AGENT_IDLE_RSS_BYTES = 40 * 2**20
CPU_SECONDS_PER_FAULT = 0.006
SYNC_SECONDS_MIN = 2.0
"""At 10,000 pods (and below)."""
SYNC_PODS_PER_SECOND = 7500.0
"""Above 10,000 pods: 20 s at 150,000."""
BYTES_PER_POD = 1024
PEAK_TO_SYNCED_RSS = 1.5
UPDATES_PER_SECOND = 1000.0
LAG_P99_MS = 1000.0


def sync_target_seconds(pods: int) -> float:
    """Initial sync target: 2 s up to 10,000 pods, then 7,500 pods a second (20 s at 150,000)."""
    return max(SYNC_SECONDS_MIN, pods / SYNC_PODS_PER_SECOND)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of a non-empty sequence."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 1))  # ceil(n*q), at least 1
    return ordered[min(len(ordered), int(rank)) - 1]


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """n, p50, p90, p99, max and mean of samples given in seconds, in milliseconds."""
    if not seconds:
        return {"n": 0}
    ms = [s * 1000 for s in seconds]
    return {"n": len(ms), "p50": round(percentile(ms, 0.50), 2), "p90": round(percentile(ms, 0.90), 2),
            "p99": round(percentile(ms, 0.99), 2), "max": round(max(ms), 2), "mean": round(sum(ms) / len(ms), 2)}


def ratio(measured: float, target: float) -> float:
    """measured / target to four significant digits (a tiny ratio stays positive)."""
    return float(f"{measured / target:.4g}") if target else float("inf")


def latency_section(kinds: Mapping[str, Mapping[str, Sequence[float]]], floor: Sequence[float],
                    write: Sequence[float] = ()) -> dict[str, Any]:
    """Per fault kind: detect and act summaries; act p50 and p99 against their targets, and p99 against
    twice the watch floor's p99 plus one write's p99 (`write`: the floor's own write, answered)."""
    floor_target = FLOOR_FACTOR * summary_ms(floor).get("p99", 0.0) + summary_ms(write).get("p99", 0.0)
    out: dict[str, Any] = {}
    for kind, series in kinds.items():
        entry: dict[str, Any] = {name: summary_ms(values) for name, values in series.items()}
        act = entry.get("act", {})
        if act.get("n"):
            entry["target_p50_ms"] = ACT_P50_MS
            entry["ratio_p50_to_target"] = ratio(act["p50"], ACT_P50_MS)
            entry["target_p99_ms"] = ACT_P99_MS
            entry["ratio_to_target"] = ratio(act["p99"], ACT_P99_MS)
            entry["floor_target_p99_ms"] = round(floor_target, 2)
            entry["ratio_to_floor_target"] = ratio(act["p99"], floor_target)
        out[kind] = entry
    return out


def footprint_section(startups: Sequence[float], *, controller_rss: int, agent_rss: int,
                      cpu_per_fault: float, faults: int) -> dict[str, Any]:
    """The roles as processes: start-up to leading (best and median of the starts), idle RSS, CPU per fault."""
    if not startups:
        return {}
    ordered = sorted(startups)
    best, median = ordered[0], ordered[len(ordered) // 2]
    return {
        "startup_to_leading_seconds": {"n": len(ordered), "best": round(best, 3), "median": round(median, 3),
                                       "target": STARTUP_TO_LEADING_SECONDS,
                                       "ratio": ratio(best, STARTUP_TO_LEADING_SECONDS)},
        "controller_idle_rss_mib": {"value": round(controller_rss / 2**20, 1),
                                    "target": CONTROLLER_IDLE_RSS_BYTES / 2**20,
                                    "ratio": ratio(controller_rss, CONTROLLER_IDLE_RSS_BYTES)},
        "agent_idle_rss_mib": {"value": round(agent_rss / 2**20, 1), "target": AGENT_IDLE_RSS_BYTES / 2**20,
                               "ratio": ratio(agent_rss, AGENT_IDLE_RSS_BYTES)},
        "cpu_ms_per_fault": {"value": round(cpu_per_fault * 1000, 2), "faults": faults,
                             "target": CPU_SECONDS_PER_FAULT * 1000,
                             "ratio": ratio(cpu_per_fault, CPU_SECONDS_PER_FAULT)},
    }


def scale_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        r = dict(row)
        r["target_bytes_per_pod"] = BYTES_PER_POD
        r["ratio_bytes_per_pod"] = ratio(float(r["bytes_per_pod"]), BYTES_PER_POD)
        r["target_sync_seconds"] = round(sync_target_seconds(int(r["pods"])), 2)
        r["ratio_sync"] = ratio(float(r["sync_seconds"]), r["target_sync_seconds"])
        if r.get("peak_rss_bytes") and r.get("rss_bytes"):
            r["peak_to_synced_rss"] = round(r["peak_rss_bytes"] / r["rss_bytes"], 3)
            r["target_peak_to_synced_rss"] = PEAK_TO_SYNCED_RSS
            r["ratio_peak_rss"] = ratio(r["peak_to_synced_rss"], PEAK_TO_SYNCED_RSS)
        out.append(r)
    return out


def throughput_section(raw: Mapping[str, Any]) -> dict[str, Any]:
    if not raw:
        return {}
    out = {k: v for k, v in raw.items() if k != "lag_seconds"}
    lag = summary_ms(raw.get("lag_seconds") or [])
    out["lag_ms"] = lag
    out["target_per_second"] = UPDATES_PER_SECOND
    out["ratio_to_target"] = ratio(float(raw["absorbed_per_second"]), UPDATES_PER_SECOND)
    out["target_lag_p99_ms"] = LAG_P99_MS
    out["ratio_lag_p99"] = ratio(float(lag.get("p99", 0.0)), LAG_P99_MS)
    return out


def ratios(report: Mapping[str, Any]) -> dict[str, float]:
    """Every figure's ratio to its target, flat (`latency.pod_error.p99`, `scale.10041.sync`, ...): the
    one place to read whether this run met the targets (below 1 meets a "<=" target)."""
    out: dict[str, float] = {}
    for kind, e in (report.get("latency_ms") or {}).items():
        for key, name in (("ratio_p50_to_target", "p50"), ("ratio_to_target", "p99"),
                          ("ratio_to_floor_target", "p99_to_floor")):
            if key in e:
                out[f"latency.{kind}.{name}"] = e[key]
    for name, e in (report.get("footprint") or {}).items():
        out[f"footprint.{name}"] = e["ratio"]
    for r in report.get("scale") or []:
        for key, name in (("ratio_sync", "sync"), ("ratio_bytes_per_pod", "bytes_per_pod"),
                          ("ratio_peak_rss", "peak_rss")):
            if key in r:
                out[f"scale.{r['pods']}.{name}"] = r[key]
    tp = report.get("throughput") or {}
    for key, name in (("ratio_to_target", "rate"), ("ratio_lag_p99", "lag_p99")):
        if key in tp:
            out[f"throughput.{name}"] = tp[key]
    for scenario, e in (report.get("api_requests_per_recovery") or {}).items():
        if "ratio_to_target" in e:
            out[f"api.{scenario}"] = e["ratio_to_target"]
    return out


FAULT_REQUESTS = 7.0
"""Issue 30: requests per fault for a 4-pod job (the Go controller makes 4: two GETs, one DeleteCollection,
one Event)."""
PURPOSES = {
    "DELETE pods": "take one pod away, its uid as precondition (a kind whose controller recreates deleted pods)",
    "CREATE pods/eviction": "evict one pod, its uid as precondition (a kind that counts deletions as failures)",
    "CREATE ledgerentries": "the restart's fenced ledger write, first restart of the unit: cooldown, budget, "
                            "replay memory and the intent a successor finishes",
    "UPDATE ledgerentries": "the restart's fenced ledger write (resourceVersion precondition), later restarts",
    "CREATE events": "the audit Event on the object acted on",
    "CREATE recoveries": "the Recovery record (kubectl get recoveries) with its status, written off the critical "
                         "path",
    "PATCH recoveries/status": "the Recovery's phase and times (a CRD installed with a status subresource)",
    "PATCH recoveries": "the Recovery's later phase and times",
    "GET discovery": "API discovery of kcover.io/v1alpha1: whether the Recovery kind has a status subresource (once "
                     "per retention pass, the first at leadership; a write before that pass asks it)",
    "GET pods/log": "recovery.save_logs: one container's log before its pod goes (and its previous one where it "
                    "restarted, or where the current one does not prove to be the instance that stopped)",
    "GET nodes": "a cordon's read of the Node (read-modify-write: spec.taints has no merge strategy)",
    "LIST ledgerentries": "a cordon's check that its ledger is served (one item at most), sent beside its read "
                          "of the Node: the Node is written before its ledger entry, never without a ledger",
    "UPDATE nodes": "the cordon (resourceVersion precondition)",
    "PATCH nodes/status": "the agent's Node condition",
}


def api_section(counts: Mapping[str, Mapping[str, Mapping[str, int]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for scenario, by_proc in counts.items():
        entry: dict[str, Any] = {"requests": {proc: dict(c) for proc, c in by_proc.items()},
                                 "total": sum(sum(c.values()) for c in by_proc.values())}
        if "_4_pods" in scenario:
            entry["purposes"] = {k: PURPOSES.get(k, "?") for c in by_proc.values() for k in c}
            entry["target"] = FAULT_REQUESTS
            entry["ratio_to_target"] = ratio(entry["total"], FAULT_REQUESTS)
        out[scenario] = entry
    return out


# --------------------------------------------------------------------------------------------- Markdown

def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def markdown(report: Mapping[str, Any]) -> str:
    lines: list[str] = []
    floor = report.get("floor_ms") or {}
    if report.get("latency_ms"):
        lines += ["### Latency (ms, from the fault's write)", ""]
        rows = []
        for kind, e in report["latency_ms"].items():
            for stage in ("detect", *(k for k in e if k not in ("detect", "act") and isinstance(e[k], dict)), "act"):
                s = e.get(stage) or {}
                last = stage == "act"
                rows.append([kind, stage, s.get("n", 0), s.get("p50", "-"), s.get("p99", "-"), s.get("max", "-"),
                             e.get("ratio_p50_to_target", "") if last else "",
                             e.get("ratio_to_target", "") if last else "",
                             e.get("ratio_to_floor_target", "") if last else ""])
        rows.append(["watch floor", "delivery", floor.get("n", 0), floor.get("p50", "-"), floor.get("p99", "-"),
                     floor.get("max", "-"), "", "", ""])
        write = report.get("write_ms") or {}
        rows.append(["watch floor", "write answered", write.get("n", 0), write.get("p50", "-"),
                     write.get("p99", "-"), write.get("max", "-"), "", "", ""])
        lines += _table(["fault", "stage", "n", "p50", "p99", "max", "p50 / 9.5 ms", "p99 / 14 ms",
                         "p99 / (2 x floor p99 + write p99)"], rows)
        lines.append("")
    fp = report.get("footprint") or {}
    if fp:
        lines += ["### The roles as processes", ""]
        startup = fp["startup_to_leading_seconds"]
        lines += _table(["figure", "measured", "target", "ratio"], [
            [f"start-up to leading (s, best of {startup['n']}; median {startup['median']})", startup["best"],
             startup["target"], startup["ratio"]],
            ["controller idle RSS (MiB)", fp["controller_idle_rss_mib"]["value"],
             fp["controller_idle_rss_mib"]["target"], fp["controller_idle_rss_mib"]["ratio"]],
            ["agent idle RSS (MiB)", fp["agent_idle_rss_mib"]["value"], fp["agent_idle_rss_mib"]["target"],
             fp["agent_idle_rss_mib"]["ratio"]],
            [f"CPU per fault (ms, {fp['cpu_ms_per_fault']['faults']} pod errors)", fp["cpu_ms_per_fault"]["value"],
             fp["cpu_ms_per_fault"]["target"], fp["cpu_ms_per_fault"]["ratio"]]])
        lines.append("")
    if report.get("scale"):
        lines += ["### Scale (controller process)", ""]
        lines += _table(["nodes", "pods", "initial sync (s)", "sync / target", "RSS delta (MiB)", "bytes per pod",
                         "per pod / 1 KiB", "peak RSS (MiB)", "synced RSS (MiB)", "peak / synced", "/ 1.5"],
                        [[r["nodes"], r["pods"], r["sync_seconds"], r["ratio_sync"],
                          round(r["rss_delta_bytes"] / 2**20, 1), r["bytes_per_pod"], r["ratio_bytes_per_pod"],
                          round(r.get("peak_rss_bytes", 0) / 2**20, 1), round(r.get("rss_bytes", 0) / 2**20, 1),
                          r.get("peak_to_synced_rss", "-"), r.get("ratio_peak_rss", "-")]
                         for r in report["scale"]])
        lines.append("")
    tp = report.get("throughput") or {}
    if tp:
        lines += ["### Throughput (cache + detectors)", ""]
        lag = tp.get("lag_ms") or {}
        lines += _table(["offered/s", "updates", "delivered", "absorbed/s", "/ 1,000", "updates per CPU-second",
                         "lag p50 (ms)", "lag p99 (ms)", "p99 / 1 s"],
                        [[tp["offered_per_second"], tp["updates"], tp["delivered"], tp["absorbed_per_second"],
                          tp["ratio_to_target"], tp["updates_per_cpu_second"], lag.get("p50", "-"),
                          lag.get("p99", "-"), tp["ratio_lag_p99"]]])
        lines.append("")
    if report.get("api_requests_per_recovery"):
        lines += ["### API requests per recovery", ""]
        rows = []
        for scenario, e in report["api_requests_per_recovery"].items():
            for proc, counts in e["requests"].items():
                rows.append([scenario, proc, ", ".join(f"{k} x{v}" for k, v in counts.items()), sum(counts.values())])
            rows.append([scenario, "**total**", "", e["total"]])
        lines += _table(["recovery", "process", "requests", "count"], rows)
        lines.append("")
        for scenario, e in report["api_requests_per_recovery"].items():
            if "purposes" not in e:
                continue
            lines += [f"{scenario}: {e['total']} requests (target at most {e['target']:g}; ratio {e['ratio_to_target']})",
                      ""]
            counts = {k: v for c in e["requests"].values() for k, v in c.items()}
            lines += _table(["request", "count", "purpose"], [[k, counts[k], p] for k, p in e["purposes"].items()])
            lines.append("")
    env = report.get("environment") or {}
    if env:
        lines.append("Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    return "\n".join(lines) + "\n"
