"""The agent's GPU sight: whether this agent can see its node's GPU faults at all.

Owns the rule "this agent is blind": on a node kcover counts as a GPU node (a GPU resource in its Node's
`status.capacity`, `kcover.kube.gpus` with `kube.gpu_resources`; or, for the agent's sight, the labels of
`agent.gpu_node_labels`, `nvidia.com/gpu.present=true` by default: a node whose driver never loaded has no
GPU capacity, and its label is what placed the agent there), none of the GPU detectors
(`agent.gpu_detectors`: NVML and DCGM by default) watches: each is unavailable (NVML cannot load, no
`dcgmi`: a broken driver rollout or a missing runtime class), failed, stopped or disabled. A blind agent
says so instead of reporting healthy GPUs: the reporter writes the condition `Unknown` with reason
`NoGPUDetector` and what is missing per detector (`reporting.condition`), `kcover_agent_blind{node}` is 1,
and /readyz and /detectors say degraded (the pod stays Ready: see `degraded`).

A detector watches once its attempt has run `detectors.settle_seconds` (`supervising.Status.settled`).
While a GPU detector has started and not settled, and none watches, there is no judgement yet
(`Seeing.SETTLING`): the reporter keeps the condition it wrote, so the agent never says `True` on a
detector about to fail, nor flips a blind condition on each retry. A node that is not a GPU node is
judged as before (`Seeing.NOT_A_GPU_NODE`: healthy unless a fault says otherwise).

The Node is read when the agent starts and, while it does not count as a GPU node, again every
`agent.gpu_node_recheck_seconds` (a device plugin may publish its capacity after the agent started);
once a GPU node, it stays one for the life of the process (a device plugin that lost the driver may drop
its capacity to 0: the node is still a GPU node the agent cannot see). `judge` is pure; a failed read is
logged and counts as not (yet) a GPU node.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import prometheus_client
import structlog

from kcover.aio import waiting
from kcover.detectors import supervising
from kcover.kube import gpus, projecting
from kcover.kube import projections as proj

log = structlog.get_logger()

BLIND_REASON = "NoGPUDetector"
"""The reason of the agent's condition while it is blind."""


class Seeing(enum.StrEnum):
    SEES = "sees"
    """A GPU detector watches this node's GPUs."""
    SETTLING = "settling"
    """None watches yet, and one has started and not settled: no judgement yet."""
    BLIND = "blind"
    """A GPU node that no GPU detector watches."""
    NOT_A_GPU_NODE = "not-a-gpu-node"


@dataclass(frozen=True)
class Sight:
    seeing: Seeing
    missing: str = ""
    """BLIND: what each GPU detector lacks, `nvml: ...; dcgm: ...`."""

    @property
    def message(self) -> str:
        return f"kcover agent cannot see this node's GPUs: no GPU detector runs ({self.missing})"


def _why(name: str, status: supervising.Status | None) -> str:
    if status is None:
        return f"{name}: not enabled on this agent"
    detail = f" ({status.detail})" if status.detail and status.state != "unavailable" else ""
    what = status.detail if status.state == "unavailable" and status.detail else status.state
    return f"{name}: {what}{detail}"


def judge(*, gpu_node: bool, statuses: Mapping[str, supervising.Status], gpu_detectors: Sequence[str]) -> Sight:
    """What the agent sees, from whether its node is a GPU node and its detectors' states (pure)."""
    if not gpu_node:
        return Sight(Seeing.NOT_A_GPU_NODE)
    mine = {name: statuses.get(name) for name in gpu_detectors}
    if any(s is not None and s.state == "running" and s.settled for s in mine.values()):
        return Sight(Seeing.SEES)
    if any(s is not None and s.state in ("starting", "running") for s in mine.values()):
        return Sight(Seeing.SETTLING)
    return Sight(Seeing.BLIND, "; ".join(_why(name, s) for name, s in mine.items()) or "agent.gpu_detectors is empty")


class NodeRead(NamedTuple):
    """One read of the agent's Node: its projection and its labels (the projection keeps none)."""

    node: proj.Node
    labels: Mapping[str, str]


def node_read(raw: Mapping[str, Any] | None) -> NodeRead | None:
    """The read of a Node object as the API server returned it (None: the read failed)."""
    if raw is None:
        return None
    labels = (raw.get("metadata") or {}).get("labels")
    safe = {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(labels, Mapping) else {}
    return NodeRead(projecting.node(raw), safe)


ReadNode = Callable[[], Awaitable[NodeRead | None]]


class GpuSight:
    """The agent's sight, kept current: its node's GPU-ness (read, re-read while not one) and the gauge."""

    def __init__(self, node: str, *, rule: gpus.GpuRule, gpu_detectors: Sequence[str],
                 statuses: Callable[[], Mapping[str, supervising.Status]], gauge: prometheus_client.Gauge,
                 recheck_seconds: float, gpu_node_labels: Mapping[str, str] | None = None) -> None:
        self.node = node
        self.rule = rule
        self.gpu_node_labels = dict(gpu_node_labels or {})
        """Labels that make a node a GPU node for the sight, all of them (none: capacity alone)."""
        self.gpu_detectors = tuple(gpu_detectors)
        self.recheck_seconds = recheck_seconds
        self._statuses = statuses
        self._gauge = gauge.labels(node=node)
        self._gauge.set(0)
        self.gpu_node = False
        self.known = False
        """The Node was read (or its read failed) at least once: until then there is no judgement."""
        self._last: Seeing | None = None

    def learn(self, read: NodeRead | None) -> None:
        """Fold in a read of the Node (None: the read failed)."""
        self.known = True
        if read is None or self.gpu_node:
            return
        labelled = bool(self.gpu_node_labels) and all(read.labels.get(k) == v for k, v in self.gpu_node_labels.items())
        if self.rule.is_gpu_node(read.node) or labelled:
            self.gpu_node = True
            log.info("agent_on_gpu_node", node=self.node, gpus=self.rule.gpu_capacity(read.node),
                     labels=sorted(self.gpu_node_labels) if labelled else [])

    def current(self) -> Sight:
        """The sight now; logs a change and keeps `kcover_agent_blind` in step."""
        if not self.known:
            return Sight(Seeing.SETTLING)
        sight = judge(gpu_node=self.gpu_node, statuses=self._statuses(), gpu_detectors=self.gpu_detectors)
        self._gauge.set(1 if sight.seeing is Seeing.BLIND else 0)
        if sight.seeing is not self._last and sight.seeing is not Seeing.SETTLING:
            if sight.seeing is Seeing.BLIND:
                log.warning("agent_blind", node=self.node, missing=sight.missing)
            elif self._last is Seeing.BLIND:
                log.info("agent_sees_again", node=self.node)
            self._last = sight.seeing
        return sight

    def degraded(self) -> str:
        """For /readyz and /detectors: what the agent cannot see, or "" (`serving.Health.add_degradation`).

        Degraded, not failing: a DaemonSet pod that is not Ready counts against the rollout's
        maxUnavailable, so a driver rollout broken across a fleet would stall kcover's own rollout exactly
        where its report is wanted, and a restart would not make the driver load; the condition, the metric
        and the alert (`KcoverAgentBlind`) say it instead."""
        sight = self.current()
        return sight.message if sight.seeing is Seeing.BLIND else ""

    async def run(self, read: ReadNode, stop: asyncio.Event) -> None:
        """Re-read the Node every `recheck_seconds` while it does not count as a GPU node."""
        while not self.gpu_node:
            if await waiting.sleep_or_stop(stop, self.recheck_seconds):
                return
            self.learn(await read())
