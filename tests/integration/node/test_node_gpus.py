"""GPUs the real kubelet allocated (from the test device plugin), as PodResources reports them, and a GPU fault
mapped by the agent in its pod to exactly the pods holding that GPU.

Three opted-in Jobs on the real node: one worker with one GPU, one with two, one with none. Which GPUs
each container got is read from the container itself (the device plugin's Allocate answer sets
NVIDIA_VISIBLE_DEVICES, which the worker prints): the kubelet chose them, nothing here did. kcover's
decoder (kcover/agent/podresources.py) reads the kubelet's real PodResources answer to the same
mapping; then an application XID (13: restart the workload) on one of the two-GPU worker's GPUs makes
the agent name that worker's pod in its Event, and kcover restarts that Job and neither other.

With KCOVER_RECORD_FIXTURES=1 the kubelet's List answer and the mapping read from the containers are
written to tests/fixtures/podresources/ (tests/agent/test_podresources_recorded.py decodes them).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import workloads as wl
from nodekit import RELEASE_NS, RealNode, nodehost, until

from kcover.agent import podresources

pytestmark = pytest.mark.parametrize("realnode", ["node"], indirect=True)
RESTARTED = "KcoverRestartedWorkload"
SOCKET = nodehost.KUBELET_ROOT / "pod-resources" / "kubelet.sock"
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "podresources"


@pytest.fixture
def ns(realnode: RealNode) -> Iterator[str]:
    name = realnode.namespace("t-" + secrets.token_hex(4))
    yield name
    realnode.request("DELETE", f"/api/v1/namespaces/{name}")


def list_raw() -> bytes:
    """The kubelet's `v1.PodResourcesLister/List` answer, as bytes."""
    with grpc.insecure_channel(f"unix://{SOCKET}") as channel:
        call = channel.unary_unary(podresources.LIST_METHOD, request_serializer=bytes, response_deserializer=bytes)
        return bytes(call(b"", timeout=10))


def allocated(rn: RealNode, pod: dict[str, Any]) -> dict[str, list[str]]:
    """container -> the GPU ids the container itself was given (its NVIDIA_VISIBLE_DEVICES, from its log)."""
    out = {}
    for c in pod["spec"]["containers"]:
        def first(c: dict[str, Any] = c) -> str:  # a container just started may not have printed yet
            lines = rn.log(pod["metadata"]["namespace"], pod["metadata"]["name"], c["name"]).splitlines()
            return lines[0] if lines else ""
        line = until(first, f"{pod['metadata']['name']}'s first log line", within=30)
        match = re.search(r"starting on GPUs (\S+)$", line)
        assert match, line
        out[c["name"]] = [] if match.group(1) == "-" else match.group(1).split(",")
    return out


def test_the_agent_maps_a_gpu_fault_to_exactly_the_pods_the_kubelet_reports(realnode: RealNode, ns: str) -> None:
    rn = realnode
    rn.wait_ready()
    jobs = {"one": 1, "two": 2, "none": 0}
    made = {name: wl.create(rn, "batch", ns, name, workers=1, gpus=gpus) for name, gpus in jobs.items()}
    pods = {name: until(lambda n=name: wl.running(rn, "batch", ns, n, workers=1), f"Job {name} Running")[0]
            for name in jobs}
    truth = {name: allocated(rn, pod) for name, pod in pods.items()}
    assert [len(ids) for c in truth.values() for ids in c.values()] == [1, 2, 0]
    given = [ids for call in rn.plugin.allocations for ids in call]
    for ids in (ids for c in truth.values() for ids in c.values() if ids):
        assert sorted(ids) in [sorted(g) for g in given]  # what the kubelet asked the plugin for

    # kcover's decoder on the real kubelet's answer gives the same mapping
    raw = list_raw()
    decoded = podresources.decode_list_response(raw)
    for name, pod in pods.items():
        key = f"{ns}/{pod['metadata']['name']}"
        got = sorted(a.device for a in decoded if a.pod == key and a.resource == "nvidia.com/gpu")
        assert got == sorted(d for ids in truth[name].values() for d in ids), (name, got)
    if os.environ.get("KCOVER_RECORD_FIXTURES") == "1":
        record(rn, raw)

    # a GPU fault on one of the two-GPU worker's GPUs: the agent names that pod, kcover restarts that Job only
    uuid = truth["two"][next(iter(truth["two"]))][1]
    index = int(uuid.rsplit("-", 1)[1])
    before = {name: wl.uids([pod]) for name, pod in pods.items()}
    injected = time.monotonic()
    rn.inject(f"xid 13 {index}")

    def reported() -> list[dict[str, Any]]:
        return [e for e in rn.events(RELEASE_NS) if (e["metadata"].get("annotations") or {}).get("kcover.io/gpu-uuid")
                == uuid and (e["metadata"].get("annotations") or {}).get("kcover.io/xid") == "13"]
    events = until(reported, f"the agent's Event for XID 13 on {uuid}", within=60)
    assert events[0]["metadata"]["annotations"]["kcover.io/pods"] == f"{ns}/{pods['two']['metadata']['name']}"
    until(lambda: rn.events(ns, RESTARTED, made["two"]["metadata"]["uid"]), "kcover's restart of Job two")
    until(lambda: wl.running(rn, "batch", ns, "two", workers=1, old=frozenset(before["two"])), "Job two Running again")
    print(f"gpu-xid: XID 13 on {uuid} to Job two Running again {time.monotonic() - injected:.2f} s")
    for name in ("one", "none"):
        assert not rn.events(ns, RESTARTED, made[name]["metadata"]["uid"])
        assert wl.uids(wl.pods(rn, "batch", ns, name)) == before[name]


def record(rn: RealNode, raw: bytes) -> None:
    """The List answer, and the truth to decode it to: every pod on the node with the GPUs each container
    reported itself (NVIDIA_VISIBLE_DEVICES), or none for a container that asked for none."""
    pods = [p for p in rn.ok("GET", "/api/v1/pods")["items"] if p["spec"].get("nodeName") == rn.node
            and p["status"].get("phase") == "Running"]
    truth: dict[str, dict[str, list[str]]] = {}
    for pod in pods:
        asks = any((c.get("resources") or {}).get("limits", {}).get("nvidia.com/gpu") for c in pod["spec"]["containers"])
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        truth[key] = allocated(rn, pod) if asks else {c["name"]: [] for c in pod["spec"]["containers"]}
    FIXTURES.mkdir(parents=True, exist_ok=True)
    version = rn.ok("GET", f"/api/v1/nodes/{rn.node}")["status"]["nodeInfo"]["kubeletVersion"]
    stem = f"kubelet-{version}-list"
    (FIXTURES / f"{stem}.pb").write_bytes(raw)
    (FIXTURES / f"{stem}.json").write_text(json.dumps({"kubelet": version, "resource": "nvidia.com/gpu",
                                                     "pods": truth}, indent=2, sort_keys=True) + "\n")
