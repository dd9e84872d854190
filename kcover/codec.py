"""The codec for what crosses the API server: a fault's typed meaning as Event annotations and a Node condition.

Owns both directions of the agent -> controller contract, so the two sides cannot drift:
* `encode_annotations(event)` (agent, plugins) turns a `CollectorEvent`'s typed fields into
  `kcover.io/` annotations of a core/v1 Event; `decode_annotations(annotations)` (the controller's
  event watcher) turns them back. `decode(encode(e))` restores every typed field (a property test
  proves it).
* `condition_status(faulty)` (agent) and `condition_recommendation(type, status)` (the controller's
  node-condition detector): the agent's `KcoverGPUHealthy=False` means "the node's agent judges this
  node must be cordoned" and decodes to a recommended `cordon-node`; `True` after a fault reported
  means the fault cleared.
The validation request and answer (controller -> agent Node annotations, agent -> controller Node
condition) are `kcover.validationcodec`'s.

| annotation | field | value | malformed |
|---|---|---|---|
| `kcover.io/need-recovery` | (asks for recovery) | `true` | anything else: not a request |
| `kcover.io/recommended-action` | `recommended` | an `Action` value | refused `bad_recommended_action` |
| `kcover.io/fault-cleared` | `cleared` | `true` / `false` | refused `bad_fault_cleared` |
| `kcover.io/pods` | `fault.pods` | `ns/name,ns/name`, at most `PODS_MAX` | refused `bad_pods` |
| `kcover.io/device-healthy` | (a DRA device is healthy again) | `true` / `false` | refused `bad_device_healthy` |
| `kcover.io/evidence` | `evidence` | an `Evidence` value | refused `bad_evidence` |
| `kcover.io/xid` | `fault.xid` | decimal, 0..2^63-1 | dropped, logged |
| `kcover.io/gpu-index` | `fault.gpu_index` | decimal, 0..2^63-1 | dropped, logged |
| `kcover.io/gpu-uuid` | `fault.gpu_uuid` | text | dropped, logged |
| `kcover.io/dra-driver`, `-pool`, `-device` | `fault.dra` | text, all three or none | all three dropped, logged |
| `kcover.io/check` | `fault.check` | text | dropped, logged |
| `kcover.io/container` | `fault.container` | text | dropped, logged |
| `kcover.io/occurrences` | `occurrences` | decimal, 1..2^63-1 | dropped (1), logged |
| `kcover.io/window-seconds` | `window_seconds` | float (Python `repr`), >= 0 | dropped (0), logged |
| `kcover.io/detector` | the reporting detector | text | dropped, logged |

`kcover.io/device-healthy: "true"` is the agent's word that a DRA device it reported faulty has stayed
healthy for `agent.condition_hold_seconds` (`encode_annotations(event, device_healthy=True)`): it goes
only with `kcover.io/fault-cleared: "true"` and a complete `kcover.io/dra-*` device, and the
controller's event watcher keeps and judges an Event carrying it like one asking for recovery (same
trust rules), so the policy removes kcover's DeviceTaintRule of that device. It never carries
`need-recovery`: a consumer that only knows that annotation ignores it. Asked for on an event that is
not cleared or names no DRA device, the encoder leaves it out (`dropped`); decoded without both, or
with a value other than true/false, the Event is refused (`bad_device_healthy`).

`kcover.io/evidence: link-down` is the agent's word that one of the node's RDMA ports went down once
(`model.Evidence`): it asks for nothing (`recommended-action: report`, never `need-recovery`), and the
controller's event watcher keeps and judges an Event carrying it like one asking for recovery (same trust
rules, about a Node only), so the controller records it for the judgement.

Why refuse some and drop others: the first five change what the controller does. A recommendation it
cannot read might have asked for less than its rules would do; an unreadable `cleared` could turn
the end of a fault into a cordon; unreadable `pods` would widen a restart from the pods on one GPU
to every workload on the node; an unreadable or inconsistent `device-healthy` could un-isolate a
device nobody said was well; an unreadable `evidence` might be read as evidence against a node. The
rest is identity and detail the policy does not act on, so the Event is still worth acting on without them. Text values are bounded by the model's limits in
characters and by `VALUE_MAX_BYTES` in UTF-8 bytes; `pods` by `PODS_MAX` entries and
`PODS_MAX_BYTES`. Empty text and absent annotations both mean "unknown".

Decoding never raises, whatever the annotations hold. Encoding never raises either: a value outside
what the codec can carry (an integer past int64, a pod key that is not `namespace/name`) is left out
and reported in `Encoded.dropped`. It does no I/O, logs nothing itself (callers log what it reports),
and imports only `kcover.model` and the standard library.
"""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field

