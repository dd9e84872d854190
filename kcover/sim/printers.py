"""Server-side printers of built-in kinds: the Table cells kube-apiserver computes for `kubectl get`.

Owns the cell rules of kubernetes/pkg/printers/internalversion (1.36) for the built-in kinds kubectl
users touch here: pods (READY, STATUS as the pod printer derives it from phase, init and container
states, deletion; RESTARTS with "(<age> ago)"; IP, NODE, NOMINATED NODE, READINESS GATES), nodes
(Ready/NotReady/Unknown plus SchedulingDisabled, roles from labels, kubelet version, addresses, OS),
core and events.k8s.io Events (LAST SEEN, TYPE, REASON, OBJECT, SUBOBJECT, SOURCE, MESSAGE, FIRST SEEN,
COUNT, NAME), namespaces, configmaps, secrets, batch Jobs, Leases, PodDisruptionBudgets,
ResourceSlices and DeviceTaintRules. Column definitions are the real server's, recorded by
scripts/record-sim-documents (recorded/table-columns.json); a server always prints wide rows and
kubectl hides the priority-1 columns without `-o wide`. Holds no state; a malformed object yields
"<unknown>"-style cells, never an exception.
"""

from __future__ import annotations

import datetime as dt
import functools
import importlib.resources
from collections.abc import Callable
from typing import Any

import orjson

Obj = dict[str, Any]
Cells = list[Any]
Printer = Callable[[Obj, dt.datetime], Cells]
_ROLE_PREFIX = "node-role.kubernetes.io/"


@functools.cache
def recorded_columns() -> dict[str, list[Obj]]:
    """Resource key -> kube-apiserver's columnDefinitions (read once; read-only)."""
    data = importlib.resources.files("kcover.sim").joinpath("recorded/table-columns.json").read_bytes()
    columns: dict[str, list[Obj]] = orjson.loads(data)
    return columns


def _d(value: Any) -> Obj:
    return value if isinstance(value, dict) else {}


