"""Plots of a `kcover bench --raw --report json` report, for docs/performance.md.

    python -m kcover.bench.plotting report.json docs/img

Writes `bench-latency.png` (cumulative distributions of fault-to-detection, fault-to-action and the
watch floor), `bench-memory.png` (controller RSS delta and bytes per cached pod against pod count)
and `bench-throughput-lag.png` (change-to-bus lag at the offered rate). matplotlib is not a kcover
dependency: this module imports it when run and exits 1 with a hint when it is missing.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any


def _cdf(ax: Any, seconds: list[float], label: str, **style: Any) -> None:
    ms = sorted(s * 1000 for s in seconds)
    if ms:
        ax.step(ms, [(i + 1) / len(ms) for i in range(len(ms))], where="post", label=f"{label} (n={len(ms)})", **style)


def plot(report: dict[str, Any], out: Path) -> list[Path]:
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    raw = report.get("raw_seconds") or {}

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = {"pod_error": "tab:blue", "dra_unhealthy": "tab:orange", "xid": "tab:green"}
    for kind, series in (raw.get("latency") or {}).items():
        _cdf(ax, series.get("detect", []), f"{kind} detect", color=colors.get(kind), linestyle="--")
        _cdf(ax, series.get("act", []), f"{kind} act", color=colors.get(kind))
    _cdf(ax, raw.get("floor", []), "watch floor", color="black", linestyle=":")
    ax.set_xscale("log")
    ax.set_xlabel("milliseconds from the fault's write (log scale)")
    ax.set_ylabel("fraction of samples")
    ax.set_title("kcover: fault to detection (dashed) and to action (solid)")
    ax.axvline(1000, color="red", linewidth=0.8)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    path = out / "bench-latency.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    written.append(path)
    plt.close(fig)

    rows = report.get("scale") or []
    if rows:
        fig, ax = plt.subplots(figsize=(7, 4))
        pods = [r["pods"] for r in rows]
        ax.plot(pods, [r["rss_delta_bytes"] / 2**20 for r in rows], marker="o", label="RSS delta (MiB)")
        ax.set_xlabel("cached pods")
        ax.set_ylabel("controller RSS delta (MiB)")
        ax2 = ax.twinx()
        ax2.plot(pods, [r["bytes_per_pod"] for r in rows], marker="s", color="tab:orange", label="bytes per pod")
        ax2.axhline(3 * 1024, color="red", linewidth=0.8)
        ax2.set_ylabel("bytes per cached pod (target 3 KiB, red)")
        ax2.set_ylim(bottom=0)
        ax.set_title("controller memory against pod count")
        ax.grid(alpha=0.3)
        fig.legend(loc="upper left", fontsize=8)
        path = out / "bench-memory.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        written.append(path)
        plt.close(fig)

    lags = raw.get("throughput_lag") or []
    if lags:
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.hist([s * 1000 for s in lags], bins=50)
        ax.set_xlabel("change-to-bus lag (ms)")
        ax.set_ylabel("updates")
        tp = report.get("throughput") or {}
        ax.set_title(f"lag at {tp.get('offered_per_second', '?')} offered updates/s")
        ax.grid(alpha=0.3)
        path = out / "bench-throughput-lag.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        written.append(path)
        plt.close(fig)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kcover.bench.plotting", description=__doc__.splitlines()[0])
    parser.add_argument("report")
    parser.add_argument("out", nargs="?", default="docs/img")
    args = parser.parse_args(argv)
    try:
        paths = plot(json.loads(Path(args.report).read_text()), Path(args.out))
    except ModuleNotFoundError:
        print("matplotlib is not installed: pip install matplotlib", file=sys.stderr)
        return 1
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