from kcover import model

PREFIX = "kcover.io/"
"""Every kcover annotation and label starts so; the cache keeps only such annotations."""
NEED_RECOVERY = "kcover.io/need-recovery"
"""`true` on an Event: it asks for recovery of its involved object (the event watcher judges it)."""
RECOMMENDED_ACTION = "kcover.io/recommended-action"
FAULT_CLEARED = "kcover.io/fault-cleared"
XID = "kcover.io/xid"
GPU_INDEX = "kcover.io/gpu-index"
GPU_UUID = "kcover.io/gpu-uuid"
DRA_DRIVER = "kcover.io/dra-driver"
DRA_POOL = "kcover.io/dra-pool"
DRA_DEVICE = "kcover.io/dra-device"
CHECK = "kcover.io/check"
CONTAINER = "kcover.io/container"
PODS = "kcover.io/pods"
OCCURRENCES = "kcover.io/occurrences"
WINDOW_SECONDS = "kcover.io/window-seconds"
DETECTOR = "kcover.io/detector"
DEVICE_HEALTHY = "kcover.io/device-healthy"
"""`true` on an Event: the agent's word that a DRA device is healthy again; kept and judged like a request."""
EVIDENCE = "kcover.io/evidence"
"""A `model.Evidence` value on an Event: what the observation is evidence of; kept and judged like a request."""

VALUE_MAX_BYTES = 1024
"""UTF-8 bytes of one annotation value (other than `pods`): the longest model text (253 characters)
at 4 bytes each fits."""
PODS_MAX = 110
"""Pods named in one Event: the Kubernetes default of 110 pods per node."""
PODS_MAX_BYTES = PODS_MAX * (63 + 1 + 253 + 1)
"""UTF-8 bytes of the `pods` value: PODS_MAX keys of the longest namespace and pod name."""
INT_MAX = 2**63 - 1
"""Largest integer carried (Kubernetes' int64)."""
TEXT_MAX_CHARS: Mapping[str, int] = {GPU_UUID: 128, CHECK: 128, CONTAINER: 253, DETECTOR: 253,
                                     DRA_DRIVER: 253, DRA_POOL: 253, DRA_DEVICE: 253}
"""Characters of each text annotation: the model's limits (the detector's name: a DNS subdomain)."""

TRUE = "true"
FALSE = "false"

REFUSED_RECOMMENDED_ACTION = "bad_recommended_action"
REFUSED_FAULT_CLEARED = "bad_fault_cleared"
REFUSED_PODS = "bad_pods"
REFUSED_DEVICE_HEALTHY = "bad_device_healthy"
REFUSED_EVIDENCE = "bad_evidence"

AGENT_CONDITION_TYPE = "KcoverGPUHealthy"
"""The Node condition kcover's agent sets (`agent.condition_type`)."""
CONDITION_HEALTHY = "True"
CONDITION_FAULTY = "False"
CONDITION_BLIND = "Unknown"
"""The agent's condition where it cannot see the node's GPUs (`kcover.agent.sight`): no signal either way, so
the controller neither cordons nor returns a node on it (`condition_recommendation`, the node-condition
detector's `is_good`, `recovery.judgement.hardware_conditions`)."""

_DECIMAL = re.compile(r"[0-9]{1,19}")
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_DNS_SUBDOMAIN = rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*"
_POD_KEY = re.compile(rf"(?P<ns>{_DNS_LABEL})/(?P<name>{_DNS_SUBDOMAIN})")


