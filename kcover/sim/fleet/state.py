"""The fleet replay's vocabulary: its parameters, the fleet's parts, what happened, and what policies are told.

Owns the data the world (`world`) keeps and the report (`report`) reads: `Params` (the fleet, the job
mix and the effective-training-time model, each with its unit and default), `Fault` (one onset and its
fate), `Node`, `Job`, `Interruption` (one stop of one job and how it ended), `CordonRecord`, and the
notices a policy receives (`Notice`: what a real controller could observe, plus the world's own changes
a policy that mirrors the fleet in an API server must copy). Plain dataclasses; no behaviour, no I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from kcover.sim.fleet import taxonomy as tax
from kcover.sim.fleet import trace as trace_


@dataclass(frozen=True)
class Params:
    """The fleet and the effective-training-time model (`kcover sim fleet --help` shows each flag)."""

    nodes: int = 2048
    gpus_per_node: int = 8
    jobs: tuple[tuple[int, int], ...] = ((1, 1024), (8, 64), (56, 8))
    """(count, nodes per job): one 1,024-node job, eight 64-node and fifty-six 8-node jobs (1,984 nodes; 64
    spare, 3.1 %). One pod per node, holding its eight GPUs."""
    days: float = 54.0
    checkpoint_minutes: float = 30.0
    """A job checkpoints every this many minutes of training; a stop loses the work since the last one."""
    restart_minutes: float = 10.0
    """From a job's pods being (re)started to training again: scheduling, containers, NCCL set-up, loading
    the checkpoint."""
    nccl_timeout_minutes: float = 10.0
    """The NCCL watchdog's timeout (PyTorch's default): ranks waiting on a dead peer abort after it."""
    repair_hours: float = 24.0
    """A node taken out of service (cordoned by anyone) and empty is back this long after: repaired, or
    looked at and found healthy, and un-cordoned by a person."""
    person_hours: float = 4.0
    """A person finds a faulty part that keeps failing jobs (or a node that stays NotReady) this long
    after its first interruption, if nothing isolated it, and cordons it."""
    eviction_seconds: float = 300.0
    """Pods on a NotReady node are evicted and replaced after this long (the default toleration)."""
    pod_stop_seconds: float = 10.0
    """From a policy deleting a job's pods to their replacements being created (graceful termination)."""
    diag_interval_seconds: float = 3600.0
    """The agent's `dcgmi diag` schedule (`detectors.entries.dcgm.config.diag_interval_seconds`)."""
    seed: int = 1

    @property
    def horizon(self) -> float:
        return self.days * 86400.0

    @property
    def job_nodes(self) -> int:
        return sum(count * size for count, size in self.jobs)


class JobState(enum.StrEnum):
    RUNNING = "running"
    DOWN = "down"
    """Stopped by a fault; nothing has restarted it yet."""
    RESTARTING = "restarting"
    """Restarted; its pods are being replaced or start up (`restart_minutes`)."""
    PENDING = "pending"
    """Restarted, but not enough schedulable nodes are free."""


@dataclass
class Fault:
    id: int
    onset: trace_.Onset
    cls: tax.FaultClass
    active: bool = True
    """Persistent: until repaired. Transient: until it struck. Follows-job: until its failures are spent."""
    job: str = ""
    """Follows-job: the job whose bug it is."""
    failures_left: int = 0
    interruptions: int = 0
    first_signal: float | None = None
    """When a controller could first have seen it (an XID, a NotReady, a failed diagnostic, an exit)."""
    first_interruption: float | None = None
    isolated_at: float | None = None
    isolated_by: str = ""
    """`policy` or `person`."""
    repaired_at: float | None = None

    @property
    def persistent(self) -> bool:
        return self.cls.physics is tax.Physics.PERSISTENT

    @property
    def node_dead(self) -> bool:
        return self.persistent and self.onset.signal is tax.SignalKind.NOTREADY


@dataclass
class Node:
    index: int
    name: str
    ready: bool = True
    cordoned_by: str = ""
    """"" (schedulable), `policy` or `person`."""
    cordoned_at: float | None = None
    job: str = ""
    """The job whose pod is on this node."""
    faults: list[Fault] = field(default_factory=list)
    """Active persistent faults."""
    notready_since: float | None = None
    repair_until: float | None = None
    emptied_at: float | None = None
    """When it was last left without a pod (for healthy GPU-hours lost)."""
    last_fault: Fault | None = None
    """The last fault that struck here (a job's rank on this node, or an onset): what a cordon answers."""

    @property
    def usable(self) -> bool:
        return self.ready and not self.cordoned_by and self.repair_until is None


