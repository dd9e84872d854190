"""GPU to pods through the kubelet PodResources API v1 (`/v1.PodResourcesLister/List`).

Owns asking the kubelet which pods hold which device ids (the NVIDIA device plugin uses GPU UUIDs)
and decoding the protobuf answer with a minimal wire-format reader, so kcover needs no generated
stubs. The call needs `grpcio`; where it is not installed, or the socket is missing, the lookup
answers [] and the agent reports node-level only. It never raises to its caller.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Iterator
from typing import Any, Protocol

import structlog

log = structlog.get_logger()

_METHOD = "/v1.PodResourcesLister/List"


class PodLookup(Protocol):
    """Which pods hold a device: the kubelet's PodResources here; any other source in a test cluster."""

    async def pods_for_device(self, device_id: str) -> list[str]:
        """`namespace/name` of the pods that hold `device_id` (a GPU UUID); [] when unknown. Never raises."""
        ...


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of a protobuf message; length-delimited values as bytes."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


def decode_list_response(data: bytes) -> dict[str, list[str]]:
    """ListPodResourcesResponse -> device id -> ["namespace/pod", ...] (pure)."""
    out: dict[str, list[str]] = {}
    for number, _, pod in _fields(data):
        if number != 1:
            continue
        name = namespace = ""
        devices: list[str] = []
        for pn, _, pv in _fields(pod):
            if pn == 1:
                name = pv.decode()
            elif pn == 2:
                namespace = pv.decode()
            elif pn == 3:  # ContainerResources
                for cn, _, cv in _fields(pv):
                    if cn == 2:  # ContainerDevices
                        devices += [dv.decode() for dn, _, dv in _fields(cv) if dn == 2]
        for device in devices:
            pods = out.setdefault(device, [])
            if f"{namespace}/{name}" not in pods:
                pods.append(f"{namespace}/{name}")
    return out


class PodResources:
    """Looks pods up by device id; [] when the kubelet cannot be asked."""

    def __init__(self, socket_path: str, *, timeout_seconds: float = 2.0) -> None:
        self.socket_path = socket_path
        self.timeout_seconds = timeout_seconds
        self._grpc: Any = None
        self._warned = False
        try:
            self._grpc = importlib.import_module("grpc")
        except ImportError:
            self._grpc = None

    @property
    def available(self) -> bool:
        return self._grpc is not None and os.path.exists(self.socket_path)

    def _list(self) -> bytes:
        grpc = self._grpc
        with grpc.insecure_channel(f"unix://{self.socket_path}") as channel:
            call = channel.unary_unary(_METHOD, request_serializer=lambda _: b"",
                                       response_deserializer=lambda raw: raw)
            return bytes(call(b"", timeout=self.timeout_seconds))

    async def pods_for_device(self, device_id: str) -> list[str]:
        if not self.available:
            if not self._warned:
                self._warned = True
                log.info("podresources_unavailable", socket=self.socket_path, grpc=self._grpc is not None)
            return []
        try:
            raw = await asyncio.to_thread(self._list)
            return decode_list_response(raw).get(device_id, [])
        except Exception as exc:  # best effort: a fault is reported with or without its pods
            log.warning("podresources_list_failed", socket=self.socket_path, error=f"{type(exc).__name__}: {exc}")
            return []
