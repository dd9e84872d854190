"""The `kcover sim` scenario `preflight-slow-node`, registered in `kcover.sim.scenarios`.

An 8-node PyTorchJob runs a `preflight` init container on every node; its ranks report pairwise
all-reduce results taken from real nccl-tests outputs (a healthy DGX H100 and the same machine with
NVLink disabled, `simdata/`), and every pair touching one node is degraded. The agents' collectors turn
the report files into PreflightReports, the controller's `preflight` detector finds that node slow, and
the recovery engine (with a rule allowing it) cordons and taints the node and restarts the job, which
comes back on the other nodes. The checks also read what `kubectl get pfr` showed: each report's last
status (the reports belong to their pods, so the garbage collector deletes them with the pods the
restart replaces; the store's watch history keeps what they last said).

Only the simulator imports this module (through its entry point); kcover's product path never does.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from importlib import resources as importlib_resources
from pathlib import Path
from typing import Any

from kcover.sim import cluster as cluster_
from kcover.sim import playing, tables
from kcover_preflight import initcontainer, judge, reports, resources, synthetic

NS = cluster_.NAMESPACE
JOB = "pretrain"
NODES = 8
SLOW_RANK = 3
REPORT_DIR = Path(tempfile.gettempdir()) / f"kcover-sim-preflight-{os.getpid()}"
"""Stands for every node's hostPath: the simulated nodes share one file system, and each agent takes
only the reports that name its own node."""
RULE = {"detector": "preflight", "target": "Node", "action": "cordon-node-and-restart"}


def simdata(name: str) -> str:
    return importlib_resources.files("kcover_preflight").joinpath("simdata", name).read_text(encoding="utf-8")


def job_manifest(name: str = JOB, *, workers: int = NODES - 1, gpus: int = 8) -> dict[str, Any]:
    """An opted-in PyTorchJob whose pods run the `preflight` init container, each asking for `gpus` GPUs."""
    template = {"metadata": {"labels": {"kcover.io/preflight": "true"}},
                "spec": {"restartPolicy": "OnFailure",
                         "initContainers": [{"name": "preflight", "image": "registry.example.com/kcover-preflight:1",
                                             "command": ["python3", "/preflight.py"]}],
                         "containers": [{"name": cluster_.CONTAINER, "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                                         "command": ["torchrun", "train.py"],
                                         "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": NS, "labels": {cluster_.OPT_IN: "true"}},
            "spec": {"pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template},
                "Worker": {"replicas": workers, "restartPolicy": "OnFailure", "template": template}}}}


def rank_of(pod: dict[str, Any]) -> int:
    """PyTorchJob ranks as the training-operator numbers them: Master 0, Worker i is i + 1."""
    labels = pod["metadata"].get("labels") or {}
    index = int(labels.get("training.kubeflow.org/replica-index", "0"))
    return index + (1 if labels.get("training.kubeflow.org/replica-type") == "worker" else 0)


def write_reports(root: Path | Callable[[str], Path], namespace: str, workload: str, pods: list[dict[str, Any]], *,
                  slow_rank: int | None, go_format: bool = False) -> str:
    """Write the report file of every rank as its init container would, into `root` or, given a function,
    into `root(node)`, the rank's own node's directory; returns the slow rank's node ('' with none)."""
    by_rank = sorted(pods, key=rank_of)
    nodes = [str(p["spec"]["nodeName"]) for p in by_rank]
    ips = [f"10.0.{i // 250}.{i % 250 + 1}" for i in range(len(nodes))]
    slow = nodes[slow_rank] if slow_rank is not None else ""
    made = synthetic.workload_reports(workload=workload, nodes=nodes, ips=ips,
                                      healthy=simdata("all_reduce_perf_h100_dgx_4gpu_nvswitch.txt"),
                                      degraded=simdata("all_reduce_perf_h100_dgx_4gpu_p2p_disabled_degraded.txt"),
                                      slow={slow} - {""}, go_format=go_format)
    for report in made:
        folder = root(report.node_name) if callable(root) else root
        opts = initcontainer.Options(namespace=namespace, workload=workload, index=report.rank, rank=report.rank,
                                     peers=ips, node_name=report.node_name, node_ip=report.node_ip, report_dir=folder)
        initcontainer.write_report(opts, json.loads(reports.dump(report)))
    return slow


KEY = f"{resources.PLURAL}.{resources.GROUP}"


def _pfrs(c: cluster_.SimCluster) -> list[dict[str, Any]]:
    return [o for o in c.srv.store.iter_objects(KEY)
            if o["metadata"].get("namespace") == NS and o["spec"].get("workloadName") == JOB]


def _last_pfrs(c: cluster_.SimCluster, since: int) -> list[dict[str, Any]]:
    """The job's PreflightReports as each last was after resourceVersion `since`, deleted ones included."""
    watcher = c.srv.store.watch(KEY, tables.Filter(namespace=NS), since)
    last: dict[str, dict[str, Any]] = {}
    try:
        for change in watcher.initial:
            obj = change.new.obj()
            last[obj["metadata"]["name"]] = obj
    finally:
        watcher.close()
    return [o for o in last.values() if o["metadata"].get("namespace") == NS and o["spec"].get("workloadName") == JOB]


