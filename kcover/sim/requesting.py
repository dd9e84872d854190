"""What every verb of the simulated API server reads of a request, and its JSON answer.

Owns query values parsed as Go's strconv parses them (`parse_bool`, `parse_int`), request bodies as JSON
or protobuf (`body`, `is_protobuf`, `protobuf_body`: client-go's generated clients send built-in kinds as
protobuf), list continue tokens in kube-apiserver's encoding (`encode_continue`, `decode_continue`), the
resource a URL addresses (`Target`), and a JSON `exchange.Reply` (`json_reply`). It does not route or
answer a verb (`apiserver`, `writing`).

Every malformed value raises `status.ApiError` with the `Status` a real kube-apiserver answers (400
BadRequest with its message).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

import orjson

from kcover.sim import deepjson, exchange, protobuf, registry, status

Obj = dict[str, Any]
_TRUE = {"1", "t", "T", "true", "TRUE", "True"}
_FALSE = {"0", "f", "F", "false", "FALSE", "False"}


def parse_bool(query: Any, name: str) -> bool:
    value = query.get(name)
    if value is None or value == "":
        return False
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise status.bad_request(f'strconv.ParseBool: parsing "{value}": invalid syntax')


def parse_int(query: Any, name: str) -> int | None:
    value = query.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise status.bad_request(f'strconv.ParseInt: parsing "{value}": invalid syntax') from None


def json_reply(body: Obj | bytes, code: int = 200, *, headers: dict[str, str] | None = None) -> exchange.Reply:
    data = body if isinstance(body, bytes) else deepjson.dumps(body)
    return exchange.Reply(status=code, body=data, content_type=exchange.JSON, headers=dict(headers or {}))


def is_protobuf(request: exchange.Request) -> bool:
    return (request.headers.get("Content-Type") or "").split(";")[0].strip().lower() == protobuf.MEDIA_TYPE


def protobuf_body(data: bytes) -> Obj:
    """A body client-go's generated clients send as protobuf (built-in kinds), as JSON."""
    try:
        return protobuf.decode(data)
    except protobuf.ProtobufError as exc:
        raise status.bad_request(f"the object provided is unrecognized: {exc}") from None


async def body(request: exchange.Request) -> Any:
    data = await request.read()
    if not data:
        raise status.bad_request("the body of the request is empty")
    if is_protobuf(request):
        return protobuf_body(data)
    try:
        return deepjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise status.bad_request(f"the object provided is unrecognized: {exc}") from None


def encode_continue(rv: int, key: str) -> str:
    raw = orjson.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": key + "\x00"})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    try:
        data = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return int(data["rv"]), str(data["start"]).rstrip("\x00")
    except (ValueError, KeyError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise status.bad_request("continue key is not valid: incorrect encoded start resourceVersion "
                                 "(version meta.k8s.io/v1)") from None


@dataclass
class Target:
    """A parsed resource URL."""

    resource: registry.Resource
    namespace: str | None
    name: str | None
    subresource: str

    @property
    def new_events(self) -> bool:
        return self.resource.group == "events.k8s.io"
