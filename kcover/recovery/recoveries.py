"""The Recovery kind and what a step's Recovery says: its names, phases, target, decision and identity.

Owns the vocabulary of the `kcover.io/v1alpha1` kind `Recovery` (plural `recoveries`): its group, version,
plural and labels (`MANAGED`, `TARGET_LABEL` with `target_hash`), its `Phase`s, the collection path of a
namespace, and for one step: the object it is about (`target_of`, `Target`), the decision it records
(`decision`), its restart unit's ledger key (`unit_key`), the fault part of its spec (`fault_spec`) and
what makes two notes the same Recovery (`identity_of`), named by `name_for` so a retried write, a resumed
restart and its verification all land on the same object.

Does not own the queue and the writes, retention, or the coordinator hook (`recording`). Pure: no I/O,
no state; nothing here raises (a step that leaves no record has no target: None).
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import re
from dataclasses import dataclass
from typing import Any

from kcover import model
from kcover.aio import clock as clock_
from kcover.recovery import ledgerentries
from kcover.recovery import steps as st

GROUP = "kcover.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Recovery"
PLURAL = "recoveries"
MANAGED = {"app.kubernetes.io/managed-by": "kcover"}
TARGET_LABEL = "kcover.io/target"
"""A short hash of the target (kind, namespace, name): retention counts per value."""


class Phase(enum.StrEnum):
    ACTING = "Acting"
    """Recorded, not carried out yet: a restart whose delete failed and stays pending."""
    VERIFYING = "Verifying"
    """Done; kcover follows the workload until it runs again."""
    RECOVERED = "Recovered"
    """The workload runs again (or finished); for a node action, the action took hold."""
    STALLED = "Stalled"
    """The workload did not run again within `recovery.verify.deadline_seconds`; `cause` says why."""
    FAILED = "Failed"
    """kcover could not carry the action out; `message` says why."""
    REFUSED = "Refused"
    """kcover decided not to act; `cause` is the refusal code."""
    HELD = "Held"
    """Pending: refused for a blocker that lifts (`cause`), planned again once it does, until `message`'s time."""
    VALIDATING = "Validating"
    """A suspect node's validation is asked and not answered yet."""
    RECORDED = "RecordOnly"
    """Decided and recorded, not carried out (`recovery.record_only`, a rule in `record` mode)."""


def collection(namespace: str) -> str:
    return f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}"


_NOT_NAME = re.compile(r"[^a-z0-9-]+")


def name_for(target: str, *identity: str) -> str:
    """A DNS-1123 name: a readable slug of `target` and a hash of `identity` (stable across retries)."""
    slug = _NOT_NAME.sub("-", target.lower()).strip("-")[:40].strip("-") or "recovery"
    digest = hashlib.sha256("|".join(identity).encode()).hexdigest()[:10]
    return f"{slug}-{digest}"


def target_hash(kind: str, namespace: str, name: str) -> str:
    return hashlib.sha256(f"{kind}/{namespace}/{name}".encode()).hexdigest()[:16]


def stamp(at: dt.datetime | float) -> str:
    when = at if isinstance(at, dt.datetime) else dt.datetime.fromtimestamp(at, dt.UTC)
    return clock_.rfc3339(when)


def fault_spec(cause: model.CollectorEvent) -> dict[str, Any]:
    """The fault part of a spec, from the typed event (never from its free-form attributes)."""
    out: dict[str, Any] = {"detector": cause.detector, "reason": cause.reason, "severity": cause.severity.value,
                           "message": model.fit(cause.message, 512), "id": cause.id,
                           "source": cause.target.describe()}
    identity = cause.fault.model_dump(mode="json", exclude_defaults=True)
    if identity:
        out["identity"] = identity
    if cause.fault.describe():
        out["describe"] = cause.fault.describe()
    if cause.recommended is not None:
        out["recommendedAction"] = cause.recommended.value
    if cause.signal:
        out["signal"] = cause.signal
    return out


