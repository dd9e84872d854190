"""The nccl-tests parser on real outputs: every fixture parses to the numbers it prints, or is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kcover_preflight import nccltests

FIXTURES = Path(__file__).parent / "fixtures"

# file -> (rows, ranks listed, printed Avg bus bandwidth, largest size, its out-of-place busbw, its time in us)
PARSED = {
    "all_reduce_perf_h100_2node_16gpu_gcp_a3mega.txt": (31, 16, 70.742, 8589934592, 338.82, 47535.0),
    "all_reduce_perf_a100_2node_16gpu_p4d_efa_mpijob_log.txt": (30, 16, 11.2432, 4294967296, 43.81, 183834.0),
    "all_reduce_perf_a40_2gpu_nvlink_pair.txt": (4, None, 47.4509, 8589934592, 47.49, 180860.0),
    "all_reduce_perf_a40_4gpu_p2p_disabled_sys_degraded.txt": (4, None, 1.40216, 8589934592, 1.35, 9542917.0),
    "all_reduce_perf_a100_dgx_4gpu_nvswitch.txt": (4, None, 222.066, 8589934592, 234.72, 54894.0),
    "all_reduce_perf_a100_dgx_4gpu_p2p_disabled_degraded.txt": (4, None, 5.19883, 8589934592, 5.20, 2479229.0),
    "all_reduce_perf_h100_dgx_4gpu_nvswitch.txt": (4, None, 369.941, 8589934592, 370.70, 34758.0),
    "all_reduce_perf_h100_dgx_4gpu_p2p_disabled_degraded.txt": (4, None, 22.9255, 8589934592, 19.98, 644771.0),
}
REFUSED = {
    "all_reduce_perf_rtx5090_2gpu_test_nccl_failure.txt":
        "nccl-tests failed: GENOA-06: Test NCCL failure common.cu:392 'unhandled cuda error",
    "all_gather_perf_v100_8gpu_out_of_bounds_failed.txt": "nccl-tests found 2 out-of-bounds values",
}


def test_every_fixture_is_covered() -> None:
    assert sorted(p.name for p in FIXTURES.glob("*.txt")) == sorted({*PARSED, *REFUSED})


@pytest.mark.parametrize("name", sorted(PARSED))
def test_fixture_parses_to_the_numbers_it_prints(name: str) -> None:
    rows, ranks, avg, size, busbw, time_us = PARSED[name]
    run = nccltests.parse((FIXTURES / name).read_text())
    assert len(run.rows) == rows
    assert run.ranks == ranks
    assert run.avg_busbw_gbps == avg
    assert run.out_of_bounds == 0
    largest = run.largest
    assert (largest.size_bytes, largest.out_of_place.busbw_gbps, largest.out_of_place.time_us) == (size, busbw, time_us)
    # the printed average is nccl-tests' mean over every size and placement; the rows give it back
    assert run.computed_avg_busbw() == pytest.approx(avg, abs=0.01)
    # algbw is size / time (GB = 1e9 B, time in us), as printed to 2 decimals
    assert largest.out_of_place.algbw_gbps == pytest.approx(size / time_us / 1e3, rel=0.01)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_failures_are_refused_with_the_reason(name: str) -> None:
    with pytest.raises(nccltests.ParseRefused) as refused:
        nccltests.parse((FIXTURES / name).read_text())
    assert str(refused.value).startswith(REFUSED[name])


def test_launcher_prefixes_and_nccl_info_lines_are_ignored() -> None:
    text = (FIXTURES / "all_reduce_perf_a100_2node_16gpu_p4d_efa_mpijob_log.txt").read_text()
    assert text.count("NCCL INFO") > 500
    plain = "\n".join(nccltests.strip_launcher(line) for line in text.splitlines() if "NCCL INFO" not in line)
    assert nccltests.parse(plain) == nccltests.parse(text)
    first = nccltests.parse(text).rows[0]
    assert (first.size_bytes, first.count, first.dtype, first.redop) == (8, 2, "float", "sum")
    assert first.out_of_place.wrong is None  # the old `error` column is a max delta, not a count


def test_a_row_with_wrong_elements_is_refused() -> None:
    lines = (FIXTURES / "all_reduce_perf_a100_dgx_4gpu_nvswitch.txt").read_text().splitlines()
    lines[3] = lines[3].replace("      0   7161.8", "     12   7161.8")
    with pytest.raises(nccltests.ParseRefused, match="wrong elements"):
        nccltests.parse("\n".join(lines))


@pytest.mark.parametrize(("text", "why"), [
    ("", "no nccl-tests table header"),
    ("# nThread 1 nGpus 8\n#\n# Using devices\n", "no nccl-tests table header"),
    ("#       size         count      type   redop    root     time   algbw   busbw #wrong\n", "no nccl-tests result rows"),
    ('{"version": 2}', "no `results` list"),
    ("{not json", "not a nccl-tests JSON report"),
])
def test_output_without_a_measurement_is_refused(text: str, why: str) -> None:
    with pytest.raises(nccltests.ParseRefused, match=why):
        nccltests.parse(text)


def as_json_report(run: nccltests.Run) -> str:
    """AUTHORED: the `-J` document nccl-tests (JSON_FILE_VERSION 2, src/util.cu) writes for `run`'s numbers."""
    def side(s: nccltests.Side | None) -> object:
        return None if s is None else {"time": s.time_us, "alg_bw": s.algbw_gbps, "bus_bw": s.busbw_gbps,
                                       "nwrong": s.wrong}
    return json.dumps({
        "version": 2, "start_time": "2023-10-31 10:00:00", "args": ["all_reduce_perf", "-b", "1G", "-e", "10G"],
        "env": [], "nccl_version": 21602, "config": {"nthreads": 1, "ngpus": 4, "devices": []},
        "results": [{"size": r.size_bytes, "count": r.count, "type": r.dtype, "redop": r.redop, "root": "    -1",
                     "out_of_place": side(r.out_of_place), "in_place": side(r.in_place), "actual_iterations": 20,
                     "experiment_name": ""} for r in run.rows],
        "out_of_bounds": {"count": 0, "okay": "true"},
        "average_bus_bandwidth": {"bandwidth": run.avg_busbw_gbps, "okay": "unchecked"},
        "errors": [], "end_time": "2023-10-31 10:01:00"})


def test_json_report_parses_to_the_same_numbers_as_the_table() -> None:
    table = nccltests.parse((FIXTURES / "all_reduce_perf_a100_dgx_4gpu_nvswitch.txt").read_text())
    from_json = nccltests.parse(as_json_report(table))
    assert from_json.rows == table.rows
    assert from_json.avg_busbw_gbps == 222.066


def test_json_report_with_errors_or_out_of_bounds_is_refused() -> None:
    table = nccltests.parse((FIXTURES / "all_reduce_perf_a100_dgx_4gpu_nvswitch.txt").read_text())
    doc = json.loads(as_json_report(table))
    with pytest.raises(nccltests.ParseRefused, match="failed: unhandled cuda error"):
        nccltests.parse(json.dumps({**doc, "errors": ["unhandled cuda error"]}))
    with pytest.raises(nccltests.ParseRefused, match="3 out-of-bounds"):
        nccltests.parse(json.dumps({**doc, "out_of_bounds": {"count": 3, "okay": "false"}}))
