"""Pure parts of the reporter: which events are node faults, the condition they call for, Event bodies."""

from __future__ import annotations

import datetime as dt

import pytest

from kcover import model
from kcover.agent import reporting

NODE = "gpu-node-1"


def _event(reason: str, *, action: model.Action | None = model.Action.CORDON_NODE,
           severity: model.Severity = model.Severity.ERROR, gpu: str = "GPU-a", detector: str = "nvml",
           cleared: bool = False, **fault: object) -> model.CollectorEvent:
    return model.CollectorEvent(
        detector=detector, target=model.Target(kind=model.TargetKind.DEVICE, node=NODE, device_id=gpu),
        severity=severity, reason=reason, message=f"{reason} on {gpu}", recommended=action, cleared=cleared,
        fault=model.Fault(gpu_uuid=gpu, **fault))  # type: ignore[arg-type]


def _node_event(reason: str, *, detector: str, check: str, action: model.Action | None,
                severity: model.Severity = model.Severity.ERROR, cleared: bool = False) -> model.CollectorEvent:
    return model.CollectorEvent(
        detector=detector, target=model.Target(kind=model.TargetKind.NODE, name=NODE, node=NODE),
        severity=severity, reason=reason, message=f"{reason} on {NODE}", recommended=action, cleared=cleared,
        fault=model.Fault(check=check))


# (event, is a node fault)
FAULTS = [
    (_event("XID79", xid=79), True),
    (_event("XID13", action=model.Action.RESTART_WORKLOAD, severity=model.Severity.WARNING, xid=13), False),
    (_event("XID43", action=model.Action.REPORT, severity=model.Severity.INFO, xid=43), False),
    (_event("XID95", action=model.Action.CORDON_NODE_AND_RESTART, xid=95), True),
    (_event("GPULost", check="gpu_lost"), True),
    (_event("RowRemapPending", action=model.Action.REPORT, severity=model.Severity.WARNING,
            check="row_remap_pending"), False),
    (_event("GPULostCleared", action=None, severity=model.Severity.INFO, check="gpu_lost", cleared=True), True),
    (_event("XID79", action=None, severity=model.Severity.INFO, cleared=True, xid=79), False),
    (_node_event("MetaxGpuUnavailable", detector="metax", check="gpu-count", action=model.Action.CORDON_NODE), True),
    (_node_event("NTPProblem", detector="script", check="ntp", action=None), False),
]


@pytest.mark.parametrize(("event", "node_fault"), FAULTS)
def test_fault_key(event: model.CollectorEvent, node_fault: bool) -> None:
    assert (reporting.fault_key(event) is not None) is node_fault


def test_xid_fault_holds_then_clears() -> None:
    faults: dict[str, reporting.Fault] = {}
    reporting.apply(faults, _event("XID79", xid=79), now=100.0)
    cond = reporting.condition(faults, 100.0, hold_seconds=300)
    assert (cond.status, cond.reason) == ("False", "XID79")
    assert "GPU-a" in cond.message
    assert reporting.condition(faults, 399.0, 300).status == "False"
    assert reporting.condition(faults, 401.0, 300).status == "True"
    assert faults == {}


def test_health_fault_stays_until_cleared_and_held() -> None:
    faults: dict[str, reporting.Fault] = {}
    reporting.apply(faults, _event("GPULost", check="gpu_lost"), now=0.0)
    assert reporting.condition(faults, 10_000.0, 300).status == "False"  # active faults do not expire
    reporting.apply(faults, _event("GPULostCleared", action=None, severity=model.Severity.INFO,
                                   check="gpu_lost", cleared=True), now=10_000.0)
    held = reporting.condition(faults, 10_200.0, 300)
    assert held.status == "False"
    assert "cleared, holding" in held.message
    assert reporting.condition(faults, 10_301.0, 300).status == "True"


def test_several_faults_name_every_gpu() -> None:
    faults: dict[str, reporting.Fault] = {}
    reporting.apply(faults, _event("XID79", gpu="GPU-b", xid=79), now=0.0)
    reporting.apply(faults, _event("DoubleBitECC", gpu="GPU-a", check="double_bit_ecc"), now=0.0)
    cond = reporting.condition(faults, 1.0, 300)
    assert cond.reason == "GPUFaults"
    assert "affected GPUs: GPU-a, GPU-b" in cond.message


