"""Reading Kubernetes protobuf request bodies into the JSON objects the simulated API server stores.

client-go's generated clients (kubectl create namespace|configmap|job, drain's evictions, ...) send
built-in kinds as `application/vnd.kubernetes.protobuf`, with no fallback to JSON: the `k8s\\x00`
magic, then a `runtime.Unknown` (typeMeta, raw, contentType) whose `raw` is the typed message. This
module owns that envelope and a schema-driven wire-format reader; the schema (field numbers, names and
types of the built-in messages) is recorded from k8s.io/api's generated.proto by
scripts/record-sim-documents. It maps protobuf onto JSON as the apiserver's codecs do: Time and
MicroTime as RFC 3339, Quantity and IntOrString as their JSON forms, RawExtension and FieldsV1 as
embedded JSON, bytes as base64, Verbs/ExtraValue as arrays, embedded structs (`json:",inline"`:
a Probe's handler, a Volume's source) flattened into their parent, and zero values left out where Go's
encoding/json would (`omitempty` on a non-pointer field, as recorded; zero times). It does not encode: the sim answers JSON, which every client accepts.
Malformed input raises `ProtobufError` (the caller answers 400).
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import gzip
import importlib.resources
import struct
from typing import Any

import orjson

from kcover import protowire

MAGIC = b"k8s\x00"
MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
_UNKNOWN = "k8s.io.apimachinery.pkg.runtime.Unknown"
_META = "k8s.io.apimachinery.pkg.apis.meta.v1."
_ARRAYS = {_META + "Verbs", "k8s.io.api.authentication.v1.ExtraValue"}
Obj = dict[str, Any]
Schema = dict[str, dict[str, list[Any]]]


class ProtobufError(ValueError):
    """A body that is not a Kubernetes protobuf object this module can read."""


@functools.cache
def schema() -> Schema:
    """The recorded message schema (loaded once; read-only)."""
    data = importlib.resources.files("kcover.sim").joinpath("recorded/protobuf-schema.json.gz").read_bytes()
    messages: Schema = orjson.loads(gzip.decompress(data))["messages"]
    return messages


def _fields(buf: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value): int for varints and fixed, bytes for length-delimited."""
    try:
        return list(protowire.fields(buf))
    except protowire.WireError as exc:
        raise ProtobufError(str(exc)) from exc


