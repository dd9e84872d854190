"""The agent -> controller codec: lossless round trip over every typed field, decoding never raises,
malformed values are refused or dropped as the module's table says."""

from __future__ import annotations

import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcover import codec, model, validationcodec

EXAMPLES = 300
"""Fixed budget, derandomized: CI runs the same examples every time."""

_label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)
_subdomain = st.lists(_label, min_size=1, max_size=4).map(".".join).filter(lambda s: len(s) <= 253)
_pod_key = st.builds(lambda ns, name: f"{ns}/{name}", _label, _subdomain)
_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
_ints = st.integers(min_value=0, max_value=codec.INT_MAX)


def _bounded(max_chars: int) -> st.SearchStrategy[str]:
    return st.one_of(_text, st.text(st.characters(blacklist_categories=("Cs",)), min_size=max_chars - 2,
                                    max_size=max_chars))


_dra = st.builds(model.DraDevice, driver=_bounded(253).filter(bool), pool=_bounded(253).filter(bool),
                 device=_bounded(253).filter(bool))
_fault = st.builds(
    model.Fault, xid=st.none() | _ints, gpu_index=st.none() | _ints, gpu_uuid=_bounded(128),
    dra=st.none() | _dra, check=_bounded(128), container=_bounded(253),
    pods=st.lists(_pod_key, max_size=codec.PODS_MAX).map(tuple))
_events = st.builds(
    model.CollectorEvent,
    detector=_bounded(253).filter(bool),
    target=st.just(model.Target(kind=model.TargetKind.NODE, name="gpu-1", node="gpu-1")),
    severity=st.sampled_from(model.Severity), reason=st.just("XID79"),
    fault=_fault, recommended=st.none() | st.sampled_from(model.Action), cleared=st.booleans(),
    occurrences=st.integers(min_value=1, max_value=codec.INT_MAX),
    window_seconds=st.floats(min_value=0, allow_nan=False, allow_infinity=True),
    evidence=st.none() | st.sampled_from(model.Evidence))


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None)
@given(_events, st.booleans())
def test_decode_restores_every_typed_field(event: model.CollectorEvent, device_healthy: bool) -> None:
    device_healthy = device_healthy and event.cleared and event.fault.dra is not None
    encoded = codec.encode_annotations(event, device_healthy=device_healthy)
    assert encoded.dropped == ()
    assert all(k.startswith(codec.PREFIX) for k in encoded.annotations)
    assert all(len(v.encode()) <= codec.PODS_MAX_BYTES for v in encoded.annotations.values())
    decoded = codec.decode_annotations(encoded.annotations)
    assert isinstance(decoded, codec.Decoded)
    assert decoded.fault == event.fault
    assert decoded.recommended == event.recommended
    assert decoded.cleared == event.cleared
    assert decoded.occurrences == event.occurrences
    assert decoded.window_seconds == event.window_seconds
    assert decoded.detector == event.detector
    assert decoded.need_recovery == codec.needs_recovery(event)
    assert decoded.device_healthy == device_healthy
    assert decoded.evidence == event.evidence
    assert decoded.dropped == ()


_keys = st.sampled_from([codec.NEED_RECOVERY, codec.RECOMMENDED_ACTION, codec.FAULT_CLEARED, codec.XID,
                         codec.GPU_INDEX, codec.GPU_UUID, codec.DRA_DRIVER, codec.DRA_POOL, codec.DRA_DEVICE,
                         codec.CHECK, codec.CONTAINER, codec.PODS, codec.OCCURRENCES, codec.WINDOW_SECONDS,
                         codec.DETECTOR, codec.DEVICE_HEALTHY, codec.EVIDENCE]) | st.text(max_size=20)
