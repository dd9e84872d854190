"""What a plan's steps are about: references to the pods, workloads and targets it names, and the small
readings of a pod the plan makes (when it was created, whether it failed). Pure; no I/O.

Owns `namespace_allowed` (`recovery.namespaces_allow`/`deny`), the `steps` references built from cached
objects and event targets, and where an Event about an event itself goes (`about_event`). Does not own the
plan (`planning`).
"""

from __future__ import annotations

from kcover import model, settings
from kcover.aio import clock as clock_
from kcover.kube import projections as proj
from kcover.recovery import planinputs
from kcover.recovery import steps as st


def namespace_allowed(namespace: str, rs: settings.RecoverySettings) -> bool:
    if namespace in rs.namespaces_deny:
        return False
    return not rs.namespaces_allow or namespace in rs.namespaces_allow


def workload_ref(w: proj.Workload) -> st.WorkloadRef:
    return st.WorkloadRef(kind=w.kind, api_version=w.api_version, name=w.name, namespace=w.namespace, uid=w.uid)


def pod_ref(pod: proj.Pod) -> st.ObjectRef:
    return st.ObjectRef("Pod", "v1", pod.name, pod.namespace, pod.uid)


def target_ref(target: model.Target) -> st.ObjectRef | None:
    if target.kind is model.TargetKind.POD:
        return st.ObjectRef("Pod", "v1", target.name, target.namespace, target.uid)
    if target.kind in (model.TargetKind.NODE, model.TargetKind.DEVICE):
        return st.node_ref(target.node or target.name)
    return None


def created_at(pod: proj.Pod) -> float | None:
    try:
        return clock_.parse_time(pod.created).timestamp() if pod.created else None
    except ValueError:
        return None


def failing(pod: proj.Pod) -> bool:
    """A container of the pod ended with an error (now or in its last instance), or the pod failed."""
    if pod.phase == "Failed":
        return True
    return any((c.terminated is not None and c.terminated.exit_code != 0) for c in pod.containers)


def about_event(event: model.CollectorEvent, snapshot: planinputs.Snapshot) -> st.ObjectRef | None:
    """The object an Event about `event` itself goes on: its pod, node or workload."""
    about = target_ref(event.target)
    if about is None and event.target.kind is model.TargetKind.WORKLOAD and event.target.uid:
        w = snapshot.workload(event.target.uid)
        about = workload_ref(w) if w is not None else None
    return about
