"""Device-level isolation under DRA: the policy's answer to a fault on one DRA device, as a table.

A fault that names a DRA device (`fault.dra`) taints that device and restarts only what holds it: the
pod the kubelet reported (dra-health), the pods the agent named (PodResources), or else the pods whose
`allocatedResourcesStatus` names the device. The node is never cordoned while device taints are
served; the node-level answer rides along as the taint's fallback. An application XID restarts the
holders and taints nothing; a cleared fault removes the taint and nothing else (a node kcover cordoned
stays so on a device's word); `device_taints.enabled: false` gives today's node-level answer.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from harness import objects as o

from kcover import kinds, model, settings
from kcover.kube import caching
from kcover.kube import projections as proj
from kcover.recovery import judging, ledger, ledgerentries, planinputs, planning
from kcover.recovery import steps as actions

NOW = dt.datetime(2025, 6, 1, 12, 0, 0, tzinfo=dt.UTC)
OPT = {proj.OPT_IN_LABEL: "true"}
KF = "kubeflow.org/v1"
DEV3 = model.DraDevice(driver="gpu.nvidia.com", pool="n1", device="gpu-3")


def _holding(pod: o.Obj, resource_id: str, health: str = "Healthy") -> o.Obj:
    pod["status"]["containerStatuses"] = [{"name": "c", "allocatedResourcesStatus": [
        {"name": "claim:gpu/gpu", "resources": [{"resourceID": resource_id, "health": health}]}]}]
    return pod


def world() -> caching.ClusterCache:
    """Two opted-in PyTorchJobs on node n1: `a` holds gpu-3, `b` holds gpu-5 (DRA)."""
    a = o.workload(KF, "PyTorchJob", "a", uid="a-uid", labels=OPT)
    b = o.workload(KF, "PyTorchJob", "b", uid="b-uid", labels=OPT)
    pods = [
        _holding(o.pod("a-worker-0", uid="a-0", node="n1", labels={kinds.KUBEFLOW_JOB_NAME: "a"}, owner=a),
                 DEV3.resource_id, "Unhealthy"),
        _holding(o.pod("b-worker-0", uid="b-0", node="n1", labels={kinds.KUBEFLOW_JOB_NAME: "b"}, owner=b),
                 "gpu.nvidia.com/n1/gpu-5"),
    ]
    nodes = [o.node(f"n{i}", uid=f"node-{i}") for i in range(1, 12)]
    return caching.ClusterCache.offline([a, b, *pods, *nodes])


def dra_health(uid: str = "a-0", *, cleared: bool = False) -> model.CollectorEvent:
    return model.CollectorEvent(
        detector="dra-health", severity=model.Severity.INFO if cleared else model.Severity.ERROR,
        reason="DeviceRecovered" if cleared else "DeviceUnhealthy", message="XID 79",
        target=model.Target(kind=model.TargetKind.POD, namespace="ml", name=uid, uid=uid, node="n1"),
        fault=model.Fault(dra=DEV3, container="c"), cleared=cleared, observed_at=NOW)


def agent(*, xid: int | None = 79, recommended: model.Action = model.Action.CORDON_NODE_AND_RESTART,
          pods: tuple[str, ...] = (), check: str = "") -> model.CollectorEvent:
    return model.CollectorEvent(
        detector="event-watcher", severity=model.Severity.ERROR, reason=f"XID{xid}" if xid else "GPULost",
        message="on GPU 3", target=model.Target(kind=model.TargetKind.DEVICE, name="n1", node="n1",
                                                device_id="GPU-3"),
        fault=model.Fault(xid=xid, gpu_index=3, gpu_uuid="GPU-3", dra=DEV3, pods=pods, check=check),
        recommended=recommended, observed_at=NOW)


def summary(planned: list[actions.Step]) -> list[str]:
    out: list[str] = []
    for a in planned:
        if isinstance(a, actions.TaintDevice):
            out.append(f"taint {a.device.resource_id}")
        elif isinstance(a, actions.UntaintDevice):
            out.append(f"untaint {a.device.resource_id}")
        elif isinstance(a, actions.Restart):
            out.append(f"restart {a.workload.name}")
        elif isinstance(a, actions.Cordon):  # `+sweep`: its pods seen, for the late arrivals after it
            out.append(f"cordon {a.node}" + (f" +sweep {len(a.swept)}" if a.swept is not None else ""))
        elif isinstance(a, actions.Uncordon):
            out.append(f"uncordon {a.node}")
        elif isinstance(a, actions.Refuse):
            out.append(f"skip {a.code.value}")
        elif isinstance(a, actions.Hold):
            out.append(f"hold {a.code.value} {a.restart.workload.name}")
        else:
            out.append(type(a).__name__.lower())
    return out


SERVED = planinputs.History()
UNSERVED = planinputs.History(device_taints_served=False)

ROWS: list[tuple[str, model.CollectorEvent, planinputs.History, dict[str, Any], list[str]]] = [
    ("kubelet reports the device Unhealthy: taint it, restart its pod's job, no cordon",
     dra_health(), SERVED, {}, ["taint gpu.nvidia.com/n1/gpu-3", "restart a"]),
    ("device healthy again: untaint", dra_health(cleared=True), SERVED, {}, ["untaint gpu.nvidia.com/n1/gpu-3"]),
    ("agent XID 79 naming the pods on the GPU: taint, restart those only",
     agent(pods=("ml/a-worker-0",)), SERVED, {}, ["taint gpu.nvidia.com/n1/gpu-3", "restart a"]),
    ("agent XID without pod names: holders from allocatedResourcesStatus",
     agent(), SERVED, {}, ["taint gpu.nvidia.com/n1/gpu-3", "restart a"]),
    ("cordon-only judgement: taint only",
     agent(xid=None, recommended=model.Action.CORDON_NODE, check="row_remap_failure"), SERVED, {},
     ["taint gpu.nvidia.com/n1/gpu-3"]),
    ("application XID 13: restart the holders, no taint",
     agent(xid=13, recommended=model.Action.RESTART_WORKLOAD, pods=("ml/a-worker-0",)), SERVED, {}, ["restart a"]),
    ("no DeviceTaintRules served: the node-level answer, cordon and sweep",
     agent(pods=("ml/a-worker-0",)), UNSERVED, {}, ["cordon n1 +sweep 2", "restart a", "restart b"]),
    ("no DeviceTaintRules served, the node's cordon in flight from an earlier plan: the holders wait for it too",
     agent(pods=("ml/a-worker-0",)), planinputs.History(device_taints_served=False, cordons_in_flight=frozenset({"n1"})),
     {}, ["skip AlreadyCordoned", "hold AwaitingCordon a", "hold AwaitingCordon b"]),
    ("no DeviceTaintRules served, holders from allocatedResourcesStatus, cordon in flight: held",
     agent(), planinputs.History(device_taints_served=False, cordons_in_flight=frozenset({"n1"})),
     {}, ["skip AlreadyCordoned", "hold AwaitingCordon a", "hold AwaitingCordon b"]),
    ("no DeviceTaintRules served, cordon-only: cordon", agent(xid=None, recommended=model.Action.CORDON_NODE),
     UNSERVED, {}, ["cordon n1"]),
    ("no DeviceTaintRules served, dra-health: restart only", dra_health(), UNSERVED, {}, ["restart a"]),
    ("device taints off: today's node-level answer",
     agent(pods=("ml/a-worker-0",)), SERVED, {"device_taints": {"enabled": False}}, ["cordon n1 +sweep 2", "restart a", "restart b"]),
    ("device taints off, dra-health: restart only", dra_health(), SERVED, {"device_taints": {"enabled": False}},
     ["restart a"]),
    ("device taints off, cleared: nothing", dra_health(cleared=True), SERVED, {"device_taints": {"enabled": False}}, []),
]


@pytest.mark.parametrize(("event", "history", "overrides", "expected"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_device_isolation(event: model.CollectorEvent, history: planinputs.History, overrides: dict[str, Any],
                          expected: list[str]) -> None:
    rs = settings.RecoverySettings(**overrides)
    assert summary(planning.plan(event, world(), history, rs, NOW)) == expected


def test_a_taint_leaves_the_breaker_alone() -> None:
    """The breaker counts cordons: a fault answered by a device taint plans none, even with the breaker at its limit."""
    planned = planning.plan(agent(xid=None, recommended=model.Action.CORDON_NODE), world(), SERVED,
                            settings.RecoverySettings(max_cordoned_fraction=0.0), NOW)
    assert summary(planned) == ["taint gpu.nvidia.com/n1/gpu-3"]


def _healthy_word(node: str) -> model.CollectorEvent:
    """The agent's device-healthy Event for gpu-3 as the event watcher publishes it (a Node target)."""
    return model.CollectorEvent(
        detector="event-watcher", severity=model.Severity.INFO, reason="RecoveryRequested", message="healthy",
        target=model.Target(kind=model.TargetKind.NODE, name=node, node=node),
        fault=model.Fault(gpu_uuid="GPU-3", dra=DEV3), cleared=True, observed_at=NOW)


