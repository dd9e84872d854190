"""The preflight verdict, table-tested on the numbers of real nccl-tests runs (tests/fixtures).

Each case is a whole workload: 8 nodes (7 with byes for the odd case) in the round-robin schedule,
every pair reporting what a healthy machine printed, and pairs touching a degraded node reporting what
the same machine printed with NVLink / P2P disabled."""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

import pytest
from kcover_preflight import judging, reports, synthetic

FIXTURES = Path(__file__).parent / "fixtures"
A100 = ("all_reduce_perf_a100_dgx_4gpu_nvswitch.txt", "all_reduce_perf_a100_dgx_4gpu_p2p_disabled_degraded.txt")
H100 = ("all_reduce_perf_h100_dgx_4gpu_nvswitch.txt", "all_reduce_perf_h100_dgx_4gpu_p2p_disabled_degraded.txt")
A40 = ("all_reduce_perf_a40_2gpu_nvlink_pair.txt", "all_reduce_perf_a40_4gpu_p2p_disabled_sys_degraded.txt")


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


def workload(machine: tuple[str, str], slow: Collection[str] = (), *, n: int = 8, go_format: bool = False,
             world_size: int = 4) -> list[judging.Member]:
    nodes = [f"n{i}" for i in range(n)]
    made = synthetic.workload_reports(workload="llm", nodes=nodes, ips=[f"10.0.0.{i + 1}" for i in range(n)],
                                      healthy=text(machine[0]), degraded=text(machine[1]), slow=slow,
                                      go_format=go_format, world_size=world_size)
    return [judging.Member(r.rank, r.node_name, r) for r in made]


# (case, machine, degraded nodes, nodes, relative fraction, absolute GB/s) -> (verdict, slow nodes)
CASES = [
    ("DGX A100 healthy", A100, (), 8, 0.5, 0.0, "Healthy", []),
    ("DGX A100, NVLink off on n3", A100, ("n3",), 8, 0.5, 0.0, "Degraded", ["n3"]),
    ("DGX H100 healthy", H100, (), 8, 0.5, 0.0, "Healthy", []),
    ("DGX H100, NVLink off on n3", H100, ("n3",), 8, 0.5, 0.0, "Degraded", ["n3"]),
    ("A40 NVLink pairs, one node across SYS", A40, ("n3",), 8, 0.5, 0.0, "Degraded", ["n3"]),
    ("two degraded nodes of eight", H100, ("n2", "n5"), 8, 0.5, 0.0, "Degraded", ["n2", "n5"]),
    ("odd count (byes), n3 degraded", A100, ("n3",), 7, 0.5, 0.0, "Degraded", ["n3"]),
    ("relative off, absolute 100 GB/s", A100, ("n3",), 8, 0.0, 100.0, "Degraded", ["n3"]),
    ("relative and absolute both off", A100, ("n3",), 8, 0.0, 0.0, "Healthy", []),
    ("every node degraded: the median is slow too", A100, [f"n{i}" for i in range(8)], 8, 0.5, 0.0, "Healthy", []),
    ("every node degraded, absolute 100 GB/s", A100, [f"n{i}" for i in range(8)], 8, 0.5, 100.0, "Degraded",
     [f"n{i}" for i in range(8)]),
    ("healthy DGX H100 against an absolute 400 GB/s", H100, (), 8, 0.5, 400.0, "Degraded",
     [f"n{i}" for i in range(8)]),
    ("two nodes: one pair, relative cannot fire", H100, ("n1",), 2, 0.5, 0.0, "Healthy", []),
    ("two nodes: the pair under the threshold blames both ends", H100, ("n1",), 2, 0.5, 100.0, "Degraded",
     ["n0", "n1"]),
]


@pytest.mark.parametrize(("case", "machine", "degraded", "n", "fraction", "absolute", "verdict", "slow"), CASES,
                         ids=[c[0] for c in CASES])