def _l(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _time(value: Any) -> dt.datetime | None:
    if not value or not isinstance(value, str):
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def human_duration(seconds: float) -> str:
    """apimachinery's `duration.HumanDuration`: the largest two units that matter."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        rest = (s % 3600) // 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = hours // 24
        return f"{days // 365}y{days % 365}d" if days % 365 else f"{days // 365}y"
    return f"{hours // 24 // 365}y"


def since(value: Any, now: dt.datetime) -> str:
    """`translateTimestampSince`: the age of an RFC 3339 time, "<unknown>" when unset."""
    at = _time(value)
    return "<unknown>" if at is None else human_duration((now - at).total_seconds())


def _age(obj: Obj, now: dt.datetime) -> str:
    return since(_d(obj.get("metadata")).get("creationTimestamp"), now)


def _name(obj: Obj) -> str:
    return str(_d(obj.get("metadata")).get("name") or "")


def _restartable_init(container: Obj | None) -> bool:
    return bool(container) and _d(container).get("restartPolicy") == "Always"


def pod(obj: Obj, now: dt.datetime) -> Cells:
    spec, st = _d(obj.get("spec")), _d(obj.get("status"))
    meta = _d(obj.get("metadata"))
    restarts = restartable_restarts = ready = 0
    last_restart: dt.datetime | None = None
    last_restartable: dt.datetime | None = None
    total = len(_l(spec.get("containers")))
    phase = str(st.get("phase") or "")
    reason = str(st.get("reason") or "") or phase
    for cond in _l(st.get("conditions")):
        if _d(cond).get("type") == "PodScheduled" and _d(cond).get("reason") == "SchedulingGated":
            reason = "SchedulingGated"
    inits = {str(_d(c).get("name")): _d(c) for c in _l(spec.get("initContainers"))}
    total += sum(1 for c in inits.values() if _restartable_init(c))

    def finished(status: Obj) -> dt.datetime | None:
        return _time(_d(_d(status.get("lastState")).get("terminated")).get("finishedAt"))

    def later(a: dt.datetime | None, b: dt.datetime | None) -> dt.datetime | None:
        return b if b is not None and (a is None or a < b) else a

    initializing = False
    init_statuses = [_d(c) for c in _l(st.get("initContainerStatuses"))]
    for i, cs in enumerate(init_statuses):
        restarts += int(cs.get("restartCount") or 0)
        last_restart = later(last_restart, finished(cs))
        restartable = _restartable_init(inits.get(str(cs.get("name"))))
        if restartable:
            restartable_restarts += int(cs.get("restartCount") or 0)
            last_restartable = later(last_restartable, finished(cs))
        state = _d(cs.get("state"))
        terminated, waiting = state.get("terminated"), state.get("waiting")
        if terminated is not None and int(_d(terminated).get("exitCode") or 0) == 0:
            continue
        if restartable and cs.get("started"):
            ready += 1 if cs.get("ready") else 0
            continue
        if terminated is not None:
            term = _d(terminated)
            if term.get("reason"):
                reason = f"Init:{term['reason']}"
            elif term.get("signal"):
                reason = f"Init:Signal:{term['signal']}"
            else:
                reason = f"Init:ExitCode:{int(term.get('exitCode') or 0)}"
        elif waiting is not None and _d(waiting).get("reason") and _d(waiting).get("reason") != "PodInitializing":
            reason = f"Init:{_d(waiting)['reason']}"
        else:
            reason = f"Init:{i}/{len(inits)}"
        initializing = True
        break
    initialized = any(_d(c).get("type") == "Initialized" and _d(c).get("status") == "True"
                      for c in _l(st.get("conditions")))
    if not initializing or initialized:
        restarts, last_restart = restartable_restarts, last_restartable
        has_running, error_reason = False, ""
        for cs in reversed([_d(c) for c in _l(st.get("containerStatuses"))]):
            restarts += int(cs.get("restartCount") or 0)
            last_restart = later(last_restart, finished(cs))
            state = _d(cs.get("state"))
            waiting, terminated = _d(state.get("waiting")), state.get("terminated")
            if waiting.get("reason"):
                reason = str(waiting["reason"])
            elif terminated is not None:
                term = _d(terminated)
                if term.get("reason"):
                    reason = str(term["reason"])
                elif term.get("signal"):
                    reason = f"Signal:{term['signal']}"
                else:
                    reason = f"ExitCode:{int(term.get('exitCode') or 0)}"
                if int(term.get("exitCode") or 0) != 0:
                    error_reason = reason
            elif cs.get("ready") and state.get("running") is not None:
                has_running = True
                ready += 1
        if reason == "Completed":
            pod_ready = any(_d(c).get("type") == "Ready" and _d(c).get("status") == "True"
                            for c in _l(st.get("conditions")))
            if has_running and pod_ready:
                reason = "Running"
            elif error_reason:
                reason = error_reason
            elif has_running:
                reason = "NotReady"
    if meta.get("deletionTimestamp") and st.get("reason") == "NodeLost":
        reason = "Unknown"
    elif meta.get("deletionTimestamp") and phase not in ("Succeeded", "Failed"):
        reason = "Terminating"
    restarts_text = str(restarts)
    if restarts and last_restart is not None:
        restarts_text = f"{restarts} ({human_duration((now - last_restart).total_seconds())} ago)"
    ips = _l(st.get("podIPs"))
    ip = str(_d(ips[0]).get("ip") or "") if ips else ""
    gates = "<none>"
    if _l(spec.get("readinessGates")):
        conditions = {str(_d(c).get("type")): _d(c).get("status") for c in _l(st.get("conditions"))}
        true = sum(1 for g in _l(spec.get("readinessGates"))
                   if conditions.get(str(_d(g).get("conditionType"))) == "True")
        gates = f"{true}/{len(_l(spec.get('readinessGates')))}"
    return [_name(obj), f"{ready}/{total}", reason, restarts_text, _age(obj, now), ip or "<none>",
            str(spec.get("nodeName") or "") or "<none>", str(st.get("nominatedNodeName") or "") or "<none>", gates]


def pod_conditions(obj: Obj) -> list[Obj] | None:
    """The row conditions the pod printer sets: Completed for Succeeded and Failed pods."""
    phase = _d(obj.get("status")).get("phase")
    if phase == "Succeeded":
        return [{"type": "Completed", "status": "True", "reason": "Succeeded",
                 "message": "The pod has completed successfully."}]
    if phase == "Failed":
        return [{"type": "Completed", "status": "True", "reason": "Failed",
                 "message": "The pod failed."}]
    return None


def node(obj: Obj, now: dt.datetime) -> Cells:
    st, spec = _d(obj.get("status")), _d(obj.get("spec"))
    ready = next((_d(c) for c in _l(st.get("conditions")) if _d(c).get("type") == "Ready"), None)
    states = [] if ready is None else ["Ready" if ready.get("status") == "True" else "NotReady"]
    states = states or ["Unknown"]
    if spec.get("unschedulable"):
        states.append("SchedulingDisabled")
    roles = set()
    for key, value in _d(_d(obj.get("metadata")).get("labels")).items():
        if key.startswith(_ROLE_PREFIX) and key[len(_ROLE_PREFIX):]:
            roles.add(key[len(_ROLE_PREFIX):])
        elif key == "kubernetes.io/role" and value:
            roles.add(str(value))
    info = _d(st.get("nodeInfo"))
    addresses = [_d(a) for a in _l(st.get("addresses"))]

    def address(kind: str) -> str:
        return next((str(a.get("address")) for a in addresses if a.get("type") == kind), "<none>")

    kernel = str(info.get("kernelVersion") or "") or "<unknown>"
    if info.get("architecture"):
        kernel += f" ({info['architecture']})"
    return [_name(obj), ",".join(states), ",".join(sorted(roles)) or "<none>", _age(obj, now),
            str(info.get("kubeletVersion") or ""), address("InternalIP"), address("ExternalIP"),
            str(info.get("osImage") or "") or "<unknown>", kernel,
            str(info.get("containerRuntimeVersion") or "") or "<unknown>"]


def event(obj: Obj, now: dt.datetime) -> Cells:
    """A core/v1 Event (events.k8s.io ones are stored in this shape)."""
    first = since(obj.get("firstTimestamp"), now) if obj.get("firstTimestamp") else since(obj.get("eventTime"), now)
    last = since(obj.get("lastTimestamp"), now) if obj.get("lastTimestamp") else first
    count = int(obj.get("count") or 0)
    series = obj.get("series")
    if isinstance(series, dict):
        last = since(series.get("lastObservedTime"), now)
        count = int(series.get("count") or 0)
    elif count == 0:
        count = 1
    involved = _d(obj.get("involvedObject"))
    kind = str(involved.get("kind") or "").lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    source = _d(obj.get("source"))
    component = str(source.get("component") or obj.get("reportingComponent") or "")
    instance = str(source.get("host") or obj.get("reportingInstance") or "")
    return [last, str(obj.get("type") or ""), str(obj.get("reason") or ""), target,
            str(involved.get("fieldPath") or ""), f"{component}, {instance}" if instance else component,
            str(obj.get("message") or "").strip(), first, count, _name(obj)]


def namespace(obj: Obj, now: dt.datetime) -> Cells:
    return [_name(obj), str(_d(obj.get("status")).get("phase") or ""), _age(obj, now)]


def configmap(obj: Obj, now: dt.datetime) -> Cells:
    return [_name(obj), len(_d(obj.get("data"))) + len(_d(obj.get("binaryData"))), _age(obj, now)]


def secret(obj: Obj, now: dt.datetime) -> Cells:
    return [_name(obj), str(obj.get("type") or ""), len(_d(obj.get("data"))), _age(obj, now)]


def lease(obj: Obj, now: dt.datetime) -> Cells:
    return [_name(obj), str(_d(obj.get("spec")).get("holderIdentity") or ""), _age(obj, now)]


def label_selector(selector: Any) -> str:
    """`metav1.FormatLabelSelector`: requirements sorted by key, "<none>" when nil or empty."""
    if not isinstance(selector, dict):
        return "<none>"
    parts: list[tuple[str, str]] = [(str(k), f"{k}={v}") for k, v in _d(selector.get("matchLabels")).items()]
    for expr in _l(selector.get("matchExpressions")):
        key, op, values = str(_d(expr).get("key")), _d(expr).get("operator"), sorted(_l(_d(expr).get("values")))
        text = {"In": f"{key} in ({','.join(values)})", "NotIn": f"{key} notin ({','.join(values)})",
                "Exists": key, "DoesNotExist": f"!{key}"}.get(str(op), f"{key} {op}")
        parts.append((key, text))
    return ",".join(text for _, text in sorted(parts)) or "<none>"


def job(obj: Obj, now: dt.datetime) -> Cells:
    spec, st = _d(obj.get("spec")), _d(obj.get("status"))
    succeeded = int(st.get("succeeded") or 0)
    if spec.get("completions") is not None:
        completions = f"{succeeded}/{spec['completions']}"
    elif int(spec.get("parallelism") or 0) > 1:
        completions = f"{succeeded}/1 of {spec['parallelism']}"
    else:
        completions = f"{succeeded}/1"
    start, end = _time(st.get("startTime")), _time(st.get("completionTime"))
    duration = "" if start is None else human_duration(((end or now) - start).total_seconds())
    true = {str(_d(c).get("type")) for c in _l(st.get("conditions")) if _d(c).get("status") == "True"}
    if "Complete" in true:
        status = "Complete"
    elif "Failed" in true:
        status = "Failed"
    elif _d(obj.get("metadata")).get("deletionTimestamp"):
        status = "Terminating"
    else:
        status = next((c for c in ("Suspended", "FailureTarget", "SuccessCriteriaMet") if c in true), "Running")
    containers = [_d(c) for c in _l(_d(_d(spec.get("template")).get("spec")).get("containers"))]
    return [_name(obj), status, completions, duration, _age(obj, now),
            ",".join(str(c.get("name") or "") for c in containers),
            ",".join(str(c.get("image") or "") for c in containers), label_selector(spec.get("selector"))]


def daemonset(obj: Obj, now: dt.datetime) -> Cells:
    spec, st = _d(obj.get("spec")), _d(obj.get("status"))
    pod_spec = _d(_d(spec.get("template")).get("spec"))
    selector = _d(pod_spec.get("nodeSelector"))
    containers = [_d(c) for c in _l(pod_spec.get("containers"))]
    counts = [int(st.get(k) or 0) for k in ("desiredNumberScheduled", "currentNumberScheduled", "numberReady",
                                            "updatedNumberScheduled", "numberAvailable")]
    # labels.FormatLabels: keys sorted, "<none>" when empty
    return [_name(obj), *counts, ",".join(f"{k}={selector[k]}" for k in sorted(selector)) or "<none>",
            _age(obj, now), ",".join(str(c.get("name") or "") for c in containers),
            ",".join(str(c.get("image") or "") for c in containers), label_selector(spec.get("selector"))]


def _int_or_string(value: Any) -> str:
    return "N/A" if value is None else str(value)


def pdb(obj: Obj, now: dt.datetime) -> Cells:
    spec = _d(obj.get("spec"))
    return [_name(obj), _int_or_string(spec.get("minAvailable")), _int_or_string(spec.get("maxUnavailable")),
            int(_d(obj.get("status")).get("disruptionsAllowed") or 0), _age(obj, now)]


def resource_slice(obj: Obj, now: dt.datetime) -> Cells:
    spec = _d(obj.get("spec"))
    return [_name(obj), str(spec.get("nodeName") or ""), str(spec.get("driver") or ""),
            str(_d(spec.get("pool")).get("name") or ""), _age(obj, now)]


def device_taint_rule(obj: Obj, now: dt.datetime) -> Cells:
    taint = _d(_d(obj.get("spec")).get("taint"))
    added = since(taint.get("timeAdded"), now) if taint.get("timeAdded") else ""
    return [_name(obj), str(taint.get("key") or ""), str(taint.get("value") or ""), str(taint.get("effect") or ""),
            added, _age(obj, now)]


PRINTERS: dict[str, Printer] = {
    "pods": pod, "nodes": node, "events": event, "namespaces": namespace, "configmaps": configmap,
    "secrets": secret, "leases.coordination.k8s.io": lease, "jobs.batch": job,
    "poddisruptionbudgets.policy": pdb, "resourceslices.resource.k8s.io": resource_slice,
    "devicetaintrules.resource.k8s.io": device_taint_rule, "daemonsets.apps": daemonset,
}
"""Resource key -> its printer; each matches the recorded columns of that key."""
