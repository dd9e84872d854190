"""`kcover sim chaos` at CI size: faults while the API server throttles, fails, lags, drops watches,
compacts and restarts, and the leader is killed. Asserts what the cluster ends up holding: every fault
answered (a restart or a refusal), none answered twice, no pod touched without a fault.

The full run (K = 200 on three seeds) is a CLI run whose figures go into the change's notes, not a test.
This run was kept out of CI for a while; meanwhile two regressions went unseen that it shows: the breaker's
window limit at 1% of six nodes latched the breaker on the second node fault, and a suspect's validation
asked by a leader that then went was never read again (its restart held past the run's loss time). Kept out
again after duplicate counts on a loaded machine that were the harness's own miscounts of needed restarts
(a job joining a node fault in the sample of its restart, or before it), it runs in CI again with both
fixed; its runs on a loaded machine also found a rank left on a node after its cordon (`latearrivals`).
"""

from __future__ import annotations

import argparse
import asyncio
import types

import pytest

from kcover.aio import clock as clock_
from kcover.sim import chaos, playing, running
from kcover.sim import cluster as cluster_


def chaos_args(**overrides: object) -> argparse.Namespace:
    values: dict[str, object] = {"faults": 30, "throttle_rate": 0.05, "error_rate": 0.02, "latency_ms": 200.0,
                                 "kill_every": 10, "apiserver_restart_every": 15, "seed": 11}
    values.update(overrides)
    return argparse.Namespace(**values)


@pytest.mark.timeout(600)  # about 2.5 min alone; more beside the suite's other worker on two cores
async def test_chaos_loses_nothing_duplicates_nothing_and_touches_nothing_else() -> None:
    args = chaos_args()
    scenario = running.chaos_scenario(args)
    report = await running.run_scenario(scenario, cluster_.Size(nodes=6, jobs=6, seed=11))
    tally = report.chaos
    assert tally is not None
    print(running.render(report).splitlines()[-3:])
    assert tally["injected"] == 30
    assert tally["node_faults"] >= 1, "node faults too (NVML XID 79: a cordon and every job on the node restarted)"
    assert tally["lost"] == 0, tally["lost_detail"]
    assert tally["duplicates"] == 0, tally["lost_detail"]
    assert tally["wrongly_touched_pods"] == 0, tally["lost_detail"]
    assert tally["recovered"] + tally["refused"] == 30
    assert tally["leader_kills"] == 3
    assert tally["apiserver_restarts"] == 2
    assert tally["api_retries"] > 0, "the API server's faults were ridden out by retries"
    assert report.passed
    await asyncio.sleep(0.5)  # the restarted API server's cancelled handlers finish their last turn
    # (the suite's task-leak fixture then fails the test if anything the run started is still running)


def _accounting(faults: list[chaos.Fault], restarts: dict[str, list[float]]) -> chaos.Tally:
    """`Chaos._count_restarts` over given faults and restarts (no cluster runs)."""
    play = object.__new__(chaos.Chaos)
    play.faults, play.restarted_at, play.tally = faults, restarts, chaos.Tally()
    play.c = types.SimpleNamespace(size=types.SimpleNamespace(pods_per_job=4))
    play.loop = asyncio.get_running_loop()
    play._count_restarts()
    return play.tally


def _fault(kind: str, jobs: tuple[str, ...], at: float, **kw: object) -> chaos.Fault:
    record = playing.FaultRecord(kind, "target", injected_at=clock_.utcnow())
    return chaos.Fault(kind, "target", jobs, at, record, **kw)  # type: ignore[arg-type]


async def test_a_node_faults_restart_of_a_job_that_landed_on_the_node_after_it_is_no_duplicate() -> None:
    """A job restarted for its own fault just after a node fault (its new pod scheduled onto the node before the
    node's cordon) is restarted again for the node: that answers the node fault, seen joining it when its
    pod appeared there. A second restart with no fault is still a duplicate."""
    own = _fault("workload", ("a",), 10.0)
    node = _fault("node", ("b", "a"), 9.5, node="n3", joined={"a": 13.0})
    tally = _accounting([own, node], {"a": [12.0, 20.0], "b": [20.0]})
    assert (tally.restarts, tally.duplicates, tally.wrongly_touched_pods) == (3, 0, 0)
    tally = _accounting([own, _fault("node", ("b",), 9.5, node="n3")], {"a": [12.0, 20.0], "b": [20.0]})
    assert (tally.restarts, tally.duplicates) == (3, 1)