@pytest.mark.parametrize(("overrides", "expected"), [
    ({}, ["untaint gpu.nvidia.com/n1/gpu-3"]),
    ({"device_taints": {"enabled": False}}, []),
])
def test_a_devices_return_undoes_only_the_devices_isolation(overrides: dict[str, Any], expected: list[str]) -> None:
    """A node kcover cordoned (for something else) stays cordoned when one of its devices is healthy again;
    the same cleared event naming no device un-cordons it, as before."""
    cordoned = o.node("n1", uid="node-1", unschedulable=True, annotations={proj.CORDONED_BY: "kcover"})
    cache = caching.ClusterCache.offline([cordoned])
    node = cache.node("n1")
    assert node is not None
    assert node.cordoned_by_kcover
    rs = settings.RecoverySettings(uncordon_enabled=True, **overrides)
    assert summary(planning.plan(_healthy_word("n1"), cache, SERVED, rs, NOW)) == expected
    no_device = _healthy_word("n1").model_copy(update={"fault": model.NO_FAULT})
    assert summary(planning.plan(no_device, cache, SERVED, rs, NOW)) == ["uncordon n1"]


class _EarlierRestartOnGpu3:
    """The ledger's read side (`judging.Evidence`) holding one earlier restart, for a fault on n1's gpu-3,
    of every unit asked about."""

    def __init__(self) -> None:
        self.keys: set[str] = set()

    def failures_at(self, node: str, since: float) -> list[ledger.Failure]:
        return [ledger.Failure(NOW.timestamp() - 600, key, DEV3.resource_id, "") for key in sorted(self.keys)]

    def unit(self, key: str) -> ledgerentries.Unit | None:
        return None

    def node(self, name: str) -> ledgerentries.Node | None:
        return None


