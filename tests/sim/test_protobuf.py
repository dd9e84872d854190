"""The sim's reader of Kubernetes protobuf bodies (`kcover.sim.protobuf`): what client-go's generated
clients send for built-in kinds, read into the JSON the API server would have decoded."""

from __future__ import annotations

import pytest

from kcover.sim import protobuf

# kubectl 1.36.3 `create namespace x`, as captured with -v=8
KUBECTL_NAMESPACE = bytes.fromhex(
    "6b3873000a0f0a0276311209 4e616d657370616365 12190a110a0178120 01a0022002a00320038004200 12001a020a00 1a002200"
    .replace(" ", ""))


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def field(number: int, value: bytes | int | str) -> bytes:
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    raw = value.encode() if isinstance(value, str) else value
    return varint(number << 3 | 2) + varint(len(raw)) + raw


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    return protobuf.MAGIC + field(1, field(1, api_version) + field(2, kind)) + field(2, raw)


def test_kubectl_create_namespace_reads_as_json() -> None:
    assert protobuf.decode(KUBECTL_NAMESPACE) == {"kind": "Namespace", "apiVersion": "v1",
                                                  "metadata": {"name": "x"}, "spec": {}, "status": {}}


def test_maps_lists_times_quantities_and_int_or_string() -> None:
    meta = field(1, "p") + field(11, field(1, "app") + field(2, "x")) + field(8, field(1, 1767225600))
    limits = field(1, "nvidia.com/gpu") + field(2, field(1, "8"))
    container = field(1, "c") + field(2, "busybox") + field(8, field(1, limits)) + field(3, "sleep")
    http_get = field(1, "/healthz") + field(2, field(1, 1) + field(3, "http"))  # path, port (IntOrString)
    container += field(10, field(1, field(2, http_get)) + field(3, 5))  # livenessProbe: handler (inline), timeout
    spec = field(2, container) + field(3, "Never") + field(4, 30)
    pod = protobuf.decode(envelope("v1", "Pod", field(1, meta) + field(2, spec)))
    assert pod["metadata"] == {"name": "p", "labels": {"app": "x"}, "creationTimestamp": "2026-01-01T00:00:00Z"}
    c = pod["spec"]["containers"][0]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "8"}}
    assert c["command"] == ["sleep"]
    assert c["livenessProbe"] == {"httpGet": {"path": "/healthz", "port": "http"}, "timeoutSeconds": 5}
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["terminationGracePeriodSeconds"] == 30


@pytest.mark.parametrize(("grace", "expected"), [
    (0, {"gracePeriodSeconds": 0}),  # a pointer: zero is meaningful (delete now), kept
    (-1, {"gracePeriodSeconds": -1}),  # negative int64 travels sign-extended
])
def test_pointer_zero_is_kept_and_negative_numbers_read(grace: int, expected: dict[str, int]) -> None:
    body = envelope("policy/v1", "Eviction", field(1, field(1, "p") + field(3, "ns")) + field(2, field(1, grace)))
    got = protobuf.decode(body)
    assert got["kind"] == "Eviction"
    assert got["deleteOptions"] == expected
    assert got["metadata"] == {"name": "p", "namespace": "ns"}


def test_omitempty_zero_values_are_left_out() -> None:
    meta = field(1, "j") + field(2, "") + field(7, 0)  # generateName "", generation 0
    got = protobuf.decode(envelope("batch/v1", "Job", field(1, meta)))
    assert got == {"kind": "Job", "apiVersion": "batch/v1", "metadata": {"name": "j"}}


@pytest.mark.parametrize("body", [b"{}", protobuf.MAGIC + b"\x0a", protobuf.MAGIC + field(2, b""),
                                  envelope("v1", "NoSuchKind", b"")])
def test_malformed_bodies_raise_protobuf_error(body: bytes) -> None:
    with pytest.raises(protobuf.ProtobufError):
        protobuf.decode(body)
