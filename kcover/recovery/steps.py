"""The vocabulary of recovery: the steps a plan is made of, and the typed outcome of carrying one out.

Owns the steps (`Restart` a workload's pods, `Cordon` / `Uncordon` a node, `TaintDevice` / `UntaintDevice`,
`Report`, `Refuse` with a reason, `Hold` a restart for later, the node ladder's `Drain` /
`RequestRemediation` / `CallPerson`, `RequestValidation` and `Judge` (a suspect node's verdict),
`RecordOnly` (a step decided and recorded, not carried out), `LatchBreaker` / `ResetBreaker`, and `Emit`, an
Event to write), the references they carry, the refusal codes (`Code`) and the four outcomes (`Done`,
`Refused`, `Failed`, `Held`). Steps are frozen values: `planning.plan` and the hooks make them, the
`coordinating.Coordinator` runs them. It does no I/O and makes no decisions.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kcover import kinds, model
from kcover.kube import events
from kcover.recovery import ledgerentries

ObjectRef = events.About
"""What an Event is about (`involvedObject`): the Event builder's own type, so an `Emit` needs no translation."""


@dataclass(frozen=True)
class WorkloadRef(ObjectRef):
    pass


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str


def node_ref(name: str, uid: str = "") -> ObjectRef:
    return ObjectRef("Node", "v1", name, "", uid)


@dataclass(frozen=True)
class Selector:
    """Labels that select a restart unit's pods (for people and for the followers of a restart).

    `uid_bearing`: one label carries the workload's uid, so no other workload's pod can match. A restart
    never removes pods by selector: it removes the pods the plan resolved to the workload, one by one,
    each with its uid as precondition (`Restart.members`)."""

    labels: tuple[tuple[str, str], ...]
    uid_bearing: bool = False

    def render(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.labels)

    def matches(self, labels: Mapping[str, str] | Iterable[tuple[str, str]]) -> bool:
        found = labels if isinstance(labels, Mapping) else dict(labels)
        return all(found.get(k) == v for k, v in self.labels)


class Code(enum.StrEnum):
    """Why a step was refused or held: each produced by exactly one function (named below)."""

    NAMESPACE_DENIED = "NamespaceDenied"
    """`targets.namespace_allowed`: recovery.namespaces_allow/deny."""
    NOT_OPTED_IN = "NotOptedIn"
    """`planning`, by `ownership.opted_in`."""
    NO_CONTROLLER = "NoController"
    """`ownership.resolve`: a bare pod (nothing would recreate it)."""
    UNSUPPORTED_OWNER = "UnsupportedOwner"
    OWNER_NOT_CACHED = "OwnerNotCached"
    OWNER_MISMATCH = "OwnerMismatch"
    TARGET_UNKNOWN = "TargetUnknown"
    """`planning`: the fault names nothing in the cache kcover can act on."""
    RESTART_POLICY = "RestartPolicyForbids"
    """`kinds.forbidden`, through `planning`."""
    NO_WORKLOADS = "NoWorkloads"
    """`planning`: no opted-in workload has pods where the fault is."""
    PAUSED = "Paused"
    """`controls.paused_scope`: `kcover.io/paused=true` at the global, namespace, workload, pod or node scope."""
    COOLDOWN = "Cooldown"
    """`admission.restart`, `planning`: the unit was restarted within its cooldown (or a restart of it is in
    flight)."""
    NODE_COOLDOWN = "NodeCooldown"
    """`admission.cordon`: the node, in service again (returned or uncordoned by a person), faulted within
    `recovery.node_cooldown_seconds` of kcover's last cordon of it. Not routine: an Event says it was left
    in service (a node kcover holds cordoned is `ALREADY_CORDONED`, decided before this)."""
    BUDGET_EXHAUSTED = "BudgetExhausted"
    """`admission.admit_restart`: the unit's restarts within the window reached the budget."""
    ALREADY_ACTED = "AlreadyActedOn"
    """`admission`: this outside signal already moved this unit (a replay); a signal moves a unit once."""
    ALREADY_RESTARTED = "AlreadyRestarted"
    """`admission.admit_restart`: the faulting pod was one a restart of its unit already removed."""
    BREAKER_OPEN = "BreakerOpen"
    """`admission.breaker`: a limit on restarts or cordons in flight or per window was reached."""
    BREAKER_LATCHED = "BreakerLatched"
    """`admission.breaker`: the breaker tripped and stays open until a person resets it."""
    BREAKER_COOLDOWN = "BreakerCooldown"
    """`admission.breaker`: a latched breaker was reset less than `recovery.breaker_cooldown_seconds` ago."""
    ALREADY_CORDONED = "AlreadyCordoned"
    """`cordoning.refusal`: kcover's cordon is in effect on the node (its annotation, with `spec.unschedulable`
    or kcover's taint)."""
    CORDONED_BY_OTHERS = "CordonedByOthers"
    """`cordoning.refusal`: someone else made the node unschedulable; kcover leaves it alone."""
    NOT_CORDONED_BY_KCOVER = "NotCordonedByKcover"
    """`cordoning.refusal_to_return`: kcover only ever un-cordons a node it cordoned."""
    SAVE_LOGS_FAILED = "SaveLogsFailed"
    """`restarting`: saving the logs failed and `save_logs.proceed_on_failure` is off."""
    INTENT_REFUSED = "IntentRefused"
    """`restarting.vet`: a pending intent no longer matches the cluster (workload, opt-in)."""
    DEVICE_TAINTS_UNSERVED = "DeviceTaintsUnserved"
    """`coordinating`: the API server stopped serving DeviceTaintRules since the plan; the next fault on the
    device is answered at node level."""
    NOTHING_TO_REMOVE = "NothingToRemove"
    """`planning`: every pod of the unit is already terminal or terminating: its controller recreates them."""
    DEVICE_TAINT_LIMIT = "DeviceTaintLimit"
    """`admission.device_taint`: the node holds `recovery.device_taints.max_per_node` device taints (those in
    flight counted); the device is not tainted, its holders still restarted; a cap, never a trip."""
    THROTTLED = "Throttled"
    """`admission.restart`: `recovery.max_concurrent_restarts` restarts are in flight; held, never latches."""
    AWAITING_VERDICT = "AwaitingVerdict"
    """`planning._Planner.await_verdict`: the fault's node is suspect and its validation not answered yet; the
    restart is held until the verdict (a failed one cordons the node first) or `judgement.verdict_wait_seconds`."""
    AWAITING_CORDON = "AwaitingCordon"
    """`planning`: the fault asks for its node's cordon and an earlier plan's cordon of it is in flight; the
    restart is held until the node shows cordoned (or that cordon failed and this plan cordons it), so that
    the restarted pods are not recreated on it before the cordon lands."""
    OWN_POLICY = "WorkloadPolicyRestarts"
    """`kinds.own_policy_restarts`, through `planning`: the workload's own failure policy (a JobSet's
    `failurePolicy`, a Job's `podFailurePolicy`) already answers this pod failure; a second restart by
    kcover would cost it a retry."""


