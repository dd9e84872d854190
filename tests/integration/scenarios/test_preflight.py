"""The `preflight-slow-node` scenario (kcover-preflight plugin) on every cluster backend.

Eight nodes, one PyTorchJob whose eight pods ran a `preflight` init container; their report files (the
pairwise results of real nccl-tests runs, every pair with one node at NVLink-disabled speed) lie in the
agents' report directory. Eight real agents (the `preflight-collector` detector) create the
PreflightReports, a real controller (the `preflight` detector, the recovery engine with a rule allowing
it) judges them, cordons and taints the slow node and restarts the job; the test plays the scheduler
and kubelet (the harness) and checks the job runs again on the other nodes. On the real kube-apiserver
the plugin's CRD is installed first, and `kubectl get pfr` shows the verdict through its printer columns.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import secrets
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kcover import errors, serving, settings
from kcover import metrics as metrics_
from kcover.agent import running as agent_running
from kcover.controller import running as controller_running
from kcover.kube import client as client_

preflight = pytest.importorskip("kcover_preflight.scenario")
resources = pytest.importorskip("kcover_preflight.resources")
judging = pytest.importorskip("kcover_preflight.judging")
reports = pytest.importorskip("kcover_preflight.reports")

Cluster = Any  # tests/backends.py's Cluster
T = TypeVar("T")
WAIT = 30.0
NODES = 8
SLOW_RANK = 3
JOB = "pretrain"


async def _until(probe: Callable[[], Awaitable[T | None]], what: str, within: float = WAIT) -> T:
    try:
        async with asyncio.timeout(within):
            while True:
                got = await probe()
                if got:
                    return got
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"timed out after {within:g} s waiting for {what}") from None


async def _install_crd(cluster: Cluster) -> None:
    """On a real API server: the plugin's CRD, established and served (the sim serves the kind built in)."""
    if cluster.sim is not None:
        return
    crd = resources.crd()
    with contextlib.suppress(errors.ConflictError):
        await cluster.client.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd)

    async def served() -> bool:
        try:
            await cluster.client.request("GET", resources.collection(cluster.namespace))
        except errors.NotFoundError:
            return False
        return True
    await _until(served, "the PreflightReport CRD to be served", within=60.0)


