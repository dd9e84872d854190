"""The agent's GPU sight: when an agent is blind, and the condition a blind agent calls for (pure parts)."""

from __future__ import annotations

import asyncio

import prometheus_client
import pytest

from kcover import codec, model
from kcover.agent import reporting, sight
from kcover.detectors import supervising
from kcover.kube import gpus

S = supervising.Status
RUNNING = S("running", "", settled=True)
YOUNG = S("running", "", settled=False)
NO_NVML = S("unavailable", "NVML unavailable on this node: NVML library unavailable: libnvidia-ml.so.1: cannot "
            "open shared object file", settled=False)
NO_DCGMI = S("unavailable", "dcgmi not found: [Errno 2] No such file or directory: 'dcgmi'", settled=False)
MISMATCH = S("failed", "NvmlError: Driver/library version mismatch (NVML return 18)", settled=False)
GPU = ("nvml", "dcgm")


@pytest.mark.parametrize(("gpu_node", "statuses", "seeing"), [
    (True, {"nvml": RUNNING, "dcgm": NO_DCGMI}, sight.Seeing.SEES),
    (True, {"nvml": NO_NVML, "dcgm": RUNNING}, sight.Seeing.SEES),
    (True, {"nvml": NO_NVML, "dcgm": NO_DCGMI}, sight.Seeing.BLIND),
    (True, {"nvml": NO_NVML}, sight.Seeing.BLIND),  # dcgm disabled
    (True, {"nvml": MISMATCH, "dcgm": NO_DCGMI}, sight.Seeing.BLIND),  # a broken driver rollout: NVML fails
    (True, {"nvml": S("stopped", "", settled=False)}, sight.Seeing.BLIND),
    (True, {}, sight.Seeing.BLIND),
    (True, {"nvml": YOUNG, "dcgm": NO_DCGMI}, sight.Seeing.SETTLING),  # not settled: no judgement yet
    (True, {"nvml": S("starting", "", settled=False), "dcgm": NO_DCGMI}, sight.Seeing.SETTLING),
    (True, {"nvml": NO_NVML, "dcgm": NO_DCGMI, "logscan": RUNNING}, sight.Seeing.BLIND),  # not a GPU detector
    (False, {"nvml": NO_NVML, "dcgm": NO_DCGMI}, sight.Seeing.NOT_A_GPU_NODE),
])
def test_judge(gpu_node: bool, statuses: dict[str, supervising.Status], seeing: sight.Seeing) -> None:
    assert sight.judge(gpu_node=gpu_node, statuses=statuses, gpu_detectors=GPU).seeing is seeing


def test_a_blind_agent_names_what_each_gpu_detector_lacks() -> None:
    found = sight.judge(gpu_node=True, statuses={"nvml": NO_NVML, "dcgm": NO_DCGMI}, gpu_detectors=GPU)
    assert found.missing == f"nvml: {NO_NVML.detail}; dcgm: {NO_DCGMI.detail}"
    failed = sight.judge(gpu_node=True, statuses={"nvml": MISMATCH}, gpu_detectors=GPU)
    assert failed.missing == f"nvml: failed ({MISMATCH.detail}); dcgm: not enabled on this agent"
    plugin = sight.judge(gpu_node=True, statuses={"nvml": NO_NVML, "metax": RUNNING}, gpu_detectors=("nvml", "metax"))
    assert plugin.seeing is sight.Seeing.SEES  # a plugin named in agent.gpu_detectors counts


def test_the_condition_a_blind_agent_calls_for() -> None:
    blind = sight.judge(gpu_node=True, statuses={"nvml": NO_NVML, "dcgm": NO_DCGMI}, gpu_detectors=GPU)
    cond = reporting.condition({}, 0.0, 300.0, blind)
    assert cond is not None
    assert (cond.status, cond.reason) == (codec.CONDITION_BLIND, "NoGPUDetector") == ("Unknown", "NoGPUDetector")
    assert cond.message.startswith("kcover agent cannot see this node's GPUs: no GPU detector runs (nvml: NVML ")
    assert "dcgm: dcgmi not found" in cond.message
    # no signal either way for the controller
    assert codec.condition_recommendation(codec.AGENT_CONDITION_TYPE, cond.status) is None
    seeing = reporting.condition({}, 0.0, 300.0, sight.Sight(sight.Seeing.SEES))
    not_gpu = reporting.condition({}, 0.0, 300.0, sight.Sight(sight.Seeing.NOT_A_GPU_NODE))
    assert seeing is not None
    assert not_gpu is not None
    assert (seeing.status, not_gpu.status) == ("True", "True")
    assert reporting.condition({}, 0.0, 300.0, sight.Sight(sight.Seeing.SETTLING)) is None


def test_a_fault_outranks_blindness_and_settling() -> None:
    faults: dict[str, reporting.Fault] = {}
    xid = model.CollectorEvent(detector="script", target=model.Target(kind=model.TargetKind.NODE, name="n", node="n"),
                               severity=model.Severity.ERROR, reason="IBPortDown", message="port down",
                               recommended=model.Action.CORDON_NODE, fault=model.Fault(check="ib"))
    reporting.apply(faults, xid, now=1.0)
    blind = sight.judge(gpu_node=True, statuses={}, gpu_detectors=GPU)
    for seen in (blind, sight.Sight(sight.Seeing.SETTLING)):
        cond = reporting.condition(dict(faults), 2.0, 300.0, seen)
        assert cond is not None
        assert (cond.status, cond.reason) == ("False", "IBPortDown")


