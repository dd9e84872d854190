"""An agent's RDMA link report, as the controller receives it, end to end on virtual time against the
simulated cluster: a flapping or dead port cordons its node once and restarts the job there; one link-down
(evidence only) moves nothing by itself, and cordons its node before the restart of a job with a rank there
whose collective fails within `recovery.judgement.link_seconds`, unless more of the job's nodes saw one
(a switch's reboot), the link-down is older, or the job's failure is an XID.

The events are what the event watcher publishes from the agent's Events (the detector's own output, its
`fault.check` and recommendation, is tested in tests/detectors/test_rdma_link.py).
"""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from harness import engines
from test_judgement import cordoned, job, node_writes, nodes, pod_fault, xid

from kcover import model
from kcover.recovery import ledgerentries

pytestmark = pytest.mark.looptime


def link_report(node: str, what: str, action: model.Action) -> model.CollectorEvent:
    """The agent's RdmaLinkFlapping (or Flapped, Down) Event about `node`, as the event watcher publishes it:
    a flapped one (one link-down) carries its evidence and asks for nothing."""
    reason = {"flapping": "RdmaLinkFlapping", "down": "RdmaLinkDown", "flapped": "RdmaLinkFlapped"}[what]
    return model.CollectorEvent(
        detector="event-watcher", severity=model.Severity.ERROR, reason=reason,
        message=f"RDMA port mlx5_3 port 1 (InfiniBand): {what}", recommended=action,
        target=model.Target(kind=model.TargetKind.NODE, name=node, node=node),
        fault=model.Fault(check="" if what == "flapped" else f"rdma/mlx5_3/1/{what}"), observed_at=engines.START,
        evidence=model.Evidence.LINK_DOWN if what == "flapped" else None)


def link_down(node: str) -> model.CollectorEvent:
    return link_report(node, "flapped", model.Action.REPORT)


def at(event: model.CollectorEvent, seconds: float) -> model.CollectorEvent:
    """`event` observed `seconds` after the replay's start (the virtual clock's)."""
    return event.model_copy(update={"observed_at": engines.START + dt.timedelta(seconds=seconds)})


def link_downs(r: engines.Rig, node: str) -> tuple[float, ...]:
    """The link-downs the node's LedgerEntry object holds, as the API server stores it."""
    for item in r.store.iter_objects("ledgerentries.kcover.io"):
        parsed = ledgerentries.parse_body(item)
        if parsed is not None and parsed[0] == f"n.{node}" and isinstance(parsed[1].entry, ledgerentries.Node):
            return parsed[1].entry.link_downs
    return ()


def deleted_pods(r: engines.Rig) -> int:
    return sum(v for k, v in r.writes().items() if k.startswith("DELETE") and " pods" in k)


@pytest.mark.parametrize("what", ["flapping", "down"])
async def test_a_bad_link_cordons_its_node_once_and_restarts_the_job_with_a_rank_there(what: str) -> None:
    objs = [*nodes(4), *job("big", ["n0", "n1", "n2", "n3"]), *job("elsewhere", ["n2"])]
    async with engines.rig(objs) as r:
        await r.handle(link_report("n1", what, model.Action.CORDON_NODE_AND_RESTART))
        assert cordoned(r) == ["n1"]
        (cordon,) = r.events("KcoverCordonedNode")
        assert "n1" in cordon["involvedObject"]["name"]
        restarted = r.events("KcoverRestartedWorkload")
        assert [e["involvedObject"]["name"] for e in restarted] == ["big"]
        assert deleted_pods(r) == 4, "the whole job, not the job on another node"
        await asyncio.sleep(30)
        await r.handle(link_report("n1", what, model.Action.CORDON_NODE_AND_RESTART))
        await r.tick()
        assert len(r.events("KcoverCordonedNode")) == 1, "once"


async def test_one_link_down_on_every_node_under_a_rebooted_switch_writes_nothing_and_blames_no_node() -> None:
    """The agent's RdmaLinkFlapped Event is evidence only: each node's link-down is recorded in its ledger
    entry, nothing else is written; a job whose 8 nodes all saw one fails next, and no node is blamed (more
    than `link_nodes` of them: the switch's)."""
    objs = [*nodes(32), *(obj for i in range(4) for obj in job(f"j{i}", [f"n{8 * i + k}" for k in range(8)]))]
    async with engines.rig(objs) as r:
        await r.handle(*(link_down(f"n{i}") for i in range(32)))
        await r.tick()
        assert cordoned(r) == []
        assert node_writes(r) == {}
        assert deleted_pods(r) == 0
        assert not r.events("KcoverRestartedWorkload")
        assert all(link_downs(r, f"n{i}") for i in range(32)), "each recorded for the judgement"
        await asyncio.sleep(600)  # the NCCL watchdog
        await r.handle(at(pod_fault("j0-3-g0"), 600))
        assert len(r.events("KcoverRestartedWorkload")) == 1
        assert cordoned(r) == []


async def test_a_link_down_then_a_failure_of_the_job_with_a_rank_there_cordons_that_node_before_the_restart() -> None:
    """One link-down on n1; ten minutes later (NCCL's watchdog) the job's rank on n2 exits first: n1 is cordoned
    before the job's pods are taken away, so they do not come back to its link; n2 and the job elsewhere are
    left alone, and the link-down alone wrote nothing to a Node."""
    objs = [*nodes(5), *job("big", ["n0", "n1", "n2", "n3"]), *job("elsewhere", ["n4"])]
    async with engines.rig(objs) as r:
        await r.handle(link_down("n1"))
        assert node_writes(r) == {}
        await asyncio.sleep(600)
        await r.handle(at(pod_fault("big-2-g0"), 600))
        assert cordoned(r) == ["n1"]
        (cordon,) = r.events("KcoverCordonedNode")
        assert cordon["involvedObject"]["name"] == "n1"
        assert "an RDMA port of Node n1 went down 600s before PyTorchJob ml/big failed" in cordon["message"]
        restarted = r.events("KcoverRestartedWorkload")
        assert [e["involvedObject"]["name"] for e in restarted] == ["big"]
        assert deleted_pods(r) == 4
        order = [k for k in r.writes() if k.startswith(("UPDATE nodes", "PATCH nodes", "DELETE pods"))]
        assert order, "the cordon and the restart wrote"
        assert order[0] != "DELETE pods", f"the cordon first: {order}"


@pytest.mark.parametrize("case", ["older-than-link-seconds", "an-xid-explains-it", "link-down-off", "record"])
async def test_a_link_down_blames_no_node_when_it_does_not_explain_the_failure(case: str) -> None:
    overrides = {"recovery": {"judgement": {"link_down": {"link-down-off": "off", "record": "record"}.get(case,
                                                                                                          "act")}}}
    objs = [*nodes(4), *job("big", ["n0", "n1", "n2", "n3"])]
    async with engines.rig(objs, overrides=overrides) as r:
        await r.handle(link_down("n1"))
        wait = 901 if case == "older-than-link-seconds" else 600
        await asyncio.sleep(wait)
        fault = xid("n2", 13, 0, ["big-worker-2-g0"], signal="x") if case == "an-xid-explains-it" \
            else pod_fault("big-2-g0")
        await r.handle(at(fault, wait))
        assert len(r.events("KcoverRestartedWorkload")) == 1
        assert cordoned(r) == []
        assert node_writes(r) == {}
        assert bool(link_downs(r, "n1")) is (case != "link-down-off")


