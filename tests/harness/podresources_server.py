"""A kubelet PodResources v1 gRPC server for tests, on a unix socket (`v1.PodResourcesLister`: List, Get).

Implements the two unary methods kcover's agent may call, with the kubelet's message numbering
(k8s.io/kubelet/pkg/apis/podresources/v1/api.proto), encoded by hand: `ListPodResourcesResponse`
{pod_resources=1}, `PodResources` {name=1, namespace=2, containers=3}, `ContainerResources` {name=1,
devices=2, dynamic_resources=5}, `ContainerDevices` {resource_name=1, device_ids=2},
`DynamicResource` {claim_name=2, claim_namespace=3, claim_resources=4}, `ClaimResource`
{cdi_devices=1, driver_name=2, pool_name=3, device_name=4}; `GetPodResourcesRequest` {name=1,
namespace=2} -> `GetPodResourcesResponse` {pod_resources=1}, NOT_FOUND for an unknown pod. What it
serves is `pods`, changeable while it runs; `calls` counts the calls by method.

    with PodResourcesServer(tmp_path / "kubelet.sock") as kubelet:
        kubelet.pods = [Pod("ml", "a-0", [Container("trainer", devices={"nvidia.com/gpu": ["GPU-2"]})])]
"""

from __future__ import annotations

import collections
import dataclasses
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc


@dataclasses.dataclass
class Container:
    name: str
    devices: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    """Device plugin resource name -> device ids."""
    dra: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    """(driver, pool, device) allocated through DRA."""
    cpu_ids: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Pod:
    namespace: str
    name: str
    containers: list[Container]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def encode_pod(pod: Pod) -> bytes:
    out = _field(1, pod.name) + _field(2, pod.namespace)
    for c in pod.containers:
        body = _field(1, c.name)
        for resource, ids in c.devices.items():
            body += _field(2, _field(1, resource) + b"".join(_field(2, i) for i in ids))
        if c.cpu_ids:  # packed repeated int64: a field the reader must step over
            body += _field(3, b"".join(_varint(i) for i in c.cpu_ids))
        for driver, pool, device in c.dra:
            claimed = _field(1, _field(1, f"{driver}/gpu={device}")) + _field(2, driver) + _field(3, pool) + \
                _field(4, device)
            body += _field(5, _field(2, f"{c.name}-claim") + _field(3, pod.namespace) + _field(4, claimed))
        out += _field(3, body)
    return out


def encode_list(pods: list[Pod]) -> bytes:
    return b"".join(_field(1, encode_pod(p)) for p in pods)


def _decode_get(data: bytes) -> tuple[str, str]:
    from kcover.agent import podresources  # the product's reader, for the request's two strings

    fields = list(podresources._fields(data))
    name = "".join(v.decode() for n, _, v in fields if n == 1)
    namespace = "".join(v.decode() for n, _, v in fields if n == 2)
    return namespace, name


class PodResourcesServer:
    """A kubelet's PodResources v1 service on a unix socket, in a thread pool (grpcio)."""

    def __init__(self, socket_path: Path | str) -> None:
        self.socket_path = str(socket_path)
        self.pods: list[Pod] = []
        self.calls: collections.Counter[str] = collections.Counter()
        self._server: Any = None

    def _list(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls["List"] += 1
        return encode_list(list(self.pods))

    def _get(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls["Get"] += 1
        namespace, name = _decode_get(request)
        for pod in self.pods:
            if (pod.namespace, pod.name) == (namespace, name):
                return _field(1, encode_pod(pod))
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {namespace}/{name} not found")
        raise AssertionError("unreachable")

    def start(self) -> PodResourcesServer:
        raw = {"request_deserializer": bytes, "response_serializer": bytes}
        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(self._list, **raw),
            "Get": grpc.unary_unary_rpc_method_handler(self._get, **raw)})
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self._server.add_generic_rpc_handlers((handler,))
        if not self._server.add_insecure_port(f"unix://{self.socket_path}"):
            raise RuntimeError(f"cannot listen on {self.socket_path}")
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    def __enter__(self) -> PodResourcesServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
