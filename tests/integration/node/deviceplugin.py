"""A device plugin for the `node` backend's real kubelet: fake `nvidia.com/gpu` devices, served over gRPC.

What NVIDIA's device plugin does, minus the GPUs: serve `v1beta1.DevicePlugin` on a unix socket in the
kubelet's device-plugin directory, register `nvidia.com/gpu` with the kubelet (`v1beta1.Registration`
on its `kubelet.sock`), stream the devices (ListAndWatch: ids `GPU-fake-0000`... as the agent's fake
NVML names its GPUs, all Healthy), and answer Allocate with `NVIDIA_VISIBLE_DEVICES` set to the ids the
kubelet chose (what the NVIDIA plugin sets for its runtime), so a container can say which GPUs it got.
The kubelet does the rest for real: it advertises the node's capacity, allocates devices to pods,
checkpoints them and serves them through PodResources.

Messages are encoded by hand (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto): RegisterRequest
{version=1, endpoint=2, resource_name=3, options=4}; ListAndWatchResponse {devices=1: Device {ID=1,
health=2}}; AllocateRequest {container_requests=1: {devices_ids=1}}; AllocateResponse
{container_responses=1: {envs=1: map entry {key=1, value=2}}}; DevicePluginOptions {} (no
PreStartContainer, no GetPreferredAllocation). `allocations` lists, per Allocate call, the device ids of
each container request.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from kcover import protowire

RESOURCE = "nvidia.com/gpu"
API_VERSION = "v1beta1"
ENDPOINT = "kcover-test-gpu.sock"


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _strings(data: bytes, number: int) -> list[str]:
    return [v.decode() for n, w, v in protowire.fields(data) if n == number and w == 2 and isinstance(v, bytes)]


def _messages(data: bytes, number: int) -> list[bytes]:
    return [v for n, w, v in protowire.fields(data) if n == number and w == 2 and isinstance(v, bytes)]


class DevicePlugin:
    """`gpus` fake GPUs registered with the kubelet whose device-plugin directory is `plugin_dir`."""

    def __init__(self, plugin_dir: Path, gpus: int = 8) -> None:
        self.plugin_dir = plugin_dir
        self.devices = [f"GPU-fake-{i:04d}" for i in range(gpus)]
        self.allocations: list[list[list[str]]] = []
        self.list_and_watch_calls = 0
        self._stopping = threading.Event()
        self._server: Any = None

    # ------------------------------------------------------------------ DevicePlugin service
    def _options(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        return b""

    def _list_and_watch(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        self.list_and_watch_calls += 1
        yield b"".join(_field(1, _field(1, d) + _field(2, "Healthy")) for d in self.devices)
        while not self._stopping.wait(0.5) and context.is_active():
            pass

    def _allocate(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        containers = [_strings(c, 1) for c in _messages(request, 1)]
        self.allocations.append(containers)
        out = b""
        for ids in containers:
            env = _field(1, "NVIDIA_VISIBLE_DEVICES") + _field(2, ",".join(ids))
            out += _field(1, _field(1, env))
        return out

    def _unused(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not offered in GetDevicePluginOptions")
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> DevicePlugin:
        raw = {"request_deserializer": bytes, "response_serializer": bytes}
        handler = grpc.method_handlers_generic_handler(f"{API_VERSION}.DevicePlugin", {
            "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(self._options, **raw),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(self._list_and_watch, **raw),
            "Allocate": grpc.unary_unary_rpc_method_handler(self._allocate, **raw),
            "GetPreferredAllocation": grpc.unary_unary_rpc_method_handler(self._unused, **raw),
            "PreStartContainer": grpc.unary_unary_rpc_method_handler(self._unused, **raw)})
        socket = self.plugin_dir / ENDPOINT
        socket.unlink(missing_ok=True)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers((handler,))
        if not self._server.add_insecure_port(f"unix://{socket}"):
            raise RuntimeError(f"cannot listen on {socket}")
        self._server.start()
        self.register()
        return self

    def register(self) -> None:
        """Register with the kubelet (again after a kubelet restart, which forgets its plugins)."""
        request = _field(1, API_VERSION) + _field(2, ENDPOINT) + _field(3, RESOURCE)
        with grpc.insecure_channel(f"unix://{self.plugin_dir / 'kubelet.sock'}") as channel:
            register = channel.unary_unary(f"/{API_VERSION}.Registration/Register", request_serializer=bytes,
                                           response_deserializer=bytes)
            register(request, timeout=10)

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.stop(grace=1).wait()
            self._server = None
        (self.plugin_dir / ENDPOINT).unlink(missing_ok=True)
