"""The bench's numbers as a report: percentiles, ratios to the targets, JSON and a Markdown table.

Owns the targets (from the design: detect-and-act p99 <= 1 s and within 2x the watch floor plus
100 ms; <= 3 KiB resident per cached pod; initial sync <= 60 s at 150,000 pods; 1,000 pod updates
per second absorbed with change-to-bus lag p99 <= 1 s) and the arithmetic: pure functions of the
raw samples, table-tested. Ratios are measured / target: below 1 meets a "<=" target; for the update
rate (a ">=" target) above 1 meets it. Nothing here asserts: the bench reports, people compare.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

DETECT_ACT_P99_MS = 1000.0
FLOOR_FACTOR = 2.0
FLOOR_SLACK_MS = 100.0
BYTES_PER_POD = 3 * 1024
SYNC_SECONDS_AT_150K = 60.0
UPDATES_PER_SECOND = 1000.0
LAG_P99_MS = 1000.0


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


def latency_section(kinds: Mapping[str, Mapping[str, Sequence[float]]], floor: Sequence[float]) -> dict[str, Any]:
    """Per fault kind: detect and act summaries, and act p99 against both latency targets."""
    floor_p99 = summary_ms(floor).get("p99", 0.0)
    floor_target = FLOOR_FACTOR * floor_p99 + FLOOR_SLACK_MS
    out: dict[str, Any] = {}
    for kind, series in kinds.items():
        entry: dict[str, Any] = {name: summary_ms(values) for name, values in series.items()}
        act_p99 = entry.get("act", {}).get("p99")
        if act_p99 is not None:
            entry["target_p99_ms"] = DETECT_ACT_P99_MS
            entry["ratio_to_target"] = ratio(act_p99, DETECT_ACT_P99_MS)
            entry["floor_target_p99_ms"] = round(floor_target, 2)
            entry["ratio_to_floor_target"] = ratio(act_p99, floor_target)
        out[kind] = entry
    return out


def scale_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        r = dict(row)
        r["target_bytes_per_pod"] = BYTES_PER_POD
        r["ratio_bytes_per_pod"] = ratio(float(r["bytes_per_pod"]), BYTES_PER_POD)
        r["target_sync_seconds"] = SYNC_SECONDS_AT_150K
        r["ratio_sync"] = ratio(float(r["sync_seconds"]), SYNC_SECONDS_AT_150K)
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


def api_section(counts: Mapping[str, Mapping[str, Mapping[str, int]]]) -> dict[str, Any]:
    return {scenario: {"requests": {proc: dict(c) for proc, c in by_proc.items()},
                       "total": sum(sum(c.values()) for c in by_proc.values())}
            for scenario, by_proc in counts.items()}


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
                             e.get("ratio_to_target", "") if last else "",
                             e.get("ratio_to_floor_target", "") if last else ""])
        rows.append(["watch floor", "delivery", floor.get("n", 0), floor.get("p50", "-"), floor.get("p99", "-"),
                     floor.get("max", "-"), "", ""])
        lines += _table(["fault", "stage", "n", "p50", "p99", "max", "p99 / 1 s", "p99 / (2 x floor p99 + 100 ms)"],
                        rows)
        lines.append("")
    if report.get("scale"):
        lines += ["### Scale (controller process)", ""]
        lines += _table(["nodes", "pods", "initial sync (s)", "sync / 60 s", "RSS delta (MiB)", "bytes per pod",
                         "per pod / 3 KiB"],
                        [[r["nodes"], r["pods"], r["sync_seconds"], r["ratio_sync"],
                          round(r["rss_delta_bytes"] / 2**20, 1), r["bytes_per_pod"], r["ratio_bytes_per_pod"]]
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
    env = report.get("environment") or {}
    if env:
        lines.append("Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    return "\n".join(lines) + "\n"
