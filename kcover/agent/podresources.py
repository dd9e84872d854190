"""GPU to pods through the kubelet's PodResources API v1 (`v1.PodResourcesLister/List`) over gRPC.

Owns asking the kubelet which pods hold which devices, on its unix socket
(`agent.pod_resources_socket`, `/var/lib/kubelet/pod-resources/kubelet.sock`), with grpcio, and reading
the protobuf answer with a minimal wire-format reader (so kcover needs no generated stubs). What a
container holds comes in two shapes: device-plugin devices (`resource_name`, `device_ids`: whole GPU
UUIDs for `nvidia.com/gpu`, MIG device UUIDs for `nvidia.com/mig-*`) and DRA devices
(`dynamic_resources[].claim_resources[]`: driver, pool and device, from Kubernetes 1.31's fields 2-4).
Both become `Assignment`s; `pods_holding` answers "which pods hold any of these ids".

How it fails: never to its caller. A missing socket, or a failed or timed-out call, answers [] (the
fault is then reported without pods and the controller falls back to the node's opted-in workloads),
logged once per kind of failure; a malformed answer is logged and answers [].
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from kcover import protowire

log = structlog.get_logger()

SERVICE = "v1.PodResourcesLister"
LIST_METHOD = f"/{SERVICE}/List"
GET_METHOD = f"/{SERVICE}/Get"


class PodLookup(Protocol):
    """Which pods hold a device: the kubelet's PodResources here; any other source in a test cluster."""

    async def pods_for_device(self, device_id: str) -> list[str]:
        """`namespace/name` of the pods that hold `device_id` (a GPU or MIG UUID); [] when unknown. Never raises."""
        ...


@dataclass(frozen=True)
class Assignment:
    """One device one container holds."""

    pod: str
    """`namespace/name`."""
    container: str
    resource: str
    """The device plugin's resource name (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`), or the DRA driver."""
    device: str
    """A device plugin's device id (GPU or MIG UUID), or a DRA device as `driver/pool/device`."""


# ------------------------------------------------------------------------------------------ wire format

def _fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of a protobuf message; length-delimited values as bytes."""
    return protowire.fields(data)


def _strings(data: bytes, number: int) -> list[str]:
    return [v.decode() for n, w, v in _fields(data) if n == number and w == 2]


def _messages(data: bytes, number: int) -> list[bytes]:
    return [bytes(v) for n, w, v in _fields(data) if n == number and w == 2]


def decode_pod(pod: bytes) -> list[Assignment]:
    """One `PodResources` message -> what its containers hold (pure)."""
    name = "".join(_strings(pod, 1))
    namespace = "".join(_strings(pod, 2))
    key = f"{namespace}/{name}"
    out: list[Assignment] = []
    for container in _messages(pod, 3):  # ContainerResources
        cname = "".join(_strings(container, 1))
        for devices in _messages(container, 2):  # ContainerDevices: resource_name 1, device_ids 2
            resource = "".join(_strings(devices, 1))
            out += [Assignment(key, cname, resource, d) for d in _strings(devices, 2)]
        for dynamic in _messages(container, 5):  # DynamicResource: claim_resources 4
            for claimed in _messages(dynamic, 4):  # ClaimResource: driver 2, pool 3, device 4
                driver, pool, device = ("".join(_strings(claimed, n)) for n in (2, 3, 4))
                if driver and pool and device:
                    out.append(Assignment(key, cname, driver, f"{driver}/{pool}/{device}"))
    return out


def decode_list_response(data: bytes) -> list[Assignment]:
    """`ListPodResourcesResponse` -> every device every container holds (pure)."""
    return [a for pod in _messages(data, 1) for a in decode_pod(pod)]


def pods_holding(assignments: Iterable[Assignment], device_ids: Iterable[str]) -> list[str]:
    """`namespace/name` of the pods holding any of `device_ids`, in first-seen order, each once (pure)."""
    wanted = set(device_ids)
    out: list[str] = []
    for a in assignments:
        if a.device in wanted and a.pod not in out:
            out.append(a.pod)
    return out


# ------------------------------------------------------------------------------------------ client

class PodResources:
    """The kubelet's PodResources v1 over gRPC on its unix socket; [] when it cannot be asked."""

    def __init__(self, socket_path: str, *, timeout_seconds: float = 2.0) -> None:
        self.socket_path = socket_path
        self.timeout_seconds = timeout_seconds
        self._said: set[str] = set()

    @property
    def available(self) -> bool:
        return os.path.exists(self.socket_path)

    def list_blocking(self) -> list[Assignment]:
        """One `List` call (blocking; raises `grpc.RpcError` or ValueError)."""
        grpc = _grpc()
        with grpc.insecure_channel(f"unix://{os.path.abspath(self.socket_path)}") as channel:
            call = channel.unary_unary(LIST_METHOD, request_serializer=_raw, response_deserializer=_raw)
            raw = call(b"", timeout=self.timeout_seconds)
        return decode_list_response(raw)

    async def assignments(self) -> list[Assignment]:
        """Every device the node's containers hold now; [] when the kubelet cannot be asked. Never raises."""
        if not self.available:
            self._once("podresources_unavailable", socket=self.socket_path)
            return []
        try:
            return await asyncio.to_thread(self.list_blocking)
        except _grpc().RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            self._once("podresources_list_failed", socket=self.socket_path, code=str(code), error=str(exc)[:300])
        except ValueError as exc:
            self._once("podresources_answer_unreadable", socket=self.socket_path, error=str(exc))
        return []

    async def pods_for_devices(self, device_ids: Sequence[str]) -> list[str]:
        """`namespace/name` of the pods holding any of `device_ids` (one List call). Never raises."""
        return pods_holding(await self.assignments(), device_ids)

    async def pods_for_device(self, device_id: str) -> list[str]:
        return await self.pods_for_devices([device_id])

    def _once(self, event: str, **fields: Any) -> None:
        if event not in self._said:
            self._said.add(event)
            log.warning(event, **fields)
        else:
            log.debug(event, **fields)


def _raw(data: bytes) -> bytes:
    return bytes(data)


def _grpc() -> Any:
    """grpc, imported when the kubelet is first asked (a GPU's fault), not when the agent starts: an
    idle agent stays about 7 MiB smaller and starts faster."""
    import grpc

    return grpc
