"""The reference init container: its round-robin schedule and its reports, without GPUs.

Four ranks play their rounds for real on loopback (each on its own port, `port_stride` 1), with a fake
nccl-tests runner that prints a recorded output; the reports they write are then judged. The real
nccl-tests invocation runs only where `all_reduce_perf` is installed."""

from __future__ import annotations

import itertools
import json
import shutil
import socket
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from kcover_preflight import initcontainer, judging, reports

FIXTURES = Path(__file__).parent / "fixtures"
HEALTHY = (FIXTURES / "all_reduce_perf_h100_dgx_4gpu_nvswitch.txt").read_text()
DEGRADED = (FIXTURES / "all_reduce_perf_h100_dgx_4gpu_p2p_disabled_degraded.txt").read_text()


@pytest.mark.parametrize("n", range(1, 13))
def test_schedule_meets_every_pair_once_and_every_node_once_per_round(n: int) -> None:
    rounds = initcontainer.schedule(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    met = [tuple(p) for r in rounds for p in r if p[1] is not None]
    assert sorted(met) == sorted(itertools.combinations(range(n), 2))
    for r in rounds:
        seen = [x for p in r for x in p if x is not None]
        assert sorted(seen) == list(range(n))  # every node once per round, a bye at most once
        assert sum(1 for p in r if p[1] is None) == n % 2
    byes = [p[0] for r in rounds for p in r if p[1] is None]
    assert sorted(byes) == (list(range(n)) if n % 2 else [])  # with an odd count each node sits out once


def test_keep_drops_nccl_info_and_keeps_the_tail() -> None:
    log = (FIXTURES / "all_reduce_perf_a100_2node_16gpu_p4d_efa_mpijob_log.txt").read_text()
    kept = initcontainer.keep(log)
    assert "NCCL INFO" not in kept
    assert "Avg bus bandwidth    : 11.2432" in kept
    assert len(initcontainer.keep(log, limit=1000).encode()) <= 1000


def free_ports(count: int) -> int:
    """A base port with `count` free ports after it (best effort)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count < 65535 and all(_free(base + i) for i in range(count)):
            return base
    raise RuntimeError("no free ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def recorded(slow_rank: int | None) -> initcontainer.Runner:
    """A fake nccl-tests run: the degraded recording for the pairs with `slow_rank`, the healthy one otherwise."""
    def runner(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        ends = argv[argv.index("-H") + 1].split("-")
        return 0, DEGRADED if slow_rank is not None and f"rank{slow_rank}" in ends else HEALTHY
    return runner


def play(tmp_path: Path, n: int, runner: initcontainer.Runner) -> list[Path]:
    base = free_ports(n)
    ips = ["127.0.0.1"] * n  # one host: ranks tell each other apart by port
    calls: list[list[str]] = []
    calls_lock = threading.Lock()

    def counted(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        with calls_lock:
            calls.append(list(argv))
        return runner(argv, timeout)

    paths: list[Path] = []
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            opts = initcontainer.Options(namespace="ml", workload="llm", index=rank, rank=rank, peers=ips,
                                         node_name=f"node-{rank}", node_ip=f"10.9.0.{rank + 1}",
                                         report_dir=tmp_path, port=base, port_stride=1, round_timeout=20.0,
                                         gpus=2, message_bytes=1 << 20,
                                         command="all_reduce_perf -H rank{low_ip}-{high_ip} -np {np} -b {bytes}")
            doc = initcontainer.report(opts, initcontainer.run_rounds(opts, runner=tagging(counted, rank, n)))
            paths.append(initcontainer.write_report(opts, doc))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,), name=f"rank-{r}") for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(calls) == n * (n - 1) // 2  # one nccl-tests run per pair, by its lower rank
    return sorted(paths)


def tagging(runner: initcontainer.Runner, rank: int, n: int) -> initcontainer.Runner:
    """Rewrite `-H rank127.0.0.1-127.0.0.1` to name the pair's ranks (loopback IPs are all alike)."""
    rounds = initcontainer.schedule(n)
    counter = iter(range(len(rounds)))

    def run(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        idx = next(counter)
        while initcontainer.peer_of(rank, rounds[idx]) is None:
            idx = next(counter)
        peer = initcontainer.peer_of(rank, rounds[idx])
        assert peer is not None
        argv = [*argv]
        argv[argv.index("-H") + 1] = f"rank{rank}-rank{peer}"
        return runner(argv, timeout)
    return run


@pytest.mark.timeout(120)
def test_four_ranks_write_reports_that_judge_the_slow_node(tmp_path: Path) -> None:
    paths = play(tmp_path, 4, recorded(slow_rank=2))
    assert [p.name for p in paths] == ["llm-0.json", "llm-1.json", "llm-2.json", "llm-3.json"]
    assert all(p.parent == tmp_path / "ml" for p in paths)
    members = []
    for p in paths:
        raw = json.loads(p.read_text())
        assert set(raw) >= {"version", "workload", "workload_size", "rank", "node_name", "node_ip", "gpu_check",
                            "storage_check", "node_check_busbw_threshold_gbps", "batches"}
        assert isinstance(raw["node_check_busbw_threshold_gbps"], str)
        report = reports.parse(p.read_text())
        assert [b.batch_idx for b in report.batches] == [0, 1, 2]
        assert all(b.status is reports.BatchStatus.OK and b.nccl_tests for b in report.batches)  # both ends have it
        members.append(judging.Member(report.rank, report.node_name, report))
    # the loopback run uses one IP for every rank: name the pairs by the node IPs the reports state
    rounds = initcontainer.schedule(4)
    for m in members:
        for b in m.report.batches:
            peer = initcontainer.peer_of(m.rank, rounds[b.batch_idx])
            assert peer is not None
            b.pair = sorted([f"10.9.0.{m.rank + 1}", f"10.9.0.{peer + 1}"])
    judged = judging.judge(members, size=4)
    assert judged.verdict is judging.Verdict.DEGRADED
    assert sorted(judged.slow_nodes) == ["node-2"]


@pytest.mark.timeout(120)
def test_no_node_is_in_two_measurements_at_once_and_each_result_reaches_its_rounds_peer(tmp_path: Path) -> None:
    """Round 0 pairs 0 with 3 and 1 with 2, round 1 pairs 1 with 3. While 0 and 3 measure slowly, 1 is done
    with round 0 and must wait for 3 to finish before measuring with it: two measurements on one node at
    once would each see half the bandwidth, and 3 would take the first result to arrive for round 0's."""
    lock = threading.Lock()
    busy: dict[str, str] = {}
    overlaps: list[tuple[str, str]] = []
    other_on_3 = threading.Event()
    healthy = recorded(slow_rank=None)

    def runner(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        pair = argv[argv.index("-H") + 1]
        nodes = pair.split("-")
        with lock:
            overlaps.extend((pair, busy[node]) for node in nodes if node in busy)
            busy.update(dict.fromkeys(nodes, pair))
            if "rank3" in nodes and pair != "rank0-rank3":
                other_on_3.set()
        if pair == "rank0-rank3":  # the slow pair: gives a measurement on node 3 up to 3 s to start alongside
            other_on_3.wait(3.0)
        code, output = healthy(argv, timeout)
        if pair == "rank0-rank3":
            output = DEGRADED  # only round 0 of rank 3 may carry this one
        with lock:
            for node in nodes:
                if busy.get(node) == pair:
                    del busy[node]
        return code, output

    paths = play(tmp_path, 4, runner)
    assert overlaps == []
    outputs = {(r.rank, b.batch_idx): b.nccl_tests for r in (reports.parse(p.read_text()) for p in paths)
               for b in r.batches}
    slow, fine = initcontainer.keep(DEGRADED), initcontainer.keep(HEALTHY)
    assert outputs == {(r, i): slow if (r, i) in ((0, 0), (3, 0)) else fine for r in range(4) for i in range(3)}


def test_a_peer_that_never_answers_fails_the_round(tmp_path: Path) -> None:
    base = free_ports(2)
    opts = initcontainer.Options(namespace="ml", workload="llm", index=1, rank=1, peers=["127.0.0.1", "127.0.0.1"],
                                 node_name="node-1", node_ip="10.9.0.2", report_dir=tmp_path, port=base,
                                 port_stride=1, round_timeout=0.5)
    (batch,) = initcontainer.run_rounds(opts)
    assert batch["status"] == "fail"
    assert "no result from rank 0" in str(batch["error"])


def test_arguments_are_checked() -> None:
    with pytest.raises(SystemExit) as exited:
        initcontainer.parse_args([], {})
    assert exited.value.code == 2
    opts = initcontainer.parse_args(["--peers", "10.0.0.1,10.0.0.2"],
                                    {"POD_NAMESPACE": "ml", "PREFLIGHT_WORKLOAD": "llm", "JOB_COMPLETION_INDEX": "1",
                                     "NODE_NAME": "node-b"})
    assert (opts.rank, opts.index, opts.node_ip, opts.node_name) == (1, 1, "10.0.0.2", "node-b")


@pytest.mark.skipif(shutil.which("all_reduce_perf") is None, reason="nccl-tests (all_reduce_perf) is not installed")
def test_real_nccl_tests_output_parses() -> None:
    """Where nccl-tests exists: one GPU, one process, its output through the plugin's parser."""
    from kcover_preflight import nccltests

    code, output = initcontainer.run_command(["all_reduce_perf", "-b", "8M", "-e", "8M", "-g", "1"], 300.0)
    assert code == 0, output
    run = nccltests.parse(initcontainer.keep(output))
    assert run.largest.size_bytes == 8 * 1024 * 1024
    assert run.avg_busbw_gbps is not None