# ---------------------------------------------------------------------------------------------- values

def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _encodable_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def valid_pod_key(key: str) -> bool:
    """`namespace/name` with a DNS-1123 label namespace and a DNS-1123 subdomain name (<= 253)."""
    match = _POD_KEY.fullmatch(key)
    return match is not None and len(match["name"]) <= 253


def _int_text(value: int, minimum: int) -> str | None:
    return str(value) if minimum <= value <= INT_MAX else None


def _parse_int(text: str, minimum: int) -> int | None:
    if not _DECIMAL.fullmatch(text):
        return None
    number = int(text)
    return number if minimum <= number <= INT_MAX else None


def _parse_window(text: str) -> float | None:
    if len(text) > 64:
        return None
    try:
        number = float(text)
    except ValueError:
        return None
    if math.isnan(number) or number < 0:
        return None
    return number


# ---------------------------------------------------------------------------------------------- encode

@dataclass(frozen=True)
class Encoded:
    annotations: dict[str, str]
    dropped: tuple[tuple[str, str], ...] = ()
    """(annotation, why) for values the codec could not carry."""


def needs_recovery(event: model.CollectorEvent) -> bool:
    """Whether an Event for `event` asks the controller to act: a fault (not its end, not a note) whose
    source recommends a restart or a cordon. A cleared fault is never a request: the controller learns
    a node is well again from its condition, after `recovered_hold_seconds`."""
    return (not event.cleared and event.severity is not model.Severity.INFO
            and event.recommended in (model.Action.RESTART_WORKLOAD, model.Action.CORDON_NODE,
                                      model.Action.CORDON_NODE_AND_RESTART))


def encode_annotations(event: model.CollectorEvent, *, device_healthy: bool = False) -> Encoded:
    """The `kcover.io/` annotations carrying `event`'s typed fields (pure, never raises). With
    `device_healthy`, also `kcover.io/device-healthy: "true"`: the agent's word that the DRA device the
    cleared `event` names has stayed healthy for the hold (left out, and reported, when it is not
    cleared or names no DRA device)."""
    out: dict[str, str] = {}
    dropped: list[tuple[str, str]] = []

    def text(key: str, value: str) -> None:
        if not value:
            return
        if len(value) > TEXT_MAX_CHARS[key] or _utf8_len(value) > VALUE_MAX_BYTES or not _encodable_text(value):
            dropped.append((key, "too long or not UTF-8"))
            return
        out[key] = value

    def integer(key: str, value: int | None, minimum: int) -> None:
        if value is None:
            return
        rendered = _int_text(value, minimum)
        if rendered is None:
            dropped.append((key, f"outside {minimum}..{INT_MAX}"))
        else:
            out[key] = rendered

    if needs_recovery(event):
        out[NEED_RECOVERY] = TRUE
    if event.evidence is not None:
        out[EVIDENCE] = event.evidence.value
    if event.recommended is not None:
        out[RECOMMENDED_ACTION] = event.recommended.value
    if event.cleared:
        out[FAULT_CLEARED] = TRUE
    text(DETECTOR, event.detector)
    fault = event.fault
    integer(XID, fault.xid, 0)
    integer(GPU_INDEX, fault.gpu_index, 0)
    text(GPU_UUID, fault.gpu_uuid)
    if fault.dra is not None:
        parts = {DRA_DRIVER: fault.dra.driver, DRA_POOL: fault.dra.pool, DRA_DEVICE: fault.dra.device}
        if all(_utf8_len(v) <= VALUE_MAX_BYTES and _encodable_text(v) for v in parts.values()):
            out.update(parts)
        else:
            dropped.append((DRA_DRIVER, "DRA device name not UTF-8"))
    text(CHECK, fault.check)
    text(CONTAINER, fault.container)
    if fault.pods:
        keys = [p for p in fault.pods if valid_pod_key(p)]
        if len(keys) < len(fault.pods):
            dropped.append((PODS, "entries that are not namespace/name left out"))
        if len(keys) > PODS_MAX:
            dropped.append((PODS, f"more than {PODS_MAX} pods: the rest left out"))
            keys = keys[:PODS_MAX]
        if keys:
            out[PODS] = ",".join(keys)
    if event.occurrences != 1:
        integer(OCCURRENCES, event.occurrences, 1)
    if event.window_seconds:
        out[WINDOW_SECONDS] = repr(event.window_seconds)
    if device_healthy:
        if event.cleared and all(k in out for k in (DRA_DRIVER, DRA_POOL, DRA_DEVICE)):
            out[DEVICE_HEALTHY] = TRUE
        else:
            dropped.append((DEVICE_HEALTHY, "only a cleared event naming a DRA device says a device is healthy"))
    return Encoded(out, tuple(dropped))


