"""Per-kind write rules of the simulated API server: defaults, status/spec split and validation.

Owns what the apiserver's registry strategies do before an object reaches storage: dropping status
on create and on main-resource writes of kinds with a status subresource, keeping everything but
status on `/status` writes, pod defaults and pod-spec immutability, pod status validation of
KEP-4680 `allocatedResourcesStatus` (names must be a resource the container has), node taint
validation and the TaintNodesByCondition admission plugin's `node.kubernetes.io/not-ready:NoSchedule`
taint on node create (API creates only: objects seeded with `Store.create` stand for state already in
etcd and never pass admission), Event rules (namespace agreement, reporting fields, lengths) and the events.k8s.io/v1 <-> core/v1
conversion, and MicroTime parsing (400 when not exactly six fractional digits plus a timezone).
Custom resources are decoded and held to their CRD's schema by `customresources` (pruning, defaults,
the schema's causes joined with the metadata's in one 422). Every refusal is a `status.ApiError` with the real reason, message shape and `details.causes`.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

from kcover.sim import customresources, devicetaints, registry, status

Obj = dict[str, Any]
Cause = tuple[str, str, str]  # (reason, field, message)

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_MICRO_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$")
MICRO_TIME_FIELDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "events": (("eventTime",), ("series", "lastObservedTime")),
    "leases.coordination.k8s.io": (("spec", "acquireTime"), ("spec", "renewTime")),
}
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
NOT_READY_TAINT: Obj = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
"""What kube-apiserver's TaintNodesByCondition admission plugin appends to every Node it creates."""
RESOURCE_HEALTH = ("Healthy", "Unhealthy", "Unknown")
HEALTH_MESSAGE_MAX_BYTES = 1024
CLAIM_NAME_MESSAGE = ("must match one of the container's resource claims in a format 'claim:<claimName>/<request>' "
                      "or 'claim:<claimName>' if request is empty")
RESOURCE_NAME_MESSAGE = "must match one of the container's resource requests"
POD_MUTABLE_MESSAGE = ("Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
                       "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
                       "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
                       "(allow it to be set to 1 if it was previously negative)")


