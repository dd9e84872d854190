"""Composition of the node agent: bus, detector supervisor (role agent), reporter.

Owns wiring one agent process (and, with `agent.validation.enabled`, the validator that answers the
controller's return-to-service checks, `validating`): loads the XID policy (`agent.xid_policy_file` over the shipped one),
builds the detector context (NVML backend, Kubernetes client, pod lookup, XID policy, the node's capacity;
the agent's GPU sight (`sight`: a GPU node none of whose GPU detectors runs makes the condition Unknown);
the DCGM detector and the plugins run their tools as subprocesses, `kcover.aio.commands`), runs the supervisor, the reporter and the watch of its node's DRA
ResourceSlices (`dradevices`: a fault on a GPU published through DRA is reported as that device's)
until `stop` is set, then closes the bus
so the reporter drains what was queued. `reconfigure()` applies a reload; a changed XID policy (a new
path, or new content at the same path: the reloader watches it) is loaded first and the NVML and DCGM
detectors restart with it. It does not read the environment (`kcover.cli` does) and never imports the
controller.

Fails with `errors.ConfigError` on an invalid XID policy or detector settings before anything runs,
and from `reconfigure()` before anything is changed (the old policy and detectors stay); a detector
that cannot run here (no GPU, no DCGM) is only marked unavailable (on a GPU node where no GPU detector runs,
the agent says it is blind).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from kcover import bus as bus_
from kcover import errors, metrics, serving, settings
from kcover.agent import dradevices, podresources, reporting, sight, validating
from kcover.aio import clock as clock_
from kcover.aio import commands
from kcover.detectors import contract, registry, supervising
from kcover.kube import client as client_
from kcover.kube import decoding, events, gpus, retrying
from kcover.nvml import backend, xid_policy

log = structlog.get_logger()


def node_name(config: settings.Settings, environ: Mapping[str, str]) -> str:
    name = config.agent.node_name or environ.get("NODE_NAME", "")
    if not name:
        raise errors.ConfigError("the agent needs its node name", ["agent.node_name: empty and $NODE_NAME unset"])
    return name


async def read_node(client: client_.KubeClient, node: str) -> dict[str, Any] | None:
    """The agent's Node as the API server holds it, or None (logged) when it cannot be read."""
    try:
        obj: dict[str, Any] = await client.request("GET", f"/api/v1/nodes/{node}")
    except errors.KubeError as exc:
        log.warning("node_capacity_unknown", node=node, error=str(exc))
        return None
    return obj


def capacity_of(obj: Mapping[str, Any] | None) -> dict[str, str]:
    """A Node's `status.capacity`, for plugins that run only on some hardware (`context.node_capacity`)."""
    capacity = ((obj or {}).get("status") or {}).get("capacity") or {}
    return {str(k): str(v) for k, v in capacity.items()}


def _many(pods: podresources.PodLookup) -> dradevices.PodsForDevices:
    """`pods_for_devices` of the pod lookup, or one `pods_for_device` call per id."""
    many = getattr(pods, "pods_for_devices", None)
    if many is not None:
        return many  # type: ignore[no-any-return]

    async def each(ids: Sequence[str]) -> list[str]:
        out: list[str] = []
        for device_id in ids:
            out += [p for p in await pods.pods_for_device(device_id) if p not in out]
        return out

    return each


@dataclass(frozen=True)
class _PodsByDevices:
    """The agent's pod lookup as detectors ask it (`contract.PodLookup`): several device ids at once."""

    many: dradevices.PodsForDevices

    async def pods_for_devices(self, device_ids: Sequence[str]) -> list[str]:
        return await self.many(device_ids)


