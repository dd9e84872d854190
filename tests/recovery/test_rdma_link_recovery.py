"""An agent's RDMA link report, as the controller receives it, end to end on virtual time against the
simulated cluster: a flapping or dead port cordons its node once and restarts the job there; one link-down
on every node under a rebooted switch changes nothing.

The events are what the event watcher publishes from the agent's Events (the detector's own output, its
`fault.check` and recommendation, is tested in tests/detectors/test_rdma_link.py).
"""

from __future__ import annotations

import asyncio

import pytest
from harness import engines
from test_judgement import cordoned, job, node_writes, nodes

from kcover import model

pytestmark = pytest.mark.looptime


def link_report(node: str, what: str, action: model.Action) -> model.CollectorEvent:
    """The agent's RdmaLinkFlapping (or Flapped, Down) Event about `node`, as the event watcher publishes it."""
    reason = {"flapping": "RdmaLinkFlapping", "down": "RdmaLinkDown", "flapped": "RdmaLinkFlapped"}[what]
    return model.CollectorEvent(
        detector="event-watcher", severity=model.Severity.ERROR, reason=reason,
        message=f"RDMA port mlx5_3 port 1 (InfiniBand): {what}", recommended=action,
        target=model.Target(kind=model.TargetKind.NODE, name=node, node=node),
        fault=model.Fault(check="" if what == "flapped" else f"rdma/mlx5_3/1/{what}"), observed_at=engines.START)


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


async def test_one_link_down_on_every_node_under_a_rebooted_switch_writes_nothing() -> None:
    """The agent's RdmaLinkFlapped Event carries no `kcover.io/need-recovery`, so the event watcher does not
    even deliver it; were a Warning like it delivered, its `report` recommendation still moves nothing."""
    objs = [*nodes(32), *(obj for i in range(4) for obj in job(f"j{i}", [f"n{8 * i + k}" for k in range(8)]))]
    async with engines.rig(objs) as r:
        await r.handle(*(link_report(f"n{i}", "flapped", model.Action.REPORT) for i in range(32)))
        await r.tick()
        assert cordoned(r) == []
        assert node_writes(r) == {}
        assert deleted_pods(r) == 0
        assert not r.events("KcoverRestartedWorkload")