ROUTINE = frozenset({Code.NAMESPACE_DENIED, Code.NOT_OPTED_IN, Code.COOLDOWN, Code.ALREADY_CORDONED,
                     Code.CORDONED_BY_OTHERS, Code.NOT_CORDONED_BY_KCOVER, Code.ALREADY_ACTED,
                     Code.ALREADY_RESTARTED, Code.TARGET_UNKNOWN, Code.NO_WORKLOADS, Code.NOTHING_TO_REMOVE})
"""Refusals that are logged and counted, never written as Events: a 1,000-pod job failing at once writes
one Event, not 1,000."""


# ------------------------------------------------------------------------------------------ steps

@dataclass(frozen=True)
class Restart:
    """Take a restart unit's pods away so its controller recreates them."""

    workload: WorkloadRef
    unit_key: str
    """The ledger key of the restart unit (`w.<uid>`, or `w.<uid>.g<group>` for a LeaderWorkerSet group)."""
    unit: str
    """Human name of the unit when smaller than the workload (`group 2`), else ""."""
    selector: Selector
    members: tuple[PodRef, ...]
    """The pods to take away: the unit's pods the plan resolved to the workload, not terminal (their
    controller counts those) and not already terminating, each removed with its uid as precondition."""
    removal: kinds.Removal
    pod: PodRef | None
    """The faulting pod, when the fault named one."""
    cause: model.CollectorEvent
    node: str = ""
    """Where the fault is (the faulting pod's node, or the faulting node)."""
    blame: model.Blame = model.Blame.UNKNOWN
    rank: str = ""
    """Which pod of the unit faulted (`kinds.rank_of`), for the evidence against its node."""
    judged: bool = False
    """A restart held for its node's verdict, planned again after it (`holding.replan_held`): the verdict
    answered its fault (or will: it waits while the suspicion is open), so it makes no node suspect again,
    and the ledger records it without its place (no evidence against the node later either)."""

    @property
    def what(self) -> str:
        return self.workload.describe() + (f" {self.unit}" if self.unit else "")


