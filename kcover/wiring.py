"""The long-running roles `kcover` can run, composed with their real implementations.

Owns the table of role commands the CLI offers (`controller`, `agent`): a role appears here only
once it works. Each role main builds its Kubernetes client from the settings, runs until `stop`,
and registers a reconfigure callable in `hooks` for hot reload. Reading files and the environment
stays in `kcover.cli`, which passes what a role needs (`environ`). A role's main imports its own package
when it starts, so `kcover agent` never loads the controller, nor the controller the agent.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from kcover import metrics, serving, settings
from kcover.detectors import registry
from kcover.kube import capabilities, leasing, retrying
from kcover.kube import client as client_

log = structlog.get_logger()

Reconfigure = Callable[[settings.Settings, set[str]], Awaitable[None]]


@dataclass
class RoleHooks:
    """What a running role offers back to the process: how to apply a new configuration."""

    environ: Mapping[str, str]
    """The process environment, read by `kcover.cli` (POD_NAME, NODE_NAME, KUBECONFIG, in-cluster
    variables)."""
    detectors: registry.Registry | None = None
    """The detectors discovered once by `kcover.cli` (the registry its configuration check used); None:
    discover."""
    reconfigure: Reconfigure | None = None
    fake_nvml_file: str = ""
    """`kcover agent --fake-nvml FILE`: use `nvml.scripted`'s fake driven by FILE instead of the real NVML."""
    abandon: Callable[[float], None] | None = None
    """What a forced exit calls, from the thread that ends the process, with the seconds it may take: the
    controller releases its Lease (`leasing.LeaderElector.abandon`)."""


RoleMain = Callable[[settings.Settings, metrics.Metrics, serving.Health, asyncio.Event, RoleHooks],
                    Coroutine[Any, Any, None]]
AddArgs = Callable[[argparse.ArgumentParser], None]


async def controller_main(config: settings.Settings, metrics_: metrics.Metrics, health: serving.Health,
                          stop: asyncio.Event, hooks: RoleHooks) -> None:
    structlog.contextvars.bind_contextvars(component="controller")
    kube = await client_.connect(config.kube.kubeconfig, environ=hooks.environ,
                                 request_timeout=config.kube.request_timeout_seconds,
                                 retry=retrying.policy_from(config.kube))
    async with kube:
        cfg = config
        if not cfg.lease.identity:
            pod = hooks.environ.get("POD_NAME") or hooks.environ.get("HOSTNAME", "") or leasing.default_identity()
            cfg = cfg.model_copy(update={"lease": cfg.lease.model_copy(update={"identity": pod})})
        elector = leasing.LeaderElector(kube, cfg.lease, identity=cfg.lease.identity,
                                        metrics=metrics_) if cfg.lease.enabled else None
        if elector is not None:
            hooks.abandon = elector.abandon
        stopped = asyncio.Event()  # set once the controller has stopped: the campaign ends last, releasing the Lease
        async with asyncio.TaskGroup() as group:
            if elector is not None:
                group.create_task(elector.run(stopped), name="leader-election")
            asking = group.create_task(announce_capabilities(kube, metrics_, health), name="api-capabilities")
            try:
                # The campaign runs first: the controller's package is imported in a thread meanwhile, so the
                # event loop answers the Lease's requests while it loads (acting still waits for the cache).
                await asyncio.to_thread(importlib.import_module, "kcover.controller.running")
                from kcover.controller import running as controller_running  # loaded: a cheap lookup

                controller = controller_running.Controller(cfg, client=kube, metrics=metrics_, health=health,
                                                           detector_registry=hooks.detectors, elector=elector)
                health.detectors = controller.supervisor.describe  # /detectors, read by `kcover detectors --url`
                hooks.reconfigure = controller.reconfigure
                await controller.run(stop)
            finally:
                asking.cancel()
                stopped.set()


async def agent_main(config: settings.Settings, metrics_: metrics.Metrics, health: serving.Health,
                     stop: asyncio.Event, hooks: RoleHooks) -> None:
    from kcover.agent import running as agent_running  # each role imports only what it runs
    from kcover.nvml import scripted

    node = agent_running.node_name(config, hooks.environ)
    structlog.contextvars.bind_contextvars(component="agent", node=node)
    kube = await client_.connect(config.kube.kubeconfig, environ=hooks.environ,
                                 request_timeout=config.kube.request_timeout_seconds,
                                 retry=retrying.policy_from(config.kube))
    async with kube:
        nvml = scripted.from_file(hooks.fake_nvml_file) if hooks.fake_nvml_file else None
        if nvml is not None:
            log.warning("fake_nvml_in_use", file=nvml.path)
        agent = agent_running.Agent(config, client=kube, metrics=metrics_, health=health, node=node, nvml=nvml,
                                    detector_registry=hooks.detectors)
        health.detectors = agent.supervisor.describe  # /detectors, read by `kcover detectors --url`
        hooks.reconfigure = agent.reconfigure
        async with asyncio.TaskGroup() as group:
            asked = tuple(capabilities.Capability(c) for c in metrics.AGENT_API_CAPABILITIES)
            asking = group.create_task(announce_capabilities(kube, metrics_, health, asked=asked),
                                       name="api-capabilities")
            try:
                await agent.run(stop)
            finally:
                asking.cancel()


async def announce_capabilities(kube: client_.KubeClient, metrics_: metrics.Metrics, health: serving.Health, *,
                                asked: tuple[capabilities.Capability, ...] = tuple(capabilities.Capability)) -> None:
    """Ask the API server what it serves (`capabilities.discover`), beside the role's start, never delaying
    it: one `api_capabilities` log line, `kcover_api_capability`, and the readiness check `api`, which
    passes whatever the answer (what kcover cannot do on this server is a detail, not a reason to stop)."""
    health.add_readiness("api", lambda: (True, "asking the API server what it serves"))
    found = await capabilities.discover(kube, asked=asked)
    capabilities.say(found, metrics_)
    health.add_readiness("api", lambda: (True, found.describe()))


def _controller_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="plan and record every action, write nothing else")
    p.add_argument("--identity", help="this replica's Lease identity (default: the pod name)")


def _agent_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node-name", help="the node this agent runs on (default: $NODE_NAME)")
    p.add_argument("--fake-nvml", metavar="FILE",
                   help="testing only: a fake NVML with 8 GPUs whose faults are lines appended to FILE "
                        "(`xid 79 0`; see kcover.nvml.scripted), for clusters of fake nodes")


ROLES: dict[str, tuple[str, RoleMain, AddArgs]] = {
    "controller": ("run the controller: detect faults cluster-wide and recover while leading",
                   controller_main, _controller_args),
    "agent": ("run the node agent: NVML and DCGM detectors reporting through Node conditions and Events",
              agent_main, _agent_args),
}
