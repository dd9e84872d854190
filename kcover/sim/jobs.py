"""batch/v1 Jobs in the simulated cluster: the API server's defaults and kube-controller-manager's Job controller.

The API server's half, read from k8s.io/kubernetes 1.36 (pkg/apis/batch/v1/defaults.go,
pkg/registry/batch/job/strategy.go): `defaults` (completions and parallelism 1 when both are unset,
parallelism 1, backoffLimit 6, completionMode NonIndexed, suspend false, podReplacementPolicy Failed
with a podFailurePolicy else TerminatingOrFailed, manualSelector false, the template's labels as the
Job's when it has none) and `generate_selector` (once the Job has its uid: the template labels
`batch.kubernetes.io/job-name`, `job-name`, `batch.kubernetes.io/controller-uid`, `controller-uid`
and `spec.selector.matchLabels` on the controller uid; a Job still without labels gets the template's,
generated ones included, as a real server stores it).

The controller's half (`JobController`, an actor of the simulated cluster) keeps, for every Job that
is not suspended or finished, `min(parallelism, completions - succeeded)` pods that are neither
terminal nor terminating (with podReplacementPolicy Failed a terminating pod still holds its place
until it is terminal), each created from the template with generateName `<job>-`, the controller
ownerReference and the `batch.kubernetes.io/job-tracking` finalizer; Indexed Jobs get the lowest
missing completion indexes (annotation and label `batch.kubernetes.io/job-completion-index`). A pod
that ends is counted once and its finalizer removed: Succeeded counts towards completions; a Failed
pod, or with TerminatingOrFailed a terminating one, is matched against `podFailurePolicy` (rules in
order; `onExitCodes` and `onPodConditions`): `Ignore` (kcover's evictions carry DisruptionTarget)
counts nothing, `FailJob` fails the Job, `Count` or no match counts towards backoffLimit. More
failures than backoffLimit fail the Job (FailureTarget and Failed, reason BackoffLimitExceeded),
completions reached complete it (SuccessCriteriaMet and Complete); either way its remaining pods
are deleted; a pod whose Job is gone loses the finalizer. Status keeps active, ready, terminating, succeeded, failed, startTime, completionTime
and conditions as the real controller writes them. Not simulated: the exponential back-off between
pod recreations, backoffLimitPerIndex, successPolicy, activeDeadlineSeconds, Events. Writes that
race (404, 409) are retried on the object's next change; it never raises out of `run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Sequence
from typing import Any

from kcover.aio import clock as clocks
from kcover.sim import informing, status, strategy
from kcover.sim import store as stores

Obj = dict[str, Any]
KEY = "jobs.batch"
TRACKING = "batch.kubernetes.io/job-tracking"
JOB_NAME = "batch.kubernetes.io/job-name"
CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
LEGACY_JOB_NAME = "job-name"
LEGACY_CONTROLLER_UID = "controller-uid"
INDEX = "batch.kubernetes.io/job-completion-index"
TERMINAL = ("Succeeded", "Failed")


def defaults(job: Obj) -> Obj:
    """SetDefaults_Job, on a create body (returns a new dict)."""
    job = copy.deepcopy(job)
    spec = job.setdefault("spec", {})
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    if spec.get("backoffLimit") is None:
        spec["backoffLimit"] = 2147483647 if spec.get("backoffLimitPerIndex") is not None else 6
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels")
    if labels and not (job.get("metadata") or {}).get("labels"):
        job.setdefault("metadata", {})["labels"] = dict(labels)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("podReplacementPolicy", "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed")
    spec.setdefault("manualSelector", False)
    for rule in (spec.get("podFailurePolicy") or {}).get("rules") or []:
        for pattern in rule.get("onPodConditions") or []:
            pattern.setdefault("status", "True")
    return job


def generate_selector(job: Obj) -> None:
    """generateSelector: the controller-uid selector and the template labels, once the Job has its uid."""
    spec, meta = job.setdefault("spec", {}), job["metadata"]
    if spec.get("manualSelector"):
        return
    template = spec.setdefault("template", {})
    labels = template.setdefault("metadata", {}).setdefault("labels", {})
    for key in (LEGACY_JOB_NAME, JOB_NAME):
        labels.setdefault(key, meta["name"])
    for key in (LEGACY_CONTROLLER_UID, CONTROLLER_UID):
        labels.setdefault(key, meta["uid"])
    selector = spec.setdefault("selector", {})
    selector.setdefault("matchLabels", {}).setdefault(CONTROLLER_UID, meta["uid"])
    if not meta.get("labels"):  # defaulted again on the way to storage: the template's labels, generated ones too
        meta["labels"] = dict(labels)


def _condition(job: Obj, kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


def finished(job: Obj) -> bool:
    return _condition(job, "Complete") or _condition(job, "Failed")


def pod_failed(pod: Obj, job: Obj) -> bool:
    """isPodFailed: Failed, or (podReplacementPolicy TerminatingOrFailed) terminating and not Succeeded."""
    phase = (pod.get("status") or {}).get("phase")
    if phase == "Failed":
        return True
    if _only_failed_replaced(job):
        return False
    return bool(pod["metadata"].get("deletionTimestamp")) and phase != "Succeeded"


def _only_failed_replaced(job: Obj) -> bool:
    spec = job.get("spec") or {}
    return spec.get("podReplacementPolicy") == "Failed" or bool(spec.get("podFailurePolicy"))


def match_failure_policy(job: Obj, pod: Obj) -> tuple[str, str]:
    """matchPodFailurePolicy: (action, FailJob message): action "" when no rule matched (counted)."""
    st = pod.get("status") or {}
    for index, rule in enumerate(((job.get("spec") or {}).get("podFailurePolicy") or {}).get("rules") or []):
        action = str(rule.get("action") or "")
        codes = rule.get("onExitCodes")
        if codes is not None:
            for cs in [*(st.get("containerStatuses") or []), *(st.get("initContainerStatuses") or [])]:
                term = (cs.get("state") or {}).get("terminated")
                if term is None or codes.get("containerName") not in (None, cs.get("name")):
                    continue
                code = int(term.get("exitCode", 0))
                values = [int(v) for v in codes.get("values") or []]
                op = codes.get("operator")
                if code != 0 and ((op == "In" and code in values) or (op == "NotIn" and code not in values)):
                    return action, (f"Container {cs.get('name')} for pod {pod['metadata'].get('namespace')}/"
                                    f"{pod['metadata']['name']} failed with exit code {code} matching {action} rule "
                                    f"at index {index}")
        elif rule.get("onPodConditions") is not None:
            for cond in st.get("conditions") or []:
                for pattern in rule["onPodConditions"]:
                    if cond.get("type") == pattern.get("type") and cond.get("status") == pattern.get("status", "True"):
                        return action, (f"Pod {pod['metadata'].get('namespace')}/{pod['metadata']['name']} has "
                                        f"condition {cond.get('type')} matching {action} rule at index {index}")
    return "", ""


class JobController:
    """kube-controller-manager's Job controller over the simulated cluster's store."""

    def __init__(self, cluster: Any) -> None:
        self.store: stores.Store = cluster.store

    async def run(self, stop: asyncio.Event) -> None:
        async for key, change in informing.follow(self.store, (KEY, "pods"), stop):
            obj = change.new.obj()
            meta = obj["metadata"]
            if key == KEY:
                if change.type != "DELETED":
                    self._sync(str(meta.get("namespace")), str(meta["name"]), str(meta["uid"]))
                continue
            owner = next((r for r in meta.get("ownerReferences") or []
                          if r.get("controller") and r.get("kind") == "Job" and r.get("apiVersion") == "batch/v1"), None)
            if owner is None or self._sync(str(meta.get("namespace")), str(owner.get("name")), str(owner.get("uid"))):
                continue
            if change.type != "DELETED" and TRACKING in (meta.get("finalizers") or []):
                self._untrack(obj)  # its Job is gone (syncOrphanPod): nothing else will release it

    def _now(self) -> str:
        return clocks.rfc3339(self.store.clock.now())

    def _sync(self, namespace: str, name: str, uid: str) -> bool:
        """Reconcile the Job; False when it no longer exists."""
        try:
            job = self.store.get(KEY, namespace, name)
        except status.ApiError:
            return False
        if job["metadata"]["uid"] != uid:
            return False
        with contextlib.suppress(status.ApiError):  # raced with another writer: the next change retries
            self._reconcile(job)
        return True

    def _pods(self, job: Obj) -> list[Obj]:
        uid = job["metadata"]["uid"]
        return [p for p in self.store.iter_objects("pods")
                if p["metadata"].get("namespace") == job["metadata"]["namespace"]
                and any(r.get("uid") == uid and r.get("controller") for r in p["metadata"].get("ownerReferences") or [])]

    def _reconcile(self, job: Obj) -> None:
        spec = job.get("spec") or {}
        st: Obj = copy.deepcopy(job.get("status") or {})
        pods = self._pods(job)
        succeeded, failed = int(st.get("succeeded", 0)), int(st.get("failed", 0))
        fail_message = ""
        completed = set(_indexes(st.get("completedIndexes") or ""))
        for pod in pods:
            if TRACKING not in (pod["metadata"].get("finalizers") or []):
                continue
            phase = (pod.get("status") or {}).get("phase")
            if phase == "Succeeded":
                succeeded += 1
                index = _index_of(pod)
                if index is not None:
                    completed.add(index)
            elif pod_failed(pod, job):
                action, message = match_failure_policy(job, pod)
                if action == "FailJob":
                    fail_message = fail_message or message
                if action != "Ignore":
                    failed += 1
            else:
                continue
            self._untrack(pod)
        live = [p for p in pods if (p.get("status") or {}).get("phase") not in TERMINAL]
        active = [p for p in live if not p["metadata"].get("deletionTimestamp")]
        terminating = [p for p in live if p["metadata"].get("deletionTimestamp")]
        now = self._now()
        conditions = list(st.get("conditions") or [])
        if not finished(job):
            completions = spec.get("completions")
            reason = message = ""
            if fail_message:
                reason, message = "PodFailurePolicy", fail_message
            elif failed > int(spec.get("backoffLimit", 6)):
                reason, message = "BackoffLimitExceeded", "Job has reached the specified backoff limit"
            if reason:
                conditions += [_cond("FailureTarget", reason, message, now), _cond("Failed", reason, message, now)]
            elif (completions is not None and succeeded >= int(completions)) or \
                    (completions is None and succeeded > 0 and not active):
                conditions += [_cond("SuccessCriteriaMet", "CompletionsReached", "Reached expected number of "
                                     "succeeded pods", now),
                               _cond("Complete", "CompletionsReached", "Reached expected number of succeeded pods",
                                     now)]
                st["completionTime"] = now
            elif spec.get("suspend"):
                if not _condition(job, "Suspended"):
                    conditions = [c for c in conditions if c.get("type") != "Suspended"]
                    conditions.append(_cond("Suspended", "JobSuspended", "Job suspended", now))
            else:
                st.setdefault("startTime", now)
                if _condition(job, "Suspended"):
                    conditions = [c if c.get("type") != "Suspended" else
                                  _cond("Suspended", "JobResumed", "Job resumed", now) | {"status": "False"}
                                  for c in conditions]
                active += self._create(job, active, terminating, succeeded, completed)
        st["conditions"] = conditions
        if any(c.get("type") in ("Failed", "Complete") and c.get("status") == "True" for c in conditions) \
                or spec.get("suspend"):
            for pod in active:
                self._delete(pod)
            terminating += active
            active = []
        st.update(active=len(active), succeeded=succeeded, failed=failed, terminating=len(terminating),
                  ready=sum(1 for p in active if _ready(p)), uncountedTerminatedPods={})
        if spec.get("completionMode") == "Indexed":
            st["completedIndexes"] = _ranges(sorted(completed))
        for k in ("active", "succeeded", "failed"):  # int32 omitempty in JobStatus; ready/terminating are pointers
            if not st[k]:
                del st[k]
        if not st["conditions"]:
            st.pop("conditions")
        if st != (job.get("status") or {}):
            job["status"] = st
            self.store.update(KEY, job)

    def _create(self, job: Obj, active: list[Obj], terminating: list[Obj], succeeded: int,
                completed: set[int]) -> list[Obj]:
        spec = job.get("spec") or {}
        want = int(spec.get("parallelism", 1))
        completions = spec.get("completions")
        if completions is not None:
            want = min(want, int(completions) - succeeded)
        held = len(active) + (len(terminating) if _only_failed_replaced(job) else 0)
        missing = want - held
        if missing <= 0:
            return []
        indexes: Sequence[int | None] = [None] * missing
        if spec.get("completionMode") == "Indexed" and completions is not None:
            taken = completed | {i for p in [*active, *terminating] if (i := _index_of(p)) is not None}
            indexes = [i for i in range(int(completions)) if i not in taken][:missing]
        made = []
        for index in indexes:
            made.append(self.store.create("pods", self._pod(job, index)))
        return made

    def _pod(self, job: Obj, index: int | None) -> Obj:
        meta = job["metadata"]
        template = copy.deepcopy((job.get("spec") or {}).get("template") or {})
        pod_meta = template.get("metadata") or {}
        pod: Obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "generateName": f"{meta['name']}-" + (f"{index}-" if index is not None else ""),
            "namespace": meta["namespace"], "labels": dict(pod_meta.get("labels") or {}),
            "annotations": dict(pod_meta.get("annotations") or {}), "finalizers": [TRACKING],
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"],
                                 "controller": True, "blockOwnerDeletion": True}]},
            "spec": template.get("spec") or {}}
        if index is not None:
            pod["metadata"]["labels"][INDEX] = str(index)
            pod["metadata"]["annotations"][INDEX] = str(index)
            pod["spec"].setdefault("hostname", f"{meta['name']}-{index}")
        if not pod["metadata"]["annotations"]:
            del pod["metadata"]["annotations"]
        res = self.store.registry.by_key("pods")
        prepared = strategy.prepare_create(res, {**pod, "metadata": {**pod["metadata"], "name": "placeholder"}})
        prepared["metadata"].pop("name")
        return prepared

    def _untrack(self, pod: Obj) -> None:
        uid = pod["metadata"]["uid"]

        def change(obj: Obj) -> None:
            if obj["metadata"]["uid"] != uid:
                return
            kept = [f for f in obj["metadata"].get("finalizers") or [] if f != TRACKING]
            if kept:
                obj["metadata"]["finalizers"] = kept
            else:
                obj["metadata"].pop("finalizers", None)

        with contextlib.suppress(status.ApiError):
            self.store.mutate("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], change)

    def _delete(self, pod: Obj) -> None:
        with contextlib.suppress(status.ApiError):
            self.store.delete("pods", pod["metadata"]["namespace"], pod["metadata"]["name"],
                              uid=pod["metadata"]["uid"])


def _cond(kind: str, reason: str, message: str, now: str) -> Obj:
    return {"type": kind, "status": "True", "reason": reason, "message": message, "lastProbeTime": now,
            "lastTransitionTime": now}


def _ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _index_of(pod: Obj) -> int | None:
    value = (pod["metadata"].get("annotations") or {}).get(INDEX)
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _indexes(text: str) -> list[int]:
    out: list[int] = []
    for part in [p for p in text.split(",") if p]:
        lo, _, hi = part.partition("-")
        with contextlib.suppress(ValueError):
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _ranges(values: list[int]) -> str:
    """`completedIndexes` text: sorted indexes as comma-separated ranges ("0-2,5")."""
    runs: list[list[int]] = []
    for v in values:
        if runs and runs[-1][1] == v - 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs)
