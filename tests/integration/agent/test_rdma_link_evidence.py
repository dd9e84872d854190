"""One RDMA link-down, then the job's failure, end to end on every cluster backend (the simulated server and
a real kube-apiserver).

The real agent (its `rdma-link` detector reading a port tree in the kernel's sysfs format, fake NVML) and the
real controller (cache, event watcher, engine, Lease) run against the backend; the harness plays kubelet and
training operator. The port's `link_downed` counter rises once: the agent posts its `RdmaLinkFlapped`
Warning with `kcover.io/evidence: link-down`, which the controller records in the node's LedgerEntry and
nothing else. The job's worker on the *other* node then exits (the first rank NCCL's watchdog ends): the
controller cordons the node whose link went down and restarts the job; the other node stays schedulable.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

from test_gpu_xid import _job, _node, _roles, _settings

from kcover.nvml import fake
from kcover.recovery import ledgerentries

Cluster = Any  # tests/backends.py's Cluster


def _port(root: Path, link_downed: int) -> None:
    d = root / "mlx5_0" / "ports" / "1"
    (d / "counters").mkdir(parents=True, exist_ok=True)
    (d / "state").write_text("4: ACTIVE\n")
    (d / "phys_state").write_text("5: LinkUp\n")
    (d / "link_layer").write_text("InfiniBand\n")
    (d / "counters" / "link_downed").write_text(f"{link_downed}\n")


async def _link_downs(kube: Any, ns: str, node: str) -> tuple[float, ...]:
    items = (await kube.request("GET", f"/apis/kcover.io/v1alpha1/namespaces/{ns}/ledgerentries"))["items"]
    for item in items:
        parsed = ledgerentries.parse_body(item)
        if parsed is not None and parsed[0] == f"n.{node}" and isinstance(parsed[1].entry, ledgerentries.Node):
            return parsed[1].entry.link_downs
    return ()


async def test_a_link_down_then_the_jobs_failure_on_another_node_cordons_the_node_of_the_link(
        cluster: Cluster, tmp_path: Path) -> None:
    ns = cluster.namespace
    suffix = secrets.token_hex(3)
    linked, other = f"link-{suffix}", f"link-other-{suffix}"
    kube = cluster.client
    _port(tmp_path, 0)
    try:
        await _node(kube, linked)
        await _node(kube, other)
        job = await _job(kube, ns, "big", [linked, other], cluster.harness)
        await cluster.harness.run_agent_pod(ns, linked)
        cfg = _settings(ns, linked, **{"rdma-link": {"config": {"sysfs_path": str(tmp_path),
                                                                "poll_interval_seconds": 0.05}}})
        async with _roles(cluster, cfg, linked, fake.FakeNvml(8)) as (_, controller):
            async with asyncio.timeout(30):
                while not (controller.is_leader() and controller.cache.synced):  # noqa: ASYNC110  (polling plain state)
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.5)  # the agent's first reads of the port: its baseline
                _port(tmp_path, 1)  # one link-down: the port went down and came back
                while not await _link_downs(kube, ns, linked):  # noqa: ASYNC110  (polling the server)
                    await asyncio.sleep(0.1)
                node = await kube.request("GET", f"/api/v1/nodes/{linked}")
                assert not (node.get("spec") or {}).get("unschedulable"), "a link-down alone moves nothing"
                await cluster.harness.fail_container(ns, "big-worker-1", "pytorch", exit_code=134)
                while True:  # the cordon's and the restart's Events (each written after its step)
                    events = (await kube.request("GET", "/api/v1/events"))["items"]  # a Node's: any namespace
                    if {"KcoverCordonedNode", "KcoverRestartedWorkload"} <= {
                            e.get("reason") for e in events if e["involvedObject"].get("name") in (
                                linked, "big")}:
                        break
                    await asyncio.sleep(0.1)
        agent_events = [e for e in events if e.get("reason") == "RdmaLinkFlapped"
                        and e["involvedObject"].get("name") == linked]
        assert agent_events, "the agent's Warning, as a person reads it"
        assert agent_events[0]["metadata"]["annotations"]["kcover.io/evidence"] == "link-down"
        assert "kcover.io/need-recovery" not in agent_events[0]["metadata"]["annotations"]
        cordons = [e for e in events if e.get("reason") == "KcoverCordonedNode"
                   and e["involvedObject"].get("name") in (linked, other)]  # the server holds other tests' too
        assert [e["involvedObject"]["name"] for e in cordons] == [linked]
        assert f"an RDMA port of Node {linked} went down" in cordons[0]["message"]
        restarted = [e for e in events if e.get("reason") == "KcoverRestartedWorkload"
                     and e["involvedObject"].get("namespace") == ns]
        assert [e["involvedObject"]["uid"] for e in restarted] == [job["metadata"]["uid"]]
        assert ((await kube.request("GET", f"/api/v1/nodes/{linked}")).get("spec") or {}).get("unschedulable") is True
        assert not ((await kube.request("GET", f"/api/v1/nodes/{other}")).get("spec") or {}).get("unschedulable")
    finally:
        for name in (linked, other):
            await kube.request("DELETE", f"/api/v1/nodes/{name}")