class Agent:
    """One node agent. Build it, `await run(stop)`, and call `reconfigure()` on a config reload."""

    def __init__(self, config: settings.Settings, *, client: client_.KubeClient, metrics: metrics.Metrics,
                 health: serving.Health | None, node: str, nvml: backend.Nvml | None = None,
                 clock: clock_.Clock | None = None, detector_registry: registry.Registry | None = None,
                 reporter_tick_seconds: float = 0.5, pod_lookup: podresources.PodLookup | None = None,
                 dcgmi: commands.CommandRunner | None = None) -> None:
        """`dcgmi`: how the validator runs `dcgmi diag` (subprocesses by default; the simulated cluster's nodes
        answer with recorded output)."""
        self.config = config
        self.node = node
        self.client = client
        self.health = health
        self.clock = clock or clock_.SystemClock()
        self.policy = xid_policy.load(config.agent.xid_policy_file)
        pods = pod_lookup or podresources.PodResources(config.agent.pod_resources_socket)
        pods_for_devices = _many(pods)
        self.context = contract.DetectorContext(
            role=contract.Role.AGENT, metrics=metrics, clock=self.clock, node_name=node, nvml=nvml,
            gateway=client, pod_lookup=_PodsByDevices(pods_for_devices), xid_policy=self.policy)
        self.bus = bus_.Bus(dedupe_window_seconds=config.bus.dedupe_window_seconds,
                            block_timeout_seconds=config.bus.block_timeout_seconds)
        metrics.registry.register(bus_.BusCollector(self.bus))  # kcover_bus_* on /metrics
        metrics.registry.register(retrying.StatsCollector(client.retry_stats))  # kcover_api_retries*
        metrics.registry.register(decoding.SkipsCollector(client.skips))  # kcover_objects_skipped*
        self.subscription = self.bus.subscribe("agent-reporter", capacity=config.bus.subscriber_capacity)
        self.supervisor = supervising.Supervisor(detector_registry or registry.discover(), self.context, self.bus,
                                                 config.detectors, metrics)
        self.supervisor.wanted(config.detectors)  # fail on bad detector settings before starting anything
        self.supervisor.on_failure = self._detector_failed
        self.devices = dradevices.DraDevices(client, node, pods_for_devices=pods_for_devices)
        self.sight = sight.GpuSight(node, rule=gpus.GpuRule.of(config.kube.gpu_resources, config.kube.gpu_dra_drivers),
                                    gpu_detectors=config.agent.gpu_detectors, statuses=self.supervisor.statuses,
                                    gauge=metrics.agent_blind, recheck_seconds=config.agent.gpu_node_recheck_seconds,
                                    gpu_node_labels=config.agent.gpu_node_labels)
        self.reporter = reporting.Reporter(client, config.agent, node, clock=self.clock,
                                           tick_seconds=reporter_tick_seconds, devices=self.devices.attach,
                                           sight=self.sight.current)
        self.validator = (validating.Validator(client, node, config.agent.validation, runner=dcgmi, clock=self.clock)
                          if config.agent.validation.enabled else None)

    async def _detector_failed(self, name: str, detail: str, required: bool) -> None:
        """A `KcoverDetectorFailed` Event on this agent's Node (no need-recovery annotation: nothing acts on it)."""
        body = events.body(events.About(reporting.NODE_KIND, "v1", self.node),
                           namespace=self.config.agent.event_namespace, reason="KcoverDetectorFailed",
                           action="RunDetector", warning=True,
                           message=f"{'required' if required else 'optional'} detector {name} failed on "
                                   f"node {self.node} ({detail}); restarting it with backoff",
                           now=self.clock.now(), controller=self.config.agent.reporting_controller,
                           instance=self.node, source_host=self.node)
        await self.client.request("POST", events.path_of(body), body=body)

    async def reconfigure(self, new: settings.Settings, changed: set[str]) -> None:
        """Apply new tunables live: detector settings, bus tunables, reporter settings, XID policy.

        `agent.xid_policy_file` in `changed` re-reads the policy (new path or new content). Raises
        ConfigError, changing nothing, when the policy or the detector settings are invalid."""
        reload_policy = "agent.xid_policy_file" in changed
        policy = await asyncio.to_thread(xid_policy.load, new.agent.xid_policy_file) if reload_policy else None
        self.supervisor.wanted(new.detectors)  # validate before touching anything
        if policy is not None:
            self.policy = policy
            self.context.xid_policy = policy
            log.info("xid_policy_reloaded", file=new.agent.xid_policy_file or "shipped")
        if policy is not None or any(p.startswith("detectors.") for p in changed):
            self.supervisor.reconfigure(new.detectors, restart=[n for n in new.detectors.entries
                                                                if policy is not None and n in ("nvml", "dcgm")])
        self.bus.configure(dedupe_window_seconds=new.bus.dedupe_window_seconds,
                           block_timeout_seconds=new.bus.block_timeout_seconds)
        self.reporter.config = new.agent
        self.sight.gpu_detectors = tuple(new.agent.gpu_detectors)
        self.sight.recheck_seconds = new.agent.gpu_node_recheck_seconds
        self.sight.gpu_node_labels = dict(new.agent.gpu_node_labels)  # a GPU node already stays one
        if self.validator is not None:
            self.validator.config = new.agent.validation
        self.config = new

    async def _read_node(self) -> sight.NodeRead | None:
        return sight.node_read(await read_node(self.client, self.node))

    async def run(self, stop: asyncio.Event) -> None:
        raw = await read_node(self.client, self.node)
        self.context.node_capacity = capacity_of(raw)
        self.sight.learn(sight.node_read(raw))
        if self.health is not None:
            self.health.add_readiness("detectors", self.supervisor.readiness)
            self.health.add_degradation("gpu-sight", self.sight.degraded)
            self.health.started()  # its own checks are in: the process's `role` check (failing while it starts) goes
        log.info("agent_starting", node=self.node, xid_policy=self.config.agent.xid_policy_file or "shipped")
        detectors_stop = asyncio.Event()
        reporter_stop = asyncio.Event()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self.supervisor.run(detectors_stop), name="agent:detectors")
                group.create_task(self.reporter.run(self.subscription, reporter_stop), name="agent:reporter")
                group.create_task(self.devices.run(reporter_stop), name="agent:dra-devices")
                group.create_task(self.sight.run(self._read_node, reporter_stop), name="agent:gpu-sight")
                if self.validator is not None:
                    group.create_task(self.validator.run(detectors_stop), name="agent:validation")
                await stop.wait()
                detectors_stop.set()
                await self.bus.close(drain_timeout_seconds=self.config.bus.drain_timeout_seconds)
                reporter_stop.set()
        finally:
            if self.health is not None:
                self.health.remove_readiness("detectors")
                self.health.remove_degradation("gpu-sight")
        log.info("agent_stopped", node=self.node)


async def run(config: settings.Settings, *, client: client_.KubeClient, metrics: metrics.Metrics,
              health: serving.Health | None, stop: asyncio.Event, nvml: backend.Nvml | None = None,
              clock: clock_.Clock | None = None, detector_registry: registry.Registry | None = None,
              reporter_tick_seconds: float = 0.5, node: str = "") -> None:
    """Run one node agent until `stop` is set (node from `agent.node_name` unless given)."""
    agent = Agent(config, client=client, metrics=metrics, health=health,
                  node=node or node_name(config, {}), nvml=nvml, clock=clock,
                  detector_registry=detector_registry, reporter_tick_seconds=reporter_tick_seconds)
    await agent.run(stop)
