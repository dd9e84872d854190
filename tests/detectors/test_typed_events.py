"""What the controller detectors publish, field by field: the typed fault, recommendation and cleared
flag (never meaning in `attributes`), the agent's Event decoded back by the event watcher, and the
node-condition detector clearing a fault only after the recovery hold."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import pytest

from kcover import bus as bus_
from kcover import codec, metrics, model
from kcover.agent import reporting
from kcover.aio import clock as clock_
from kcover.detectors import contract, dra_health, event_watcher, node_condition
from kcover.kube import indexing, projecting
from kcover.kube import projections as proj

T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


def _ts(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Nodes:
    """The one cache lookup the node-condition detector's tick makes."""

    by_name: dict[str, proj.Node] = field(default_factory=dict)

    def node(self, name: str) -> proj.Node | None:
        return self.by_name.get(name)


# ------------------------------------------------------------------------------------- DRA resourceID

@pytest.mark.parametrize(("resource_id", "expected"), [
    ("gpu.nvidia.com/pool-a/gpu-3", ("gpu.nvidia.com", "pool-a", "gpu-3")),
    ("gpu.nvidia.com/node-1/rack/a/gpu-3", ("gpu.nvidia.com", "node-1/rack/a", "gpu-3")),
    ("gpu.nvidia.com/gpu-3", None),
    ("nvidia.com/gpu", None),
    ("", None),
    ("a//b", None),
])
def test_dra_resource_id_parts(resource_id: str, expected: tuple[str, str, str] | None) -> None:
    device = dra_health.dra_device(resource_id)
    assert (None if device is None else (device.driver, device.pool, device.device)) == expected


# ------------------------------------------------------------------------------------- event watcher

def _kube_event(body: dict[str, Any]) -> proj.KubeEvent:
    body = dict(body, metadata=dict(body["metadata"], uid="ev-uid", name="gpu-1.kcover-abc"))
    projected = projecting.recovery_event(body)
    assert projected is not None
    return projected


class _WatcherRig:
    def __init__(self) -> None:
        self.metrics = metrics.Metrics()
        self.clock = clock_.FakeClock(T0)
        node = proj.Node("node-uid", "1", "gpu-1", False, (), (), (), ())
        self.cache = _Lookups(node)
        context = contract.DetectorContext(role=contract.Role.CONTROLLER, metrics=self.metrics, clock=self.clock,
                                           cluster=self.cache, namespace="kcover-system")
        self.detector = event_watcher.EventWatcherDetector("event-watcher", event_watcher.EventWatcherConfig(),
                                                           context)
        self.bus = bus_.Bus(dedupe_window_seconds=0)
        self.sub = self.bus.subscribe("test")
        self.detector._bus = self.bus

    def rejected(self) -> dict[str, float]:
        family = next(iter(self.metrics.events_rejected.collect()))
        # every reason starts at 0 (pre-initialised): the ones refused are those counted
        return {s.labels["reason"]: s.value for s in family.samples if s.name.endswith("_total") and s.value}


@dataclass
class _Lookups:
    the_node: proj.Node

    def node(self, name: str) -> proj.Node | None:
        return self.the_node if name == self.the_node.name else None

    def pod_by_name(self, namespace: str, name: str) -> proj.Pod | None:
        return None

    def pods_on_node(self, name: str) -> list[proj.Pod]:
        """The agent's own pod runs on the node."""
        labels = tuple(sorted(event_watcher.AGENT_POD_LABELS.items()))
        return [proj.Pod("agent-uid", "1", "kcover-system", "kcover-agent-x", name, "Running", labels, (), None, "",
                         "Always", ())]


def _agent_event(event: model.CollectorEvent) -> dict[str, Any]:
    return reporting.event_body(event, node="gpu-1", reporter="kcover.io/agent", when=T0)


XID79 = model.CollectorEvent(
    detector="nvml", target=model.Target(kind=model.TargetKind.DEVICE, node="gpu-1", name="gpu-1", device_id="GPU-3"),
    severity=model.Severity.ERROR, reason="XID79", message="XID 79 on GPU 3",
    fault=model.Fault(xid=79, gpu_index=3, gpu_uuid="GPU-3", pods=("ml/bert-0", "ml/bert-1")),
    recommended=model.Action.CORDON_NODE, occurrences=2, window_seconds=1800.0)


def test_agent_event_reaches_the_controller_with_its_typed_fields() -> None:
    rig = _WatcherRig()
    rig.detector._on_change(indexing.Kind.EVENT, None, _kube_event(_agent_event(XID79)))
    [got] = rig.sub.get_nowait()
    assert got.target == model.Target(kind=model.TargetKind.NODE, name="gpu-1", node="gpu-1")
    assert (got.fault, got.recommended, got.cleared) == (XID79.fault, model.Action.CORDON_NODE, False)
    assert (got.occurrences, got.window_seconds, got.severity) == (2, 1800.0, model.Severity.ERROR)
    assert got.attributes["source_detector"] == "nvml"
    assert rig.rejected() == {}