_values: st.SearchStrategy[Any] = (st.text() | st.sampled_from(["true", "FALSE", "-1", "1e400", "nan", "inf", "0x1f",
                                                                "٣", "1_000", " 7", "a/b,,c/d", "cordon-node"])
                                   | st.text(string.digits, min_size=18, max_size=25) | st.integers() | st.none()
                                   | st.floats() | st.lists(st.text(max_size=3), max_size=3))


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None)
@given(st.dictionaries(_keys, _values, max_size=12))
def test_decode_never_raises_on_arbitrary_annotations(annotations: dict[str, Any]) -> None:
    decoded = codec.decode_annotations(annotations)
    assert isinstance(decoded, codec.Decoded | codec.Refused)
    if isinstance(decoded, codec.Refused):
        assert decoded.reason in {codec.REFUSED_RECOMMENDED_ACTION, codec.REFUSED_FAULT_CLEARED, codec.REFUSED_PODS,
                                  codec.REFUSED_DEVICE_HEALTHY, codec.REFUSED_EVIDENCE}


DEVICE = {codec.DRA_DRIVER: "gpu.nvidia.com", codec.DRA_POOL: "n1", codec.DRA_DEVICE: "gpu-2"}


@pytest.mark.parametrize(("annotations", "reason"), [
    ({codec.RECOMMENDED_ACTION: "reboot"}, codec.REFUSED_RECOMMENDED_ACTION),
    ({codec.RECOMMENDED_ACTION: "Cordon-Node"}, codec.REFUSED_RECOMMENDED_ACTION),
    ({codec.FAULT_CLEARED: "yes"}, codec.REFUSED_FAULT_CLEARED),
    ({codec.PODS: "ml/a,ml"}, codec.REFUSED_PODS),
    ({codec.PODS: "ml/a,,ml/b"}, codec.REFUSED_PODS),
    ({codec.PODS: ",".join(f"ml/p{i}" for i in range(codec.PODS_MAX + 1))}, codec.REFUSED_PODS),
    ({codec.PODS: "ml/" + "a" * 40_000}, codec.REFUSED_PODS),
    ({codec.DEVICE_HEALTHY: "yes", codec.FAULT_CLEARED: "true", **DEVICE}, codec.REFUSED_DEVICE_HEALTHY),
    ({codec.DEVICE_HEALTHY: "true", **DEVICE}, codec.REFUSED_DEVICE_HEALTHY),  # not cleared
    ({codec.DEVICE_HEALTHY: "true", codec.FAULT_CLEARED: "false", **DEVICE}, codec.REFUSED_DEVICE_HEALTHY),
    ({codec.DEVICE_HEALTHY: "true", codec.FAULT_CLEARED: "true"}, codec.REFUSED_DEVICE_HEALTHY),  # no device
    ({codec.DEVICE_HEALTHY: "true", codec.FAULT_CLEARED: "true", **DEVICE, codec.DRA_POOL: "p" * 254},
     codec.REFUSED_DEVICE_HEALTHY),  # a device it cannot read
    ({codec.EVIDENCE: "Link-Down"}, codec.REFUSED_EVIDENCE),
    ({codec.EVIDENCE: "link-down" + " " * 40_000}, codec.REFUSED_EVIDENCE),
])
def test_values_that_change_what_happens_are_refused(annotations: dict[str, str], reason: str) -> None:
    decoded = codec.decode_annotations({codec.NEED_RECOVERY: "true", **annotations})
    assert isinstance(decoded, codec.Refused)
    assert decoded.reason == reason


