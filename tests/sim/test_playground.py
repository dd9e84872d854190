"""`kcover sim --serve` as a playground, driven only with kubectl as a new user drives it.

One served cluster (two 1-GPU nodes, one PyTorchJob of two 1-GPU pods): kcover's agents are DaemonSet
pods, so `kubectl drain --ignore-daemonsets` evicts the job's pod and leaves the agent; the evicted pod's
replacement cannot fit on the other node (its one GPU is taken) and stays Pending with the scheduler's
FailedScheduling Event until the node is uncordoned; pods have distinct IPs from their node's pod CIDR
and the node's host IP; a batch Job gets its pod; deleting the PyTorchJob deletes its pods.
"""

from __future__ import annotations

import ipaddress
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
from test_kubectl import _binary, _serve_sim

T = TypeVar("T")


def _until(probe: Callable[[], T | None], what: str, within: float = 30.0) -> T:
    deadline = time.monotonic() + within
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out after {within:g} s waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def kc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    _binary()
    yield from _serve_sim(tmp_path_factory.mktemp("playground"))


def kubectl(kc: str, *args: str, ok: bool = True) -> str:
    import subprocess

    done = subprocess.run([_binary(), "--kubeconfig", kc, *args], capture_output=True, text=True, timeout=120)
    if ok:
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout + (done.stderr if not ok else "")


def _json(kc: str, *args: str) -> Any:
    return json.loads(kubectl(kc, "get", *args, "-o", "json"))


def test_pods_have_their_nodes_addresses(kc: str) -> None:
    pods = _json(kc, "pods", "-n", "ml")["items"]
    nodes = {n["metadata"]["name"]: n for n in _json(kc, "nodes")["items"]}
    assert len({p["status"]["podIP"] for p in pods}) == len(pods) == 2
    for pod in pods:
        node = nodes[pod["spec"]["nodeName"]]
        assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(node["spec"]["podCIDR"])
        assert pod["status"]["hostIP"] == next(a["address"] for a in node["status"]["addresses"]
                                               if a["type"] == "InternalIP")


def test_drain_evicts_the_job_pod_the_gpus_keep_its_replacement_pending(kc: str) -> None:
    agents = _json(kc, "pods", "-n", "kcover-system")["items"]
    assert {r["kind"] for p in agents for r in p["metadata"]["ownerReferences"]} == {"DaemonSet"}
    node = "gpu-node-0"
    on_node = [p["metadata"]["name"] for p in _json(kc, "pods", "-n", "ml", "--field-selector",
                                                    f"spec.nodeName={node}")["items"]]
    out = kubectl(kc, "drain", node, "--ignore-daemonsets", "--timeout=60s")
    assert f"node/{node} cordoned" in out
    assert [f"pod/{name} evicted" for name in on_node] == [line for line in out.splitlines() if "evicted" in line]
    assert out.splitlines()[-1] == f"node/{node} drained"

    def pending() -> list[dict[str, Any]]:
        return [p for p in _json(kc, "pods", "-n", "ml")["items"] if p["status"].get("phase") == "Pending"
                and any(c.get("reason") == "Unschedulable" for c in p["status"].get("conditions") or [])]

    (stuck,) = _until(pending, "the replacement pod Pending")  # the other node's one GPU is taken
    message = next(c["message"] for c in stuck["status"]["conditions"] if c["type"] == "PodScheduled")
    assert message.startswith("0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) were unschedulable.")
    events = _json(kc, "events", "-n", "ml", "--field-selector",
                   f"involvedObject.name={stuck['metadata']['name']},reason=FailedScheduling")["items"]
    assert [e["message"] for e in events] == [message]
    kubectl(kc, "uncordon", node)
    _until(lambda: not pending(), "the replacement scheduled once the node is back")
    used: dict[str, int] = {}
    for pod in _json(kc, "pods", "-n", "ml")["items"]:
        gpus = sum(int((c.get("resources") or {}).get("limits", {}).get("nvidia.com/gpu", 0))
                   for c in pod["spec"]["containers"])
        used[pod["spec"]["nodeName"]] = used.get(pod["spec"]["nodeName"], 0) + gpus
    assert used == {"gpu-node-0": 1, "gpu-node-1": 1}


def test_a_batch_job_gets_a_pod(kc: str) -> None:
    kubectl(kc, "create", "job", "hello", "--image=busybox", "-n", "ml")

    def running() -> list[dict[str, Any]]:
        pods = _json(kc, "pods", "-n", "ml", "-l", "batch.kubernetes.io/job-name=hello")["items"]
        return [p for p in pods if p["status"].get("phase") == "Running"]

    (pod,) = _until(running, "the Job's pod Running")
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "Job"
    job = _json(kc, "job", "hello", "-n", "ml")
    assert job["status"]["active"] == 1
    kubectl(kc, "delete", "job", "hello", "-n", "ml")  # kubectl deletes in the background: the pod goes too
    _until(lambda: not _json(kc, "pods", "-n", "ml", "-l", "batch.kubernetes.io/job-name=hello")["items"],
           "the Job's pod collected")


def test_deleting_a_pytorchjob_deletes_its_pods(kc: str) -> None:
    kubectl(kc, "delete", "pytorchjob", "train-0", "-n", "ml")
    _until(lambda: not _json(kc, "pods", "-n", "ml", "-l", "training.kubeflow.org/job-name=train-0")["items"],
           "the PyTorchJob's pods collected")
