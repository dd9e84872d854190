"""Return to service after a validation: the controller's side of `recovery.return_validation`.

Owns the requests the leader has open. When a node kcover cordoned is to be un-cordoned (its fault has
stayed cleared for the hold) and `recovery.return_validation.enabled` is on, `ask()` writes the
request on the Node (`codec.encode_validation_request`: `kcover.io/validate-request` and
`kcover.io/validate-level`, a merge patch) and an Event, instead of un-cordoning. The node's agent runs
`dcgmi diag -r <level>` and answers with the Node condition `KcoverGPUValidated`, which the cache
brings back; `tick()` (the leader's periodic pass) reads it with `codec.decode_validation_answer`,
counting only an answer naming this request's id:

* `Passed`: the un-cordon goes ahead (`uncordon`, through the operator controls and kcover's
  ownership rule);
* `Failed`: the node stays cordoned and climbs the node ladder again (`escalate`: drain, remediation
  request, a person);
* `DiagError`, or no answer within `timeout_seconds`: the node stays cordoned, with an Event.

Every end takes the request annotations back. Every step is a `KcoverValidation` Event on the Node
(actions `RequestValidation`, `ValidationPassed`, `ValidationFailed`, `ValidationError`,
`ValidationTimedOut`) and a count in `kcover_actions_total{action="uncordon_node",result=...}`.
Open requests live in the leader's memory: after a leader change the node-condition detector reports
the node cleared again and the new leader asks anew (a new id; a late answer to the old one is
ignored). Dry run asks nothing: the executor's `DryRunUncordon` stands for the whole step. How it
fails: API errors of its writes propagate to the executor's caller, as the executor's own do.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from kcover import codec, metrics, settings
from kcover.aio import clock as clock_
from kcover.kube import client as kube_client
from kcover.kube import retrying
from kcover.recovery import actions, executing, policy

log = structlog.get_logger()

VALIDATION = "KcoverValidation"
Emit = Callable[..., Awaitable[None]]


@dataclass
class Open:
    """A validation asked of a node's agent and not answered yet."""

    action: actions.UncordonNode
    request: codec.ValidationRequest
    asked_at: float
    deadline: float


class Returner:
    """The validations the leader has asked for; see the module docstring."""

    def __init__(self, kube: kube_client.KubeClient, snapshot: policy.ClusterSnapshot, *,
                 recovery: Callable[[], settings.RecoverySettings], metrics_: metrics.Metrics, clock: clock_.Clock,
                 emit: Emit, uncordon: Callable[[actions.UncordonNode], Awaitable[executing.Result]],
                 escalate: Callable[[actions.UncordonNode, str], Awaitable[None]],
                 fence: retrying.Fence | None = None) -> None:
        self._kube = kube
        self._snapshot = snapshot
        self._recovery = recovery
        self._metrics = metrics_
        self._clock = clock
        self._emit = emit
        self._uncordon = uncordon
        self._escalate = escalate
        self._fence = fence
        self.open: dict[str, Open] = {}
        """Node name -> its open request."""
        self._passed: set[str] = set()
        """Nodes whose un-cordon is going ahead after a pass (not asked again)."""

    def _count(self, result: str) -> None:
        self._metrics.actions.labels(action="uncordon_node", result=result).inc()

    def wanted(self, action: actions.UncordonNode) -> bool:
        """Whether `action` must wait for a validation first."""
        rs = self._recovery()
        if not rs.return_validation.enabled or rs.dry_run or action.node in self._passed:
            return False
        node = self._snapshot.node(action.node)
        return node is not None and node.cordoned_by_kcover  # the executor refuses the others itself

    async def ask(self, action: actions.UncordonNode) -> executing.Result:
        """Ask the node's agent for a validation (once per node at a time) instead of un-cordoning now."""
        name = action.node
        if name in self.open:
            return executing.Result(executing.Outcome.SKIPPED, action, "a validation is already asked for")
        cfg = self._recovery().return_validation
        request = codec.ValidationRequest(uuid.uuid4().hex[:12], cfg.diag_level)
        await self._write(name, request)
        now = self._clock.now().timestamp()
        self.open[name] = Open(action, request, now, now + cfg.timeout_seconds)
        self._count("validating")
        log.info("validation_requested", node=name, request=request.id, level=request.level)
        await self._emit(policy.node_ref(name), reason=VALIDATION, action="RequestValidation",
                         message=f"Node {name}'s fault cleared; before returning it to service kcover asked its agent "
                                 f"to run dcgmi diag -r {request.level} (request {request.id}, answer awaited "
                                 f"{cfg.timeout_seconds:g}s)")
        return executing.Result(executing.Outcome.SKIPPED, action, f"waiting for validation {request.id}")

    async def _write(self, node: str, request: codec.ValidationRequest | None) -> None:
        body = {"metadata": {"annotations": codec.encode_validation_request(request)}}
        await self._kube.request("PATCH", f"/api/v1/nodes/{node}", body=body,
                                 content_type="application/merge-patch+json", fence=self._fence)

    def _answer(self, pending: Open) -> codec.ValidationAnswer | None:
        node = self._snapshot.node(pending.action.node)
        for cond in node.conditions if node is not None else ():
            answer = codec.decode_validation_answer(cond.type, cond.status, cond.reason, cond.message)
            if answer is not None and answer.request == pending.request.id:
                return answer
        return None

    async def tick(self, now: float) -> None:
        """Act on the answers that arrived and the requests past their deadline."""
        for name, pending in list(self.open.items()):
            answer = self._answer(pending)
            if answer is None and now < pending.deadline:
                continue
            del self.open[name]
            await self._write(name, None)
            await self._ended(pending, answer)

    async def _ended(self, pending: Open, answer: codec.ValidationAnswer | None) -> None:
        name, rid = pending.action.node, pending.request.id
        about = policy.node_ref(name)
        if answer is None:
            self._count("validation_timed_out")
            log.warning("validation_timed_out", node=name, request=rid)
            await self._emit(about, reason=VALIDATION, action="ValidationTimedOut", warning=True,
                             message=f"Node {name}: no answer to validation {rid} within "
                                     f"{pending.deadline - pending.asked_at:g}s (is agent.validation.enabled on, with "
                                     "dcgmi in the agent's image?); kcover leaves the node cordoned")
            return
        log.info("validation_answered", node=name, request=rid, outcome=answer.outcome.value)
        if answer.outcome is codec.ValidationOutcome.PASSED:
            self._count("validation_passed")
            await self._emit(about, reason=VALIDATION, action="ValidationPassed",
                             message=f"Node {name} passed validation {rid}: {answer.message}")
            self._passed.add(name)
            try:
                await self._uncordon(pending.action)
            finally:
                self._passed.discard(name)
        elif answer.outcome is codec.ValidationOutcome.FAILED:
            self._count("validation_failed")
            await self._emit(about, reason=VALIDATION, action="ValidationFailed", warning=True,
                             message=f"Node {name} failed validation {rid}: {answer.message}; kcover keeps it "
                                     "cordoned and escalates")
            await self._escalate(pending.action, answer.message)
        else:
            self._count("validation_error")
            await self._emit(about, reason=VALIDATION, action="ValidationError", warning=True,
                             message=f"Node {name}: its agent could not run validation {rid}: {answer.message}; "
                                     "kcover leaves the node cordoned")