@dataclass
class Interruption:
    job: str
    at: float
    fault: Fault | None
    """None: the policy stopped a job that was running fine."""
    repeat: bool = False
    """A persistent fault striking again after its first interruption."""
    signal_at: float = 0.0
    """When the first signal any controller could see appeared."""
    decided_at: float | None = None
    """When a restart began: the policy's, a person's, or Kubernetes' own (in place)."""
    by: str = ""
    """`policy`, `person` or `kubernetes`."""
    resumed_at: float | None = None
    rework: float = 0.0
    pending: float = 0.0
    """Seconds the job waited for free nodes."""


@dataclass
class Job:
    name: str
    size: int
    ranks: list[int | None]
    state: JobState = JobState.RUNNING
    run: int = 0
    """Bumped at every (re)start decision; scheduled events carry the run they belong to."""
    started_at: float = 0.0
    bug: Fault | None = None
    streak: int = 0
    """In-place restarts in a row without ten minutes of running (the kubelet's back-off)."""
    down: Interruption | None = None
    productive: float = 0.0
    """Seconds of training kept (run time minus the work lost since the last checkpoint)."""
    pending_since: float | None = None
    blocked_until: float = 0.0
    progress: list[tuple[float, float]] = field(default_factory=list)
    """(time, productive seconds so far) at each change, for the plot."""


def initial_jobs(params: Params) -> dict[str, Job]:
    """The fleet's jobs at the replay's start, by name, in `params.jobs`' order: each of its ranks on the next
    node (indices from 0); the nodes after the last job's are spare."""
    jobs: dict[str, Job] = {}
    index = 0
    for count, size in params.jobs:
        for k in range(count):
            name = f"train-{size}n-{k:02d}" if count > 1 else f"train-{size}n"
            jobs[name] = Job(name, size, list(range(index, index + size)), progress=[(0.0, 0.0)])
            index += size
    return jobs


@dataclass
class CordonRecord:
    node: int
    at: float
    by: str
    healthy: bool
    """No active fault on the node and Ready: a healthy node taken out of service."""
    cause: str = ""
    """The cordon's reason as the policy gave it."""
    fault: Fault | None = None
    """The last fault that struck the node before the cordon (None: none ever did)."""
    returned_at: float | None = None
    idle_seconds: float = 0.0
    """Seconds it spent out of service and empty while healthy (GPU-hours lost = this x GPUs / 3600)."""


# ---------------------------------------------------------------------------------------------- notices

@dataclass(frozen=True)
class RankExited:
    """A rank's container exited with an error; the kubelet restarts it in place (restartPolicy OnFailure)."""

    job: str
    rank: int
    node: int
    exit_code: int
    message: str


@dataclass(frozen=True)
class XidSeen:
    """The node's agent sees an XID on one of its GPUs."""

    node: int
    gpu: int
    xid: int


@dataclass(frozen=True)
class LinkDown:
    """The node's agent sees RDMA port `port` (`mlx5_<port>`, the rail of GPU `port`) go down and up."""

    node: int
    port: int


@dataclass(frozen=True)
class NodeReadiness:
    node: int
    ready: bool


@dataclass(frozen=True)
class DiagResult:
    """The node's scheduled `dcgmi diag`: failed on `gpu`, or passed."""

    node: int
    gpu: int
    failed: bool


@dataclass(frozen=True)
class Placed:
    """Pods (re)created for these ranks on these nodes; the job's other pods were kept as they were."""

    job: str
    ranks: tuple[tuple[int, int], ...]
    """(rank, node) of every new pod."""


@dataclass(frozen=True)
class PersonCordoned:
    node: int


@dataclass(frozen=True)
class NodeReturned:
    """A person un-cordoned the node after its repair (or after finding nothing wrong)."""

    node: int


Notice = RankExited | XidSeen | LinkDown | NodeReadiness | DiagResult | Placed | PersonCordoned | NodeReturned