def _node(capacity: dict[str, str], labels: object = None) -> sight.NodeRead | None:
    meta: dict[str, object] = {"name": "n1"}
    if labels is not None:
        meta["labels"] = labels
    return sight.node_read({"metadata": meta, "status": {"capacity": capacity}})


def _gpu_sight(statuses: dict[str, supervising.Status], registry: prometheus_client.CollectorRegistry,
               recheck: float = 60.0, labels: dict[str, str] | None = None) -> sight.GpuSight:
    gauge = prometheus_client.Gauge("kcover_agent_blind", "test", ["node"], registry=registry)
    return sight.GpuSight("n1", rule=gpus.DEFAULT, gpu_detectors=GPU, statuses=lambda: statuses, gauge=gauge,
                          recheck_seconds=recheck, gpu_node_labels=labels)


def test_a_node_labelled_as_having_gpus_but_without_their_capacity_is_a_gpu_node_the_agent_is_blind_on() -> None:
    """Seen on a real kubelet: a node labelled `nvidia.com/gpu.present=true` (so the chart's agent ran there)
    whose GPUs were never published (no driver, no device plugin), NVML and `dcgmi` missing: the agent wrote
    `KcoverGPUHealthy=True`, "sees no GPU fault". With the label it counts as a GPU node, and is blind."""
    statuses = {"nvml": NO_NVML, "dcgm": NO_DCGMI}
    present = {"nvidia.com/gpu.present": "true"}
    seen = _gpu_sight(statuses, prometheus_client.CollectorRegistry(), labels=present)
    seen.learn(_node({"cpu": "64"}, {"nvidia.com/gpu.present": "true", "kubernetes.io/os": "linux"}))
    assert seen.current().seeing is sight.Seeing.BLIND
    cond = reporting.condition({}, 0.0, 300.0, seen.current())
    assert cond is not None
    assert (cond.status, cond.reason) == ("Unknown", sight.BLIND_REASON)
    # what does not make a GPU node: another value, no labels, labels of the wrong shape, no label configured
    for labels in ({"nvidia.com/gpu.present": "false"}, None, ["nvidia.com/gpu.present"], {"nvidia.com/gpu.present": True}):
        other = _gpu_sight(statuses, prometheus_client.CollectorRegistry(), labels=present)
        other.learn(_node({"cpu": "64"}, labels))
        assert other.current().seeing is sight.Seeing.NOT_A_GPU_NODE, labels
    capacity_alone = _gpu_sight(statuses, prometheus_client.CollectorRegistry(), labels={})
    capacity_alone.learn(_node({"cpu": "64"}, present))
    assert capacity_alone.current().seeing is sight.Seeing.NOT_A_GPU_NODE


def test_the_gauge_follows_the_sight_and_a_gpu_node_stays_one() -> None:
    registry = prometheus_client.CollectorRegistry()
    statuses = {"nvml": NO_NVML, "dcgm": NO_DCGMI}
    seen = _gpu_sight(statuses, registry)

    def gauge() -> float | None:
        return registry.get_sample_value("kcover_agent_blind", {"node": "n1"})

    assert gauge() == 0
    assert seen.current().seeing is sight.Seeing.SETTLING  # the Node not read yet
    assert seen.degraded() == ""
    seen.learn(_node({"cpu": "64", "nvidia.com/gpu": "0"}))
    assert seen.current().seeing is sight.Seeing.NOT_A_GPU_NODE
    assert gauge() == 0
    seen.learn(_node({"nvidia.com/gpu": "8"}))
    assert seen.current().seeing is sight.Seeing.BLIND
    assert gauge() == 1
    assert seen.degraded().startswith("kcover agent cannot see this node's GPUs")
    seen.learn(_node({"nvidia.com/gpu": "0"}))  # the device plugin lost the driver: still a GPU node
    assert seen.current().seeing is sight.Seeing.BLIND
    statuses["nvml"] = RUNNING
    assert seen.current().seeing is sight.Seeing.SEES
    assert gauge() == 0
    assert seen.degraded() == ""


@pytest.mark.looptime
async def test_the_node_is_read_again_only_while_it_is_not_a_gpu_node() -> None:
    seen = _gpu_sight({"nvml": NO_NVML}, prometheus_client.CollectorRegistry(), recheck=60.0)
    seen.learn(None)  # the first read failed: not (yet) a GPU node
    reads: list[float] = []
    capacities = [{"cpu": "64"}, {"nvidia.com/gpu": "8"}, {"nvidia.com/gpu": "8"}]

    async def read() -> sight.NodeRead | None:
        reads.append(asyncio.get_running_loop().time())
        return _node(capacities[len(reads) - 1])

    stop = asyncio.Event()
    start = asyncio.get_running_loop().time()
    task = asyncio.create_task(seen.run(read, stop))
    await asyncio.sleep(600)
    assert task.done()  # a GPU node: no more reads
    assert [round(t - start) for t in reads] == [60, 120]
    assert seen.current().seeing is sight.Seeing.BLIND