@pytest.mark.parametrize(("annotation", "value", "reason"), [
    (codec.RECOMMENDED_ACTION, "reboot-the-rack", "bad_recommended_action"),
    (codec.FAULT_CLEARED, "maybe", "bad_fault_cleared"),
    (codec.PODS, "ml/bert-0,not a pod", "bad_pods"),
])
def test_an_event_the_codec_cannot_read_is_refused_and_counted(annotation: str, value: str, reason: str) -> None:
    rig = _WatcherRig()
    body = _agent_event(XID79)
    body["metadata"]["annotations"][annotation] = value
    rig.detector._on_change(indexing.Kind.EVENT, None, _kube_event(body))
    assert rig.sub.get_nowait() == []
    assert rig.rejected() == {reason: 1.0}


def test_unreadable_detail_is_dropped_and_the_event_acted_on() -> None:
    rig = _WatcherRig()
    body = _agent_event(XID79)
    body["metadata"]["annotations"][codec.XID] = "seventy-nine"
    rig.detector._on_change(indexing.Kind.EVENT, None, _kube_event(body))
    [got] = rig.sub.get_nowait()
    assert (got.fault.xid, got.fault.gpu_uuid, got.recommended) == (None, "GPU-3", model.Action.CORDON_NODE)


def test_a_cleared_event_passes_through_as_cleared() -> None:
    rig = _WatcherRig()
    body = _agent_event(XID79)
    body["metadata"]["annotations"][codec.FAULT_CLEARED] = "true"
    rig.detector._on_change(indexing.Kind.EVENT, None, _kube_event(body))
    [got] = rig.sub.get_nowait()
    assert (got.cleared, got.severity) == (True, model.Severity.INFO)


def test_a_go_project_event_without_kcover_fields_is_left_to_the_rules() -> None:
    rig = _WatcherRig()
    body = _agent_event(XID79)
    body["metadata"]["annotations"] = {codec.NEED_RECOVERY: "true"}
    rig.detector._on_change(indexing.Kind.EVENT, None, _kube_event(body))
    [got] = rig.sub.get_nowait()
    assert (got.fault, got.recommended, got.cleared, got.occurrences) == (model.NO_FAULT, None, False, 1)


# ------------------------------------------------------------------------------------- node condition

class _ConditionRig:
    def __init__(self, agent_condition_type: str = "KcoverGPUHealthy", **config: Any) -> None:
        self.clock = clock_.FakeClock(T0)
        self.nodes = Nodes()
        context = contract.DetectorContext(role=contract.Role.CONTROLLER, metrics=metrics.Metrics(), clock=self.clock,
                                           cluster=self.nodes, agent_condition_type=agent_condition_type)
        cfg = node_condition.NodeConditionConfig.model_validate({"min_duration_seconds": 10, **config})
        self.detector = node_condition.NodeConditionDetector("node-condition", cfg, context)
        self.bus = bus_.Bus(dedupe_window_seconds=0)
        self.sub = self.bus.subscribe("test")
        self.detector._bus = self.bus

    def set(self, *conds: proj.Condition, cordoned: bool = False) -> None:
        annotations = (("kcover.io/cordoned-by", "kcover"),) if cordoned else ()
        node = proj.Node("nu", "1", "gpu-1", cordoned, (), conds, annotations, ())
        old = self.nodes.by_name.get("gpu-1")
        self.nodes.by_name["gpu-1"] = node
        self.detector._on_change(indexing.Kind.NODE, old, node)

    def advance(self, seconds: float) -> list[model.CollectorEvent]:
        self.clock.advance(seconds)
        self.detector._recheck_waiting(self.nodes)  # type: ignore[arg-type]
        return self.sub.get_nowait()


def _cond(ctype: str, status: str, since: dt.datetime) -> proj.Condition:
    return proj.Condition(ctype, status, "XID79", "GPU fell off the bus", _ts(since))


def test_agent_condition_false_recommends_a_cordon_and_its_end_is_cleared_after_the_hold() -> None:
    rig = _ConditionRig(recovered_hold_seconds=600)
    rig.set(_cond("KcoverGPUHealthy", "False", T0 - dt.timedelta(seconds=60)))
    [bad] = rig.sub.get_nowait()
    assert (bad.reason, bad.recommended, bad.cleared, bad.fault) == \
        ("NodeConditionBad", model.Action.CORDON_NODE, False, model.Fault(check="KcoverGPUHealthy"))
    rig.set(_cond("KcoverGPUHealthy", "True", T0), cordoned=True)
    assert rig.sub.get_nowait() == []
    assert rig.advance(599) == []
    [cleared] = rig.advance(2)
    assert (cleared.reason, cleared.cleared, cleared.severity, cleared.recommended) == \
        ("NodeConditionRecovered", True, model.Severity.INFO, None)
    assert cleared.target == model.Target(kind=model.TargetKind.NODE, name="gpu-1", node="gpu-1")
    assert rig.advance(600) == []  # once


