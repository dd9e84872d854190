"""PodResources: the protobuf decoder and the node-level fallback without grpcio or a socket."""

from __future__ import annotations

from pathlib import Path

from kcover.agent import podresources


def _field(number: int, payload: bytes) -> bytes:
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


def _pod(name: str, namespace: str, *device_ids: str) -> bytes:
    devices = _field(1, b"nvidia.com/gpu") + b"".join(_field(2, d.encode()) for d in device_ids)
    container = _field(1, b"trainer") + _field(2, devices) + bytes([3 << 3 | 0, 7])  # cpu_ids varint
    return _field(1, name.encode()) + _field(2, namespace.encode()) + _field(3, container)


def test_decode_list_response() -> None:
    raw = _field(1, _pod("bert-0", "ml", "GPU-a", "GPU-b")) + _field(1, _pod("bert-1", "ml", "GPU-c"))
    assert podresources.decode_list_response(raw) == {
        "GPU-a": ["ml/bert-0"], "GPU-b": ["ml/bert-0"], "GPU-c": ["ml/bert-1"]}


def test_decode_empty_response() -> None:
    assert podresources.decode_list_response(b"") == {}


async def test_missing_socket_answers_node_level(tmp_path: Path) -> None:
    lookup = podresources.PodResources(str(tmp_path / "kubelet.sock"))
    assert not lookup.available
    assert await lookup.pods_for_device("GPU-a") == []
