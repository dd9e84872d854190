"""`Status` objects and the exception that carries them out of the simulated API server.

Owns the exact shapes and messages of apimachinery's `StatusError`s (NotFound, AlreadyExists,
Conflict, Invalid, BadRequest, Expired, UnsupportedMediaType, TooManyRequests, Timeout). It does
not decide when they happen; `store` and `apiserver` do.
"""

from __future__ import annotations

from typing import Any

from kcover import errors

Obj = dict[str, Any]

CONFLICT_MESSAGE = ("the object has been modified; please apply your changes to the latest version "
                    "and try again")


class ApiError(errors.KubeError):
    """A request the simulated server refuses; `status_obj` is the `Status` body it answers with."""

    def __init__(self, status_obj: Obj) -> None:
        super().__init__(str(status_obj.get("message", "")), status=int(status_obj["code"]),
                         reason=str(status_obj.get("reason", "")), body=status_obj)
        self.status_obj = status_obj


def status(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    out: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason}
    if details is not None:
        out["details"] = details
    out["code"] = code
    return out


def _qualified(plural: str, group: str) -> str:
    return f"{plural}.{group}" if group else plural


def _details(name: str, plural: str, group: str) -> Obj:
    details: Obj = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = plural
    return details


def not_found(plural: str, group: str, name: str) -> ApiError:
    return ApiError(status(404, "NotFound", f'{_qualified(plural, group)} "{name}" not found',
                           _details(name, plural, group)))


def already_exists(plural: str, group: str, name: str) -> ApiError:
    return ApiError(status(409, "AlreadyExists", f'{_qualified(plural, group)} "{name}" already exists',
                           _details(name, plural, group)))


def conflict(plural: str, group: str, name: str, why: str = CONFLICT_MESSAGE) -> ApiError:
    return ApiError(status(409, "Conflict",
                           f'Operation cannot be fulfilled on {_qualified(plural, group)} "{name}": {why}',
                           _details(name, plural, group)))


def invalid(kind: str, group: str, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """422. `causes` are (reason, field, message) such as ("FieldValueRequired", "spec.x", "Required value")."""
    parts = [f"{fld}: {msg}" if fld else msg for _, fld, msg in causes]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    details: Obj = {"name": name} if name else {}  # the real StatusDetails omits an empty name
    if group:
        details["group"] = group
    details["kind"] = kind
    details["causes"] = [{"reason": r, "message": m, "field": f} for r, f, m in causes]
    qualified = f"{kind}.{group}" if group else kind
    return ApiError(status(422, "Invalid", f'{qualified} "{name}" is invalid: {joined}', details))


def bad_request(message: str) -> ApiError:
    return ApiError(status(400, "BadRequest", message))


def forbidden(plural: str, group: str, name: str, why: str) -> ApiError:
    return ApiError(status(403, "Forbidden", f'{_qualified(plural, group)} "{name}" is forbidden: {why}',
                           _details(name, plural, group)))


def expired(message: str) -> ApiError:
    return ApiError(status(410, "Expired", message))


def too_old(requested: int, oldest: int) -> ApiError:
    return expired(f"too old resource version: {requested} ({oldest})")


def unsupported_media_type(content_type: str, accepted: list[str]) -> ApiError:
    return ApiError(status(415, "UnsupportedMediaType",
                           f"the body of the request was in an unknown format - accepted media types "
                           f"include: {', '.join(accepted)}"))


def too_many_requests(retry_after: int) -> ApiError:
    return ApiError(status(429, "TooManyRequests", "Too many requests, please try again later.",
                           {"retryAfterSeconds": retry_after}))


def too_large_rv(requested: int, current: int) -> ApiError:
    return ApiError(status(504, "Timeout", f"Too large resource version: {requested}, current: {current}",
                           {"causes": [{"reason": "ResourceVersionTooLarge",
                                        "message": "Too large resource version"}],
                            "retryAfterSeconds": 1}))


def internal(message: str) -> ApiError:
    return ApiError(status(500, "InternalError", f"Internal error occurred: {message}",
                           {"causes": [{"message": message}]}))


def success(plural: str, group: str, name: str, uid: str) -> Obj:
    details = _details(name, plural, group)
    details["uid"] = uid
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}
