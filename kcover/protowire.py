"""The protobuf wire format, read: varints and a message's (field number, wire type, value) triples.

Owns only the encoding layer shared by the two places kcover reads protobuf without generated code:
the agent's PodResources client (the kubelet's gRPC answers) and the simulated API server (the bodies
kubectl sends for built-in kinds). It knows no schema. Values: varints and fixed32/fixed64 as `int`,
length-delimited fields as `bytes`. Malformed input raises `WireError` (a `ValueError`), never anything
else; it does no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator


class WireError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


def varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it."""
    value = shift = 0
    while True:
        if pos >= len(data):
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of a message, in order."""
    pos = 0
    while pos < len(data):
        key, pos = varint(data, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, pos = varint(data, pos)
        elif wire == 2:
            length, pos = varint(data, pos)
            if pos + length > len(data):
                raise WireError("truncated length-delimited field")
            value, pos = data[pos:pos + length], pos + length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if pos + size > len(data):
                raise WireError("truncated fixed-size field")
            value, pos = int.from_bytes(data[pos:pos + size], "little"), pos + size
        else:
            raise WireError(f"unsupported wire type {wire}")
        yield number, wire, value
