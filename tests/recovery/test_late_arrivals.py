"""A pod that came to a node after the plan that cordons it, before its cordon held, is restarted for the
node's fault (`recovery/latearrivals.py`), end to end on virtual time against the simulated cluster.

Seen in the CI-sized chaos run (seed 26, 200 ms API latency and 429s): a job restarted for its own fault had
its restart under way when an XID 79 on another node was planned; its operator recreated a rank on that node
before the node's 2.4 s cordon landed, and nothing restarted it: a rank left on a GPU that fell off the bus.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from harness import engines
from harness import objects as o
from test_failover import xid_on
from test_judgement import job, pod_fault, recreate

from kcover.recovery import latearrivals

pytestmark = pytest.mark.looptime


def restarted(r: engines.Rig, name: str) -> int:
    return len(r.events("KcoverRestartedWorkload", name=name))


async def test_a_rank_recreated_on_the_node_before_its_cordon_held_is_restarted_after_its_cooldown() -> None:
    nodes_ = [o.node(f"n{i}") for i in range(3)]
    stranger = o.pod("agent-x", uid="agent-x", node="n0", namespace="ml")  # not opted in: passed over
    async with engines.rig([*nodes_, *job("a", ["n1", "n2"]), *job("b", ["n0"]), stranger]) as r:
        await r.handle(pod_fault("a-0-g0"))  # a's own fault: restarted, its pods gone
        assert restarted(r, "a") == 1
        await r.handle(xid_on("n0"))  # planned while a had no pod on n0
        assert r.store.get("nodes", "", "n0")["spec"].get("unschedulable") is True
        assert restarted(r, "b") == 1
        recreate(r, "a", ["n0", "n2"], 1)  # a's operator put rank 0 on n0 before the cordon reached the scheduler
        await r.settle()
        await r.tick()
        assert "a-0-g1" in r.pod_uids(), "within a's cooldown: held, not restarted yet"
        assert any("cooldown" in e["message"] for e in r.events("KcoverRecoveryHeld", name="a"))
        await asyncio.sleep(61)
        await r.tick()
        assert restarted(r, "a") == 2, "restarted once more, for the node's fault"
        assert {"a-0-g1", "a-1-g1"}.isdisjoint(r.pod_uids())
        assert restarted(r, "b") == 1, "what the node's plan restarted is not restarted again"
        assert "agent-x" in r.pod_uids()
        assert not r.events("KcoverRecoverySkipped"), "nothing refused aloud for the pods seen by the plan"
        await asyncio.sleep(61)
        await r.tick()
        assert restarted(r, "a") == 2


async def test_a_pod_that_comes_to_the_node_after_the_watch_window_is_left_alone() -> None:
    """Past `latearrivals.WINDOW_SECONDS` after the cordon nothing comes to the node through its scheduler: a
    pod there then (a toleration, a person's binding) is not the fault's business."""
    async with engines.rig([*(o.node(f"n{i}") for i in range(3)), *job("a", ["n1"]), *job("b", ["n0"])]) as r:
        await r.handle(xid_on("n0"))
        await asyncio.sleep(latearrivals.WINDOW_SECONDS + 1)
        await r.tick()
        recreate(r, "a", ["n0"], 1)  # a member of a, on n0, after the window
        await r.settle()
        await r.tick()
        assert restarted(r, "a") == 0
        assert "a-0-g1" in r.pod_uids()


def test_the_docs_say_the_watch_window() -> None:
    """docs/runbook.md and docs/architecture.md tell an operator how long after a cordon late arrivals are
    restarted: the constant's value, so a change of it without them fails here."""
    root = Path(__file__).resolve().parents[2]
    said = f"{latearrivals.WINDOW_SECONDS:g} s"
    for doc in ("docs/runbook.md", "docs/architecture.md"):
        text = " ".join((root / doc).read_text(encoding="utf-8").split())
        assert re.search(rf"(within|for) {re.escape(said)}\b[^.]*cordon|cordon[^.]*(within|for) {re.escape(said)}\b",
                         text), f"{doc} says late arrivals are looked for {said} after the cordon"