@dataclass(frozen=True)
class Target:
    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = ""
    node: str = ""
    unit: str = ""

    def spec(self) -> dict[str, Any]:
        out = {"kind": self.kind, "name": self.name}
        for key, value in (("namespace", self.namespace), ("uid", self.uid), ("apiVersion", self.api_version),
                           ("node", self.node), ("unit", self.unit)):
            if value:
                out[key] = value
        return out

    def describe(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind}/{where}" + (f" {self.unit}" if self.unit else "")


def target_of(step: st.Step) -> Target | None:
    """What a step is about, or None for steps that leave no record (a report without an object)."""
    if isinstance(step, st.RecordOnly):
        return target_of(step.step)
    if isinstance(step, st.RequestValidation | st.Judge):
        return Target("Node", step.node)
    restart = step.restart if isinstance(step, st.Hold | st.Resume) else step
    if isinstance(restart, st.Restart):
        w = restart.workload
        return Target(w.kind, w.name, w.namespace, w.uid, w.api_version, node=restart.node, unit=restart.unit)
    if isinstance(step, st.Cordon | st.Uncordon | st.TaintDevice | st.UntaintDevice):
        return Target("Node", step.node)
    if isinstance(step, st.Refuse) and step.about is not None:
        a = step.about
        return Target(a.kind, a.name, a.namespace, a.uid, a.api_version)
    return None


def decision(step: st.Step) -> str:
    if isinstance(step, st.RecordOnly):
        return decision(step.step)
    if isinstance(step, st.RequestValidation | st.Judge):
        return "ValidateNode"
    if isinstance(step, st.Restart | st.Resume | st.Hold):
        return "RestartWorkload"
    if isinstance(step, st.Cordon):
        return "CordonNode"
    if isinstance(step, st.Uncordon):
        return "UncordonNode"
    if isinstance(step, st.TaintDevice):
        return "TaintDevice"
    if isinstance(step, st.UntaintDevice):
        return "UntaintDevice"
    return "Skip" if isinstance(step, st.Refuse) else "Report"


def held_ref(key: str, held: ledgerentries.HeldRestart) -> tuple[str, str] | None:
    """(namespace, name) of the Recovery a held restart left `Held`, from its ledger entry alone (the key,
    the workload, the cause), as `identity_of` named it when the restart was held: what a leader that did
    not hold it moves on. None for an entry that does not say (written before the workload was kept, or a
    cause that does not parse)."""
    kind, _, rest = held.workload.partition("/")
    namespace, _, name = rest.partition("/")
    cause = held.event()
    if not (kind and namespace and name) or cause is None:
        return None
    return namespace, name_for(f"{kind}-{name}", "restart", key, cause.id)


def unit_key(step: st.Step) -> str:
    if isinstance(step, st.Restart):
        return step.unit_key
    if isinstance(step, st.Hold):
        return step.restart.unit_key
    if isinstance(step, st.Resume):
        return step.key
    return ""


def identity_of(step: st.Step) -> tuple[str, ...]:
    """What makes two notes the same Recovery: the unit or node, the cause, the decision."""
    cause = st.cause_of(step)
    cause_id = cause.id if cause is not None else ""
    if isinstance(step, st.RecordOnly):
        return (*identity_of(step.step), "record-only")
    if isinstance(step, st.RequestValidation | st.Judge):
        return ("ValidateNode", step.node, cause_id)
    if isinstance(step, st.Resume):
        return ("restart", step.key, step.intent.fault or step.intent.id)
    if isinstance(step, st.Restart | st.Hold):
        return ("restart", unit_key(step), cause_id)
    if isinstance(step, st.Cordon | st.Uncordon | st.TaintDevice | st.UntaintDevice):
        return (decision(step), step.node, cause_id)
    if isinstance(step, st.Refuse):
        about = step.about
        return ("skip", step.code.value, about.describe() if about else "", about.uid if about else "", cause_id)
    return ("other", cause_id)
