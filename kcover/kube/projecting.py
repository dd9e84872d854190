"""Projecting: raw API dicts in, the slim records of `projections` out.

Owns the pure functions that build each record kcover keeps (`pod`, `node`, `workload`, `namespace`,
`config_map`, `resource_slice`, `recovery_event`, and a pod's or workload's controller, `controller_of`)
from the API server's JSON. Strings repeated across objects (namespaces, node names, label values,
reasons, owner names) are interned, so 150,000 cached pods stay under a few hundred MiB. It does not own
the records' shape or the names they keep (`projections`), nor where they are kept (`caching`).

It does no I/O and never raises on odd input: a missing or mistyped field becomes its empty value.
A projection returns None for an object kcover does not keep (an Event without the recovery
annotation), which the reflector treats as "not in the store".
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from kcover import codec, kinds
from kcover.kube import projections as proj

_intern = sys.intern


# --------------------------------------------------------------------------------------- helpers

def _d(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _s(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _i(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _l(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _kept(mapping: Any, keep: frozenset[str] | None = None, prefix: str = "") -> proj.Pairs:
    if not isinstance(mapping, dict) or not mapping:
        return ()
    out = []
    for key, value in mapping.items():
        if (keep is not None and key in keep) or (prefix and key.startswith(prefix)):
            out.append((_intern(key), _intern(value if isinstance(value, str) else "")))
    if not out:
        return ()
    out.sort()
    return tuple(out)


def controller_of(meta: Mapping[str, Any]) -> proj.OwnerRef | None:
    refs = meta.get("ownerReferences")
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if isinstance(ref, dict) and ref.get("controller") is True:
            return proj.OwnerRef(_intern(_s(ref.get("kind"))), _intern(_s(ref.get("name"))),
                                 _intern(_s(ref.get("uid"))), _intern(_s(ref.get("apiVersion"))))
    return None


def _terminated(state: Any) -> proj.Terminated | None:
    term = state.get("terminated") if isinstance(state, dict) else None
    if not isinstance(term, dict):
        return None
    return proj.Terminated(_intern(_s(term.get("reason"))), _i(term.get("exitCode")), _s(term.get("finishedAt")))


def _resources(status: Mapping[str, Any]) -> tuple[proj.ResourceHealth, ...]:
    entries = status.get("allocatedResourcesStatus")
    if not isinstance(entries, list) or not entries:
        return ()
    out = []
    for entry in entries:
        entry = _d(entry)
        claim = _intern(_s(entry.get("name")))
        for res in _l(entry.get("resources")):
            res = _d(res)
            out.append(proj.ResourceHealth(claim, _intern(_s(res.get("resourceID"))),
                                           _intern(_s(res.get("health")) or "Unknown"), _s(res.get("message"))))
    return tuple(out)


def _container(status: Any, init: bool) -> proj.ContainerState:
    if not isinstance(status, dict):
        status = _NOTHING
    state = status.get("state")
    waiting = state.get("waiting") if isinstance(state, dict) else None
    return proj.ContainerState(_intern(_s(status.get("name"))), init, _i(status.get("restartCount")),
                               _terminated(state), _terminated(status.get("lastState")),
                               _resources(status),
                               (_intern(_s(waiting.get("reason"))), _s(waiting.get("message")))
                               if isinstance(waiting, dict) and waiting else None)


def _unschedulable(status: Mapping[str, Any]) -> str:
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        return ""
    for cond in conditions:
        if isinstance(cond, dict) and cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return _s(cond.get("message")) or _s(cond.get("reason")) or "Unschedulable"
    return ""


_NOTHING: Mapping[str, Any] = MappingProxyType({})
"""What a missing or mistyped object reads as (never written to)."""


# ------------------------------------------------------------------------------------ projections

def pod(raw: Mapping[str, Any]) -> proj.Pod:
    # the reflector projects every pod change: the helpers `_d`/`_s`/`_l` are inlined on the common path
    meta = raw.get("metadata")
    if not isinstance(meta, dict):
        meta = _NOTHING
    spec = raw.get("spec")
    if not isinstance(spec, dict):
        spec = _NOTHING
    status = raw.get("status")
    if not isinstance(status, dict):
        status = _NOTHING
    inits, regular = status.get("initContainerStatuses"), status.get("containerStatuses")
    containers = [_container(c, True) for c in inits] if isinstance(inits, list) else []
    if isinstance(regular, list):
        containers += [_container(c, False) for c in regular]
    return proj.Pod(
        uid=_s(meta.get("uid")),
        rv=_s(meta.get("resourceVersion")),
        namespace=_intern(_s(meta.get("namespace"))),
        name=_s(meta.get("name")),
        node=_intern(_s(spec.get("nodeName"))),
        phase=_intern(_s(status.get("phase"))),
        labels=_kept(meta.get("labels"), proj.KEPT_POD_LABELS),
        annotations=_kept(meta.get("annotations"), prefix=codec.PREFIX),
        owner=controller_of(meta),
        deletion_timestamp=_s(meta.get("deletionTimestamp")),
        restart_policy=_intern(_s(spec.get("restartPolicy")) or "Always"),
        containers=tuple(containers),
        unschedulable=_unschedulable(status),
        created=_s(meta.get("creationTimestamp")),
        devices=_devices(spec),
    )


def _devices(spec: Mapping[str, Any]) -> tuple[str, ...]:
    names: set[str] = set()
    for group in (spec.get("initContainers"), spec.get("containers")):
        if not isinstance(group, list):
            continue
        for c in group:
            resources = c.get("resources") if isinstance(c, dict) else None
            if not isinstance(resources, dict):
                continue
            for part in (resources.get("limits"), resources.get("requests")):
                if isinstance(part, dict):
                    for name, value in part.items():
                        if "/" in name and _quantity(value) > 0:
                            names.add(name)
    claims = spec.get("resourceClaims")
    if isinstance(claims, list) and claims:
        names.add(proj.DRA_CLAIMS)
    return tuple(sorted(_intern(n) for n in names)) if names else ()


def _quantity(value: Any) -> int:
    if isinstance(value, int):
        return value
    try:
        return int(str(value))
    except ValueError:
        return 0


def _extended(capacity: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    out = []
    for name, value in capacity.items():
        if "/" in name:
            count = _quantity(value)
            if count > 0:
                out.append((_intern(name), count))
    out.sort()
    return tuple(out)


def node(raw: Mapping[str, Any]) -> proj.Node:
    meta = _d(raw.get("metadata"))
    spec = _d(raw.get("spec"))
    status = _d(raw.get("status"))
    capacity = _d(status.get("capacity"))
    return proj.Node(
        uid=_s(meta.get("uid")),
        rv=_s(meta.get("resourceVersion")),
        name=_intern(_s(meta.get("name"))),
        unschedulable=spec.get("unschedulable") is True,
        taints=tuple(proj.Taint(_intern(_s(t.get("key"))), _intern(_s(t.get("value"))), _intern(_s(t.get("effect"))))
                     for t in map(_d, _l(spec.get("taints")))),
        conditions=tuple(proj.Condition(_intern(_s(c.get("type"))), _intern(_s(c.get("status"))),
                                        _intern(_s(c.get("reason"))), _s(c.get("message")),
                                        _s(c.get("lastTransitionTime")))
                         for c in map(_d, _l(status.get("conditions")))),
        annotations=_kept(meta.get("annotations"), prefix=codec.PREFIX),
        extended_resources=_extended(capacity),
        addresses=tuple(_s(a.get("address")) for a in map(_d, _l(status.get("addresses")))
                        if a.get("type") in ("InternalIP", "ExternalIP") and a.get("address")),
    )


_TERMINAL = frozenset(("Succeeded", "Failed", "Complete", "Completed"))


def workload(raw: Mapping[str, Any]) -> proj.Workload:
    meta = _d(raw.get("metadata"))
    kind = _intern(_s(raw.get("kind")))
    api_version = _intern(_s(raw.get("apiVersion")))
    table = kinds.of(proj.group_of(api_version), kind)
    policies, max_restarts = table.restart_fields(_d(raw.get("spec"))) if table is not None else ((), None)
    policies = tuple((_intern(k), _intern(v)) for k, v in policies)
    conditions = _l(_d(raw.get("status")).get("conditions"))
    finished = any(_d(c).get("type") in _TERMINAL and _d(c).get("status") == "True" for c in conditions)
    return proj.Workload(
        uid=_s(meta.get("uid")),
        rv=_s(meta.get("resourceVersion")),
        kind=kind,
        api_version=api_version,
        namespace=_intern(_s(meta.get("namespace"))),
        name=_intern(_s(meta.get("name"))),
        labels=_kept(meta.get("labels"), frozenset((proj.OPT_IN_LABEL,))),
        annotations=_kept(meta.get("annotations"), prefix=codec.PREFIX),
        owner=controller_of(meta),
        restart_policies=policies,
        max_restarts=max_restarts,
        finished=finished,
        own=table.own_policy(_d(raw.get("spec")), _d(raw.get("status"))) if table is not None else kinds.NO_POLICY,
    )


def namespace(raw: Mapping[str, Any]) -> proj.Namespace:
    meta = _d(raw.get("metadata"))
    return proj.Namespace(uid=_s(meta.get("uid")), rv=_s(meta.get("resourceVersion")), name=_intern(_s(meta.get("name"))),
                          labels=_kept(meta.get("labels"), prefix=codec.PREFIX),
                          annotations=_kept(meta.get("annotations"), prefix=codec.PREFIX))


def config_map(raw: Mapping[str, Any]) -> proj.ConfigMap:
    meta = _d(raw.get("metadata"))
    return proj.ConfigMap(uid=_s(meta.get("uid")), rv=_s(meta.get("resourceVersion")),
                          namespace=_s(meta.get("namespace")), name=_s(meta.get("name")),
                          annotations=_kept(meta.get("annotations"), prefix=codec.PREFIX))


def resource_slice(raw: Mapping[str, Any]) -> proj.ResourceSlice:
    meta = _d(raw.get("metadata"))
    spec = _d(raw.get("spec"))
    return proj.ResourceSlice(
        uid=_s(meta.get("uid")),
        rv=_s(meta.get("resourceVersion")),
        name=_s(meta.get("name")),
        driver=_intern(_s(spec.get("driver"))),
        node=_intern(_s(spec.get("nodeName"))),
        pool=_intern(_s(_d(spec.get("pool")).get("name"))),
        devices=frozenset(_intern(name) for d in _l(spec.get("devices"))
                          if isinstance(d, Mapping) and (name := _s(d.get("name")))),
    )


def recovery_event(raw: Mapping[str, Any]) -> proj.KubeEvent | None:
    """Project a core/v1 Event, or None unless it carries `kcover.io/need-recovery: "true"`,
    `kcover.io/device-healthy: "true"` or a `kcover.io/evidence` (the event watcher judges all three)."""
    meta = _d(raw.get("metadata"))
    annotations = _d(meta.get("annotations"))
    if _s(annotations.get(codec.NEED_RECOVERY)).lower() != "true" \
            and _s(annotations.get(codec.DEVICE_HEALTHY)).lower() != "true" and not _s(annotations.get(codec.EVIDENCE)):
        return None
    involved = _d(raw.get("involvedObject"))
    series = _d(raw.get("series"))
    return proj.KubeEvent(
        uid=_s(meta.get("uid")),
        rv=_s(meta.get("resourceVersion")),
        namespace=_intern(_s(meta.get("namespace"))),
        name=_s(meta.get("name")),
        involved=proj.InvolvedObject(_intern(_s(involved.get("kind"))), _intern(_s(involved.get("namespace"))),
                                     _s(involved.get("name")), _s(involved.get("uid"))),
        reason=_intern(_s(raw.get("reason"))),
        message=_s(raw.get("message")),
        type=_intern(_s(raw.get("type"))),
        reporting_controller=_intern(_s(raw.get("reportingComponent") or raw.get("reportingController"))),
        source_component=_intern(_s(_d(raw.get("source")).get("component"))),
        event_count=_i(raw.get("count")),
        series_count=_i(series.get("count")),
        last_timestamp=_s(raw.get("lastTimestamp")),
        event_time=_s(raw.get("eventTime")),
        series_last_observed=_s(series.get("lastObservedTime")),
        first_timestamp=_s(raw.get("firstTimestamp")),
        reporting_instance=_s(raw.get("reportingInstance")),
        source_host=_s(_d(raw.get("source")).get("host")),
        annotations=_kept(meta.get("annotations"), prefix=codec.PREFIX),
    )