async def _node(kube: client_.KubeClient, name: str, address: str = "") -> None:
    await kube.request("POST", "/api/v1/nodes", body={
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}}})
    node = await kube.request("GET", f"/api/v1/nodes/{name}")
    resources_ = {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"}
    node["status"] = {"capacity": resources_, "allocatable": resources_,
                      "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                      "message": "kubelet is posting ready status"}]}
    if address:
        node["status"]["addresses"] = [{"type": "InternalIP", "address": address}]
    await kube.request("PUT", f"/api/v1/nodes/{name}/status", body=node)


async def _pods(cluster: Cluster) -> list[dict[str, Any]]:
    listed = await cluster.client.request("GET", f"/api/v1/namespaces/{cluster.namespace}/pods",
                                          query={"labelSelector": f"training.kubeflow.org/job-name={JOB}"})
    return [p for p in listed.get("items") or [] if not p["metadata"].get("deletionTimestamp")]


async def _pfrs(cluster: Cluster) -> list[dict[str, Any]]:
    listed = await cluster.client.request("GET", resources.collection(cluster.namespace))
    return sorted(listed.get("items") or [], key=lambda o: int(o["spec"]["rank"]))


def _agent_settings(node: str, report_dir: Path) -> settings.Settings:
    return settings.Settings.model_validate({
        "agent": {"node_name": node, "min_write_interval_seconds": 0.1,
                  "pod_resources_socket": "/nonexistent/kcover-test/kubelet.sock"},
        "bus": {"drain_timeout_seconds": 0.5},
        "detectors": {"entries": {"nvml": {"enabled": False}, "dcgm": {"enabled": False},
                                  "preflight-collector": {"isolated": False, "config": {
                                      "report_dir": str(report_dir), "retry_seconds": 0.2,
                                      "report_wait_seconds": 5.0}}}}})


def _controller_settings(cluster: Cluster, tmp_path: Path) -> settings.Settings:
    ns = cluster.namespace
    return settings.Settings.model_validate({
        "recovery": {"ledger_namespace": ns, "max_cordoned_fraction": 1.0, "namespaces_deny": [],
                     "save_logs": {"enabled": False}, "rules": [preflight.RULE]},
        "lease": {"namespace": ns, "identity": "preflight-a", "lease_duration_seconds": 2.0,
                  "renew_deadline_seconds": 1.5, "retry_period_seconds": 0.2},
        "kube": {"workload_kinds": ["pytorchjobs.kubeflow.org"], "gc_freeze_after_sync": False},
        "bus": {"drain_timeout_seconds": 0.5},
        "detectors": {"entries": {"nvml": {"enabled": False}, "dcgm": {"enabled": False},
                                  "preflight": {"isolated": False, "config": {"sweep_seconds": 0.5,
                                                                              "collection_timeout_seconds": 60.0}}}},
    })


@contextlib.asynccontextmanager
async def _kcover(cluster: Cluster, nodes: list[str], report_dir: Path,
                  tmp_path: Path) -> AsyncIterator[controller_running.Controller]:
    """An agent per node and one controller, running until the block ends (a crash fails the test)."""
    stops: list[asyncio.Event] = []
    tasks: list[asyncio.Task[None]] = []
    clients: list[client_.KubeClient] = []
    try:
        for node in nodes:
            kube = cluster.new_client()
            clients.append(kube)
            agent = agent_running.Agent(_agent_settings(node, report_dir), client=kube, metrics=metrics_.Metrics(),
                                        health=None, node=node, reporter_tick_seconds=0.1)
            stops.append(asyncio.Event())
            tasks.append(asyncio.create_task(agent.run(stops[-1]), name=f"agent:{node}"))
        kube = cluster.new_client()
        clients.append(kube)
        controller = controller_running.Controller(_controller_settings(cluster, tmp_path), client=kube,
                                                   metrics=metrics_.Metrics(), health=serving.Health())
        stops.append(asyncio.Event())
        tasks.append(asyncio.create_task(controller.run(stops[-1]), name="controller"))

        async def ready() -> bool:
            states = controller.supervisor.health()
            return controller.is_leader() and controller.cache.synced and states.get("preflight") == "running"
        await _until(ready, "the controller to lead with its preflight detector running")
        yield controller
    finally:
        for stop in stops:
            stop.set()
        if tasks:
            await asyncio.wait(tasks, timeout=10.0)
        for kube in clients:
            await kube.close()
        for task in tasks:
            task.result()


async def test_preflight_slow_node_is_cordoned_and_the_job_runs_elsewhere(cluster: Cluster, tmp_path: Path) -> None:
    ns = cluster.namespace
    await _install_crd(cluster)
    tag = secrets.token_hex(3)
    nodes = [f"pf-{tag}-{i}" for i in range(NODES)]
    for node in nodes:
        await _node(cluster.client, node)
    manifest = preflight.job_manifest()
    manifest["metadata"]["namespace"] = ns
    job = await cluster.client.request("POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", body=manifest)
    await cluster.harness.reconcile_jobs()
    pods = sorted(await _pods(cluster), key=preflight.rank_of)
    assert len(pods) == NODES
    for pod, node in zip(pods, nodes, strict=True):  # rank r on node r, its preflight init container done
        await cluster.harness.run_pod(ns, pod["metadata"]["name"], node)
    pods = sorted(await _pods(cluster), key=preflight.rank_of)
    assert all(p["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0 for p in pods)
    old = {p["metadata"]["uid"] for p in pods}
    report_dir = tmp_path / "preflight"
    slow = preflight.write_reports(report_dir, ns, JOB, pods, slow_rank=SLOW_RANK)
    assert slow == nodes[SLOW_RANK]

    try:
        async with cluster.harness.playing(), _kcover(cluster, nodes, report_dir, tmp_path):
            async def created() -> list[dict[str, Any]]:
                found = await _pfrs(cluster)
                return found if len(found) == NODES else []
            pfrs = await _until(created, f"{NODES} PreflightReports from the agents")
            assert [p["spec"]["nodeName"] for p in pfrs] == nodes
            assert all(p["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
                       for p, pod in zip(pfrs, pods, strict=True))

            async def cordoned() -> bool:
                node = await cluster.client.request("GET", f"/api/v1/nodes/{slow}")
                taints = [t["key"] for t in node["spec"].get("taints") or []]
                return bool(node["spec"].get("unschedulable")) and "kcover.io/unhealthy" in taints
            await _until(cordoned, f"Node {slow} cordoned and tainted")

            async def restarted() -> list[dict[str, Any]]:
                events = await cluster.client.request("GET", f"/api/v1/namespaces/{ns}/events")
                return [e for e in events.get("items") or [] if e.get("reason") == "KcoverRestartedWorkload"
                        and e["involvedObject"].get("uid") == job["metadata"]["uid"]]
            await _until(restarted, f"a KcoverRestartedWorkload Event for PyTorchJob {JOB}")

            # the scheduler's part: the recreated pods go to schedulable nodes only
            async def recreated() -> list[dict[str, Any]]:
                fresh = [p for p in await _pods(cluster) if p["metadata"]["uid"] not in old]
                return fresh if len(fresh) == NODES else []
            fresh = await _until(recreated, f"PyTorchJob {JOB} recreated by its operator")
            schedulable = []
            for node in nodes:
                obj = await cluster.client.request("GET", f"/api/v1/nodes/{node}")
                if not obj["spec"].get("unschedulable"):
                    schedulable.append(node)
            assert schedulable == [n for n in nodes if n != slow]
            for i, pod in enumerate(fresh):
                await cluster.harness.run_pod(ns, pod["metadata"]["name"], schedulable[i % len(schedulable)])
            running = await _pods(cluster)
            assert len(running) == NODES
            assert all(p["status"]["phase"] == "Running" and p["spec"]["nodeName"] != slow for p in running)

            async def judged() -> list[dict[str, Any]]:
                found = await _pfrs(cluster)
                return found if all((p.get("status") or {}).get("verdict") == "Degraded" for p in found) else []
            pfrs = await _until(judged, "every PreflightReport to show the verdict: "
                                + str([(p.get("status") or {}).get("verdict") for p in await _pfrs(cluster)]))
            for p in pfrs:
                status = p["status"]
                assert status["slowNodes"] == [slow]
                assert status["nodeVerdict"] == ("Slow" if p["spec"]["nodeName"] == slow else "Healthy")
                assert len(status["pairs"]) == NODES - 1
            mine = next(p for p in pfrs if p["spec"]["nodeName"] == slow)
            assert {pair["busbwGbps"] for pair in mine["status"]["pairs"]} == {19.98}
            assert all(pair["slow"] for pair in mine["status"]["pairs"])

            if cluster.controlplane is not None and shutil.which("kubectl"):
                shown = await asyncio.to_thread(
                    subprocess.run, ["kubectl", "--kubeconfig", cluster.kubeconfig_path, "get", "pfr", "-n", ns],
                    capture_output=True, text=True, timeout=30, check=False)
                assert shown.returncode == 0, shown.stderr
                header, *rows = shown.stdout.splitlines()
                assert header.split()[:7] == ["NAME", "WORKLOAD", "RANK", "NODE", "VERDICT", "NODE-VERDICT",
                                              "MIN-BUSBW"]
                assert len(rows) == NODES
                slow_row = next(r.split() for r in rows if slow in r.split())
                assert slow_row[4:7] == ["Degraded", "Slow", "19.98"]

            # the spec is immutable (a CEL rule on the real server)
            if cluster.controlplane is not None:
                with pytest.raises(errors.KubeError) as refused:
                    await cluster.client.request(
                        "PATCH", f"{resources.collection(ns)}/{mine['metadata']['name']}",
                        body={"spec": {"rank": 0}}, content_type=client_.MERGE_PATCH)
                assert refused.value.status == 422
                assert "immutable" in str(refused.value)
    finally:
        with contextlib.suppress(errors.NotFoundError):
            await cluster.client.request("DELETE", resources.collection(ns))
        started = time.monotonic()
        while time.monotonic() - started < 5 and cluster.controlplane is not None:
            if not await _pfrs(cluster):
                break
            await asyncio.sleep(0.1)


async def test_status_text_is_cut_to_the_crds_limits_which_count_characters(cluster: Cluster) -> None:
    """A slow node's reason comes from its report (untrusted text, any script). The status the judge writes
    keeps 1,024 characters of message and 512 of each pair's reason: the real kube-apiserver takes 1,024
    CJK characters (3,072 UTF-8 bytes), so a CRD's maxLength counts characters, and refuses one more, so
    the cut sits exactly at the limit."""
    if cluster.controlplane is None:
        pytest.skip("the simulated API server does not validate custom resources against their CRD schema")
    ns = cluster.namespace
    await _install_crd(cluster)
    why = "节点带宽过低" * 350  # 2,100 characters, 6,300 UTF-8 bytes
    judgement = judging.Judgement(verdict=judging.Verdict.DEGRADED, slow_nodes={"gpu-a": why},
                                  pairs=(judging.PairResult(0, ("gpu-a", "gpu-b"), None, None, None, True, why),))
    status = resources.status_for(judgement, "gpu-a", judged_at=dt.datetime.now(dt.UTC))
    pod = resources.PodRef(ns, "pretrain-worker-0", "uid-0")
    report = reports.Report.model_validate({"version": "1", "workload": JOB, "workload_size": 2, "rank": 0,
                                                      "node_name": "gpu-a", "batches": []})
    body = resources.body(pod=pod, workload=JOB, workload_uid="job-uid", node="gpu-a", report_text="{}",
                          report=report, observed_at=dt.datetime.now(dt.UTC))
    name = body["metadata"]["name"]
    await cluster.client.request("POST", resources.collection(ns), body=body)
    path = f"{resources.collection(ns)}/{name}/status"
    await cluster.client.request("PATCH", path, body={"status": status}, content_type=client_.MERGE_PATCH)
    got = (await cluster.client.request("GET", f"{resources.collection(ns)}/{name}"))["status"]
    assert got["message"] == why[:1024]
    assert len(got["message"].encode()) == 3 * 1024
    assert got["pairs"][0]["reason"] == why[:512]
    for field, text in (("message", why[:1025]), ("pairs", [{"batch": 0, "reason": why[:513]}])):
        with pytest.raises(errors.KubeError) as refused:
            await cluster.client.request("PATCH", path, body={"status": {field: text}}, content_type=client_.MERGE_PATCH)
        assert refused.value.status == 422
        assert "Too long" in str(refused.value)