async def play(run: playing.Run) -> None:
    c = run.cluster
    REPORT_DIR.mkdir(parents=True, exist_ok=True)
    try:
        await _play(run, c)
    finally:
        shutil.rmtree(REPORT_DIR, ignore_errors=True)


async def _play(run: playing.Run, c: cluster_.SimCluster) -> None:
    since = c.srv.store.resource_version
    # as many GPUs a pod as the cluster's own jobs ask: the simulated scheduler counts them, and with the
    # slow node cordoned the restarted ranks must fit on the other nodes beside those jobs' pods
    c.srv.store.create("pytorchjobs.kubeflow.org", job_manifest(gpus=c.size.gpus_per_pod))
    await c.until(lambda: len(c.running_pods(JOB)) == NODES, playing.WAIT,
                  f"PyTorchJob {NS}/{JOB}: {NODES} pods past their preflight init container")
    pods = c.running_pods(JOB)
    old = c.pod_uids(JOB)
    placed = sorted({str(p["spec"]["nodeName"]) for p in pods})
    run.check(f"the {NODES} ranks run on {NODES} different nodes", len(placed) == NODES, ", ".join(placed))
    slow = str(sorted(pods, key=rank_of)[SLOW_RANK]["spec"]["nodeName"])
    f = run.fault("preflight-slow-node", f"Node {slow}",
                  f"every pair with {slow} runs at NVLink-disabled speed (19.98 GB/s against 370.70 GB/s at 8 GiB)")
    write_reports(REPORT_DIR, NS, JOB, pods, slow_rank=SLOW_RANK)
    await c.until(lambda: len(_pfrs(c)) == NODES, playing.WAIT, f"{NODES} PreflightReports from the agents")
    run.note("agent", f"{NODES} PreflightReports created for PyTorchJob {NS}/{JOB}")
    await run.detected(f, lambda e: e.reason == judge.SLOW and e.target.name == slow,
                       f"the preflight detector to find {slow} slow")
    await run.acted(f, lambda e: e.reason == playing.CORDONED and e.name == slow,
                    f"a {playing.CORDONED} Event for {slow}")
    await run.acted(f, lambda e: e.reason == playing.RESTARTED and e.name == JOB,
                    f"a {playing.RESTARTED} Event for PyTorchJob {NS}/{JOB}")
    await run.recovered(f, JOB, old)
    await asyncio.sleep(playing.SETTLE)

    spec = c.srv.store.get("nodes", "", slow)["spec"]
    run.check(f"Node {slow} is cordoned (spec.unschedulable)", spec.get("unschedulable") is True)
    taints = [t.get("key") for t in spec.get("taints") or []]
    run.check(f"Node {slow} carries the kcover.io/unhealthy taint", "kcover.io/unhealthy" in taints, str(taints))
    cordoned = [n for n in c.nodes if c.srv.store.get("nodes", "", n)["spec"].get("unschedulable")]
    run.check("only that node was cordoned", cordoned == [slow], ", ".join(cordoned))
    restarts = len(run.api_events(playing.RESTARTED, JOB))
    run.check(f"PyTorchJob {NS}/{JOB} restarted exactly once ({restarts})", restarts == 1)
    stuck = [p["metadata"]["name"] for p in c.job_pods(JOB) if p["spec"].get("nodeName") == slow]
    run.check(f"PyTorchJob {NS}/{JOB} came back on the other nodes", not stuck, ", ".join(stuck))
    last = _last_pfrs(c, since)
    statuses = [o.get("status") or {} for o in last]
    run.check("every PreflightReport shows the verdict Degraded with the slow node",
              len(statuses) == NODES and all(s.get("verdict") == "Degraded" and s.get("slowNodes") == [slow]
                                             for s in statuses), str([s.get("verdict") for s in statuses]))
    mine = [o for o in last if o["spec"]["nodeName"] == slow]
    run.check(f"the report of {slow} says Slow, with 7 slow pairs",
              bool(mine) and (mine[0].get("status") or {}).get("nodeVerdict") == "Slow"
              and sum(1 for p in (mine[0].get("status") or {}).get("pairs", []) if p.get("slow")) == NODES - 1)
    run.note("pfr", "kubectl get pfr: " + "; ".join(
        f"{o['metadata']['name']} {o['spec']['nodeName']} {(o.get('status') or {}).get('nodeVerdict')} "
        f"{(o.get('status') or {}).get('minBusbwGbps')}" for o in sorted(last, key=lambda o: o["spec"]["rank"])))


SCENARIO = playing.Scenario(
    "preflight-slow-node",
    "an 8-node job's preflight (pairwise nccl-tests) finds one node at NVLink-disabled speed: kcover cordons it, "
    "restarts the job, which runs again on the other nodes",
    play, nodes=NODES, plugin="preflight", timeout=60.0,
    overrides={"detectors": {"entries": {"preflight": {"isolated": False, "config": {"sweep_seconds": 0.5,
                                                                  "collection_timeout_seconds": 30.0}}}},
               "recovery": {"rules": [RULE]}},
    agent_overrides={"detectors": {"entries": {"preflight-collector": {"isolated": False, "config": {
        "report_dir": str(REPORT_DIR), "retry_seconds": 0.2, "report_wait_seconds": 3.0}}}}})
