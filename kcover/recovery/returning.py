"""Validations the leader asked of a node's agent: before returning a node to service (`recovery.return_validation`)
and of a suspect node (`recovery.judgement`).

Owns the requests the leader has open. `ask()` carries out a `RequestValidation` step: it writes the
request on the Node (`validationcodec.encode_validation_request`: `kcover.io/validate-request` and
`kcover.io/validate-level`, a merge patch). The node's agent runs `dcgmi diag -r <level>` and answers with
the Node condition `KcoverGPUValidated`, which the cache brings back; `tick()` (the leader's periodic
pass) reads it with `validationcodec.decode_validation_answer`, counting only an answer naming this request's id,
takes the request back, and returns the validations that ended (`Ended`). For a return, `after_return`
gives the steps that follow:

* `Passed`: the un-cordon (`Uncordon`, which still checks the node is kcover's);
* `Failed`: the node stays cordoned; the ladder's remediation request (when enabled) and a person;
* `DiagError`, or no answer within `timeout_seconds`: the node stays cordoned, with an Event.

For a suspect node the plan decides (`planning.verdict`).

Every end is a `KcoverValidation` Event on the Node. A return's open requests live in the leader's memory:
after a leader change the node-condition detector reports the node cleared again and the new leader asks
anew (a new id; a late answer to the old one is ignored). A suspect's request is in the ledger as well
(`ledgerentries.Node.request`, written before it is asked): `adopt()` opens it again in a leader that does
not hold it (a new leader, or one whose verdict's writes failed), and its answer on the Node settles it.
How it fails: API errors of the request's write propagate; taking an answered request off the Node is
best effort (the agent does not run a request its answer names again).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from kcover import errors, model, settings, validationcodec
from kcover.aio import clock as clock_
from kcover.kube import gateway
from kcover.recovery import ledgerentries, planinputs
from kcover.recovery import steps as st

log = structlog.get_logger()

VALIDATION = "KcoverValidation"


@dataclass
class Open:
    """A validation asked of a node's agent and not answered yet."""

    node: str
    request: validationcodec.ValidationRequest
    asked_at: float
    deadline: float
    cause: model.CollectorEvent
    purpose: st.Purpose = st.Purpose.RETURN
    evidence: str = ""


@dataclass(frozen=True)
class Ended:
    """A validation answered (`answer`) or past its deadline (`answer` None)."""

    open: Open
    answer: validationcodec.ValidationAnswer | None

    def describe(self) -> str:
        rid = self.open.request.id
        if self.answer is None:
            return (f"no answer to validation {rid} within {self.open.deadline - self.open.asked_at:g}s (is "
                    "agent.validation.enabled on, with dcgmi in the agent's image?)")
        return f"validation {rid} {self.answer.outcome.value}: {self.answer.message}"


FUTURE_SKEW_SECONDS = 60.0
"""How far in the future a ledger suspicion may be dated (the clocks of two replicas) and still be adopted."""


def new_request_id() -> str:
    return uuid.uuid4().hex[:12]