@pytest.mark.parametrize("go_format", [False, True], ids=["native", "go"])
def test_verdict(case: str, machine: tuple[str, str], degraded: Collection[str], n: int, fraction: float,
                 absolute: float, verdict: str, slow: list[str], go_format: bool) -> None:
    world = 2 if machine is A40 else 4  # the A40 NVLink pair ran with -g 2
    judged = judging.judge(workload(machine, degraded, n=n, go_format=go_format, world_size=world), size=n,
                           relative_fraction=fraction, absolute_gbps=absolute)
    assert (judged.verdict.value, sorted(judged.slow_nodes)) == (verdict, slow)


def test_the_numbers_judged_are_the_fixtures() -> None:
    judged = judging.judge(workload(H100, ("n3",)), size=8)
    bad = [p for p in judged.pairs if "n3" in p.nodes]
    good = [p for p in judged.pairs if "n3" not in p.nodes]
    assert len(bad) == 7
    assert len(good) == 21
    assert {p.busbw_gbps for p in bad} == {19.98}
    assert {p.busbw_gbps for p in good} == {370.70}
    assert {p.median_gbps for p in judged.pairs} == {370.70}
    assert {p.size_bytes for p in judged.pairs} == {8589934592}
    assert all(p.slow for p in bad)
    assert not any(p.slow for p in good)
    assert "19.98 GB/s below 0.5 x the median 370.70 GB/s" in judged.slow_nodes["n3"]


def test_one_flaky_pair_blames_nobody() -> None:
    """A pair slow in one round only (no degraded node): each end is slow in 1 of its 7 pairs."""
    members = workload(A100)
    for m in members:
        for b in m.report.batches:
            if sorted(b.pair) == ["10.0.0.2", "10.0.0.7"]:
                b.nccl_tests = text(A100[1])
    judged = judging.judge(members, size=8)
    assert [p.nodes for p in judged.pairs if p.slow] == [("n1", "n6")]
    assert judged.verdict is judging.Verdict.HEALTHY
    assert judged.slow_nodes == {}


def test_failed_rounds_and_checks_count() -> None:
    members = workload(A100)
    for m in members:
        for b in m.report.batches:
            if "10.0.0.4" in b.pair:  # every pair of n3 fails
                b.status = reports.BatchStatus.FAIL
                b.error = "mpirun exited with 1"
    members[5].report.gpu_check = reports.Check.FAIL
    judged = judging.judge(members, size=8)
    assert judged.slow_nodes == {"n3": "slow in 7 of its 7 pairs (mpirun exited with 1)",
                                 "n5": "gpu check failed on rank 5"}


def test_a_refused_nccl_tests_output_fails_its_pair() -> None:
    members = workload(H100)
    for m in members:
        for b in m.report.batches:
            if "10.0.0.1" in b.pair:
                b.nccl_tests = text("all_reduce_perf_rtx5090_2gpu_test_nccl_failure.txt")
    judged = judging.judge(members, size=8)
    assert sorted(judged.slow_nodes) == ["n0"]
    assert "Test NCCL failure common.cu:392" in judged.slow_nodes["n0"]


def test_missing_ranks_make_it_incomplete() -> None:
    members = [m for m in workload(H100) if m.rank not in (2, 6)]
    silent = {"10.0.0.3": "n2", "10.0.0.7": "n6"}  # where the workload's silent pods run, as the cluster says
    judged = judging.judge(members, size=8, nodes=silent)
    assert judged.verdict is judging.Verdict.INCOMPLETE
    assert judged.missing_ranks == (2, 6)
    assert len(judged.pairs) == 27  # the silent ranks' pairs come from their peers' reports, all but 2-6
    assert judged.foreign_pairs == 0
    unknown = judging.judge(members, size=8)  # nodes the cluster does not place the workload on: left out
    assert len(unknown.pairs) == 15
    assert unknown.foreign_pairs == 12


def test_pair_entries_name_only_the_workloads_nodes() -> None:
    """A report's pair may name anything: an IP or a node name that is not one of the workload's nodes says
    nothing about that node, however slow it claims the pair was (it was taken as a node name)."""
    members = workload(H100)
    forged = members[0].report.model_copy(update={"batches": [
        *members[0].report.batches,
        *(reports.Batch(batch_idx=100 + i, pair=["10.0.0.1", victim], self_ip="10.0.0.1",
                        status=reports.BatchStatus.FAIL, error="forged") for i, victim in
          enumerate(("victim-node", "10.9.9.9", "victim-node-2")))]})
    judged = judging.judge([judging.Member(0, "n0", forged), *members[1:]], size=8)
    assert judged.verdict is judging.Verdict.HEALTHY
    assert not judged.slow_nodes
    assert judged.foreign_pairs == 3
    assert all(set(p.nodes) <= {m.node for m in members} for p in judged.pairs)


