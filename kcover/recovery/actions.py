"""The actions `policy.plan()` returns and the executors carry out: frozen values, no behaviour.

Owns the vocabulary of recovery (restart a workload, cordon or un-cordon a node, taint or un-taint one
DRA device, skip with a reason, record only) and the references they carry. It does no I/O and makes no decisions.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kcover import model


@dataclass(frozen=True)
class ObjectRef:
    """What an audit Event is about (`involvedObject`)."""

    kind: str
    api_version: str
    name: str
    namespace: str = ""
    uid: str = ""

    def describe(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"


@dataclass(frozen=True)
class WorkloadRef(ObjectRef):
    pass


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class MemberSelector:
    """Labels that select the restart unit's pods, and only them.

    `uid_bearing` is True when one of the labels carries the workload's uid (then no other workload
    can match). `pods` is set when the labels alone were not safe: the executor then deletes exactly
    those pods, one by one, with `preconditions.uid`.
    """

    labels: tuple[tuple[str, str], ...]
    uid_bearing: bool = False
    pods: tuple[PodRef, ...] | None = None

    def render(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.labels)

    def matches(self, labels: Mapping[str, str] | Iterable[tuple[str, str]]) -> bool:
        """The labels (a mapping, or a projection's (key, value) pairs) carry every selector label."""
        found = labels if isinstance(labels, Mapping) else dict(labels)
        return all(found.get(k) == v for k, v in self.labels)


ActionKind = model.Action
"""The actions rules choose between: the same vocabulary a fault's source recommends in."""


class SkipCode(enum.StrEnum):
    NAMESPACE_DENIED = "NamespaceDenied"
    NOT_OPTED_IN = "NotOptedIn"
    NO_CONTROLLER = "NoController"
    UNSUPPORTED_OWNER = "UnsupportedOwner"
    OWNER_NOT_CACHED = "OwnerNotCached"
    OWNER_MISMATCH = "OwnerMismatch"
    TARGET_UNKNOWN = "TargetUnknown"
    RESTART_POLICY = "RestartPolicyForbids"
    COOLDOWN = "Cooldown"
    BUDGET_EXHAUSTED = "BudgetExhausted"
    BREAKER_OPEN = "BreakerOpen"
    ALREADY_CORDONED = "AlreadyCordoned"
    CORDONED_BY_OTHERS = "CordonedByOthers"
    NOT_CORDONED_BY_KCOVER = "NotCordonedByKcover"
    PRECONDITION_FAILED = "PreconditionFailed"
    SAVE_LOGS_FAILED = "SaveLogsFailed"
    NO_WORKLOADS = "NoWorkloads"
    ALREADY_ACTED = "AlreadyActedOn"
    """The signal that caused this was acted on before (the ledger remembers): a replay, never acted on twice."""
    INTENT_REFUSED = "IntentRefused"
    """A pending intent in the ledger no longer matches the cluster (workload, opt-in, selector): dropped."""
    PAUSED = "Paused"
    """An operator paused kcover for this target (`kcover.io/paused=true` at global, namespace, workload or node scope)."""
    BREAKER_LATCHED = "BreakerLatched"
    """The breaker tripped and stays open until a person resets it (`recovery.breaker_latch`)."""
    BREAKER_COOLDOWN = "BreakerCooldown"
    """A latched breaker was reset less than `recovery.breaker_cooldown_seconds` ago."""


@dataclass(frozen=True)
class RestartWorkload:
    workload: WorkloadRef
    selector: MemberSelector
    ledger_key: str
    """Ledger entry holding this restart unit's restart times (a workload, or one LWS group)."""
    pod: PodRef | None
    """The faulting pod (or a pod on the faulting node); re-checked just before the delete."""
    cause: model.CollectorEvent
    unit: str = ""
    """Human name of the restart unit when it is smaller than the workload (an LWS group)."""


@dataclass(frozen=True)
class CordonNode:
    node: str
    reason: str
    cause: model.CollectorEvent


@dataclass(frozen=True)
class UncordonNode:
    node: str
    cause: model.CollectorEvent | None = None


@dataclass(frozen=True)
class TaintDevice:
    """Isolate one DRA device with kcover's DeviceTaintRule; the node stays schedulable.

    `fallback` is what the policy would have done at node level (a cordon with every check, and the
    restarts it implies): the executor carries it out instead where the API server serves no
    DeviceTaintRules."""

    device: model.DraDevice
    node: str
    reason: str
    cause: model.CollectorEvent
    fallback: tuple[CordonNode | RestartWorkload | Skip, ...] = ()


@dataclass(frozen=True)
class UntaintDevice:
    """Remove kcover's own DeviceTaintRule of one device (never a rule someone else wrote)."""

    device: model.DraDevice
    node: str
    cause: model.CollectorEvent


@dataclass(frozen=True)
class Skip:
    code: SkipCode
    text: str
    cause: model.CollectorEvent
    about: ObjectRef | None = None
    """The object the refusal concerns; the audit Event goes there."""
    audit: bool = True
    """False for routine refusals (cooldown, already cordoned) that would flood the API with Events."""


@dataclass(frozen=True)
class RecordOnly:
    """The `report` action: an Event on the object, nothing else."""

    text: str
    cause: model.CollectorEvent
    about: ObjectRef | None = None


Action = RestartWorkload | CordonNode | UncordonNode | TaintDevice | UntaintDevice | Skip | RecordOnly


def action_name(action: Action) -> str:
    """Metric label of an action."""
    if isinstance(action, RestartWorkload):
        return "restart_workload"
    if isinstance(action, CordonNode):
        return "cordon_node"
    if isinstance(action, UncordonNode):
        return "uncordon_node"
    if isinstance(action, TaintDevice):
        return "taint_device"
    if isinstance(action, UntaintDevice):
        return "untaint_device"
    if isinstance(action, RecordOnly):
        return "report"
    return "skip"