async def test_a_job_joining_a_node_fault_in_the_sample_that_sees_its_restart_is_no_duplicate() -> None:
    """The sampler saw a job's restart and its new pod already bound to the faulty node in one sample (a loaded
    machine samples late): the join is at that restart's time, and the node's restart of the job after it
    answers the node fault. Seen in a CI-sized run: `duplicate restart of train-4 11.0s after the last`."""
    own = _fault("workload", ("a",), 10.0)
    node = _fault("node", ("b", "a"), 9.5, node="n3", joined={"a": 12.0})
    tally = _accounting([own, node], {"a": [12.0, 23.0], "b": [20.0]})
    assert (tally.restarts, tally.duplicates, tally.wrongly_touched_pods) == (3, 0, 0), tally.detail
    # the restart that made the joining pod does not answer the join; only one after it does
    tally = _accounting([own, _fault("node", ("b", "a"), 9.5, node="n3", joined={"a": 12.0})], {"a": [12.0], "b": [20.0]})
    assert (tally.restarts, tally.duplicates) == (2, 0)


class _Pods:
    """The few parts of the simulated cluster `Chaos._sample` reads: the jobs' pods and whether a node is cordoned."""

    def __init__(self, pods: dict[str, list[tuple[str, str, bool]]]) -> None:
        self.jobs = list(pods)
        self.pods = pods
        self.srv = types.SimpleNamespace(store=types.SimpleNamespace(get=lambda *_: {"spec": {}}))

    def job_pods(self, job: str) -> list[dict[str, object]]:
        return [{"metadata": {"uid": uid, **({"deletionTimestamp": "x"} if deleting else {})}, "spec": {"nodeName": node}}
                for uid, node, deleting in self.pods[job]]


async def test_a_new_pod_on_the_faulty_node_joins_when_its_jobs_restart_is_seen_not_before() -> None:
    """A job's restart still under way (one old pod not deleted yet) while a new pod already runs on the
    faulty node: the join waits for the restart to be seen, so the node's restart of the job after it is no
    duplicate. Seen in a CI-sized run (seed 21): the join came 1 s before the restart it followed from."""
    play = object.__new__(chaos.Chaos)
    cluster = _Pods({"a": [("old1", "n1", False), ("old2", "n2", False)], "b": [("b1", "n3", False)]})
    play.c, play.loop, play.tally = cluster, asyncio.get_running_loop(), chaos.Tally()  # type: ignore[assignment]
    play.base, play.restarted_at = {"a": {"old1", "old2"}, "b": {"b1"}}, {"a": [], "b": []}
    node = _fault("node", ("b",), play.loop.time(), node="n3")
    play.faults = [_fault("workload", ("a",), play.loop.time()), node]
    cluster.pods["a"] = [("old1", "n1", True), ("old2", "n2", False), ("new1", "n3", False)]
    play._sample()  # mid-restart: new1 on the node, old2 not deleted yet
    assert (node.jobs, play.restarted_at["a"]) == (("b",), [])
    await asyncio.sleep(0.01)
    cluster.pods["a"] = [("old2", "n2", True), ("new1", "n3", False), ("new2", "n1", False)]
    play._sample()
    restarted = play.restarted_at["a"]
    assert len(restarted) == 1
    assert node.jobs == ("b", "a")
    assert node.since("a") == restarted[0], "joined in the sample that saw the restart"
    restarted.append(restarted[0] + 12.0)  # the node's restart of "a"
    play.restarted_at["b"].append(restarted[0] + 12.0)
    play.c.size = types.SimpleNamespace(pods_per_job=2)  # type: ignore[assignment]
    play._count_restarts()
    assert (play.tally.restarts, play.tally.duplicates, play.tally.wrongly_touched_pods) == (3, 0, 0), play.tally.detail
