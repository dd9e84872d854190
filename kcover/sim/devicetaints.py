"""DeviceTaintRules (KEP-5055) as kube-apiserver 1.36 serves them: `resource.k8s.io/v1beta2`, validation, defaults.

Owns what the apiserver's DeviceTaintRule strategy does before storage, as seen on a real 1.36 server
with the `DRADeviceTaintRules` gate and `--runtime-config=resource.k8s.io/v1beta2=true`: `spec.taint.key`
a qualified name, `spec.taint.effect` one of NoExecute, NoSchedule, None (PreferNoSchedule is a node
effect and refused), the selector's `device` a lowercase RFC 1123 label, and `spec.taint.timeAdded`
set when missing. Refusals are `status.ApiError`s with the real reasons and causes (through
`strategy`). Holds no state; no eviction (no device taint eviction controller runs in the sim).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from kcover.aio import clock as clocks

Obj = dict[str, Any]
Cause = tuple[str, str, str]

KEY = "devicetaintrules.resource.k8s.io"
EFFECTS = ("NoExecute", "NoSchedule", "None")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_NAME_RULE = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
              "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
              "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
_LABEL_RULE = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
               "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
               "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')")


def errors(obj: Obj) -> list[Cause]:
    """The causes kube-apiserver gives for an invalid DeviceTaintRule spec (metadata is checked elsewhere)."""
    spec = obj.get("spec") or {}
    taint = spec.get("taint") or {}
    out: list[Cause] = []
    key = str(taint.get("key") or "")
    name = key.rsplit("/", 1)[-1]
    if not name:
        out.append(("FieldValueInvalid", "spec.taint.key", f'Invalid value: "{key}": name part must be non-empty'))
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        out.append(("FieldValueInvalid", "spec.taint.key", f'Invalid value: "{key}": {_NAME_RULE}'))
    effect = taint.get("effect")
    if not effect:
        out.append(("FieldValueRequired", "spec.taint.effect", "Required value"))
    elif effect not in EFFECTS:
        out.append(("FieldValueNotSupported", "spec.taint.effect",
                    f'Unsupported value: "{effect}": supported values: "NoExecute", "NoSchedule", "None"'))
    device = (spec.get("deviceSelector") or {}).get("device")
    if device is not None and (not isinstance(device, str) or len(device) > 63 or not _LABEL.match(device)):
        out.append(("FieldValueInvalid", "spec.deviceSelector.device", f'Invalid value: "{device}": {_LABEL_RULE}'))
    return out


def defaults(obj: Obj, now: dt.datetime) -> Obj:
    """`spec.taint.timeAdded` set to now when the writer left it out (mutates and returns `obj`)."""
    taint = (obj.get("spec") or {}).get("taint")
    if isinstance(taint, dict) and not taint.get("timeAdded"):
        taint["timeAdded"] = clocks.rfc3339(now)
    return obj
