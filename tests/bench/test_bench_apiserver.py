"""`kcover bench --quick --kubeconfig` against the real kube-apiserver (the `controlplane` fixture).

The bench had only ever run against the simulated API server; this runs it on a real one, as a user
would on their cluster, and checks that every figure is reported and sane. Figures are never compared
with their targets here: benchmarks are not timed tests (docs/performance.md has the numbers).
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from kcover import cli

FIGURES = {"footprint.startup_to_leading_seconds", "footprint.controller_idle_rss_mib",
           "footprint.agent_idle_rss_mib", "footprint.cpu_ms_per_fault"}


def _sane(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0 and math.isfinite(value)


def test_the_quick_bench_reports_every_figure_on_a_real_apiserver(controlplane: Any,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["bench", "--quick", "--kubeconfig", controlplane.kubeconfig_path, "--report", "json"])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads(out)
    assert report["environment"]["cluster"] == "real (kubeconfig)"
    ratios = report["ratios"]
    assert set(ratios) >= FIGURES
    for kind in ("pod_error", "dra_unhealthy", "xid"):
        assert {f"latency.{kind}.p50", f"latency.{kind}.p99", f"latency.{kind}.p99_to_floor"} <= set(ratios)
        entry = report["latency_ms"][kind]
        assert entry["act"]["n"] == (4 if kind == "xid" else 10)
        assert all(_sane(entry[stage][q]) for stage in ("detect", "act") for q in ("p50", "p99"))
    assert [name for name, value in ratios.items() if not _sane(value)] == []
    (row,) = report["scale"]  # what the cluster holds, synced by a fresh controller process
    assert set(ratios) >= {f"scale.{row['pods']}.{figure}" for figure in ("sync", "bytes_per_pod", "peak_rss")}
    assert row["peak_rss_bytes"] >= row["rss_bytes"] > 0
    assert _sane(report["floor_ms"]["p99"])
    assert _sane(report["write_ms"]["p99"])
    assert report["throughput"] == {}  # it writes pod statuses: skipped on a real cluster
    restart = report["api_requests_per_recovery"]["pod_error_restart"]["requests"]["controller"]
    assert restart.get("DELETECOLLECTION pods") == 1 or restart.get("DELETE pods") == 2