@pytest.mark.parametrize(("annotations", "dropped"), [
    ({codec.XID: "-1"}, codec.XID),
    ({codec.XID: "79.0"}, codec.XID),
    ({codec.GPU_INDEX: "٣"}, codec.GPU_INDEX),
    ({codec.OCCURRENCES: "0"}, codec.OCCURRENCES),
    ({codec.WINDOW_SECONDS: "nan"}, codec.WINDOW_SECONDS),
    ({codec.WINDOW_SECONDS: "-5"}, codec.WINDOW_SECONDS),
    ({codec.GPU_UUID: "G" * 129}, codec.GPU_UUID),
    ({codec.CHECK: "é" * 129}, codec.CHECK),
    ({codec.DRA_DRIVER: "gpu.nvidia.com", codec.DRA_DEVICE: "gpu-0"}, codec.DRA_DRIVER),
])
def test_malformed_detail_is_dropped_and_the_event_still_decodes(annotations: dict[str, str], dropped: str) -> None:
    decoded = codec.decode_annotations({codec.RECOMMENDED_ACTION: "cordon-node", **annotations})
    assert isinstance(decoded, codec.Decoded)
    assert decoded.recommended is model.Action.CORDON_NODE
    assert [key for key, _ in decoded.dropped] == [dropped]
    assert decoded.fault == model.NO_FAULT
    assert (decoded.occurrences, decoded.window_seconds) == (1, 0.0)


def test_encode_leaves_out_what_it_cannot_carry_and_says_so() -> None:
    event = model.CollectorEvent(
        detector="nvml", target=model.Target(kind=model.TargetKind.NODE, name="n"), severity=model.Severity.ERROR,
        reason="XID79", fault=model.Fault(xid=2**64, pods=("ml/a", "not a pod", "ml/b")))
    encoded = codec.encode_annotations(event)
    assert codec.XID not in encoded.annotations
    assert encoded.annotations[codec.PODS] == "ml/a,ml/b"
    assert {key for key, _ in encoded.dropped} == {codec.XID, codec.PODS}


@pytest.mark.parametrize(("recommended", "severity", "cleared", "asks"), [
    (model.Action.CORDON_NODE, model.Severity.ERROR, False, True),
    (model.Action.CORDON_NODE_AND_RESTART, model.Severity.WARNING, False, True),
    (model.Action.RESTART_WORKLOAD, model.Severity.WARNING, False, True),
    (model.Action.REPORT, model.Severity.ERROR, False, False),
    (None, model.Severity.ERROR, False, False),
    (model.Action.CORDON_NODE, model.Severity.INFO, False, False),
    (model.Action.CORDON_NODE, model.Severity.ERROR, True, False),
])
def test_need_recovery_only_for_faults_whose_source_wants_action(
        recommended: model.Action | None, severity: model.Severity, cleared: bool, asks: bool) -> None:
    event = model.CollectorEvent(detector="d", target=model.Target(kind=model.TargetKind.NODE, name="n"),
                                 severity=severity, reason="R", recommended=recommended, cleared=cleared)
    assert (codec.NEED_RECOVERY in codec.encode_annotations(event).annotations) is asks


@pytest.mark.parametrize(("ctype", "status", "recommended"), [
    ("KcoverGPUHealthy", "False", model.Action.CORDON_NODE),
    ("KcoverGPUHealthy", "True", None),
    ("KcoverGPUHealthy", "Unknown", None),
    ("AcceleratedHardwareReady", "False", None),
])
def test_the_agent_condition_false_recommends_a_cordon(ctype: str, status: str,
                                                       recommended: model.Action | None) -> None:
    assert codec.condition_recommendation(ctype, status) == recommended
    assert codec.condition_status(True) == "False"
    assert codec.condition_status(False) == "True"


# ---------------------------------------------------------------------------------------------- validation

@settings(max_examples=200, derandomize=True, database=None)
@given(rid=st.from_regex(r"[a-z0-9]{1,32}", fullmatch=True), level=st.integers(1, 4),
       outcome=st.sampled_from(list(validationcodec.ValidationOutcome)), text=st.text(max_size=300))
def test_validation_request_and_answer_round_trip(rid: str, level: int, outcome: validationcodec.ValidationOutcome,
                                                  text: str) -> None:
    request = validationcodec.ValidationRequest(rid, level)
    assert validationcodec.decode_validation_request(validationcodec.encode_validation_request(request)) == request
    cond = validationcodec.encode_validation_answer(validationcodec.ValidationAnswer(rid, outcome, text), "2026-01-01T00:00:00Z")
    answer = validationcodec.decode_validation_answer(cond["type"], cond["status"], cond["reason"], cond["message"])
    assert answer is not None
    assert (answer.request, answer.outcome) == (rid, outcome)
    assert cond["message"].startswith(f"request {rid}: ")


