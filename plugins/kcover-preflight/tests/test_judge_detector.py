"""The `preflight` detector on the simulated API server: a workload with ranks that never report.

The reports are created through the API as the agents create them; the cluster cache holds the job and
its pods (built offline from what the server stores). After the collection timeout the detector must
publish `PreflightIncomplete` naming the silent ranks, set `kcover_preflight_missing_ranks`, publish the
silent ranks' nodes when asked to suspect them, and write the verdict `Incomplete` into the reports."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from kcover_preflight import config as config_
from kcover_preflight import judge, reports, resources, scenario, synthetic

from kcover import bus as bus_
from kcover import errors, metrics, model
from kcover.detectors import contract
from kcover.kube import caching
from kcover.kube import client as client_
from kcover.sim import behaviour
from kcover.sim import server as simserver

FIXTURES = Path(__file__).parent / "fixtures"
NS = "ml"


async def seed(srv: simserver.SimServer) -> tuple[caching.ClusterCache, list[dict[str, Any]]]:
    store = srv.store
    store.create("namespaces", {"metadata": {"name": NS}})
    job = store.create("pytorchjobs.kubeflow.org", {**scenario.job_manifest(workers=3)})
    pods = []
    for i, pod in enumerate(sorted(behaviour.job_pods(job, "pytorchjobs.kubeflow.org"), key=scenario.rank_of)):
        pod["spec"]["nodeName"] = f"node-{i}"
        pods.append(store.create("pods", {**pod, "status": {"phase": "Running"}}))
    cache = caching.ClusterCache.offline([job, *pods], workload_kinds=[
        k for k in caching.WORKLOAD_KINDS if k.kind == "PyTorchJob"])
    return cache, pods


async def create_reports(kube: client_.KubeClient, pods: list[dict[str, Any]], ranks: list[int]) -> None:
    nodes = [p["spec"]["nodeName"] for p in pods]
    made = synthetic.workload_reports(workload="pretrain", nodes=nodes, ips=[f"10.0.0.{i + 1}" for i in range(4)],
                                      healthy=(FIXTURES / "all_reduce_perf_a100_dgx_4gpu_nvswitch.txt").read_text(),
                                      degraded="")
    for rank in ranks:
        pod = pods[rank]
        body = resources.body(pod=resources.PodRef(NS, pod["metadata"]["name"], pod["metadata"]["uid"]),
                              workload="pretrain", workload_uid=pod["metadata"]["ownerReferences"][0]["uid"],
                              node=nodes[rank], report_text=reports.dump(made[rank]), report=made[rank],
                              observed_at=dt.datetime.now(dt.UTC))
        await kube.request("POST", resources.collection(NS), body=body)


@pytest.mark.parametrize("suspect", [False, True], ids=["report-only", "suspect-silent"])
async def test_silent_ranks_are_reported_after_the_collection_timeout(suspect: bool) -> None:
    async with simserver.SimServer() as srv, client_.from_configuration(srv.kube_configuration()) as kube:
        cache, pods = await seed(srv)
        await create_reports(kube, pods, ranks=[0, 2])
        mets = metrics.Metrics()
        context = contract.DetectorContext(role=contract.Role.CONTROLLER, metrics=mets, cluster=cache, gateway=kube)
        cfg = config_.JudgeConfig(collection_timeout_seconds=1.0, sweep_seconds=0.1, suspect_silent_nodes=suspect)
        detector = judge.PreflightJudge("preflight", cfg, context)
        bus = bus_.Bus()
        seen = bus.subscribe("test")
        stop = asyncio.Event()
        task = asyncio.create_task(detector.run(bus, stop), name="preflight")
        try:
            first = await asyncio.wait_for(seen.get_batch(), 10)
            await asyncio.sleep(0.3)
            events = [*first, *seen.get_nowait()]
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)
            await bus.close(drain_timeout_seconds=0.1)
        incomplete = [e for e in events if e.reason == judge.INCOMPLETE]
        assert len(incomplete) == 1
        event = incomplete[0]
        assert event.target == model.Target(kind=model.TargetKind.WORKLOAD, namespace=NS, name="pretrain",
                                            uid=pods[0]["metadata"]["ownerReferences"][0]["uid"],
                                            workload_kind="PyTorchJob")
        assert event.recommended is model.Action.REPORT
        assert event.message == "ranks 1, 3 of 4 never reported within 1s"
        silent = sorted(e.target.name for e in events if e.reason == judge.NO_REPORT)
        assert silent == (["node-1", "node-3"] if suspect else [])
        assert all(e.recommended is model.Action.CORDON_NODE for e in events if e.reason == judge.NO_REPORT)
        assert not [e for e in events if e.reason == judge.SLOW]
        for rank in ("1", "3"):
            assert mets.registry.get_sample_value("kcover_preflight_missing_ranks",
                                                  {"namespace": NS, "workload": "pretrain", "rank": rank}) == 1
        assert mets.registry.get_sample_value("kcover_preflight_verdicts_total", {"verdict": "Incomplete"}) == 1
        listed = await kube.request("GET", resources.collection(NS))
        statuses = [o["status"] for o in listed["items"]]
        assert [s["verdict"] for s in statuses] == ["Incomplete", "Incomplete"]
        assert all(s["missingRanks"] == [1, 3] for s in statuses)


async def test_the_collector_refuses_to_run_isolated_and_without_a_client() -> None:
    from kcover_preflight import collector

    context = contract.DetectorContext(role=contract.Role.AGENT, metrics=metrics.Metrics(), node_name="n")
    detector = collector.PreflightCollector("preflight-collector", config_.CollectorConfig(), context)
    with pytest.raises(errors.DetectorUnavailableError, match=r"context\.gateway"):
        await detector.run(bus_.Bus(), asyncio.Event())
    with pytest.raises(errors.DetectorUnavailableError, match="isolated to false"):
        await detector.run(object(), asyncio.Event())  # type: ignore[arg-type]


def test_report_json_round_trips() -> None:
    made = synthetic.workload_reports(workload="w", nodes=["a", "b"], ips=["1.1.1.1", "1.1.1.2"],
                                      healthy=(FIXTURES / "all_reduce_perf_a40_2gpu_nvlink_pair.txt").read_text(),
                                      degraded="", go_format=True, world_size=2)
    text = reports.dump(made[0])
    assert "nccl_tests" not in json.loads(text)["batches"][0]
    assert reports.parse(text) == made[0]
