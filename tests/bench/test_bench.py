"""`kcover bench`: the report's shape and arithmetic (numbers are compared as ratios, never asserted)."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import sys
import time
from typing import Any

import pytest

from kcover import cli
from kcover.bench import footprint, reporting, running, scale


@pytest.mark.parametrize(("values", "q", "expected"), [
    ([5.0], 0.99, 5.0),
    ([1.0, 2.0, 3.0, 4.0], 0.5, 2.0),
    ([4.0, 3.0, 2.0, 1.0], 0.99, 4.0),
    ([float(i) for i in range(1, 101)], 0.99, 99.0),
    ([float(i) for i in range(1, 101)], 0.90, 90.0),
])
def test_percentile_is_nearest_rank(values: list[float], q: float, expected: float) -> None:
    assert reporting.percentile(values, q) == expected


def test_latency_targets_are_9_5_and_14_ms_and_twice_the_floor_plus_one_write() -> None:
    section = reporting.latency_section({"pod_error": {"detect": [0.001, 0.002], "act": [0.0095, 0.028]}},
                                        floor=[0.002, 0.005], write=[0.001, 0.004])
    entry = section["pod_error"]
    assert (entry["act"]["p50"], entry["act"]["p99"]) == (9.5, 28.0)
    assert (entry["ratio_p50_to_target"], entry["ratio_to_target"]) == (1.0, 2.0)
    assert entry["floor_target_p99_ms"] == 14.0  # 2 x 5 ms + 4 ms
    assert entry["ratio_to_floor_target"] == 2.0


def test_footprint_ratios_and_the_flat_table_of_every_ratio() -> None:
    fp = reporting.footprint_section([0.6, 0.15, 0.2], controller_rss=25 * 2**20, agent_rss=40 * 2**20,
                                     cpu_per_fault=0.003, faults=10)
    assert fp["startup_to_leading_seconds"] == {"n": 3, "best": 0.15, "median": 0.2, "target": 0.3, "ratio": 0.5}
    assert (fp["controller_idle_rss_mib"]["ratio"], fp["agent_idle_rss_mib"]["ratio"]) == (0.5, 1.0)
    assert fp["cpu_ms_per_fault"]["ratio"] == 0.5
    (row,) = reporting.scale_rows([{"nodes": 1, "pods": 150_000, "sync_seconds": 10.0, "bytes_per_pod": 512,
                                    "rss_delta_bytes": 1, "rss_bytes": 200, "peak_rss_bytes": 450}])
    assert (row["target_sync_seconds"], row["ratio_sync"], row["ratio_peak_rss"]) == (20.0, 0.5, 1.5)
    flat = reporting.ratios({"footprint": fp, "scale": [row]})
    assert flat == {"footprint.startup_to_leading_seconds": 0.5, "footprint.controller_idle_rss_mib": 0.5,
                    "footprint.agent_idle_rss_mib": 1.0, "footprint.cpu_ms_per_fault": 0.5,
                    "scale.150000.sync": 0.5, "scale.150000.bytes_per_pod": 0.5, "scale.150000.peak_rss": 1.5}


def test_scale_and_throughput_ratios() -> None:
    (row,) = reporting.scale_rows([{"nodes": 1, "pods": 10, "sync_seconds": 0.2, "bytes_per_pod": 512,
                                    "rss_delta_bytes": 5120}])
    assert (row["ratio_bytes_per_pod"], row["ratio_sync"]) == (0.5, 0.1)
    tp = reporting.throughput_section({"absorbed_per_second": 2000.0, "lag_seconds": [0.1, 0.5]})
    assert (tp["ratio_to_target"], tp["lag_ms"]["p99"], tp["ratio_lag_p99"]) == (2.0, 500.0, 0.5)
    assert reporting.throughput_section({}) == {}


def test_sizes_parse_and_reject_garbage() -> None:
    assert running.parse_sizes("1000x10000, 5000x150000") == [scale.Size(1000, 10_000), scale.Size(5000, 150_000)]
    with pytest.raises(ValueError, match="NODESxPODS"):
        running.parse_sizes("1000")


def _positive_numbers(obj: Any, path: str = "") -> list[str]:
    """Paths of numbers in a report that are not positive and finite (counts may be zero nowhere)."""
    bad = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            bad += _positive_numbers(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            bad += _positive_numbers(v, f"{path}[{i}]")
    elif isinstance(obj, bool):
        pass
    elif isinstance(obj, int | float) and not (obj > 0 and math.isfinite(obj)):
        bad.append(path)
    return bad


def test_bench_command_prints_a_json_report_of_positive_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    # the whole bench, with tiny sizes: simulated API server in a child process, controller worker process
    code = cli.main(["bench", "--report", "json", "--samples", "2", "--xid-samples", "1", "--starts", "1",
                     "--cpu-faults", "2", "--sizes", "20x96", "--rate", "200", "--seconds", "0.5"])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads(out)
    assert set(report) >= {"latency_ms", "floor_ms", "scale", "throughput", "api_requests_per_recovery"}
    assert set(report["latency_ms"]) == {"pod_error", "dra_unhealthy", "xid"}
    for kind in report["latency_ms"].values():
        assert kind["detect"]["n"] >= 1
        assert {"p50", "p99"} <= set(kind["act"])
        assert {"ratio_to_target", "ratio_to_floor_target"} <= set(kind)
    assert report["floor_ms"]["n"] == 2
    (row,) = report["scale"]
    # plus the other scenarios' own: latency's 16 + 1 nodes, 9 pods, the two 4-pod jobs of the cost of one fault
    # (on 8 nodes) and an agent pod; the footprint's node, its agent pod and two 2-pod jobs
    assert (row["nodes"], row["pods"]) == (20 + 16 + 1 + 8 + 1, 96 + 9 + 8 + 1 + 5)
    assert {"sync_seconds", "bytes_per_pod", "ratio_bytes_per_pod", "ratio_sync"} <= set(row)
    assert report["throughput"]["delivered"] == report["throughput"]["updates"]
    assert {"ratio_to_target", "ratio_lag_p99"} <= set(report["throughput"])
    restart = report["api_requests_per_recovery"]["pod_error_restart"]
    deletes = restart["requests"]["controller"]
    assert deletes.get("DELETECOLLECTION pods") == 1 or deletes.get("DELETE pods") == 2  # one per pod
    assert set(report["footprint"]) == {"startup_to_leading_seconds", "controller_idle_rss_mib",
                                        "agent_idle_rss_mib", "cpu_ms_per_fault"}
    assert report["ratios"]["footprint.cpu_ms_per_fault"] > 0
    cost = report["api_requests_per_recovery"]["pod_error_restart_4_pods"]
    assert cost["total"] == sum(sum(c.values()) for c in cost["requests"].values()) > 0
    assert set(cost["purposes"]) == set(cost["requests"]["controller"])
    assert "?" not in cost["purposes"].values()  # every request named with its purpose
    # under restartPolicy Never: the failed pod is terminal, its controller's, and not taken away (so its log
    # stays with it and none is read); the Recovery is created with its status: 3 uid-preconditioned deletes,
    # the ledger write, the Event, the Recovery
    never = report["api_requests_per_recovery"]["pod_error_restart_4_pods_never"]["requests"]["controller"]
    assert never == {"DELETE pods": 3, "CREATE ledgerentries": 1, "CREATE events": 1, "CREATE recoveries": 1}, never
    onfailure = cost["requests"]["controller"]
    assert (onfailure.get("DELETE pods"), onfailure.get("CREATE recoveries")) == (4, 1), onfailure
    assert "PATCH recoveries/status" not in onfailure
    cordon = report["api_requests_per_recovery"]["xid_cordon"]
    assert set(cordon["requests"]) == {"agent", "controller"}
    assert _positive_numbers({k: v for k, v in report.items() if k != "environment"}) == []


def test_restart_section_sets_each_size_against_the_servers_deletecollection_floor() -> None:
    from kcover.bench import restarts
    rows = [restarts.Row("job", 128, 0.5, 128, {"CREATE pods/eviction": 128}),
            restarts.Row("job", 1024, 4.0, 1024, {"CREATE pods/eviction": 1024})]
    sec = restarts.section(rows, {128: 0.25, 1024: 2.5})
    assert [(r["floor_seconds"], r["vs_floor"]) for r in sec["rows"]] == [(0.25, 2.0), (2.5, 1.6)]
    assert sec["ratios"]["job"] == {"pods": 1024, "vs_128": 8.0, "target": 3.0, "floor_vs_128": 10.0}
    text = restarts.markdown(sec)
    assert "the server's own DeleteCollection of as many pods takes 10.0x its 128-pod time" in text
    assert "DeleteCollection of as many" not in restarts.markdown(restarts.section(rows))


def test_restart_section_sets_each_row_against_the_same_removals_from_a_bare_client() -> None:
    from kcover.bench import restarts
    rows = [restarts.Row("pytorchjob", 2048, 6.0, 2048, {"DELETE pods": 2048}, concurrency=16, bare_seconds=4.0),
            restarts.Row("pytorchjob", 2048, 4.5, 2048, {"DELETE pods": 2048}, concurrency=64, bare_seconds=3.0),
            restarts.Row("job", 2048, 5.0, 2048, {"CREATE pods/eviction": 2048}, concurrency=16)]
    sec = restarts.section(rows, {2048: 5.0})
    assert [(r["concurrency"], r.get("bare_seconds"), r.get("vs_bare")) for r in sec["rows"]] == [
        (16, 4.0, 1.5), (64, 3.0, 1.5), (16, None, None)]
    text = restarts.markdown(sec)
    assert "| bare client (s) | / bare |" in text
    assert "| 5.0 | 1.2 | 4.0 | 1.5 | 2048 |" in text  # floor, / floor, bare, / bare, requests
    from kcover.bench import fleet
    names = [f["figure"] for f in fleet.figures({"restarts": sec})]
    assert "pytorchjob of 2048 pods (64 in flight): / the same removals from a bare client (3.0 s)" in names
    assert not [n for n in names if n.startswith("job of 2048 pods") and "bare client" in n]


def test_restart_bench_on_the_simulated_cluster_times_kcover_and_the_floor(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--restarts", "2,4", "--report", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    sec = report["restarts"]
    assert set(sec["floors"]) == {"2", "4"}
    assert all(v > 0 for v in sec["floors"].values())
    rows = {(r["kind"], r["pods"]): r for r in sec["rows"]}
    assert set(rows) == {(k, n) for k in ("jobset", "job", "pytorchjob") for n in (2, 4)}
    for (kind, pods), row in rows.items():
        assert row["removed"] == pods
        assert row["vs_floor"] > 0
        assert row["bare_seconds"] > 0  # the same removals, all answered 2xx
        assert row["vs_bare"] > 0
        assert row["settled_seconds"] > 0  # kcover's scenario waited for its cache; the bare client as long
        assert row["concurrency"] == (16 if kind == "pytorchjob" else 32)  # the product's deletes and evictions
        removal = "DELETE pods" if kind == "pytorchjob" else "CREATE pods/eviction"
        assert row["by_request"][removal] == pods


def test_a_fleet_report_cut_short_after_its_sync_has_the_sync_figures_and_names_no_others() -> None:
    from kcover.bench import fleet
    sync = {"pods": 4000, "nodes": 2000, "sync_seconds": 15.0, "rss_bytes": 100 * 2**20,
            "peak_rss_bytes": 120 * 2**20, "bytes_per_pod": 1500, "cpu_seconds": 6.5,
            "lists": {"pods": 12.5, "nodes": 1.0}}
    got = {f["figure"]: f for f in fleet.figures({"environment": {}, "sync": sync, "relist": {}})}
    assert got["kcover's CPU over the sync"]["measured"] == 6.5
    assert got["the pod list's own time within the sync"]["measured"] == 12.5
    assert got["sync of 4000 pods, 2000 nodes"]["ratio"] == reporting.ratio(15.0, fleet.SYNC_TARGET_SECONDS)
    assert got["peak / synced RSS during the sync"]["measured"] == 1.2
    assert got["peak RSS within the chart's memory limit (MiB)"]["measured"] == 120.0
    assert not [name for name in got if "fault to action" in name or "ledger" in name or "failover" in name]
    text = fleet.markdown({"environment": {"nodes": 2000}, "sync": sync, "figures": list(got.values()),
                           "errors": {"latency": "TimeoutError: x"}})
    assert "| sync of 4000 pods, 2000 nodes | 15.0 s | 30 s |" in text
    assert "Not measured: latency: TimeoutError: x" in text


def test_a_fleet_restart_that_removed_fewer_pods_than_the_bench_made_is_not_reported_as_timed() -> None:
    from kcover.bench import fleet
    rows = [{"kind": "jobset", "pods": 2048, "seconds": 0.0007, "removed": 0, "requests": 0, "throttled": 0},
            {"kind": "pytorchjob", "pods": 2048, "seconds": 6.0, "removed": 2049, "requests": 2051, "throttled": 0}]
    got = {f["figure"]: f for f in fleet.figures({"restarts": {"rows": rows}})}
    assert got["jobset of 2048 pods: only 0 removed (the rest were gone before the restart), not timed"]["measured"] is None
    assert "jobset of 2048 pods: fault to every pod removed" not in got
    assert got["pytorchjob of 2048 pods: fault to every pod removed"]["measured"] == 6.0


async def test_a_roles_timeline_is_the_first_line_of_each_event_between_two_moments() -> None:
    """`footprint.Role.timeline`: what the failover section reports of the survivor's log."""
    lines = ["start", "lease_acquired", "ledger_loaded", "ledger_loaded", "workload_restarted"]
    script = "import json, sys\nfor e in " + repr(lines) + ":\n    print(json.dumps({'event': e}), file=sys.stderr)\n"
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", script, stderr=asyncio.subprocess.PIPE)
    role = footprint.Role(proc, 0, time.perf_counter())
    await role.logged("workload_restarted", timeout=30)
    await proc.wait()
    first = role.lines[1][0]
    timeline = role.timeline(first, role.lines[-1][0])
    assert [event for _, event in timeline] == ["lease_acquired", "ledger_loaded", "workload_restarted"]
    assert timeline[0][0] == 0.0
    assert all(a <= b for (a, _), (b, _) in itertools.pairwise(timeline))