def test_token_bucket() -> None:
    bucket = reporting.TokenBucket(rate_per_second=1.0, burst=2.0)
    assert [bucket.take(0.0) for _ in range(3)] == [True, True, False]
    assert bucket.take(1.0)
    assert not bucket.take(1.0)


def test_event_body_for_a_cordon_recommendation() -> None:
    when = dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
    event = _event("XID79", xid=79, gpu_index=3, pods=("ml/bert-0",)).model_copy(update={"occurrences": 2,
                                                                                        "window_seconds": 60.0})
    body = reporting.event_body(event, node=NODE, reporter="kcover.io/agent", when=when)
    assert body["metadata"]["namespace"] == "kcover-system"
    assert body["metadata"]["annotations"] == {
        "kcover.io/need-recovery": "true", "kcover.io/recommended-action": "cordon-node",
        "kcover.io/detector": "nvml", "kcover.io/gpu-uuid": "GPU-a", "kcover.io/xid": "79",
        "kcover.io/gpu-index": "3", "kcover.io/pods": "ml/bert-0", "kcover.io/occurrences": "2",
        "kcover.io/window-seconds": "60.0"}
    # the API server keeps Events about a Node outside default/kube-system only if the reference names
    # the Event's namespace (kube-apiserver 1.36 answers 422 otherwise)
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "namespace": "kcover-system"}
    assert (body["eventTime"], body["reportingComponent"], body["reportingInstance"], body["action"]) == \
        ("2026-01-02T03:04:05.000006Z", "kcover.io/agent", NODE, "cordon-node")
    assert body["type"] == "Warning"


def test_event_body_for_a_cleared_fault_asks_for_nothing() -> None:
    body = reporting.event_body(_event("GPULostCleared", action=None, severity=model.Severity.INFO,
                                       check="gpu_lost", cleared=True),
                                node=NODE, reporter="r", when=dt.datetime.now(dt.UTC))
    annotations = body["metadata"]["annotations"]
    assert "kcover.io/need-recovery" not in annotations
    assert (annotations["kcover.io/fault-cleared"], annotations["kcover.io/check"]) == ("true", "gpu_lost")
    assert (body["type"], body["action"]) == ("Normal", "cleared")


@pytest.mark.parametrize(("action", "severity", "annotated"), [
    (model.Action.RESTART_WORKLOAD, model.Severity.WARNING, True),
    (model.Action.CORDON_NODE_AND_RESTART, model.Severity.ERROR, True),
    (model.Action.REPORT, model.Severity.WARNING, False),
    (None, model.Severity.ERROR, False),
    (model.Action.CORDON_NODE, model.Severity.INFO, False),
])
def test_need_recovery_only_for_actions(action: model.Action | None, severity: model.Severity,
                                        annotated: bool) -> None:
    body = reporting.event_body(_event("X", action=action, severity=severity), node=NODE, reporter="r",
                                when=dt.datetime.now(dt.UTC))
    assert ("kcover.io/need-recovery" in body["metadata"]["annotations"]) is annotated


def test_event_body_in_default_keeps_the_plain_node_reference() -> None:
    body = reporting.event_body(_event("XID79"), node=NODE, reporter="r", namespace="default",
                                when=dt.datetime.now(dt.UTC))
    assert body["metadata"]["namespace"] == "default"
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE}


def test_event_body_text_is_cut_in_utf8_bytes() -> None:
    """600 CJK characters are 1,800 bytes: the API server refuses past 1,024 bytes, not characters."""
    event = _event("XID79").model_copy(update={"message": "显存" * 300, "reason": "故障" * 100})
    body = reporting.event_body(event, node="节点" * 50, reporter="r", when=dt.datetime.now(dt.UTC))
    assert len(body["message"].encode()) <= 1024
    assert body["message"].startswith("显存")
    for field in ("reason", "reportingInstance", "action"):
        assert len(body[field].encode()) <= 128
    body["message"].encode().decode()  # cut on a character boundary