# ---------------------------------------------------------------------------------------------- decode

@dataclass(frozen=True)
class Decoded:
    """The typed meaning an Event's annotations carry."""

    need_recovery: bool = False
    recommended: model.Action | None = None
    cleared: bool = False
    fault: model.Fault = model.NO_FAULT
    occurrences: int = 1
    window_seconds: float = 0.0
    detector: str = ""
    """The detector that saw the fault at the source (e.g. the agent's `nvml`)."""
    device_healthy: bool = False
    """The agent says the DRA device `fault.dra` has stayed healthy for its hold (then `cleared` is True)."""
    evidence: model.Evidence | None = None
    """What the observation is evidence of (`kcover.io/evidence`)."""
    dropped: tuple[tuple[str, str], ...] = field(default=())
    """(annotation, why) for optional detail that was malformed and left out."""


@dataclass(frozen=True)
class Refused:
    """The annotations ask for something the controller must not act on."""

    reason: str
    """snake_case, counted as `kcover_events_rejected{reason}`."""
    annotation: str
    detail: str


def annotation_text(annotations: Mapping[str, object], key: str) -> str | None:
    """The value of `key`, None when absent or empty; a value that is not text reads as its repr, so
    it fails to parse like any other malformed value."""
    value = annotations.get(key)
    if value is None or value == "":
        return None
    return value if isinstance(value, str) else repr(value)


_Member = typing.TypeVar("_Member", model.Action, model.Evidence)


def _member(raw: str | None, kind: type[_Member]) -> tuple[_Member | None, str]:
    """The member of `kind` an annotation names (None when absent), and the refusal's detail when it names
    none or is longer than the codec carries ("" otherwise)."""
    if raw is None:
        return None, ""
    if len(raw) <= VALUE_MAX_BYTES and _utf8_len(raw) <= VALUE_MAX_BYTES:
        try:
            return kind(raw), ""
        except ValueError:
            pass
    return None, f"not one of {', '.join(m.value for m in kind)}: {raw[:64]!r}"