@pytest.mark.parametrize("annotations", [
    {}, {"kcover.io/validate-request": "abc"}, {"kcover.io/validate-request": "ABC", "kcover.io/validate-level": "1"},
    {"kcover.io/validate-request": "abc", "kcover.io/validate-level": "5"},
    {"kcover.io/validate-request": "abc", "kcover.io/validate-level": "x"},
])
def test_a_malformed_validation_request_is_no_request(annotations: dict[str, str]) -> None:
    assert validationcodec.decode_validation_request(annotations) is None


@pytest.mark.parametrize(("ctype", "status", "reason", "message"), [
    ("KcoverGPUHealthy", "True", "Passed", "request abc: ok"),  # another condition
    ("KcoverGPUValidated", "False", "Passed", "request abc: ok"),  # status disagrees with the reason
    ("KcoverGPUValidated", "True", "Fine", "request abc: ok"),  # not an outcome
    ("KcoverGPUValidated", "True", "Passed", "passed"),  # names no request
])
def test_an_answer_the_agent_could_not_have_written_is_no_answer(ctype: str, status: str, reason: str,
                                                                 message: str) -> None:
    assert validationcodec.decode_validation_answer(ctype, status, reason, message) is None


def test_device_healthy_is_carried_only_by_a_cleared_event_naming_a_device() -> None:
    dra = model.DraDevice(driver="gpu.nvidia.com", pool="n1", device="gpu-2")
    target = model.Target(kind=model.TargetKind.NODE, name="n1", node="n1")
    healthy = model.CollectorEvent(detector="nvml", target=target, severity=model.Severity.INFO,
                                   reason="GPUDeviceHealthy", fault=model.Fault(dra=dra), cleared=True)
    encoded = codec.encode_annotations(healthy, device_healthy=True)
    assert encoded.annotations[codec.DEVICE_HEALTHY] == "true"
    assert codec.NEED_RECOVERY not in encoded.annotations  # a consumer of need-recovery alone ignores it
    decoded = codec.decode_annotations(encoded.annotations)
    assert isinstance(decoded, codec.Decoded)
    assert (decoded.device_healthy, decoded.cleared, decoded.fault.dra) == (True, True, dra)
    for event in (healthy.model_copy(update={"cleared": False}), healthy.model_copy(update={"fault": model.NO_FAULT})):
        encoded = codec.encode_annotations(event, device_healthy=True)
        assert codec.DEVICE_HEALTHY not in encoded.annotations
        assert [key for key, _ in encoded.dropped] == [codec.DEVICE_HEALTHY]
    assert codec.DEVICE_HEALTHY not in codec.encode_annotations(healthy).annotations


def test_an_evidence_event_asks_for_nothing_and_an_unknown_evidence_is_refused() -> None:
    target = model.Target(kind=model.TargetKind.NODE, name="n1", node="n1")
    down = model.CollectorEvent(detector="rdma-link", target=target, severity=model.Severity.WARNING,
                                reason="RdmaLinkFlapped", recommended=model.Action.REPORT,
                                evidence=model.Evidence.LINK_DOWN)
    encoded = codec.encode_annotations(down)
    assert encoded.annotations[codec.EVIDENCE] == "link-down"
    assert codec.NEED_RECOVERY not in encoded.annotations, "evidence is no request"
    decoded = codec.decode_annotations(encoded.annotations)
    assert isinstance(decoded, codec.Decoded)
    assert (decoded.evidence, decoded.need_recovery) == (model.Evidence.LINK_DOWN, False)
    refused = codec.decode_annotations({**encoded.annotations, codec.EVIDENCE: "cable-cut"})
    assert isinstance(refused, codec.Refused)
    assert (refused.reason, refused.annotation) == (codec.REFUSED_EVIDENCE, codec.EVIDENCE)