def _qualified_name_errors(value: str, fld: str) -> list[Cause]:
    name = value.rsplit("/", 1)[-1]
    prefix = value[: -len(name) - 1] if "/" in value else ""
    out: list[Cause] = []
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        out.append(("FieldValueInvalid", fld, f'Invalid value: "{value}": name part must consist of '
                    "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
                    "character"))
    if prefix and (len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
        out.append(("FieldValueInvalid", fld, f'Invalid value: "{value}": prefix part a lowercase RFC 1123 '
                    "subdomain must consist of lower case alphanumeric characters, '-' or '.'"))
    return out


def _meta_errors(res: registry.Resource, obj: Obj) -> list[Cause]:
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    out: list[Cause] = []
    if res.key == "namespaces":
        if len(name) > 63 or not _LABEL.match(name):
            out.append(("FieldValueInvalid", "metadata.name", f'Invalid value: "{name}": a lowercase RFC 1123 '
                        "label must consist of lower case alphanumeric characters or '-', and must start and "
                        "end with an alphanumeric character"))
    elif len(name) > 253 or not _SUBDOMAIN.match(name):
        out.append(("FieldValueInvalid", "metadata.name", f'Invalid value: "{name}": a lowercase RFC 1123 '
                    "subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start "
                    "and end with an alphanumeric character"))
    for key, value in (meta.get("labels") or {}).items():
        out += _qualified_name_errors(str(key), "metadata.labels")
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            out.append(("FieldValueInvalid", "metadata.labels", f'Invalid value: "{value}": a valid label must '
                        "be an empty string or consist of alphanumeric characters, '-', '_' or '.'"))
    return out


def _raise(res: registry.Resource, obj: Obj, causes: list[Cause]) -> None:
    if causes:
        name = str((obj.get("metadata") or {}).get("name", ""))
        raise status.invalid(res.kind, res.group, name, causes)


def check_micro_times(res: registry.Resource, obj: Obj) -> None:
    """400 for a MicroTime that is not exactly six fractional digits plus a timezone (a decode error)."""
    for path in MICRO_TIME_FIELDS.get(res.key, ()):
        cur: Any = obj
        for part in path:
            cur = cur.get(part) if isinstance(cur, dict) else None
        if cur is None:
            continue
        if not isinstance(cur, str) or not _MICRO_TIME.match(cur):
            raise status.bad_request(
                f'{res.kind} in version "{res.version}" cannot be handled as a {res.kind}: parsing time '
                f'"{cur}" as "2006-01-02T15:04:05.000000Z07:00": cannot parse "{cur}" as MicroTime')


# --- events -----------------------------------------------------------------------------------

def _bytes(text: str) -> int:
    """Length as the API server measures it: Go's `len` of the UTF-8 string, in bytes, not characters."""
    return len(text.encode("utf-8", "surrogatepass"))


_NEW_TO_CORE = {"regarding": "involvedObject", "note": "message", "reportingController": "reportingComponent",
                "deprecatedSource": "source", "deprecatedFirstTimestamp": "firstTimestamp",
                "deprecatedLastTimestamp": "lastTimestamp", "deprecatedCount": "count"}
_CORE_TO_NEW = {v: k for k, v in _NEW_TO_CORE.items()}


def event_to_core(obj: Obj) -> Obj:
    """An events.k8s.io/v1 Event in the stored (core/v1) shape."""
    out = {_NEW_TO_CORE.get(k, k): copy.deepcopy(v) for k, v in obj.items()}
    out["apiVersion"], out["kind"] = "v1", "Event"
    return out


def event_from_core(obj: Obj) -> Obj:
    """A stored core/v1 Event as events.k8s.io/v1 shows it."""
    out = {_CORE_TO_NEW.get(k, k): v for k, v in obj.items()}
    out["apiVersion"], out["kind"] = "events.k8s.io/v1", "Event"
    return out


def _event_errors(obj: Obj, *, new_api: bool) -> list[Cause]:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace", "")
    involved = obj.get("involvedObject") or {}
    inv_ns = involved.get("namespace", "")
    controller_field = "reportingController" if new_api else "reportingComponent"
    note_field = "note" if new_api else "message"
    inv_field = "regarding.namespace" if new_api else "involvedObject.namespace"
    out: list[Cause] = []
    mismatch = ("FieldValueInvalid", inv_field, f'Invalid value: "{inv_ns}": does not match event.namespace')
    if not obj.get("eventTime"):
        if new_api:
            out.append(("FieldValueRequired", "eventTime", "Required value"))
        if (inv_ns and namespace != inv_ns) or (not inv_ns and namespace not in ("", "default")):
            out.append(mismatch)
        if not new_api:
            return out
    elif not inv_ns and namespace not in ("default", "kube-system"):
        out.append(mismatch)
    controller = str(obj.get("reportingComponent") or "")
    if not controller:
        out.append(("FieldValueRequired", controller_field, "Required value"))
    else:
        out += _qualified_name_errors(controller, controller_field)
    instance = str(obj.get("reportingInstance") or "")
    if not instance:
        out.append(("FieldValueRequired", "reportingInstance", "Required value"))
    elif _bytes(instance) > 128:
        out.append(("FieldValueInvalid", "reportingInstance", 'Invalid value: "": can have at most 128 characters'))
    for fld in ("action", "reason"):
        value = str(obj.get(fld) or "")
        if not value:
            out.append(("FieldValueRequired", fld, "Required value"))
        elif _bytes(value) > 128:
            out.append(("FieldValueInvalid", fld, 'Invalid value: "": can have at most 128 characters'))
    if _bytes(str(obj.get("message") or "")) > 1024:
        out.append(("FieldValueInvalid", note_field, 'Invalid value: "": can have at most 1024 characters'))
    if new_api and obj.get("type") not in ("Normal", "Warning"):
        out.append(("FieldValueInvalid", "type", f'Invalid value: "": has invalid value: {obj.get("type", "")}'))
    return out


# --- pods and nodes ---------------------------------------------------------------------------

def _pod_create_errors(obj: Obj) -> list[Cause]:
    containers = (obj.get("spec") or {}).get("containers")
    if not containers:
        return [("FieldValueRequired", "spec.containers", "Required value")]
    out: list[Cause] = []
    seen: set[str] = set()
    for i, c in enumerate(containers):
        name = str(c.get("name") or "")
        if not name:
            out.append(("FieldValueRequired", f"spec.containers[{i}].name", "Required value"))
        elif name in seen:
            out.append(("FieldValueDuplicate", f"spec.containers[{i}].name", f'Duplicate value: "{name}"'))
        seen.add(name)
        if not c.get("image"):
            out.append(("FieldValueRequired", f"spec.containers[{i}].image", "Required value"))
    return out


def _taint_errors(obj: Obj) -> list[Cause]:
    # kube-apiserver reports taint errors under "metadata.taints" (its node validation starts from the
    # metadata path), not "spec.taints": mimicked, as seen on a real server.
    out: list[Cause] = []
    seen: set[tuple[str, str]] = set()
    for i, taint in enumerate((obj.get("spec") or {}).get("taints") or []):
        key, effect = str(taint.get("key") or ""), str(taint.get("effect") or "")
        if not key:
            out.append(("FieldValueRequired", f"metadata.taints[{i}].key", "Required value"))
        else:
            out += _qualified_name_errors(key, f"metadata.taints[{i}].key")
        if not effect:
            out.append(("FieldValueRequired", f"metadata.taints[{i}].effect", "Required value"))
        elif effect not in TAINT_EFFECTS:
            out.append(("FieldValueNotSupported", f"metadata.taints[{i}].effect",
                        f'Unsupported value: "{effect}": supported values: "NoSchedule", "PreferNoSchedule", '
                        f'"NoExecute"'))
        if (key, effect) in seen:
            out.append(("FieldValueDuplicate", f"metadata.taints[{i}]",
                        "Duplicate value: taints must be unique by key and effect pair"))
        seen.add((key, effect))
    return out


def not_ready_taint_added(obj: Obj) -> Obj:
    """`obj` (a Node create body) as TaintNodesByCondition admits it: `NOT_READY_TAINT` appended to
    spec.taints unless a taint with its key and effect (any value) is there already. Whatever the
    node's status says: the node lifecycle controller, not admission, removes it once the node is Ready."""
    out = copy.deepcopy(obj)
    spec = out.get("spec")
    if not isinstance(spec, dict):
        spec = out["spec"] = {}
    taints = spec.get("taints") or []
    if not any(isinstance(t, dict) and t.get("key") == NOT_READY_TAINT["key"]
               and t.get("effect") == NOT_READY_TAINT["effect"] for t in taints):
        spec["taints"] = [*taints, dict(NOT_READY_TAINT)]
    return out


def _allocatable_names(container: Obj) -> tuple[set[str], set[str]]:
    """(claim names a status may report, resource names a status may report) for one container."""
    resources = container.get("resources") or {}
    claims: set[str] = set()
    for claim in resources.get("claims") or []:
        name, request = str(claim.get("name") or ""), str(claim.get("request") or "")
        claims.add(f"{name}/{request}" if request else name)
    # A real server defaults requests from limits on create, so its check against requests covers
    # limits too; objects seeded through the store skip defaulting, hence the union.
    names = {str(k) for k in (resources.get("requests") or {})} | {str(k) for k in (resources.get("limits") or {})}
    return claims, names


def _allocated_errors(statuses: Any, containers: Any, fld: str) -> list[Cause]:
    out: list[Cause] = []
    by_name = {str(c.get("name")): c for c in reversed(containers or []) if isinstance(c, dict)}
    for i, cs in enumerate(statuses or []):
        allocated = cs.get("allocatedResourcesStatus") if isinstance(cs, dict) else None
        if not allocated:
            continue
        container = by_name.get(str(cs.get("name")))  # a status of no such container is not checked
        for j, entry in enumerate(allocated):
            at = f"{fld}[{i}].allocatedResourcesStatus[{j}]"
            name = str(entry.get("name") or "")
            if container is not None:
                claims, names = _allocatable_names(container)
                if name.startswith("claim:"):
                    if name[len("claim:"):] not in claims:
                        out.append(("FieldValueInvalid", f"{at}.name", f'Invalid value: "{name}": {CLAIM_NAME_MESSAGE}'))
                elif name not in names:
                    out.append(("FieldValueInvalid", f"{at}.name", f'Invalid value: "{name}": {RESOURCE_NAME_MESSAGE}'))
            seen: set[str] = set()
            for k, res in enumerate(entry.get("resources") or []):
                health = str(res.get("health") or "")
                if health not in RESOURCE_HEALTH:
                    out.append(("FieldValueNotSupported", f"{at}.resources[{k}].health",
                                f'Unsupported value: "{health}": supported values: "Healthy", "Unhealthy", "Unknown"'))
                if len(str(res.get("message") or "").encode()) > HEALTH_MESSAGE_MAX_BYTES:
                    out.append(("FieldValueTooLong", f"{at}.resources[{k}].message",
                                f"Too long: may not be more than {HEALTH_MESSAGE_MAX_BYTES} bytes"))
                rid = str(res.get("resourceID") or "")
                if rid in seen:
                    out.append(("FieldValueDuplicate", f"{at}.resources[{k}].resourceID", f'Duplicate value: "{rid}"'))
                seen.add(rid)
    return out


def pod_status_errors(pod: Obj) -> list[Cause]:
    """What kube-apiserver refuses in a pod's status (checked on /status writes), as seen on 1.36:
    `allocatedResourcesStatus[].name` must be `claim:<claim>` or `claim:<claim>/<request>` of one of
    the container's `resources.claims`, or a resource name of its requests (limits); health must be
    Healthy, Unhealthy or Unknown; a message at most 1024 bytes; resourceIDs unique per entry.
    Container statuses are checked against containers, init ones against init containers (a status
    naming no such container is skipped); ephemeral container statuses may not have the field."""
    spec, st = pod.get("spec") or {}, pod.get("status") or {}
    out = _allocated_errors(st.get("containerStatuses"), spec.get("containers"), "status.containerStatuses")
    out += _allocated_errors(st.get("initContainerStatuses"), spec.get("initContainers"),
                             "status.initContainerStatuses")
    for i, cs in enumerate(st.get("ephemeralContainerStatuses") or []):
        if isinstance(cs, dict) and cs.get("allocatedResourcesStatus"):
            out.append(("FieldValueForbidden", f"status.ephemeralContainerStatuses[{i}].allocatedResourcesStatus",
                        "Forbidden: must not be specified in container status"))
    return out


def check_pod_status(pod: Obj) -> None:
    """422 Invalid, as kube-apiserver answers a pod /status write, when `pod_status_errors` finds any."""
    causes = pod_status_errors(pod)
    if causes:
        raise status.invalid("Pod", "", str((pod.get("metadata") or {}).get("name", "")), causes)


def _pod_spec_frozen(spec: Obj) -> Obj:
    frozen = copy.deepcopy(spec)
    for group in ("containers", "initContainers"):
        for c in frozen.get(group) or []:
            c.pop("image", None)
    for mutable in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds", "schedulingGates"):
        frozen.pop(mutable, None)
    return frozen


def _validate(res: registry.Resource, obj: Obj, *, new_api: bool, schema_causes: Sequence[Cause] = ()) -> None:
    check_micro_times(res, obj)
    causes = _meta_errors(res, obj) if res.key != "events" else []
    causes += schema_causes
    if res.key == "nodes":
        causes += _taint_errors(obj)
    elif res.key == "events":
        causes += _event_errors(obj, new_api=new_api)
    elif res.key == devicetaints.KEY:
        causes += devicetaints.errors(obj)
    elif res.key == "leases.coordination.k8s.io":
        duration = (obj.get("spec") or {}).get("leaseDurationSeconds")
        if duration is not None and (not isinstance(duration, int) or duration <= 0):
            causes.append(("FieldValueInvalid", "spec.leaseDurationSeconds",
                           f"Invalid value: {duration}: must be greater than 0"))
    _raise(res, obj, causes)


def prepare_create(res: registry.Resource, obj: Obj, *, new_api: bool = False) -> Obj:
    """Defaults and validation for a create through the API; returns the object to store."""
    obj = copy.deepcopy(obj)
    schema_causes: list[Cause] = []
    if res.schema is not None:  # a custom resource: decoded (pruned, defaulted), status dropped, then validated
        obj = customresources.decode(res, obj)
        if res.has_status:
            obj.pop("status", None)
        schema_causes = customresources.create_causes(res, obj)
    meta = obj.setdefault("metadata", {})
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = str(meta["generateName"]) + "xxxxx"  # placeholder for validation only
        _validate(res, obj, new_api=new_api, schema_causes=schema_causes)
        meta.pop("name")
    else:
        _validate(res, obj, new_api=new_api, schema_causes=schema_causes)
    if res.key == "pods":
        _raise(res, obj, _pod_create_errors(obj))
        spec = obj["spec"]
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("schedulerName", "default-scheduler")
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    elif res.key == "nodes":
        obj = not_ready_taint_added(obj)
    elif res.key == "namespaces":
        obj["spec"] = {"finalizers": ["kubernetes"]}
        obj["status"] = {"phase": "Active"}
    elif res.has_status and res.key != "nodes":
        obj.pop("status", None)
    return customresources.encoded(obj) if res.schema is not None else obj


def prepare_update(res: registry.Resource, new: Obj, old: Obj, *, subresource: str = "",
                   new_api: bool = False) -> Obj:
    """Merge an incoming full object with the stored one according to the subresource written."""
    new = customresources.decode(res, new) if res.schema is not None else copy.deepcopy(new)
    if subresource == "status":
        if not res.strategic_merge:  # custom resources: a status write changes nothing else
            result = copy.deepcopy(old)
            result["metadata"]["resourceVersion"] = (new.get("metadata") or {}).get(
                "resourceVersion", old["metadata"]["resourceVersion"])
        else:  # built-in kinds: metadata may change, spec may not
            result = {k: v for k, v in new.items() if k in ("metadata", "apiVersion", "kind")}
            result.update({k: copy.deepcopy(v) for k, v in old.items() if k not in ("metadata", "status")})
            if res.key == "pods":
                result["metadata"].pop("ownerReferences", None)
                if "ownerReferences" in old["metadata"]:
                    result["metadata"]["ownerReferences"] = copy.deepcopy(old["metadata"]["ownerReferences"])
        if "status" in new:
            result["status"] = new["status"]
        else:
            result.pop("status", None)
        new = result
    elif res.has_status:
        if "status" in old:
            new["status"] = copy.deepcopy(old["status"])
        else:
            new.pop("status", None)
    schema_causes = [] if res.schema is None else customresources.update_causes(res, new, old, subresource=subresource)
    _validate(res, new, new_api=new_api, schema_causes=schema_causes)
    if res.schema is not None:
        return customresources.encoded(new)
    if res.key == "pods" and subresource == "status":
        _raise(res, new, pod_status_errors(new))
    if res.key == "pods" and subresource != "status":
        old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
        if _pod_spec_frozen(old_spec) != _pod_spec_frozen(new_spec):
            _raise(res, new, [("FieldValueForbidden", "spec", POD_MUTABLE_MESSAGE)])
        old_tol = old_spec.get("tolerations") or []
        if old_tol and new_spec.get("tolerations", [])[: len(old_tol)] != old_tol:
            _raise(res, new, [("FieldValueForbidden", "spec.tolerations", POD_MUTABLE_MESSAGE)])
    return new
