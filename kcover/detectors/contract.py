"""The detector contract: what a detector implements, what it is given, and what it may use.

A detector is a class registered in the entry point group `kcover.detectors` (`Detector`): it declares
the roles it runs in and a pydantic model for its config, is built with its name, its validated config
(an instance of that model: detectors are generic in their config type) and a `DetectorContext`, and
publishes onto the bus from `run()` until `stop` is set. It never writes to the Kubernetes API. Raising
from `run()` gets it restarted with backoff; raising `DetectorUnavailableError` marks it unavailable
here (no GPU, no DCGM, not this hardware).

The context carries what the role offers, each a typed field (a Protocol where more than one thing can
stand behind it): the controller's cluster reads (`ClusterView`), the agent's pod lookup by device
(`PodLookup`), the XID policy in force (`XidPolicy`), the log reader (`LogReader`), the node's capacity,
a command runner (`CommandRunner`), the NVML backend, and per-detector state that outlives a restart
(`state()`). A field the role does not offer is None (or empty).

This is the one kcover module a plugin imports, besides `kcover.model` (the event vocabulary every
detector publishes in: `CollectorEvent`, `Target`, `Fault`, `Severity`, `Action`). What else a plugin
may use is re-exported here under the names below: the bus, the errors a detector raises, the clock,
the subprocess runner, the waiting helpers, the cluster records, and (for plugins that keep kinds of
their own, like kcover-preflight) the Kubernetes client and reflector. It does no I/O and decides
nothing.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, TypeVar, cast, runtime_checkable

from pydantic import BaseModel

from kcover import bus as bus_
from kcover import codec, errors, kinds, model
from kcover import metrics as metrics_
from kcover.aio import clock as clock_
from kcover.aio import commands, waiting
from kcover.kube import client as client_
from kcover.kube import indexing, ownership, projecting, watching
from kcover.kube import projections as proj
from kcover.nvml import backend, xid_policy

# ---------------------------------------------------------------------------------------------- re-exports

Bus = bus_.Bus
Subscription = bus_.Subscription
Overflow = bus_.Overflow
BusClosedError = bus_.BusClosedError
KcoverError = errors.KcoverError
DetectorUnavailableError = errors.DetectorUnavailableError
KubeError = errors.KubeError
NotFoundError = errors.NotFoundError
ConflictError = errors.ConflictError
Clock = clock_.Clock
SystemClock = clock_.SystemClock
CommandRunner = commands.CommandRunner
CommandResult = commands.CommandResult
SubprocessRunner = commands.SubprocessRunner
CommandError = commands.CommandError
CommandNotFoundError = commands.CommandNotFoundError
CommandTimeoutError = commands.CommandTimeoutError
sleep_or_stop = waiting.sleep_or_stop
first_of = waiting.first_of
or_stop = waiting.or_stop
ChangeKind = indexing.Kind
"""What changed in the cluster cache: POD, NODE, WORKLOAD, EVENT or SLICE."""
Pod = proj.Pod
Node = proj.Node
Workload = proj.Workload
KubeEvent = proj.KubeEvent
ResourceSlice = proj.ResourceSlice
Record = proj.Pod | proj.Node | proj.Workload | proj.KubeEvent | proj.ResourceSlice
MEMBERSHIP_LABELS = kinds.MEMBERSHIP_LABELS
Resolved = ownership.Resolved
"""A pod's owner chain up to the workload recovery restarts (`ClusterView.resolve`)."""
Unresolved = ownership.Unresolved
controller_of = projecting.controller_of
Nvml = backend.Nvml
XidDecision = xid_policy.Decision
XidPolicy = xid_policy.Judge
"""The XID policy in force, as detectors judge with it (a Protocol: `longest_window_seconds`, `decide`)."""
KubeClient = client_.KubeClient
Reflector = watching.Reflector
MERGE_PATCH = client_.MERGE_PATCH

ConfigT_co = TypeVar("ConfigT_co", bound=BaseModel, covariant=True)
T = TypeVar("T")


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

OnChange = Callable[[indexing.Kind, Record | None, Record | None], None]
"""Told (kind, old, new) of every cache change: old None for an addition, new None for a removal."""


# ---------------------------------------------------------------------------------------------- what a role offers

class ClusterView(Protocol):
    """The reads a controller detector makes of the synced cluster cache (`kcover.kube.caching.ClusterCache`).
    Every answer is a slim record of `kcover.kube.projections`; none does I/O but `wait_synced`."""

    async def wait_synced(self, stop: asyncio.Event | None = None) -> bool:
        """Wait until the cache listed everything once; False when `stop` was set first."""
        ...

    def subscribe(self, callback: OnChange, *, replay: bool = True) -> Callable[[], None]:
        """Call `callback` synchronously for every change (and, with `replay`, for what is cached now);
        returns the unsubscribe function."""
        ...

    def pod(self, uid: str) -> proj.Pod | None: ...

    def pod_by_name(self, namespace: str, name: str) -> proj.Pod | None: ...

    def pods_on_node(self, node: str) -> Sequence[proj.Pod]: ...

    def pods_of_workload(self, workload_uid: str) -> Sequence[proj.Pod]: ...

    def node(self, name: str) -> proj.Node | None: ...

    def workload_of(self, pod: proj.Pod) -> proj.Workload | None:
        """The workload recovery would restart for `pod` (its top owner kcover supports), if cached."""
        ...

    def workload_ref(self, pod: proj.Pod) -> Mapping[str, str] | None:
        """That workload as kind/name/uid text, for the attributes people read."""
        ...

    def opted_in(self, pod: proj.Pod) -> bool:
        """The pod, its workload or its Namespace is labelled `kcover.io/cascading-recovery=true` (`ownership.opted_in`)."""
        ...

    def resolve(self, pod: proj.Pod) -> ownership.Resolved | ownership.Unresolved:
        """The pod's owner chain through controller ownerReferences with uids, up to its workload."""
        ...

    def is_gpu_node(self, node: proj.Node) -> bool:
        """The node has a non-zero capacity of a GPU resource (`kube.gpu_resources`)."""
        ...

    def holds_gpus(self, pod: proj.Pod) -> bool:
        """The pod requests a GPU resource or holds a DRA device."""
        ...

    def publishes_device(self, node: str, device: model.DraDevice) -> bool:
        """A ResourceSlice of `node` publishes that DRA driver, pool and device."""
        ...