def test_a_failed_gpu_check_counts_only_on_a_gpu_node() -> None:
    members = workload(H100)
    claims = members[2].report.model_copy(update={"gpu_check": reports.Check.FAIL})
    on_cpu = judging.judge([*members[:2], judging.Member(2, "n2", claims, gpu_node=False), *members[3:]], size=8)
    assert not on_cpu.slow_nodes
    on_gpu = judging.judge([*members[:2], judging.Member(2, "n2", claims), *members[3:]], size=8)
    assert sorted(on_gpu.slow_nodes) == ["n2"]


def test_a_go_format_file_judges_as_the_native_format(tmp_path: Path) -> None:
    """A report file in the Go project's schema, written field by field, against nccl-tests' own output."""
    healthy = text(A100[0])
    degraded = text(A100[1])
    rounds = [[(0, 3), (1, 2)], [(0, 2), (1, 3)], [(0, 1), (2, 3)]]
    ips = ["10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4"]
    # the largest row of each fixture: 8589934592 B = 2147483648 float32 in 54894 us (healthy), 2479229 us (degraded)
    time_ms = {healthy: 54.894, degraded: 2479.229}
    go_members, native_members = [], []
    for rank in range(4):
        go_batches, native_batches = [], []
        for idx, pairs in enumerate(rounds):
            a, b = next(p for p in pairs if rank in p)
            output = degraded if 2 in (a, b) else healthy
            common = {"batch_idx": idx, "pair": [ips[a], ips[b]], "self_ip": ips[rank], "status": "ok"}
            go_batches.append({**common, "allreduce_ms": time_ms[output], "world_size": 4,
                               "allreduce_shape": [2147483648], "dtype_bytes": 4})
            native_batches.append({**common, "nccl_tests": output})
        head = {"version": "v1", "workload": "llm", "workload_size": 4, "rank": rank, "node_name": f"node-{rank}",
                "node_ip": ips[rank], "gpu_check": 1, "storage_check": 1, "node_check_busbw_threshold_gbps": "0"}
        path = tmp_path / "ml" / f"llm-{rank}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({**head, "batches": go_batches}))
        go_members.append(judging.Member(rank, f"node-{rank}", reports.parse(path.read_bytes())))
        native_members.append(judging.Member(rank, f"node-{rank}",
                                             reports.Report.model_validate({**head, "batches": native_batches})))
    go = judging.judge(go_members, size=4)
    native = judging.judge(native_members, size=4)
    assert (go.verdict, sorted(go.slow_nodes)) == (native.verdict, sorted(native.slow_nodes)) == (
        judging.Verdict.DEGRADED, ["node-2"])
    assert [round(p.busbw_gbps or 0, 2) for p in go.pairs] == [p.busbw_gbps for p in native.pairs]


def test_the_go_threshold_string_applies_when_the_setting_is_off() -> None:
    members = workload(A100)
    for m in members:
        m.report.node_check_busbw_threshold_gbps = "300"
    assert len(judging.judge(members, size=8).slow_nodes) == 8
    assert judging.judge(members, size=8, absolute_gbps=100.0).slow_nodes == {}
    for m in members:
        m.report.node_check_busbw_threshold_gbps = "not a number"
    assert judging.judge(members, size=8).slow_nodes == {}


@pytest.mark.parametrize(("raw", "why"), [
    ("[]", "a JSON object"),
    ("{", "not JSON"),
    ('{"workload": "w"}', "workload_size: Field required"),
    ('{"workload": "w", "workload_size": 2, "rank": 0, "gpu_check": 5}', "gpu_check"),
])
def test_unreadable_reports_are_refused(raw: str, why: str) -> None:
    with pytest.raises(reports.ReportError, match=why):
        reports.parse(raw)
