"""Which PreflightReports count (`vetting`) and which report files the agent reads (`collector.find_report`).

The reports are the objects the agents create (`resources.body`, read back by `resources.read`), vetted
against the product's own cluster cache built offline from raw API objects: an opted-in PyTorchJob in
`ml` with four GPU workers on four GPU nodes, a CPU pod of the same job, a bare pod in `tenant` and a
pod of another namespace. Each forged report is refused for its reason; the genuine ones count for their
own pod's node and workload, and a stated `workload_size` never shrinks the workload.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pytest
from kcover_preflight import collector, reports, resources, scenario, synthetic, vetting

from kcover.kube import caching
from kcover.sim import behaviour

NS = "ml"
FIXTURES = Path(__file__).parent / "fixtures"
Obj = dict[str, Any]


def gpu_node(name: str, *, gpus: int = 8) -> Obj:
    capacity = {"nvidia.com/gpu": str(gpus), "cpu": "64"} if gpus else {"cpu": "64"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": f"uid-{name}"},
            "status": {"capacity": capacity, "addresses": [{"type": "InternalIP", "address": f"10.0.0.{name[-1]}"}]}}


def world() -> tuple[caching.ClusterCache, Obj, list[Obj], dict[str, Obj]]:
    job = {**scenario.job_manifest(workers=3), "kind": "PyTorchJob", "apiVersion": "kubeflow.org/v1"}
    job["metadata"] = {**job["metadata"], "namespace": NS, "uid": "job-uid"}
    pods = []
    for i, pod in enumerate(sorted(behaviour.job_pods(job, "pytorchjobs.kubeflow.org"), key=scenario.rank_of)):
        pod["metadata"]["uid"] = f"pod-{i}"
        pod["spec"]["nodeName"] = f"node-{i}"
        pod["status"] = {"phase": "Running", "initContainerStatuses": [
            {"name": "preflight", "state": {"terminated": {"exitCode": 0}}}]}
        pods.append(pod)
    cpu = {**pods[0], "metadata": {**pods[0]["metadata"], "name": "pretrain-cpu", "uid": "pod-cpu"},
           "spec": {**pods[0]["spec"], "nodeName": "node-2", "containers": [{"name": "c", "image": "x"}]}}
    bare = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "forger", "namespace": "tenant", "uid": "pod-bare",
                         "labels": {"training.kubeflow.org/job-name": "pretrain", "kcover.io/preflight": "true"}},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "x",
                                                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}}
    other = {**bare, "metadata": {**bare["metadata"], "name": "elsewhere", "namespace": "other", "uid": "pod-other"}}
    nodes = [gpu_node(f"node-{i}") for i in range(4)]
    cache = caching.ClusterCache.offline([job, *pods, cpu, bare, other, *nodes], workload_kinds=[
        k for k in caching.WORKLOAD_KINDS if k.kind == "PyTorchJob"])
    return cache, job, pods, {"cpu": cpu, "bare": bare, "other": other}


def stored(pod: Obj, *, rank: int, namespace: str = NS, node: str = "", workload: str = "pretrain",
           workload_uid: str = "job-uid", **report: Any) -> resources.Stored:
    made = synthetic.workload_reports(workload=workload, nodes=[f"node-{i}" for i in range(4)],
                                      ips=[f"10.0.0.{i}" for i in range(4)], healthy=(
                                          FIXTURES / "all_reduce_perf_a100_dgx_4gpu_nvswitch.txt").read_text(),
                                      degraded="")[rank]
    made = made.model_copy(update=report)
    body = resources.body(pod=resources.PodRef(namespace, pod["metadata"]["name"], pod["metadata"]["uid"]),
                          workload=workload, workload_uid=workload_uid, node=node or pod["spec"]["nodeName"],
                          report_text=reports.dump(made), report=made, observed_at=dt.datetime.now(dt.UTC))
    body["metadata"]["uid"] = f"pfr-{namespace}-{rank}-{pod['metadata']['uid']}"
    got = resources.read(body)
    assert got is not None
    return got


def test_genuine_reports_count_for_their_pods_node_and_workload() -> None:
    cache, _, pods, _ = world()
    for i, pod in enumerate(pods):
        got = vetting.vet(stored(pod, rank=i), cache)
        assert isinstance(got, vetting.Vetted), got
        assert (got.node, got.workload.uid, got.gpu_node) == (f"node-{i}", "job-uid", True)


@pytest.mark.parametrize(("case", "reason"), [
    ("owned by another namespace's pod", vetting.Refusal.OWNER_OTHER_NAMESPACE),
    ("for a node its pod does not run on", vetting.Refusal.NOT_OWNER_NODE),
    ("naming another node inside", vetting.Refusal.NOT_OWNER_NODE),
    ("from a bare pod with the job's label", vetting.Refusal.OWNER_NOT_A_WORKLOAD),
    ("naming another workload uid", vetting.Refusal.WORKLOAD_MISMATCH),
    ("naming another workload", vetting.Refusal.WORKLOAD_MISMATCH),
])
def test_forged_reports_are_refused(case: str, reason: vetting.Refusal) -> None:
    cache, _, pods, extra = world()
    forged = {
        "owned by another namespace's pod": lambda: stored(extra["other"], rank=1, namespace="tenant"),
        "for a node its pod does not run on": lambda: stored(pods[1], rank=1, node="node-3"),
        "naming another node inside": lambda: stored(pods[1], rank=1, node_name="node-3"),
        "from a bare pod with the job's label": lambda: stored(extra["bare"], rank=1, namespace="tenant",
                                                               workload_uid=""),
        "naming another workload uid": lambda: stored(pods[1], rank=1, workload_uid="some-other-job"),
        "naming another workload": lambda: stored(pods[1], rank=1, workload="victim"),
    }[case]()
    got = vetting.vet(forged, cache)
    assert isinstance(got, vetting.Refused), got
    assert got.reason is reason


def test_a_gpu_check_counts_only_from_a_pod_that_holds_gpus_on_a_gpu_node() -> None:
    cache, _, _, extra = world()
    got = vetting.vet(stored(extra["cpu"], rank=2, gpu_check=reports.Check.FAIL), cache)
    assert isinstance(got, vetting.Vetted)
    assert not got.gpu_node, "a pod without GPUs cannot have failed a GPU check"


def test_a_stated_workload_size_never_shrinks_the_workload() -> None:
    cache, _, pods, _ = world()
    alone = vetting.vet(stored(pods[0], rank=0, workload_size=1), cache)
    assert isinstance(alone, vetting.Vetted)
    # the job's five live pods (four GPU workers and the CPU one) all ran the preflight init container
    assert vetting.expected_size([alone], cache, init_container="preflight") == 5
    assert vetting.expected_size([alone], cache, init_container="other") == 1


# ----------------------------------------------------------------------------------------- report files

def _pod(namespace: str = NS) -> collector.PreflightPod:
    return collector.PreflightPod(uid="u", rv="1", namespace=namespace, name="pretrain-master-0", node="node-0",
                                  created=dt.datetime.fromtimestamp(0, dt.UTC), workload="pretrain",
                                  workload_uid="job-uid", finished=dt.datetime.now(dt.UTC), exit_code=0,
                                  deleting=False)


def _report_text(node: str = "node-0") -> str:
    made = synthetic.workload_reports(workload="pretrain", nodes=[node, "node-1"], ips=["10.0.0.0", "10.0.0.1"],
                                      healthy=(FIXTURES / "all_reduce_perf_a40_2gpu_nvlink_pair.txt").read_text(),
                                      degraded="", world_size=2)[0]
    return reports.dump(made)


def test_the_agent_reads_only_plain_files_of_the_pods_own_namespace_folder(tmp_path: Path) -> None:
    (tmp_path / NS).mkdir()
    (tmp_path / "tenant").mkdir()
    forged = tmp_path / "tenant" / "forged.json"
    forged.write_text(_report_text())
    find = lambda: collector.find_report(tmp_path, _pod(), "node-0", max_bytes=1 << 20, taken=set())  # noqa: E731

    os.symlink(forged, tmp_path / NS / "pretrain-0.json")  # a link out of the folder
    assert find() is None
    (tmp_path / NS / "pretrain-0.json").unlink()
    os.link(forged, tmp_path / NS / "pretrain-0.json")  # the same file under two names
    assert find() is None
    (tmp_path / NS / "pretrain-0.json").unlink()
    os.rmdir(tmp_path / NS)
    os.symlink(tmp_path / "tenant", tmp_path / NS)  # the whole folder a link to another namespace's
    forged.rename(tmp_path / "tenant" / "pretrain-0.json")
    assert find() is None
    (tmp_path / NS).unlink()
    (tmp_path / NS).mkdir()
    (tmp_path / NS / "pretrain-0.json").write_text(_report_text())
    found = find()
    assert found is not None
    assert found.path == tmp_path / NS / "pretrain-0.json"
    assert collector.find_report(tmp_path, _pod("tenant"), "node-0", max_bytes=1 << 20, taken=set()) is not None, \
        "a pod of `tenant` reads its own folder"