class PodLookup(Protocol):
    """Which pods hold a device on this node (the agent asks the kubelet's PodResources)."""

    async def pods_for_devices(self, device_ids: Sequence[str]) -> list[str]:
        """`namespace/name` of the pods that hold any of `device_ids` (GPU or MIG UUIDs); [] when unknown.
        Never raises."""
        ...


class LogReader(Protocol):
    """Read-only access to container logs (the controller: the pods/log subresource)."""

    async def read_log(self, namespace: str, pod: str, container: str, *, previous: bool, tail_lines: int,
                       limit_bytes: int) -> str:
        """The last `tail_lines` lines of the container's log (of its previous instance when `previous`), at
        most about `limit_bytes` bytes. Raises `NotFoundError` when there is no such log, `KubeError` else."""
        ...


@dataclass
class DetectorContext:
    """What a detector may use. Fields a role does not provide are None (or empty)."""

    role: Role
    metrics: metrics_.Metrics
    """Register a detector's own metrics on `metrics.registry`."""
    clock: clock_.Clock = field(default_factory=clock_.SystemClock)
    """Wall and monotonic time: use it, not the OS, so tests can move it."""
    node_name: str = ""
    """Agent: the node it runs on."""
    cluster: ClusterView | None = None
    """Controller: the synced cluster cache."""
    gateway: client_.KubeClient | None = None
    """Both roles: kcover's Kubernetes client, for reads (and for plugins that keep kinds of their own, the
    writes to those). Its connections belong to the process's loop: only inline detectors may use it."""
    nvml: backend.Nvml | None = None
    """Agent: the NVML backend, real or simulated; None means the real one."""
    pod_lookup: PodLookup | None = None
    """Agent: which pods hold a device, when the agent can ask the kubelet."""
    xid_policy: XidPolicy | None = None
    """Agent: the XID policy in force; None means the shipped one."""
    log_reader: LogReader | None = None
    """Controller: container logs."""
    node_capacity: Mapping[str, str] = field(default_factory=dict)
    """Agent: the node's `status.capacity` (resource name -> quantity), read once at start; empty when it
    could not be read. Plugins that run only on some hardware check it."""
    command_runner: commands.CommandRunner = field(default_factory=commands.SubprocessRunner)
    """Runs node commands (`dcgmi`, `mx-smi`, check scripts): asyncio subprocesses in a running kcover;
    tests and the simulated cluster hand a scripted runner here."""
    namespace: str = ""
    """Controller: the namespace kcover runs in (the release namespace, its ledger's)."""
    refusals: RefusalSink | None = None
    """Controller: where refused signals are answered (`controller.answering`); None answers nothing."""
    agent_condition_type: str = codec.AGENT_CONDITION_TYPE
    """Controller: the Node condition kcover's agent sets (`agent.condition_type`)."""
    kept: dict[str, object] = field(default_factory=dict, repr=False, compare=False)
    """The state `state()` keeps, shared by every copy of this context; use `state()`."""

    def state(self, name: str, factory: Callable[[], T]) -> T:
        """The state object kept under `name`, made by `factory` the first time it is asked for and then the
        same object for the process's life, across restarts of the detector by the supervisor (a seen-set,
        what was already reported). Name it after the detector (its entry point name): every call with one
        name must ask for the same type."""
        found = self.kept.get(name)
        if found is None:
            found = self.kept[name] = factory()
        return cast(T, found)


# ---------------------------------------------------------------------------------------------- a detector

@runtime_checkable
class Detector(Protocol[ConfigT_co]):
    """A detector class with config type `ConfigT_co`: `config_model` is that type, and `__init__` is given
    an instance of it (validated by kcover), so a detector never checks the type of its config."""

    roles: ClassVar[frozenset[Role]]
    config_model: ClassVar[type[BaseModel]]

    def __init__(self, name: str, config: ConfigT_co, context: DetectorContext) -> None: ...

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        """Observe and publish until `stop` is set, then return promptly."""
        ...


DetectorClass = type[Detector[BaseModel]]
"""A detector class of any config type, as the registry loads it."""


class EmptyConfig(BaseModel):
    """For detectors without settings."""

    model_config = {"extra": "forbid"}


def cluster_of(context: DetectorContext, name: str) -> ClusterView:
    """The cluster reads, or `DetectorUnavailableError` naming the detector `name` that needs them."""
    if context.cluster is None:
        raise errors.DetectorUnavailableError(f"{name} needs the controller's cluster cache")
    return context.cluster
