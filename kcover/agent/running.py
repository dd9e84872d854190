"""Composition of the node agent: bus, detector supervisor (role agent), reporter.

Owns wiring one agent process: loads the XID policy (`agent.xid_policy_file` over the shipped one),
builds the detector context (NVML backend, command runner, pod lookup), runs the supervisor and the
reporter until `stop` is set, then closes the bus so the reporter drains what was queued. It does
not read the environment (`cli.py` does) and never imports the controller.

Fails with `errors.ConfigError` on an invalid XID policy or detector settings before anything runs;
a detector that cannot run here (no GPU, no DCGM) is only marked unavailable.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import structlog

from kcover import bus as bus_
from kcover import errors, metrics, serving, settings
from kcover.agent import podresources, reporting
from kcover.aio import clock as clock_
from kcover.detectors import contract, registry, supervising
from kcover.kube import client as client_
from kcover.nvml import xid_policy

log = structlog.get_logger()


def node_name(config: settings.Settings) -> str:
    name = config.agent.node_name or os.environ.get("NODE_NAME", "")
    if not name:
        raise errors.ConfigError("the agent needs its node name", ["agent.node_name: empty and $NODE_NAME unset"])
    return name


async def run(config: settings.Settings, *, client: client_.KubeClient, metrics: metrics.Metrics,
              health: serving.Health | None, stop: asyncio.Event, nvml: Any = None, command_runner: Any = None,
              clock: clock_.Clock | None = None, detector_registry: registry.Registry | None = None,
              reporter_tick_seconds: float = 0.5) -> None:
    """Run one node agent until `stop` is set."""
    node = node_name(config)
    clock = clock or clock_.SystemClock()
    policy = xid_policy.load(config.agent.xid_policy_file)
    pods = podresources.PodResources(config.agent.pod_resources_socket)
    context = contract.DetectorContext(
        role=contract.Role.AGENT, metrics=metrics, clock=clock, node_name=node, nvml=nvml,
        command_runner=command_runner,
        extras={"xid_policy": policy, "pods_for_device": pods.pods_for_device})
    bus = bus_.Bus(dedupe_window_seconds=config.bus.dedupe_window_seconds,
                   block_timeout_seconds=config.bus.block_timeout_seconds)
    sub = bus.subscribe("agent-reporter", capacity=config.bus.subscriber_capacity)
    supervisor = supervising.Supervisor(detector_registry or registry.discover(), context, bus,
                                        config.detectors, metrics)
    supervisor.wanted(config.detectors)  # fail on bad detector settings before starting anything
    reporter = reporting.Reporter(client, config.agent, node, clock=clock, tick_seconds=reporter_tick_seconds)
    if health is not None:
        health.add_readiness("detectors", supervisor.readiness)
    log.info("agent_starting", node=node, xid_policy=config.agent.xid_policy_file or "shipped")
    detectors_stop = asyncio.Event()
    reporter_stop = asyncio.Event()
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(supervisor.run(detectors_stop), name="agent:detectors")
            group.create_task(reporter.run(sub, reporter_stop), name="agent:reporter")
            await stop.wait()
            detectors_stop.set()
            await bus.close(drain_timeout_seconds=config.bus.drain_timeout_seconds)
            reporter_stop.set()
    finally:
        if health is not None:
            health.remove_readiness("detectors")
    log.info("agent_stopped", node=node)