def test_the_default_rule_follows_the_agents_condition_type() -> None:
    """`agent.condition_type` is the one source: the default rule and the cordon reading follow it."""
    rig = _ConditionRig(agent_condition_type="AcmeGPUHealthy")
    long_ago = T0 - dt.timedelta(seconds=60)
    rig.set(_cond("KcoverGPUHealthy", "False", long_ago), _cond("AcmeGPUHealthy", "False", long_ago))
    [bad] = rig.sub.get_nowait()  # the other type is no condition of this agent's: not watched
    assert (bad.fault, bad.recommended) == (model.Fault(check="AcmeGPUHealthy"), model.Action.CORDON_NODE)


def test_configured_rules_are_taken_as_they_are() -> None:
    rig = _ConditionRig(agent_condition_type="AcmeGPUHealthy",
                        conditions=[{"type": "KcoverGPUHealthy", "bad_status": "False"}])
    long_ago = T0 - dt.timedelta(seconds=60)
    rig.set(_cond("KcoverGPUHealthy", "False", long_ago), _cond("AcmeGPUHealthy", "False", long_ago))
    [bad] = rig.sub.get_nowait()
    # watched as configured, but not the agent's condition: it recommends nothing, the rules decide
    assert (bad.fault, bad.recommended) == (model.Fault(check="KcoverGPUHealthy"), None)


def test_the_hold_counts_from_last_transition_so_a_restart_does_not_reset_it() -> None:
    rig = _ConditionRig(recovered_hold_seconds=600)
    rig.set(_cond("KcoverGPUHealthy", "False", T0 - dt.timedelta(seconds=60)))
    rig.sub.get_nowait()
    rig.set(_cond("KcoverGPUHealthy", "True", T0 - dt.timedelta(seconds=601)), cordoned=True)
    assert [e.cleared for e in rig.sub.get_nowait()] == [True]


def test_a_condition_bad_again_inside_the_hold_is_not_cleared_nor_reported_twice() -> None:
    rig = _ConditionRig(recovered_hold_seconds=600)
    rig.set(_cond("KcoverGPUHealthy", "False", T0 - dt.timedelta(seconds=60)))
    rig.sub.get_nowait()
    rig.set(_cond("KcoverGPUHealthy", "True", T0))
    assert rig.advance(300) == []
    rig.set(_cond("KcoverGPUHealthy", "False", rig.clock.now()))
    assert rig.advance(400) == []


def test_nothing_is_cleared_while_another_condition_is_bad() -> None:
    rig = _ConditionRig(recovered_hold_seconds=10)
    hw_bad = _cond("AcceleratedHardwareReady", "False", T0 - dt.timedelta(seconds=60))
    rig.set(_cond("KcoverGPUHealthy", "False", T0 - dt.timedelta(seconds=60)), hw_bad)
    bad = rig.sub.get_nowait()
    assert sorted((e.fault.check, e.recommended) for e in bad) == [  # type: ignore[type-var]
        ("AcceleratedHardwareReady", None), ("KcoverGPUHealthy", model.Action.CORDON_NODE)]
    rig.set(_cond("KcoverGPUHealthy", "True", T0), hw_bad)
    assert rig.advance(60) == []
    rig.set(_cond("KcoverGPUHealthy", "True", T0), _cond("AcceleratedHardwareReady", "True", rig.clock.now()))
    assert rig.advance(11) != []


def test_after_a_controller_restart_a_node_kcover_cordoned_is_cleared_once_good_for_the_hold() -> None:
    rig = _ConditionRig(recovered_hold_seconds=600)
    rig.set(_cond("KcoverGPUHealthy", "True", T0 - dt.timedelta(seconds=100)), cordoned=True)
    assert rig.sub.get_nowait() == []
    [cleared] = rig.advance(500)
    assert (cleared.cleared, cleared.reason, cleared.fault.check) == (True, "NodeConditionRecovered", "KcoverGPUHealthy")
    assert rig.advance(600) == []
    rig.set(_cond("KcoverGPUHealthy", "True", T0 - dt.timedelta(seconds=100)), cordoned=True)
    assert rig.sub.get_nowait() == []  # once per cordon


@pytest.mark.parametrize("conds", [
    (),  # no configured condition at all: nothing says the node is well
    (_cond("KcoverGPUHealthy", "Unknown", T0 - dt.timedelta(days=1)),),
    (_cond("KcoverGPUHealthy", "True", T0 - dt.timedelta(days=1)),
     _cond("AcceleratedHardwareReady", "Unknown", T0 - dt.timedelta(days=1))),
])
def test_a_cordoned_node_without_all_conditions_good_stays_cordoned(conds: tuple[proj.Condition, ...]) -> None:
    rig = _ConditionRig(recovered_hold_seconds=600)
    rig.set(*conds, cordoned=True)
    assert rig.advance(1000) == []


def test_a_node_not_cordoned_by_kcover_gets_no_cleared_event() -> None:
    rig = _ConditionRig(recovered_hold_seconds=0)
    rig.set(_cond("KcoverGPUHealthy", "True", T0 - dt.timedelta(days=1)))
    assert rig.advance(10) == []