@dataclass(frozen=True)
class Cordon:
    node: str
    reason: str
    cause: model.CollectorEvent
    blame: model.Blame = model.Blame.UNKNOWN
    swept: frozenset[str] | None = None
    """The node's pods (uids) its plan restarted or passed over, when the cordon comes with the restart of
    the node's workloads; None when it restarts nothing. Once the cordon is written, a pod not among them
    that came to the node before the cordon held is a late arrival (`latearrivals`)."""


@dataclass(frozen=True)
class EnterCordon:
    """Enter in the ledger a cordon of kcover's found on a node whose entry lacks it: a term ended between
    the Node write and its entry (`Coordinator.cordon` writes them in that order), or the entry's write
    failed. The node's cooldown and the breaker's window then count it, as they count every other cordon."""

    node: str
    at: float
    """Epoch seconds of the cordon: the node's `kcover.io/cordoned-at`."""
    reason: str


@dataclass(frozen=True)
class NoteLinkDown:
    """Record in the node's ledger entry that its agent saw one of its RDMA ports go down (evidence the
    judgement reads when a job with a rank there fails soon after: `linking.linked`). Moves nothing itself."""

    node: str
    at: float
    """Epoch seconds the agent saw the link go down (its observation's time)."""
    cause: model.CollectorEvent


@dataclass(frozen=True)
class Uncordon:
    node: str
    cause: model.CollectorEvent


@dataclass(frozen=True)
class TaintDevice:
    """Isolate one DRA device with kcover's DeviceTaintRule; the node stays schedulable."""

    device: model.DraDevice
    node: str
    reason: str
    cause: model.CollectorEvent


@dataclass(frozen=True)
class UntaintDevice:
    """Remove kcover's own DeviceTaintRule of a device (never another's): healthy again, or held too long."""

    device: model.DraDevice
    node: str
    cause: model.CollectorEvent | None
    """The fault that cleared; None when kcover ends a taint it held past `device_taints.max_hold_seconds`."""
    why: str = "the device is healthy again"


@dataclass(frozen=True)
class Report:
    """The `report` action: an Event a person reads, nothing else."""

    text: str
    cause: model.CollectorEvent
    about: ObjectRef | None = None


@dataclass(frozen=True)
class Refuse:
    """A refusal decided by the plan: logged, counted, and (unless routine) an Event on `about`."""

    code: Code
    text: str
    cause: model.CollectorEvent
    about: ObjectRef | None = None
    quiet: bool = False
    """Logged and counted only, whatever the code (an owner problem of a pod that never opted in)."""

    @property
    def audit(self) -> bool:
        return self.code not in ROUTINE and not self.quiet


@dataclass(frozen=True)
class Hold:
    """A restart refused for a blocker that lifts (a pause, a cooldown, the budget window, the breaker):
    kept in the ledger and planned again when the blocker lifts, unless the workload recovered meanwhile."""

    restart: Restart
    """The restart held, its `members` not resolved (empty): the pods it takes away are read when it is
    planned again (`holding.replan_held`), as they will have changed by then."""
    code: Code
    text: str
    until: float
    """Epoch seconds after which the held restart is given up (`recovery.hold_seconds` after the fault)."""

    @property
    def cause(self) -> model.CollectorEvent:
        return self.restart.cause


@dataclass(frozen=True)
class Resume:
    """Finish (or forget, or give up) a restart the ledger holds as pending: an earlier leader's, or this
    leader's own whose removals failed. `restart` is what it stands for, once vetted against the cluster."""

    key: str
    intent: ledgerentries.Intent
    restart: Restart | None = None

    @property
    def cause(self) -> model.CollectorEvent | None:
        return self.restart.cause if self.restart is not None else None


@dataclass(frozen=True)
class Drain:
    """The node ladder's drain of a cordoned node (`recovery.escalation.drain_mode`)."""

    node: str
    pods: tuple[PodRef, ...]
    cause: model.CollectorEvent


@dataclass(frozen=True)
class RequestRemediation:
    """Ask an external remediator for the node (label and condition), or take the request back."""

    node: str
    requested: bool
    message: str
    cause: model.CollectorEvent | None = None


@dataclass(frozen=True)
class CallPerson:
    """The ladder's last step: an Event saying what kcover did and what is left to a person."""

    about: ObjectRef
    message: str
    cause: model.CollectorEvent | None = None


class Purpose(enum.StrEnum):
    """Why kcover asks a node's agent for a validation."""

    RETURN = "return"
    """Before returning a node kcover cordoned to service (`recovery.return_validation`)."""
    SUSPECT = "suspect"
    """Differential evidence made a schedulable node suspect (`recovery.judgement`): only a failed
    validation cordons it."""