def _signed(value: int) -> int:
    """A varint as Go's int32/int64 (negative numbers travel sign-extended to 64 bits)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >> 63 else value


def _scalar(kind: str, wire: int, value: Any) -> Any:
    if kind == "string":
        return bytes(value).decode("utf-8", errors="replace")
    if kind == "bytes":
        return base64.b64encode(value).decode()
    if kind == "bool":
        return bool(value)
    if kind in ("int32", "int64"):
        return _signed(value)
    if kind in ("uint32", "uint64"):
        return int(value)
    if kind == "double" and wire == 1:
        return struct.unpack("<d", value.to_bytes(8, "little"))[0]
    raise ProtobufError(f"unsupported scalar {kind}")


def _time(fields: dict[int, int], micro: bool) -> str | None:
    seconds, nanos = _signed(fields.get(1, 0)), fields.get(2, 0)
    if not seconds and not nanos:
        return None
    at = dt.datetime.fromtimestamp(seconds, dt.UTC) + dt.timedelta(microseconds=nanos // 1000)
    if micro:
        return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _special(name: str, buf: bytes) -> tuple[bool, Any]:
    """Messages whose JSON form is not an object: (handled, value)."""
    if name in (_META + "Time", _META + "MicroTime"):
        return True, _time({n: v for n, _, v in _fields(buf)}, micro=name.endswith("MicroTime"))
    if name == "k8s.io.apimachinery.pkg.api.resource.Quantity":
        return True, next((bytes(v).decode() for n, _, v in _fields(buf) if n == 1), "0")
    if name == "k8s.io.apimachinery.pkg.util.intstr.IntOrString":
        parts = {n: v for n, _, v in _fields(buf)}
        if parts.get(1, 0) == 1:
            return True, bytes(parts.get(3, b"")).decode()
        return True, _signed(parts.get(2, 0))
    if name in ("k8s.io.apimachinery.pkg.runtime.RawExtension", _META + "FieldsV1"):
        raw = next((bytes(v) for n, _, v in _fields(buf) if n == 1), b"")
        try:
            return True, orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError as exc:
            raise ProtobufError(f"embedded object is not JSON: {exc}") from None
    if name == _META + "Duration":
        nanos = next((_signed(v) for n, _, v in _fields(buf) if n == 1), 0)
        return True, _go_duration(nanos)
    if name in _ARRAYS:
        return True, [bytes(v).decode() for n, _, v in _fields(buf) if n == 1]
    return False, None


def _go_duration(nanos: int) -> str:
    """time.Duration.String() for whole seconds and above (what API durations hold)."""
    if nanos == 0:
        return "0s"
    sign, nanos = ("-", -nanos) if nanos < 0 else ("", nanos)
    hours, rest = divmod(nanos, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    seconds = rest / 1e9
    text = f"{seconds:g}s"
    if hours:
        return f"{sign}{hours}h{minutes}m{text}"
    return f"{sign}{minutes}m{text}" if minutes else f"{sign}{text}"


def _value(kind: str, wire: int, value: Any, messages: Schema) -> Any:
    if kind.startswith("m:"):
        return message(kind[2:], value, messages)
    return _scalar(kind, wire, value)


def message(name: str, buf: bytes, messages: Schema | None = None) -> Any:
    """The JSON value of protobuf message `name` (a fully qualified name in the schema)."""
    messages = messages if messages is not None else schema()
    handled, special = _special(name, buf)
    if handled:
        return special
    fields = messages.get(name)
    if fields is None:
        raise ProtobufError(f"no schema for protobuf message {name}")
    out: Obj = {}
    for number, wire, value in _fields(buf):
        spec = fields.get(str(number))
        if spec is None:
            continue  # a field newer than the recorded schema: ignored, as an older server would
        json_name, kind, repeated, omit_zero = spec
        if kind.startswith("map:"):
            _, key_kind, value_kind = kind.split(":", 2)
            entry = {n: (w, v) for n, w, v in _fields(value)}
            key = _scalar(key_kind, *entry[1]) if 1 in entry else ""
            item = _value(value_kind, *entry[2], messages) if 2 in entry else ("" if value_kind == "string" else None)
            out.setdefault(json_name, {})[str(key)] = item
            continue
        if repeated and wire == 2 and kind in ("int32", "int64", "bool", "uint32", "uint64"):
            packed, pos, items = bytes(value), 0, []
            while pos < len(packed):
                try:
                    raw_int, pos = protowire.varint(packed, pos)
                except protowire.WireError as exc:
                    raise ProtobufError(str(exc)) from exc
                items.append(_scalar(kind, 0, raw_int))
            out.setdefault(json_name, []).extend(items)
            continue
        decoded = _value(kind, wire, value, messages)
        if not json_name and isinstance(decoded, dict):  # an embedded struct (`json:",inline"`)
            out.update(decoded)
            continue
        if repeated:
            out.setdefault(json_name, []).append(decoded)
        elif decoded is not None and not (omit_zero and decoded in ("", 0, False)):
            out[json_name] = decoded
    return out


def _message_name(api_version: str, kind: str, messages: Schema) -> str:
    """k8s.io/api's package of a group version (`batch/v1` -> k8s.io.api.batch.v1, `v1` -> core), or
    meta/v1 for the options kinds every group version carries (DeleteOptions)."""
    group, _, version = api_version.rpartition("/")
    package = f"k8s.io.api.{group.split('.')[0] or 'core'}.{version}"
    name = f"{package}.{kind}"
    return name if name in messages else _META + kind


def decode(body: bytes) -> Obj:
    """The JSON object of a `k8s\\x00`-framed protobuf body, with its kind and apiVersion."""
    if not body.startswith(MAGIC):
        raise ProtobufError("the body does not start with the Kubernetes protobuf magic number")
    envelope = {n: v for n, _, v in _fields(body[len(MAGIC):])}
    type_meta = {n: bytes(v).decode() for n, _, v in _fields(envelope.get(1, b""))}
    api_version, kind = type_meta.get(1, ""), type_meta.get(2, "")
    if not kind:
        raise ProtobufError("the protobuf envelope names no kind")
    content_encoding = bytes(envelope.get(3, b"")).decode()
    if content_encoding:
        raise ProtobufError(f"content encoding {content_encoding!r} is not supported")
    obj = message(_message_name(api_version, kind, schema()), bytes(envelope.get(2, b"")))
    if not isinstance(obj, dict):
        raise ProtobufError(f"{kind} is not an object")
    return {"kind": kind, "apiVersion": api_version, **obj} if api_version else {"kind": kind, **obj}
