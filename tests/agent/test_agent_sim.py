"""The whole agent (fake NVML, real detector supervisor and reporter) against the simulated API server:
what the API server ends up holding."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml

from kcover import checking, layering, metrics, reloading, settings
from kcover.agent import running
from kcover.cli import configuring
from kcover.detectors import contract, registry
from kcover.kube import client
from kcover.nvml import fake, xid_policy

simserver = pytest.importorskip("kcover.sim.server")

NODE = "gpu-node-1"


def agent_settings(**agent: Any) -> settings.Settings:
    return layering.layer(file_data={
        "agent": {"node_name": NODE, "condition_hold_seconds": 0.5, "min_write_interval_seconds": 0.0, **agent},
        "detectors": {"entries": {"nvml": {"config": {"wait_timeout_ms": 50, "health_interval_seconds": 0.05}},
                                  "dcgm": {"enabled": False}}},
    }).settings


@dataclass
class Cluster:
    srv: Any
    kube: client.KubeClient

    async def node(self) -> dict[str, Any]:
        result: dict[str, Any] = await self.kube.request("GET", f"/api/v1/nodes/{NODE}")
        return result

    async def condition(self) -> dict[str, Any] | None:
        for cond in (await self.node())["status"].get("conditions", []):
            if cond["type"] == "KcoverGPUHealthy":
                return dict(cond)
        return None

    async def events(self) -> list[dict[str, Any]]:
        result = await self.kube.request("GET", "/api/v1/namespaces/kcover-system/events")
        return list(result["items"])

    async def until(self, check: Callable[[], Any], within: float = 5.0) -> Any:
        async with asyncio.timeout(within):
            for _ in range(100_000):
                value = await check()
                if value:
                    return value
                await asyncio.sleep(0.02)
        raise AssertionError("unreachable")


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with simserver.SimServer() as srv:
        srv.store.create("nodes", {"metadata": {"name": NODE}, "spec": {},
                                   "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        kube = client.from_configuration(srv.kube_configuration())
        try:
            yield Cluster(srv, kube)
        finally:
            await kube.close()


@pytest.fixture
async def agent(cluster: Cluster) -> AsyncIterator[fake.FakeNvml]:
    nvml = fake.FakeNvml(8)
    stop = asyncio.Event()
    task = asyncio.create_task(running.run(agent_settings(), client=cluster.kube, metrics=metrics.Metrics(),
                                           health=None, stop=stop, nvml=nvml, reporter_tick_seconds=0.05),
                               name="agent")
    for _ in range(500):
        if nvml.registered:
            break
        await asyncio.sleep(0.01)
    yield nvml
    stop.set()
    await asyncio.wait_for(task, 10)


async def test_xid79_sets_the_condition_and_posts_a_recovery_event(cluster: Cluster, agent: fake.FakeNvml) -> None:
    agent.xid(79, gpu_index=5)

    async def unhealthy() -> dict[str, Any] | None:
        cond = await cluster.condition()
        return cond if cond and cond["status"] == "False" else None

    cond = await cluster.until(unhealthy)
    assert cond["reason"] == "XID79"
    assert "GPU-fake-0005" in cond["message"]
    ready = [c for c in (await cluster.node())["status"]["conditions"] if c["type"] == "Ready"]
    assert ready, "the strategic merge kept the other conditions"

    events = await cluster.until(cluster.events)
    assert len(events) == 1
    ev = events[0]
    assert ev["reason"] == "XID79"
    assert ev["involvedObject"]["kind"] == "Node"
    assert ev["involvedObject"]["name"] == NODE
    assert ev["reportingComponent"] == "kcover.io/agent"
    assert ev["reportingInstance"] == NODE
    assert ev["metadata"]["annotations"]["kcover.io/need-recovery"] == "true"
    assert ev["metadata"]["annotations"]["kcover.io/recommended-action"] == "cordon-node-and-restart"

    async def healthy_again() -> bool:
        cond = await cluster.condition()
        return bool(cond and cond["status"] == "True")

    await cluster.until(healthy_again)  # no recurrence for the 0.5 s hold


async def test_xid_storm_is_deduplicated(cluster: Cluster, agent: fake.FakeNvml) -> None:
    for _ in range(20):
        agent.xid(43, gpu_index=0)
    await cluster.until(cluster.events)
    await asyncio.sleep(0.3)
    events = await cluster.events()
    assert [e["reason"] for e in events] == ["XID43"]
    assert "kcover.io/need-recovery" not in events[0]["metadata"]["annotations"]
    cond = await cluster.condition()
    assert cond is None or cond["status"] == "True"  # an application XID never marks the node


async def test_lost_gpu_holds_the_condition_until_it_is_back(cluster: Cluster, agent: fake.FakeNvml) -> None:
    agent.gpu_lost(2)

    async def reason() -> str:
        cond = await cluster.condition()
        return str(cond["reason"]) if cond and cond["status"] == "False" else ""

    assert await cluster.until(reason) == "GPULost"
    await asyncio.sleep(1.0)  # longer than the hold: an active fault does not expire
    assert await reason() == "GPULost"
    agent.clear(2)

    async def healthy() -> bool:
        cond = await cluster.condition()
        return bool(cond and cond["status"] == "True")

    await cluster.until(healthy)
    reasons = sorted(e["reason"] for e in await cluster.events())
    assert reasons == ["GPULost", "GPULostCleared"]


async def test_an_rdma_port_that_goes_down_sets_the_condition_and_asks_for_a_cordon_and_restart(
        cluster: Cluster, tmp_path: Path) -> None:
    """The whole agent with its rdma-link detector reading a port tree in the kernel's sysfs format."""

    def port(state: str) -> None:
        d = tmp_path / "mlx5_1" / "ports" / "1"
        (d / "counters").mkdir(parents=True, exist_ok=True)
        (d / "state").write_text(state + "\n")
        (d / "phys_state").write_text(("5: LinkUp" if state == "4: ACTIVE" else "3: Disabled") + "\n")
        (d / "link_layer").write_text("InfiniBand\n")
        (d / "counters" / "link_downed").write_text("0\n")

    port("4: ACTIVE")
    config = agent_settings().model_dump(mode="json")
    config["detectors"]["entries"]["rdma-link"] = {"enabled": True, "config": {
        "sysfs_path": str(tmp_path), "poll_interval_seconds": 0.05, "down_seconds": 0.2}}
    stop = asyncio.Event()
    task = asyncio.create_task(running.run(settings.Settings.model_validate(config), client=cluster.kube,
                                           metrics=metrics.Metrics(), health=None, stop=stop,
                                           nvml=fake.FakeNvml(8), reporter_tick_seconds=0.05), name="agent")
    try:
        await asyncio.sleep(0.3)
        port("1: DOWN")

        async def reason() -> str:
            cond = await cluster.condition()
            return str(cond["reason"]) if cond and cond["status"] == "False" else ""

        assert await cluster.until(reason) == "RdmaLinkDown"
        (event,) = await cluster.until(cluster.events)
        assert event["reason"] == "RdmaLinkDown"
        assert event["involvedObject"]["kind"] == "Node"
        assert event["metadata"]["annotations"]["kcover.io/need-recovery"] == "true"
        assert event["metadata"]["annotations"]["kcover.io/recommended-action"] == "cordon-node-and-restart"
        assert "mlx5_1 port 1" in event["message"]
        port("4: ACTIVE")

        async def healthy() -> bool:
            cond = await cluster.condition()
            return bool(cond and cond["status"] == "True")

        await cluster.until(healthy)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_no_gpu_leaves_the_agent_running_and_the_node_alone(cluster: Cluster) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(running.run(agent_settings(), client=cluster.kube, metrics=metrics.Metrics(),
                                           health=None, stop=stop, nvml=fake.FakeNvml(init_error="no_gpu"),
                                           reporter_tick_seconds=0.05), name="agent")
    await asyncio.sleep(0.5)
    assert not task.done()
    stop.set()
    await asyncio.wait_for(task, 5)
    assert await cluster.events() == []