def decode_annotations(annotations: Mapping[str, object]) -> Decoded | Refused:
    """Read the typed meaning back from an Event's annotations (pure, never raises).
    Keys outside `kcover.io/` and unknown `kcover.io/` keys are ignored."""
    dropped: list[tuple[str, str]] = []

    def oversize(value: str, limit: int = VALUE_MAX_BYTES) -> bool:
        return len(value) > limit or _utf8_len(value) > limit

    recommended, unread = _member(annotation_text(annotations, RECOMMENDED_ACTION), model.Action)
    if unread:
        return Refused(REFUSED_RECOMMENDED_ACTION, RECOMMENDED_ACTION, unread)
    evidence, unread = _member(annotation_text(annotations, EVIDENCE), model.Evidence)
    if unread:
        return Refused(REFUSED_EVIDENCE, EVIDENCE, unread)

    raw_cleared = annotation_text(annotations, FAULT_CLEARED)
    cleared = False
    if raw_cleared is not None:
        if raw_cleared.lower() not in (TRUE, FALSE):
            return Refused(REFUSED_FAULT_CLEARED, FAULT_CLEARED, f"not true or false: {raw_cleared[:64]!r}")
        cleared = raw_cleared.lower() == TRUE

    raw_pods = annotation_text(annotations, PODS)
    pods: tuple[str, ...] = ()
    if raw_pods is not None:
        if oversize(raw_pods, PODS_MAX_BYTES):
            return Refused(REFUSED_PODS, PODS, f"longer than {PODS_MAX_BYTES} bytes")
        keys = raw_pods.split(",")
        bad = [k for k in keys if not valid_pod_key(k)]
        if bad:
            return Refused(REFUSED_PODS, PODS, f"not namespace/name: {bad[0][:64]!r}")
        if len(keys) > PODS_MAX:
            return Refused(REFUSED_PODS, PODS, f"{len(keys)} pods, more than {PODS_MAX}")
        pods = tuple(keys)

    def text(key: str) -> str:
        value = annotation_text(annotations, key)
        if value is None:
            return ""
        if len(value) > TEXT_MAX_CHARS[key] or oversize(value):
            dropped.append((key, "too long"))
            return ""
        return value

    def integer(key: str, minimum: int) -> int | None:
        value = annotation_text(annotations, key)
        if value is None:
            return None
        number = _parse_int(value, minimum)
        if number is None:
            dropped.append((key, f"not a decimal in {minimum}..{INT_MAX}"))
        return number

    xid = integer(XID, 0)
    gpu_index = integer(GPU_INDEX, 0)
    dra: model.DraDevice | None = None
    dra_parts = {k: text(k) for k in (DRA_DRIVER, DRA_POOL, DRA_DEVICE)}
    if all(dra_parts.values()):
        dra = model.DraDevice(driver=dra_parts[DRA_DRIVER], pool=dra_parts[DRA_POOL], device=dra_parts[DRA_DEVICE])
    elif any(dra_parts.values()):
        dropped.append((DRA_DRIVER, "driver, pool and device must come together"))
    occurrences = integer(OCCURRENCES, 1)
    window: float | None = None
    raw_window = annotation_text(annotations, WINDOW_SECONDS)
    if raw_window is not None:
        window = _parse_window(raw_window)
        if window is None:
            dropped.append((WINDOW_SECONDS, "not a number >= 0"))
    fault = model.Fault(xid=xid, gpu_index=gpu_index, gpu_uuid=text(GPU_UUID), dra=dra, check=text(CHECK),
                        container=text(CONTAINER), pods=pods)
    raw_healthy = annotation_text(annotations, DEVICE_HEALTHY)
    healthy = False
    if raw_healthy is not None:
        if raw_healthy.lower() not in (TRUE, FALSE):
            return Refused(REFUSED_DEVICE_HEALTHY, DEVICE_HEALTHY, f"not true or false: {raw_healthy[:64]!r}")
        healthy = raw_healthy.lower() == TRUE
        if healthy and not (cleared and dra is not None):
            return Refused(REFUSED_DEVICE_HEALTHY, DEVICE_HEALTHY,
                           f"needs {FAULT_CLEARED}: true and a readable DRA driver, pool and device")
    need = annotation_text(annotations, NEED_RECOVERY)
    return Decoded(need_recovery=need is not None and need.lower() == TRUE, recommended=recommended,
                   cleared=cleared, fault=fault, occurrences=occurrences or 1,
                   window_seconds=0.0 if window is None else window, detector=text(DETECTOR),
                   device_healthy=healthy, evidence=evidence, dropped=tuple(dropped))


# ---------------------------------------------------------------------------------------------- condition

def condition_status(faulty: bool) -> str:
    """The status of the agent's condition: `False` when the agent judges the node must be cordoned."""
    return CONDITION_FAULTY if faulty else CONDITION_HEALTHY


def condition_recommendation(condition_type: str, status: str, *,
                             agent_condition_type: str = AGENT_CONDITION_TYPE) -> model.Action | None:
    """What a Node condition in `status` recommends: the agent's condition `False` recommends
    `cordon-node` (the agent sets it only for node-level faults); any other condition recommends
    nothing and leaves the decision to the controller's rules."""
    if condition_type == agent_condition_type and status == CONDITION_FAULTY:
        return model.Action.CORDON_NODE
    return None
