"""The detector contract: what a plugin implements and what it is given.

A detector is a class registered in the entry point group `kcover.detectors`. It declares the roles
it runs in, a pydantic model for its config, and an async `run()` that publishes onto the bus until
`stop` is set. It never writes to the Kubernetes API. Raising from `run()` gets it restarted with
backoff; raising `errors.DetectorUnavailableError` marks it unavailable here (no GPU, no DCGM).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel

from kcover import bus as bus_
from kcover import metrics as metrics_
from kcover.aio import clock as clock_


class Role(enum.StrEnum):
    CONTROLLER = "controller"
    AGENT = "agent"


@dataclass(frozen=True)
class Refusal:
    """A signal a detector refused to act on, to be answered with a warning Event in its own namespace."""

    namespace: str
    """Where the answer goes: the namespace of the refused object (a forged Event's own)."""
    kind: str
    api_version: str
    name: str
    uid: str
    reason: str
    """Why (snake_case, the `kcover_events_rejected` reason)."""
    text: str
    """What a person reads."""


RefusalSink = Callable[[Refusal], None]
"""Takes a refusal without blocking; the controller writes (rate-limited) Events from it while leading."""


@dataclass
class DetectorContext:
    """What a detector may use. Fields a role does not provide are None."""

    role: Role
    metrics: metrics_.Metrics
    clock: clock_.Clock = field(default_factory=clock_.SystemClock)
    node_name: str = ""
    cache: Any = None
    """Controller: the synced cluster cache (`kcover.kube.caching.ClusterCache`)."""
    gateway: Any = None
    """Agent: the agent's `kcover.kube.client.KubeClient`, for reads (the controller reads through `cache`)."""
    nvml: Any = None
    """Agent: the NVML backend (`kcover.nvml.backend.Nvml`), real or simulated."""
    command_runner: Any = None
    """Runs node commands such as `dcgmi`; None (what both roles pass) means the detector's own asyncio
    subprocess runner. Tests hand the DCGM detector a scripted runner here."""
    namespace: str = ""
    """Controller: the namespace kcover runs in (the release namespace, its ledger's)."""
    refusals: RefusalSink | None = None
    """Controller: where refused signals are answered (`controller.answering`); None answers nothing."""
    extras: dict[str, Any] = field(default_factory=dict)
    """Anything else a composition root wants to hand plugins; keys are documented where they are set."""


@runtime_checkable
class Detector(Protocol):
    roles: ClassVar[frozenset[Role]]
    config_model: ClassVar[type[BaseModel]]

    def __init__(self, name: str, config: BaseModel, context: DetectorContext) -> None: ...

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        """Observe and publish until `stop` is set, then return promptly."""
        ...


class EmptyConfig(BaseModel):
    """For detectors without settings."""

    model_config = {"extra": "forbid"}