async def test_a_missing_node_is_retried_with_backoff_not_every_tick() -> None:
    async with simserver.SimServer() as srv:
        kube = client.from_configuration(srv.kube_configuration())
        stop = asyncio.Event()
        task = asyncio.create_task(running.run(agent_settings(), client=kube, metrics=metrics.Metrics(),
                                               health=None, stop=stop, nvml=fake.FakeNvml(2),
                                               reporter_tick_seconds=0.05), name="agent")
        try:
            await asyncio.sleep(3.5)  # 70 reporter ticks
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
            await kube.close()
        attempts = srv.request_counts.get("PATCH nodes/status", 0)
        # backoff of 0.5-1 s, 1-2 s, 2-4 s: at most 4 tries in 3.5 s, against 70 without it
        assert 1 <= attempts <= 4, attempts


async def test_an_xid_policy_edited_in_place_applies_live_and_an_invalid_edit_is_refused(
        cluster: Cluster, tmp_path: Path) -> None:
    """The settings file stays as it is; only the XID policy file's content changes (same path). XID 14 is
    ignored by the shipped policy; the edit makes it cordon-node, the NVML detector restarts with it, and
    the node's condition says so. An edit that does not parse as a policy keeps the one in force."""
    policy_file = tmp_path / "xid-policy.yaml"
    policy_file.write_text("xids: {}\n")
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump({
        "agent": {"node_name": NODE, "condition_hold_seconds": 0.5, "min_write_interval_seconds": 0.0,
                  "xid_policy_file": str(policy_file)},
        "detectors": {"entries": {"nvml": {"config": {"wait_timeout_ms": 50, "health_interval_seconds": 0.05}},
                                  "dcgm": {"enabled": False}}}}))
    load = configuring.checked_loader(str(config_file), {}, role=contract.Role.AGENT, detectors=registry.discover(),
                                      environ={})
    config = load().settings
    nvml = fake.FakeNvml(8)
    m = metrics.Metrics()
    agent = running.Agent(config, client=cluster.kube, metrics=m, health=None, node=NODE, nvml=nvml,
                          reporter_tick_seconds=0.05)
    assert agent.policy.decide(14, [], 0).action is xid_policy.Action.IGNORE
    reloader = reloading.Reloader(str(config_file), load, agent.reconfigure, config, m,
                                  watch=lambda cfg: checking.watched_files(cfg, role=contract.Role.AGENT))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop), name="agent")
    try:

        async def registered() -> bool:
            return bool(nvml.registered)

        await cluster.until(registered)
        policy_file.write_text("xids:\n  14: {name: EDITED, class: hardware, severity: Error, action: cordon-node}\n")
        assert await reloader.check_once() is True
        assert agent.policy.decide(14, [], 0).action is xid_policy.Action.CORDON_NODE

        async def cordon_recommended() -> str:
            nvml.xid(14, gpu_index=3)  # again until the restarted detector has registered
            cond = await cluster.condition()
            return str(cond["reason"]) if cond and cond["status"] == "False" else ""

        assert await cluster.until(cordon_recommended) == "XID14"

        in_force = agent.policy
        policy_file.write_text("xids:\n  14: {action: explode}\n")
        with structlog.testing.capture_logs() as logs:
            assert await reloader.check_once() is False
        assert agent.policy is in_force
        assert agent.context.xid_policy is in_force
        assert m.registry.get_sample_value("kcover_config_reload_failures_total") == 1
        (refused,) = [e for e in logs if e["event"] == "config_reload_refused"]
        assert refused["edited_files"] == ["agent.xid_policy_file"]
        assert any(line.startswith(f"agent.xid_policy_file: {policy_file}: xids.14.action:")
                   for line in refused["field_errors"])
        assert await reloader.check_once() is False  # refused once, not at every poll
        assert m.registry.get_sample_value("kcover_config_reload_failures_total") == 1
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