class Validations:
    """The validations the leader has asked for; see the module docstring."""

    def __init__(self, gw: gateway.Gateway, snapshot: planinputs.Snapshot, *,
                 recovery: Callable[[], settings.RecoverySettings], clock: clock_.Clock) -> None:
        self._gw = gw
        self._snapshot = snapshot
        self._recovery = recovery
        self._clock = clock
        self.open: dict[str, Open] = {}
        """Node name -> its open request."""
        self._future_said: set[str] = set()

    async def ask(self, step: st.RequestValidation, *, request_id: str = "") -> st.Outcome:
        """Ask the node's agent for a validation (once per node at a time); `request_id`: the id the ledger
        recorded for it (a suspect's), else a new one."""
        if step.node in self.open:
            return st.Done(step, detail=f"validation {self.open[step.node].request.id} is already asked for", noop=True)
        rs = self._recovery()
        level, timeout = ((rs.judgement.validation_level, rs.judgement.validation_timeout_seconds)
                          if step.purpose is st.Purpose.SUSPECT
                          else (rs.return_validation.diag_level, rs.return_validation.timeout_seconds))
        request = validationcodec.ValidationRequest(request_id or new_request_id(), level)
        await self._gw.patch_node_annotations(step.node, validationcodec.encode_validation_request(request))
        now = self._clock.now().timestamp()
        self.open[step.node] = Open(step.node, request, now, now + timeout, step.cause, step.purpose, step.evidence)
        log.info("validation_requested", node=step.node, request=request.id, level=request.level,
                 purpose=step.purpose.value)
        return st.Done(step, detail=f"dcgmi diag -r {request.level} (request {request.id}, answer awaited "
                                    f"{timeout:g}s)")

    async def adopt(self, node: str, entry: ledgerentries.Node, cause: model.CollectorEvent) -> bool:
        """Open again a suspect's validation the ledger holds and this leader does not (its deadline counted
        from the suspicion), asking it of the node again when the node shows neither the request nor its
        answer (a leader gone between the ledger's write and the request's); False when one is open for the
        node already, the entry is not pending, or the request could not be written (tried on the next pass)."""
        if node in self.open or not entry.pending_suspicion() or entry.suspect_at is None:
            return False
        now = self._clock.now().timestamp()
        if entry.suspect_at > now + FUTURE_SKEW_SECONDS:  # no verdict would settle it (judged before it)
            if node not in self._future_said:
                self._future_said.add(node)
                log.warning("validation_not_adopted", node=node, request=entry.request or None,
                            error=f"the ledger's suspicion is dated {entry.suspect_at - now:.0f}s in the future")
            return False
        js = self._recovery().judgement
        request = validationcodec.ValidationRequest(entry.request, js.validation_level)
        deadline = entry.suspect_at + js.validation_timeout_seconds
        asked = ""
        if request.id and now < deadline and not self._on_node(node, request.id):
            try:
                await self._gw.patch_node_annotations(node, validationcodec.encode_validation_request(request))
            except errors.KubeError as exc:
                log.warning("validation_not_adopted", node=node, request=request.id, error=str(exc)[:300])
                return False
            asked = "asked again"
        self.open[node] = Open(node, request, entry.suspect_at, deadline, cause, st.Purpose.SUSPECT, entry.suspicion)
        log.info("validation_adopted", node=node, request=request.id or None, age_seconds=round(now - entry.suspect_at, 3),
                 asked=asked or None)
        return True

    def _on_node(self, node: str, request_id: str) -> bool:
        """The node carries the request `request_id`, or an answer to it."""
        found = self._snapshot.node(node)
        if found is None:
            return True  # nothing to ask of a node that is gone; its deadline ends it
        on = validationcodec.decode_validation_request(dict(found.annotations))
        return (on is not None and on.id == request_id) or self._answered(node, request_id) is not None

    def _answered(self, node: str, request_id: str) -> validationcodec.ValidationAnswer | None:
        """The node's answer naming `request_id`, as the cache shows the Node."""
        found = self._snapshot.node(node)
        for cond in found.conditions if found is not None else ():
            answer = validationcodec.decode_validation_answer(cond.type, cond.status, cond.reason, cond.message)
            if answer is not None and answer.request == request_id:
                return answer
        return None

    def _answer(self, pending: Open) -> validationcodec.ValidationAnswer | None:
        if not pending.request.id:
            return None  # a suspicion recorded without its request's id: only its deadline ends it
        return self._answered(pending.node, pending.request.id)

    async def tick(self, now: float) -> list[Ended]:
        """Take back the requests answered or past their deadline; the validations that ended."""
        out: list[Ended] = []
        for name, pending in list(self.open.items()):
            answer = self._answer(pending)
            if answer is None and now < pending.deadline:
                continue
            if self.open.get(name) is not pending:
                continue  # taken back meanwhile (the engine runs one pass at a time; this holds without it too)
            del self.open[name]
            out.append(Ended(pending, answer))
            try:
                await self._gw.patch_node_annotations(name, validationcodec.encode_validation_request(None))
            except errors.KubeError as exc:  # the answer is read; a request left on the Node is not run again
                log.warning("validation_request_not_cleared", node=name, request=pending.request.id,
                            error=str(exc)[:300])
        return out

    def after_return(self, ended: Ended) -> list[st.Step]:
        """The steps that follow a validation before a return (see the module docstring)."""
        pending, answer = ended.open, ended.answer
        name, rid = pending.node, pending.request.id
        about = st.node_ref(name)
        if answer is None:
            log.warning("validation_timed_out", node=name, request=rid)
            return [st.Emit(about, VALIDATION, "ValidationTimedOut",
                            f"Node {name}: no answer to validation {rid} within {pending.deadline - pending.asked_at:g}s "
                            "(is agent.validation.enabled on, with dcgmi in the agent's image?); kcover leaves the "
                            "node cordoned")]
        log.info("validation_answered", node=name, request=rid, outcome=answer.outcome.value)
        if answer.outcome is validationcodec.ValidationOutcome.PASSED:
            return [st.Emit(about, VALIDATION, "ValidationPassed", f"Node {name} passed validation {rid}: "
                            f"{answer.message}", warning=False),
                    st.Uncordon(node=name, cause=pending.cause)]
        if answer.outcome is validationcodec.ValidationOutcome.FAILED:
            out: list[st.Step] = [st.Emit(about, VALIDATION, "ValidationFailed",
                                          f"Node {name} failed validation {rid}: {answer.message}; kcover keeps it "
                                          "cordoned and escalates")]
            if self._recovery().escalation.remediation_enabled:
                out.append(st.RequestRemediation(node=name, requested=True, cause=pending.cause,
                                                 message=f"the node failed kcover's validation: {answer.message}"))
            out.append(st.CallPerson(about=about, cause=pending.cause,
                                     message=f"Node {name} failed its validation ({answer.message}): it stays "
                                             "cordoned; a person should repair it"))
            return out
        return [st.Emit(about, VALIDATION, "ValidationError", f"Node {name}: its agent could not run validation "
                        f"{rid}: {answer.message}; kcover leaves the node cordoned")]