@dataclass(frozen=True)
class RequestValidation:
    """Ask the node's agent to validate it (`dcgmi diag`)."""

    node: str
    cause: model.CollectorEvent
    purpose: Purpose = Purpose.RETURN
    evidence: str = ""
    """Why the node is suspect, for people (`Purpose.SUSPECT`)."""


@dataclass(frozen=True)
class Judge:
    """Settle a suspect node: what its validation found, in its ledger entry (the evidence before it no
    longer counts) and its Recovery."""

    node: str
    verdict: ledgerentries.Verdict
    text: str
    cause: model.CollectorEvent


@dataclass(frozen=True)
class RecordOnly:
    """A step decided and recorded, not carried out: its class is in `recovery.record_only`, its rule's
    mode is `record`, or a `recovery.judgement` rule is in `record` mode."""

    step: Step
    why: str

    @property
    def cause(self) -> model.CollectorEvent | None:
        return cause_of(self.step)


@dataclass(frozen=True)
class LatchBreaker:
    """Latch the breaker open after it refused (`recovery.breaker_latch`), with what tripped it."""

    reason: str
    cause: model.CollectorEvent


@dataclass(frozen=True)
class ResetBreaker:
    """Close a latched breaker on a person's request (the controls ConfigMap's reset annotation)."""

    requested_at: str
    """The request's value, so one request resets once."""


@dataclass(frozen=True)
class Emit:
    """Write one Event (the audit hook makes these; a failed Event never fails what it records)."""

    about: ObjectRef
    reason: str
    action: str
    message: str
    warning: bool = True


Step = (Restart | Resume | Cordon | EnterCordon | NoteLinkDown | Uncordon | TaintDevice | UntaintDevice | Report
        | Refuse | Hold | Drain | RequestRemediation | CallPerson | RequestValidation | Judge | RecordOnly | LatchBreaker | ResetBreaker
        | Emit)


def name_of(step: Step) -> str:
    """The metric label of a step (a record-only step's is its own step's)."""
    return name_of(step.step) if isinstance(step, RecordOnly) else _NAMES[type(step)]


_NAMES: dict[type, str] = {
    Restart: "restart_workload", Resume: "restart_workload", Cordon: "cordon_node", EnterCordon: "enter_cordon",
    NoteLinkDown: "note_link_down",
    Uncordon: "uncordon_node", TaintDevice: "taint_device",
    UntaintDevice: "untaint_device", Report: "report", Refuse: "refuse", Hold: "hold", Drain: "drain",
    RequestRemediation: "remediation", CallPerson: "call_person", RequestValidation: "request_validation",
    Judge: "judge_node", LatchBreaker: "latch_breaker", ResetBreaker: "reset_breaker", Emit: "event",
}
ACTION_NAMES: tuple[str, ...] = tuple(sorted(set(_NAMES.values())))
"""Every `name_of` value: the `action` label values of `kcover_actions_total`."""


def cause_of(step: Step) -> model.CollectorEvent | None:
    return getattr(step, "cause", None)


# ------------------------------------------------------------------------------------------ outcomes

@dataclass(frozen=True)
class Done:
    step: Step
    detail: str = ""
    removed: int = 0
    """Pods a restart took away (or would have, in a dry run)."""
    noop: bool = False
    """The cluster already held what the step asked for (a node kcover had cordoned): nothing was written."""


@dataclass(frozen=True)
class Refused:
    step: Step
    code: Code
    text: str

    @property
    def audit(self) -> bool:
        return self.code not in ROUTINE


@dataclass(frozen=True)
class Failed:
    """The API kept refusing. `recorded`: a restart's intent is pending in the ledger and the resume pass
    tries again; otherwise nothing was recorded and the engine retries the fault itself."""

    step: Step
    error: str
    recorded: bool = False


@dataclass(frozen=True)
class Held:
    step: Step
    code: Code
    text: str
    until: float
    joined: model.CollectorEvent | None = None
    """The cause of the restart the unit already held, which this fault joined (one restart covers both;
    its Recovery is that cause's)."""


Outcome = Done | Refused | Failed | Held


RECORD_ONLY = "record_only"
RESULT_NAMES: tuple[str, ...] = ("done", "failed", RECORD_ONLY, *(c.value for c in Code))
"""Every `result_of` value: the `result` label values of `kcover_actions_total`."""


def result_of(outcome: Outcome) -> str:
    """The metric label of an outcome: `done`, `record_only`, `failed`, or the refusal/hold code."""
    if isinstance(outcome, Done):
        return RECORD_ONLY if isinstance(outcome.step, RecordOnly) else "done"
    if isinstance(outcome, Failed):
        return "failed"
    return outcome.code.value
