"""JSON of any depth in the simulated cluster, as kube-apiserver stores and serves it.

Owns decoding and encoding the objects the simulated API server keeps. The real server's decoder
allows 10,000 levels of nesting; orjson parses 1,024 and writes 254. Anyone who may write an object
can nest it deeper than that, in a `metadata.managedFields[].fieldsV1` or in a custom resource's
schema-less fields, and the real server stores it and serves it byte for byte. So does this one: a
document orjson refuses is decoded with every array or object that opens `KEPT_DEPTH` levels down kept
as its bytes (`Raw`), which `dumps` writes back unchanged. A `Raw` compares by its bytes and is
immutable, so copies, patches and no-op checks treat it as any other value.

How it fails: `loads` raises `orjson.JSONDecodeError` for a document that is not JSON even so.
"""

from __future__ import annotations

from typing import Any

import orjson

from kcover.kube import decoding

KEPT_DEPTH = 64
"""Containers this deep are kept as bytes: far below orjson's limits, far above any field a kind defines."""
_PLACEHOLDER = "\x00kcover-sim-raw:"


class Raw:
    """A JSON array or object kept as its bytes (too deep to decode); immutable."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Raw) and other.data == self.data

    def __hash__(self) -> int:
        return hash(self.data)

    def __deepcopy__(self, memo: dict[int, Any]) -> Raw:
        return self

    def __copy__(self) -> Raw:
        return self

    def __repr__(self) -> str:
        return f"Raw({len(self.data)} bytes)"


def _default(value: Any) -> Any:
    if isinstance(value, Raw):
        return orjson.Fragment(value.data)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def dumps(obj: Any) -> bytes:
    """`orjson.dumps`, writing `Raw` values back as they were read."""
    return orjson.dumps(obj, default=_default)


def loads(data: bytes) -> Any:
    """`orjson.loads`; a document it refuses is decoded with its containers `KEPT_DEPTH` down as `Raw`."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        spans = decoding.spans_at_depth(data, KEPT_DEPTH)
        if not spans:
            raise
    pieces: list[bytes] = []
    raws: list[Raw] = []
    pos = 0
    for a, b in spans:
        pieces.append(data[pos:a])
        pieces.append(orjson.dumps(f"{_PLACEHOLDER}{len(raws)}"))
        raws.append(Raw(data[a:b]))
        pos = b
    pieces.append(data[pos:])
    return _restore(orjson.loads(b"".join(pieces)), raws)


def _raw(value: Any, raws: list[Raw]) -> Any:
    if isinstance(value, str) and value.startswith(_PLACEHOLDER):
        return raws[int(value[len(_PLACEHOLDER):])]
    return _restore(value, raws) if isinstance(value, dict | list) else value


def _restore(value: Any, raws: list[Raw]) -> Any:
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = _raw(item, raws)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            value[i] = _raw(item, raws)
    return value
