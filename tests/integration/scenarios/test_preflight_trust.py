"""Forged preflight reports cordon nothing and restart nothing, on every cluster backend.

A victim PyTorchJob (four GPU workers on four GPU nodes, opted in) runs a genuine, healthy preflight. A
tenant in another namespace forges every kind of report the trust model names, through the same path the
genuine ones take (report files its pods' init containers write, turned into PreflightReports by the real
agents) or by creating a PreflightReport directly:

* its own CPU-only job, sharing the victim's nodes, reports a failed GPU check (self-reported) and pairs
  that name the victim's other nodes, by name and by address, as failed;
* a report owned by the victim's pod (an ownerReference across namespaces), claiming a failed GPU check;
* a bare pod labelled with the victim job's name, and a report file for it in its own folder;
* a report file in the victim's folder that is a symbolic link to the tenant's (on a real cluster the
  chart's admission policy keeps the tenant from writing there at all: tests/chart/test_apiserver.py).

The real controller judges everything. Then no node is cordoned or tainted, no pod is deleted, no
KcoverCordonedNode or KcoverRestartedWorkload Event exists, both jobs' verdicts are Healthy, and each
refusal is counted by reason. The genuine slow node is still found by tests/integration/scenarios/
test_preflight.py, on the same path.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import secrets
from pathlib import Path
from typing import Any

import pytest
from test_preflight import _install_crd, _kcover, _node, _until

from kcover import errors

preflight = pytest.importorskip("kcover_preflight.scenario")
resources = pytest.importorskip("kcover_preflight.resources")
reports = pytest.importorskip("kcover_preflight.reports")
initcontainer = pytest.importorskip("kcover_preflight.initcontainer")
synthetic = pytest.importorskip("kcover_preflight.synthetic")

Cluster = Any
Obj = dict[str, Any]
SETTLE = 1.5
JOB_LABEL = "training.kubeflow.org/job-name"
ACTIONS = ("KcoverCordonedNode", "KcoverRestartedWorkload")


async def _job_pods(cluster: Cluster, ns: str, job: str) -> list[Obj]:
    listed = await cluster.client.request("GET", f"/api/v1/namespaces/{ns}/pods",
                                          query={"labelSelector": f"{JOB_LABEL}={job}"})
    return sorted(listed.get("items") or [], key=preflight.rank_of)


async def _start_job(cluster: Cluster, ns: str, name: str, nodes: list[str], *, gpus: bool) -> list[Obj]:
    manifest = preflight.job_manifest(name, workers=len(nodes) - 1)
    manifest["metadata"]["namespace"] = ns
    if not gpus:
        for replica in manifest["spec"]["pytorchReplicaSpecs"].values():
            for c in replica["template"]["spec"]["containers"]:
                c.pop("resources", None)
    await cluster.client.request("POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", body=manifest)
    await cluster.harness.reconcile_jobs(ns)
    pods = await _job_pods(cluster, ns, name)
    for pod, node in zip(pods, nodes, strict=True):
        await cluster.harness.run_pod(ns, pod["metadata"]["name"], node)
    return await _job_pods(cluster, ns, name)


def _write(root: Path, ns: str, workload: str, report: Any, *, index: int) -> Path:
    opts = initcontainer.Options(namespace=ns, workload=workload, index=index, rank=report.rank, peers=[],
                                 node_name=report.node_name, node_ip=report.node_ip, report_dir=root)
    return Path(initcontainer.write_report(opts, json.loads(reports.dump(report))))


async def _pfrs(cluster: Cluster, ns: str) -> list[Obj]:
    return list((await cluster.client.request("GET", resources.collection(ns))).get("items") or [])


async def test_forged_preflight_reports_cordon_nothing_and_restart_nothing(cluster: Cluster, tmp_path: Path) -> None:
    victim_ns = cluster.namespace
    tenant_ns = await cluster.create_namespace(f"pf-tenant-{secrets.token_hex(3)}")
    await _install_crd(cluster)
    tag = secrets.token_hex(3)
    nodes = [f"pft-{tag}-{i}" for i in range(4)]
    ips = [f"10.7.0.{i + 1}" for i in range(4)]
    for node, ip in zip(nodes, ips, strict=True):
        await _node(cluster.client, node, ip)
    victim = await _start_job(cluster, victim_ns, "victim", nodes, gpus=True)
    tenant = await _start_job(cluster, tenant_ns, "tenant-job", nodes[1:3], gpus=False)
    bare = await cluster.client.request("POST", f"/api/v1/namespaces/{tenant_ns}/pods", body={
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "victim-lookalike", "labels": {
            JOB_LABEL: "victim", "kcover.io/preflight": "true"}},
        "spec": {"nodeName": nodes[3], "initContainers": [{"name": "preflight", "image": "x"}],
                 "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}})
    await cluster.harness.run_pod(tenant_ns, bare["metadata"]["name"])
    before = {p["metadata"]["uid"] for p in victim + tenant}

    root = tmp_path / "preflight"
    healthy = preflight.simdata("all_reduce_perf_h100_dgx_4gpu_nvswitch.txt")
    degraded = preflight.simdata("all_reduce_perf_h100_dgx_4gpu_p2p_disabled_degraded.txt")
    for report in synthetic.workload_reports(workload="victim", nodes=nodes, ips=ips, healthy=healthy,
                                             degraded=degraded):
        _write(root, victim_ns, "victim", report, index=report.rank)  # the genuine, healthy preflight
    own = synthetic.workload_reports(workload="tenant-job", nodes=nodes[1:3], ips=ips[1:3], healthy=healthy,
                                     degraded=degraded)
    _write(root, tenant_ns, "tenant-job", own[0].model_copy(update={"gpu_check": reports.Check.FAIL}), index=0)
    framing = [reports.Batch(batch_idx=10 + i, pair=[ips[2], victim_end], self_ip=ips[2],
                             status=reports.BatchStatus.FAIL, error="forged")
               for i, victim_end in enumerate((nodes[0], ips[0], nodes[3], ips[3], "some-other-node"))]
    _write(root, tenant_ns, "tenant-job", own[1].model_copy(update={"batches": [*own[1].batches, *framing]}), index=1)
    lookalike = synthetic.workload_reports(workload="victim", nodes=[nodes[3], nodes[0]], ips=[ips[3], ips[0]],
                                           healthy=healthy, degraded=degraded)[0]
    _write(root, tenant_ns, "victim", lookalike.model_copy(update={"gpu_check": reports.Check.FAIL}), index=0)
    link = _write(root, tenant_ns, "forged", lookalike.model_copy(update={
        "node_name": nodes[0], "workload": "victim", "gpu_check": reports.Check.FAIL}), index=9)
    os.symlink(link, root / victim_ns / "victim-9.json")

    victim_pod = victim[0]["metadata"]
    cross = resources.body(pod=resources.PodRef(tenant_ns, victim_pod["name"], victim_pod["uid"]), workload="victim",
                           workload_uid=victim_pod["ownerReferences"][0]["uid"], node=nodes[0],
                           report_text=reports.dump(lookalike), report=lookalike.model_copy(update={"rank": 7}),
                           observed_at=dt.datetime.now(dt.UTC))
    cross["spec"]["report"] = reports.dump(lookalike.model_copy(update={
        "rank": 7, "node_name": nodes[0], "gpu_check": reports.Check.FAIL}))

    try:
        async with cluster.harness.playing(), _kcover(cluster, nodes, root, tmp_path) as controller:
            await cluster.client.request("POST", resources.collection(tenant_ns), body=cross)

            async def refused(reason: str) -> float:
                sample = controller.metrics.registry.get_sample_value(
                    "kcover_preflight_reports_refused_total", {"reason": reason})
                return sample or 0.0

            async def settled() -> bool:  # 4 victim and 2 tenant-job reports judged, 2 forged ones refused
                mine = await _pfrs(cluster, victim_ns)
                theirs = await _pfrs(cluster, tenant_ns)
                verdicts = [(o.get("status") or {}).get("verdict") for o in mine + theirs]
                return (len(mine) == 4 and len(theirs) == 4 and verdicts.count("Healthy") == 6
                        and await refused("owner_in_another_namespace") >= 1
                        and await refused("owner_not_in_a_workload") >= 1)
            await _until(settled, "every report judged or refused")
            await asyncio.sleep(SETTLE)  # room for a wrongful action to show

            for node in nodes:
                spec = (await cluster.client.request("GET", f"/api/v1/nodes/{node}"))["spec"]
                assert not spec.get("unschedulable"), node
                assert not [t for t in spec.get("taints") or [] if t.get("key") == "kcover.io/unhealthy"], node
            after = {p["metadata"]["uid"] for p in await _job_pods(cluster, victim_ns, "victim")
                     + await _job_pods(cluster, tenant_ns, "tenant-job")
                     if not p["metadata"].get("deletionTimestamp")}
            assert after == before, "no pod was deleted"
            for ns in (victim_ns, tenant_ns):
                events = (await cluster.client.request("GET", f"/api/v1/namespaces/{ns}/events")).get("items") or []
                assert not [e for e in events if e.get("reason") in ACTIONS], ns
            statuses = {o["metadata"]["name"]: o.get("status") or {} for o in await _pfrs(cluster, tenant_ns)}
            judged = [s for s in statuses.values() if s.get("verdict")]
            assert all(s["verdict"] == "Healthy" and not s.get("slowNodes") for s in judged), statuses
            names = {p["spec"]["nodeName"] for p in await _pfrs(cluster, victim_ns)}
            assert names == set(nodes), "the symbolic link in the victim's folder was not taken for a victim's rank"
    finally:
        for ns in (victim_ns, tenant_ns):
            with contextlib.suppress(errors.NotFoundError):
                await cluster.client.request("DELETE", resources.collection(ns))
