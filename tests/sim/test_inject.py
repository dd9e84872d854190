"""`kcover sim inject`: every fault kind and flag, through the real command against a served simulated cluster.

The cluster is the one `kcover sim --serve` runs (real controller replicas and agents, the control endpoint
installed), reached only through the kubeconfig it writes, as a user reaches it. Each fault is checked where
a real cluster would show it (pod status, the node's NVML as its agent sees it, Events) and, where kcover
acts on it, by what kcover then did.
"""


from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kcover.aio import clock
from kcover.sim import cluster as cluster_
from kcover.sim import control
from kcover.sim import server as simserver

NS = cluster_.NAMESPACE
SIZE = cluster_.Size(nodes=2, gpus_per_node=4, jobs=1, seed=5)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[cluster_.SimCluster, str]]:
    c = cluster_.SimCluster(SIZE)
    control.install(c)
    async with c:
        yield c, str(c.srv.write_kubeconfig(tmp_path / "kubeconfig"))


async def inject(kubeconfig: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "kcover.cli", "sim", "inject", *args,
                                                "--kubeconfig", kubeconfig, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _status(c: cluster_.SimCluster, pod: str, container: str = cluster_.CONTAINER) -> dict[str, Any]:
    cs = c.srv.store.get("pods", NS, pod)["status"]["containerStatuses"]
    return next(s for s in cs if s["name"] == container)


async def test_pod_error_with_every_flag_and_kcover_restarts_the_job(served: tuple[cluster_.SimCluster, str]) -> None:
    c, kc = served
    pod = str(c.running_pods(c.jobs[0])[1]["metadata"]["name"])
    old = c.pod_uids(c.jobs[0])
    code, out, err = await inject(kc, "pod-error", pod, "-n", NS, "--container", cluster_.CONTAINER, "--exit-code",
                                  "3", "--reason", "Error", "--message", "worker group failed", "--log",
                                  "torch.OutOfMemoryError: CUDA out of memory")
    assert code == 0, err
    assert out == f"container pytorch of pod {NS}/{pod} exited with code 3 (Error)\n"
    # kcover restarts the job within milliseconds: read the kubelet's write from the store's history
    written = [cs["lastState"]["terminated"] for change in c.srv.store.table("pods").history
               if change.new.name == pod for cs in change.new.obj()["status"].get("containerStatuses") or []
               if "terminated" in (cs.get("lastState") or {})]
    assert [(t["exitCode"], t["reason"], t["message"]) for t in written][:1] == [(3, "Error", "worker group failed")]
    saved = await c.until(lambda: [f for f in Path(c.log_dir).rglob("*") if f.is_file()
                                   and "CUDA out of memory" in f.read_text(errors="replace")], 20,
                          "kcover to save the failed container's previous log")
    assert saved
    await c.until(lambda: c.recovered(c.jobs[0], old), 20, "kcover to restart the job")


async def test_xid_reaches_the_nodes_agent_through_its_nvml(served: tuple[cluster_.SimCluster, str]) -> None:
    c, kc = served
    node = c.nodes[1]
    started = clock.utcnow()
    code, out, err = await inject(kc, "xid", node, "--gpu", "2", "--code", "79", "-o", "json")
    assert code == 0, err
    assert json.loads(out) == {"injected": f"NVML on node {node} reported XID 79 on GPU 2 ({c.gpu_uuids[node][2]})"}
    seen = await c.until(lambda: c.detection(lambda e: e.reason == "XID79" and node in (e.target.node, e.target.name),
                                             started), 20, "the agent to see XID 79")
    assert seen.where == f"agent {node}"
    assert c.gpu_uuids[node][2] in seen.event.model_dump_json()
    other = [d for d in c.detections if d.event.reason == "XID79" and d.where == f"agent {c.nodes[0]}"]
    assert not other  # only that node's NVML had it


async def test_dra_health_sets_the_device_and_refuses_a_resource_the_pod_lacks(
        served: tuple[cluster_.SimCluster, str]) -> None:
    c, kc = served
    pod = str(c.running_pods(c.jobs[0])[0]["metadata"]["name"])
    code, out, err = await inject(kc, "dra-health", pod, "-n", NS, "--container", cluster_.CONTAINER, "--device",
                                  "gpu.nvidia.com/pool/gpu-1", "--health",
                                  "Unknown", "--message", "driver restarting", "--resource", cluster_.GPU_RESOURCE_STATUS)
    assert code == 0, err
    assert "gpu.nvidia.com/pool/gpu-1" in out
    (entry,) = _status(c, pod)["allocatedResourcesStatus"]
    assert entry == {"name": cluster_.GPU_RESOURCE_STATUS, "resources": [
        {"resourceID": "gpu.nvidia.com/pool/gpu-1", "health": "Unknown", "message": "driver restarting"}]}
    code, _, err = await inject(kc, "dra-health", pod, "--resource", "claim:no-such-claim")
    assert code == 1
    assert "claim:no-such-claim" in err


async def test_node_not_ready_and_back(served: tuple[cluster_.SimCluster, str]) -> None:
    c, kc = served
    node = c.nodes[0]

    def ready() -> dict[str, Any]:
        return next(x for x in c.srv.store.get("nodes", "", node)["status"]["conditions"] if x["type"] == "Ready")

    code, out, err = await inject(kc, "node-not-ready", node, "--status", "Unknown", "--reason", "NodeStatusUnknown",
                                  "--message", "Kubelet stopped posting node status.")
    assert code == 0, err
    assert out == f"node {node} is Ready=Unknown (NodeStatusUnknown)\n"
    assert (ready()["status"], ready()["message"]) == ("Unknown", "Kubelet stopped posting node status.")
    await c.until(lambda: any(t.get("key") == "node.kubernetes.io/unreachable"
                              for t in c.srv.store.get("nodes", "", node)["spec"].get("taints") or []),
                  10, "the node lifecycle controller's unreachable taint")
    code, _, err = await inject(kc, "node-not-ready", node, "--status", "True")
    assert code == 0, err
    assert ready()["status"] == "True"


async def test_nccl_hang_posts_the_annotated_event_and_kcover_restarts(served: tuple[cluster_.SimCluster, str]) -> None:
    c, kc = served
    pod = str(c.running_pods(c.jobs[0])[1]["metadata"]["name"])
    old = c.pod_uids(c.jobs[0])
    code, out, err = await inject(kc, "nccl-hang", pod, "-n", NS, "--reason", "NCCLTimeout", "--message", "rank 1 stalled",
                                  "--reporter", "checker.example.com/nccl")
    assert code == 0, err
    assert out.endswith(f"posted about pod {NS}/{pod} by checker.example.com/nccl\n")
    event = await c.until(lambda: next((e for e in c.api_events if e.reason == "NCCLTimeout"), None), 5, "the Event")
    assert (event.name, event.message, event.reporter) == (pod, "rank 1 stalled", "checker.example.com/nccl")
    assert event.annotations == {"kcover.io/need-recovery": "true"}
    await c.until(lambda: c.recovered(c.jobs[0], old), 20, "kcover to restart the job")


async def test_refusals_say_why_and_change_nothing(served: tuple[cluster_.SimCluster, str]) -> None:
    c, kc = served

    def versions() -> list[str]:
        return [str(o["metadata"]["resourceVersion"]) for key in ("pods", "nodes", "events")
                for o in c.srv.store.iter_objects(key) if key != "events" or o["involvedObject"].get("kind") == "Pod"]

    def watched() -> bool:  # every agent has written its condition once: no node changes after this on its own
        return all(any(cond.get("type") == "KcoverGPUHealthy"
                       for cond in (c.srv.store.get("nodes", "", n).get("status") or {}).get("conditions") or [])
                   for n in c.nodes)
    for _ in range(1500):
        if watched():
            break
        await asyncio.sleep(0.02)
    assert watched(), "the agents never wrote their node condition"
    before = versions()
    cases = [(("pod-error", "no-such-pod"), f"no pod {NS}/no-such-pod"),
             (("xid", c.nodes[0], "--gpu", "9"), f"node {c.nodes[0]} has GPUs 0-3, not 9"),
             (("xid", "no-such-node"), "no node no-such-node"),
             (("pod-error", "x", "-n", "no-such-ns"), "no pod no-such-ns/x")]
    for args, why in cases:
        code, out, err = await inject(kc, *args)
        assert (code, out) == (1, ""), (args, err)
        assert err == f"kcover sim inject: {why}\n"
    assert versions() == before


async def test_a_cluster_that_is_not_served_by_kcover_sim(tmp_path: Path) -> None:
    async with simserver.SimServer() as bare:  # an API server without the control endpoint answers 404
        kc = str(bare.write_kubeconfig(tmp_path / "bare"))
        code, _, err = await inject(kc, "xid", "n")
        assert code == 3
        assert "answered HTTP 404" in err
    code, _, err = await inject(kc, "xid", "n")  # nothing listens there any more
    assert code == 3
    assert "cannot reach the served cluster" in err
    code, _, err = await inject(str(tmp_path / "missing"), "xid", "n")
    assert code == 3
    assert "cannot read kubeconfig" in err