@pytest.mark.parametrize(("event", "suspect"), [
    (agent(xid=79, pods=("ml/a-worker-0",)), False),
    (agent(xid=94, recommended=model.Action.RESTART_WORKLOAD, pods=("ml/a-worker-0",)), True),
    (agent(xid=13, recommended=model.Action.RESTART_WORKLOAD, pods=("ml/a-worker-0",)), True),
    (agent(xid=79, recommended=model.Action.RESTART_WORKLOAD, pods=("ml/a-worker-0",)), False),
], ids=["xid79-taints-and-is-no-evidence", "xid94-restart-only-is-evidence", "xid13-is-evidence",
        "xid79-reported-as-restart-only-is-still-no-evidence"])
def test_a_repeat_on_a_tainted_device_is_not_widened_to_a_validation_of_its_node(
        event: model.CollectorEvent, suspect: bool) -> None:
    """A second XID on gpu-3 by the same job: one that isolates the device (79, a DeviceTaintRule, the node
    left schedulable) asks no validation, which could cordon the node for a device already taken out; one
    that only restarts makes the node suspect (94, a hardware XID: `recovery.judgement.hardware_xid_restarts`,
    its first already; 13, an application's: `device_restarts`, this second). Which is which is kcover's XID
    catalog's word, not the report's recommendation."""
    rs = settings.RecoverySettings()
    steps = planning.plan(event, world(), SERVED, rs, NOW)
    restarts = [s for s in steps if isinstance(s, actions.Restart)]
    assert [s.workload.name for s in restarts] == ["a"]
    evidence = _EarlierRestartOnGpu3()
    evidence.keys = {s.unit_key for s in restarts}
    asked = judging.suspects(steps, world(), evidence, rs, NOW.timestamp())
    assert [type(s).__name__ for s in asked] == (["RequestValidation"] if suspect else [])
