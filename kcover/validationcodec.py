"""The codec of a node's validation: the controller's request (Node annotations) and the agent's answer (a
Node condition).

Before it returns a node to service (`recovery.return_validation`) the controller asks the node's agent
for a health check with two Node annotations, and the agent answers with a Node condition:

| where | key | value | malformed |
|---|---|---|---|
| annotation (controller) | `kcover.io/validate-request` | the request's id, `[a-z0-9]{1,32}` | no request |
| annotation (controller) | `kcover.io/validate-level` | the `dcgmi diag -r` level, 1..4 | no request |
| condition (agent) | `KcoverGPUValidated` | status True (passed), False (failed), Unknown (not run); reason `Passed`, `Failed`, `DiagError`; message `request <id>: <what dcgmi said>` | no answer |

An answer counts only for the request whose id its message names, so a stale condition from an
earlier validation never un-cordons a node.

Owns both directions, as `kcover.codec` owns the fault's: `encode_validation_request`/
`decode_validation_request` (controller -> agent) and `encode_validation_answer`/`decode_validation_answer`
(agent -> controller). Decoding never raises and does no I/O; it imports only the model, the codec and the
standard library.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass

from kcover import codec, model

VALIDATE_REQUEST = "kcover.io/validate-request"
VALIDATE_LEVEL = "kcover.io/validate-level"
VALIDATION_CONDITION = "KcoverGPUValidated"
_REQUEST_ID = re.compile(r"[a-z0-9]{1,32}")
_ANSWER = re.compile(r"request (?P<id>[a-z0-9]{1,32}): (?P<text>.*)", re.DOTALL)


class ValidationOutcome(enum.StrEnum):
    PASSED = "Passed"
    FAILED = "Failed"
    ERROR = "DiagError"
    """dcgmi did not run or said nothing readable (missing, timed out, unparsable output)."""


_STATUS_OF = {ValidationOutcome.PASSED: "True", ValidationOutcome.FAILED: "False", ValidationOutcome.ERROR: "Unknown"}


@dataclass(frozen=True)
class ValidationRequest:
    id: str
    level: int


@dataclass(frozen=True)
class ValidationAnswer:
    request: str
    """The id of the request answered."""
    outcome: ValidationOutcome
    message: str


def encode_validation_request(request: ValidationRequest | None) -> dict[str, str | None]:
    """The Node annotations asking for `request` (a merge patch; None removes both)."""
    if request is None:
        return {VALIDATE_REQUEST: None, VALIDATE_LEVEL: None}
    return {VALIDATE_REQUEST: request.id, VALIDATE_LEVEL: str(request.level)}


def decode_validation_request(annotations: Mapping[str, object]) -> ValidationRequest | None:
    """The request the annotations hold, or None (absent or malformed)."""
    rid, level = codec.annotation_text(annotations, VALIDATE_REQUEST), codec.annotation_text(annotations, VALIDATE_LEVEL)
    if rid is None or level is None or not _REQUEST_ID.fullmatch(rid) or level not in ("1", "2", "3", "4"):
        return None
    return ValidationRequest(rid, int(level))


def encode_validation_answer(answer: ValidationAnswer, now_text: str) -> dict[str, str]:
    """The agent's Node condition for `answer` (for a strategic-merge patch of the Node's status)."""
    message = model.fit(f"request {answer.request}: {answer.message}", model.MESSAGE_MAX)
    return {"type": VALIDATION_CONDITION, "status": _STATUS_OF[answer.outcome], "reason": answer.outcome.value,
            "message": message, "lastTransitionTime": now_text, "lastHeartbeatTime": now_text}


def decode_validation_answer(condition_type: str, status: str, reason: str, message: str) -> ValidationAnswer | None:
    """The answer a Node condition holds, or None (another condition, or not one the agent could write)."""
    if condition_type != VALIDATION_CONDITION:
        return None
    try:
        outcome = ValidationOutcome(reason)
    except ValueError:
        return None
    found = _ANSWER.fullmatch(message)
    if found is None or _STATUS_OF[outcome] != status:
        return None
    return ValidationAnswer(found["id"], outcome, found["text"])
