"""PodResources v1 over real gRPC: the agent's client against a kubelet-like server on a unix socket.

The server (tests/harness/podresources_server.py) implements `v1.PodResourcesLister` List and Get with
the kubelet's message numbering. What a node reports comes through: whole GPUs (`nvidia.com/gpu`, GPU
UUIDs), MIG instances (`nvidia.com/mig-1g.10gb`, MIG UUIDs) and DRA devices (driver/pool/device); a
field the reader does not use (cpu_ids) is stepped over. No socket, a server that went away, a call
past the timeout, and an answer that is not protobuf all answer [] (node-level) without raising.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import grpc
import pytest
from harness.podresources_server import Container, Pod, PodResourcesServer, encode_list

from kcover.agent import podresources

NODE = [
    Pod("ml", "a-worker-0", [Container("trainer", devices={"nvidia.com/gpu": ["GPU-2"]}, cpu_ids=[0, 1, 130])]),
    Pod("ml", "b-worker-0", [Container("trainer", devices={"nvidia.com/gpu": ["GPU-5", "GPU-6"]})]),
    Pod("infer", "small-0", [Container("server", devices={"nvidia.com/mig-1g.10gb": ["MIG-7a"]}),
                             Container("sidecar")]),
    Pod("infer", "small-1", [Container("server", devices={"nvidia.com/mig-1g.10gb": ["MIG-7b"]})]),
    Pod("dra", "c-0", [Container("trainer", dra=[("gpu.nvidia.com", "node-a", "gpu-3")])]),
]


def test_decode_what_the_server_encodes() -> None:
    got = podresources.decode_list_response(encode_list(NODE))
    assert [(a.pod, a.container, a.resource, a.device) for a in got] == [
        ("ml/a-worker-0", "trainer", "nvidia.com/gpu", "GPU-2"),
        ("ml/b-worker-0", "trainer", "nvidia.com/gpu", "GPU-5"),
        ("ml/b-worker-0", "trainer", "nvidia.com/gpu", "GPU-6"),
        ("infer/small-0", "server", "nvidia.com/mig-1g.10gb", "MIG-7a"),
        ("infer/small-1", "server", "nvidia.com/mig-1g.10gb", "MIG-7b"),
        ("dra/c-0", "trainer", "gpu.nvidia.com", "gpu.nvidia.com/node-a/gpu-3"),
    ]
    assert podresources.decode_list_response(b"") == []


async def test_list_over_a_unix_socket(tmp_path: Path) -> None:
    with PodResourcesServer(tmp_path / "kubelet.sock") as kubelet:
        kubelet.pods = NODE
        lookup = podresources.PodResources(kubelet.socket_path)
        assert lookup.available
        assert await lookup.pods_for_device("GPU-2") == ["ml/a-worker-0"]
        assert await lookup.pods_for_device("GPU-6") == ["ml/b-worker-0"]
        # a fault on a MIG-enabled GPU: the pods holding any of its MIG instances
        assert await lookup.pods_for_devices(["GPU-7", "MIG-7a", "MIG-7b"]) == ["infer/small-0", "infer/small-1"]
        assert await lookup.pods_for_device("gpu.nvidia.com/node-a/gpu-3") == ["dra/c-0"]
        assert await lookup.pods_for_device("GPU-0") == []
        kubelet.pods = NODE[1:]  # a pod went away: the next call sees the kubelet's state now
        assert await lookup.pods_for_device("GPU-2") == []
        assert kubelet.calls["List"] == 6


def test_get_answers_one_pod_and_not_found(tmp_path: Path) -> None:
    with PodResourcesServer(tmp_path / "kubelet.sock") as kubelet:
        kubelet.pods = NODE
        with grpc.insecure_channel(f"unix://{kubelet.socket_path}") as channel:
            get = channel.unary_unary(podresources.GET_METHOD, request_serializer=bytes, response_deserializer=bytes)
            request = b"\x0a\x0ab-worker-0\x12\x02ml"
            pods = [podresources.decode_pod(m) for m in podresources._messages(get(request, timeout=2), 1)]
            assert [a.device for a in pods[0]] == ["GPU-5", "GPU-6"]
            with pytest.raises(grpc.RpcError) as refused:
                get(b"\x0a\x04none\x12\x02ml", timeout=2)
            assert refused.value.code() is grpc.StatusCode.NOT_FOUND


async def test_no_socket_or_a_dead_server_answers_node_level(tmp_path: Path) -> None:
    lookup = podresources.PodResources(str(tmp_path / "kubelet.sock"), timeout_seconds=0.5)
    assert not lookup.available
    assert await lookup.pods_for_device("GPU-2") == []
    kubelet = PodResourcesServer(tmp_path / "kubelet.sock").start()
    kubelet.pods = NODE
    assert await lookup.pods_for_device("GPU-2") == ["ml/a-worker-0"]
    kubelet.stop()  # the socket file stays, nobody answers
    assert await lookup.pods_for_device("GPU-2") == []


async def test_a_hung_kubelet_is_cut_at_the_timeout(tmp_path: Path) -> None:
    release = threading.Event()
    with PodResourcesServer(tmp_path / "kubelet.sock") as kubelet:
        original = kubelet._list

        def hang(request: bytes, context: grpc.ServicerContext) -> bytes:
            release.wait(5)
            return original(request, context)

        kubelet._list = hang  # type: ignore[method-assign]
        kubelet.stop()  # handlers are bound at start: restart to serve `hang`
        kubelet.start()
        lookup = podresources.PodResources(kubelet.socket_path, timeout_seconds=0.3)
        started = asyncio.get_running_loop().time()
        assert await lookup.pods_for_device("GPU-2") == []
        assert asyncio.get_running_loop().time() - started < 2
        release.set()


async def test_an_answer_that_is_not_protobuf_answers_node_level(tmp_path: Path) -> None:
    with PodResourcesServer(tmp_path / "kubelet.sock") as kubelet:
        kubelet._list = lambda request, context: b"\x0a\xff\xff\xff\x0f"  # type: ignore[method-assign]
        kubelet.stop()
        kubelet.start()
        assert await podresources.PodResources(kubelet.socket_path).pods_for_device("GPU-2") == []
