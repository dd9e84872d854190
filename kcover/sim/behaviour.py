"""What a kubelet and a Kubeflow v1 operator write, as pure functions over plain manifests.

Owns the shapes only: the pods an operator keeps for a job (names, labels, controller
ownerReference), the status a kubelet writes when a pod runs, when it kills a pod being deleted,
when a container exits with an error,
and when a DRA device's health changes (KEP-4680 `allocatedResourcesStatus`), and the NoSchedule
taints the node lifecycle controller keeps in line with a node's Ready condition. It does no I/O: the
simulated cluster's actors (`kcover.sim.actors`) apply these through the Store, and the test harness
(`tests/harness`) applies them over HTTP to any API server, so both play the same cluster.
Functions never mutate their arguments; they raise `KeyError` on a manifest missing `metadata`.
"""

from __future__ import annotations

import copy
from typing import Any

Obj = dict[str, Any]

#: Kubeflow v1 job resource key -> (kind, field of spec holding the replica specs).
REPLICA_SPECS = {
    "pytorchjobs.kubeflow.org": ("PyTorchJob", "pytorchReplicaSpecs"),
    "tfjobs.kubeflow.org": ("TFJob", "tfReplicaSpecs"),
    "mpijobs.kubeflow.org": ("MPIJob", "mpiReplicaSpecs"),
    "xgboostjobs.kubeflow.org": ("XGBoostJob", "xgbReplicaSpecs"),
    "paddlejobs.kubeflow.org": ("PaddleJob", "paddleReplicaSpecs"),
    "jaxjobs.kubeflow.org": ("JAXJob", "jaxReplicaSpecs"),
}
JOB_NAME = "training.kubeflow.org/job-name"
OPERATOR_NAME = "training.kubeflow.org/operator-name"
REPLICA_TYPE = "training.kubeflow.org/replica-type"
REPLICA_INDEX = "training.kubeflow.org/replica-index"
JOB_ROLE = "training.kubeflow.org/job-role"
NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"
#: Ready condition status -> the NoSchedule taint key the node lifecycle controller wants for it.
READY_TAINT = {"True": "", "False": NOT_READY, "Unknown": UNREACHABLE}


def job_pods(job: Obj, key: str) -> list[Obj]:
    """Every replica pod the training-operator keeps for `job` (a `key` resource), as create bodies.

    A job being deleted (deletionTimestamp set) keeps none."""
    kind, specs_field = REPLICA_SPECS[key]
    meta = job["metadata"]
    if meta.get("deletionTimestamp"):
        return []
    pods = []
    for rtype, rspec in ((job.get("spec") or {}).get(specs_field) or {}).items():
        for index in range(int(rspec.get("replicas", 1))):
            pods.append(replica_pod(job, kind, rtype, index, rspec.get("template") or {}))
    return pods


def replica_pod(job: Obj, kind: str, rtype: str, index: int, template: Obj) -> Obj:
    """The pod `<job>-<replica type>-<index>` with the operator's labels and controller ownerReference."""
    meta = job["metadata"]
    pod_meta = copy.deepcopy(template.get("metadata") or {})
    pod_meta.update(name=f"{meta['name']}-{rtype.lower()}-{index}", namespace=meta["namespace"])
    pod_meta["labels"] = {**(pod_meta.get("labels") or {}),
                          JOB_NAME: meta["name"],
                          OPERATOR_NAME: f"{kind.lower()}-controller",
                          REPLICA_TYPE: rtype.lower(),
                          REPLICA_INDEX: str(index)}
    if rtype.lower() == "master" and index == 0:
        pod_meta["labels"][JOB_ROLE] = "master"
    pod_meta["ownerReferences"] = [{"apiVersion": job.get("apiVersion", "kubeflow.org/v1"), "kind": kind,
                                    "name": meta["name"], "uid": meta["uid"], "controller": True,
                                    "blockOwnerDeletion": True}]
    spec = copy.deepcopy(template.get("spec") or {"containers": [{"name": "main", "image": "trainer"}]})
    spec.setdefault("restartPolicy", "OnFailure")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec}


def running_status(pod: Obj, now: str, *, host_ip: str = "", pod_ip: str = "") -> Obj | None:
    """The status a kubelet writes when it starts `pod`, or None when it would not (not Pending,
    or being deleted). Every init container ran to completion (exit 0, `Completed`), every container
    runs and is ready; `now` is an RFC 3339 timestamp; the host and pod IPs are set (with `hostIPs`,
    `podIPs`) where given."""
    if pod["metadata"].get("deletionTimestamp"):
        return None
    old = pod.get("status") or {}
    if old.get("phase", "Pending") != "Pending":
        return None
    st = copy.deepcopy(old)
    st.update(phase="Running", startTime=now, conditions=[
        {"type": t, "status": "True", "lastTransitionTime": now}
        for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")])
    if host_ip:
        st.update(hostIP=host_ip, hostIPs=[{"ip": host_ip}])
    if pod_ip:
        st.update(podIP=pod_ip, podIPs=[{"ip": pod_ip}])
    st["containerStatuses"] = [
        {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": True, "restartCount": 0,
         "started": True, "state": {"running": {"startedAt": now}}}
        for c in (pod.get("spec") or {}).get("containers") or []]
    inits = (pod.get("spec") or {}).get("initContainers") or []
    if inits:
        st["initContainerStatuses"] = [
            {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": True, "restartCount": 0,
             "started": False, "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now,
                                                        "finishedAt": now}}}
            for c in inits]
    return st


def failed_container_status(pod: Obj, container: str, now: str, *, exit_code: int = 1, reason: str = "Error",
                            message: str = "", restart: bool | None = None) -> Obj:
    """The status after `container` exits with `exit_code`: with restartPolicy Never (or
    `restart=False`) it stays terminated and the pod fails; otherwise the kubelet restarts it in
    place (lastState.terminated, restartCount + 1, running again)."""
    st = copy.deepcopy(pod.get("status") or {})
    terminated: Obj = {"exitCode": exit_code, "reason": reason, "startedAt": now, "finishedAt": now}
    if message:
        terminated["message"] = message
    if restart is None:
        restart = (pod.get("spec") or {}).get("restartPolicy") != "Never"
    for cs in st.get("containerStatuses") or []:
        if cs["name"] != container:
            continue
        if restart:
            cs.update(lastState={"terminated": terminated}, state={"running": {"startedAt": now}},
                      restartCount=int(cs.get("restartCount", 0)) + 1)
        else:
            cs.update(state={"terminated": terminated}, ready=False)
    if not restart and (pod.get("spec") or {}).get("restartPolicy") == "Never":
        st["phase"] = "Failed"
    return st


def killed_status(pod: Obj, now: str) -> Obj:
    """The terminal status a kubelet writes for a pod being deleted once it killed its containers
    (kubelets since 1.27): phase Failed, every container terminated with exit code 137 (`Error`),
    Ready and ContainersReady False (`PodCompleted`), other conditions (DisruptionTarget) kept."""
    st = copy.deepcopy(pod.get("status") or {})
    st["phase"] = "Failed"
    conditions = []
    for cond in st.get("conditions") or []:
        if cond.get("type") in ("Ready", "ContainersReady"):
            cond = {**cond, "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
        conditions.append(cond)
    st["conditions"] = conditions
    statuses = {cs.get("name"): cs for cs in st.get("containerStatuses") or []}
    st["containerStatuses"] = [
        {**statuses.get(c["name"], {"name": c["name"], "image": c.get("image", ""), "imageID": "",
                                     "restartCount": 0}),
         "ready": False, "started": False,
         "state": {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": now, "finishedAt": now}}}
        for c in (pod.get("spec") or {}).get("containers") or []]
    return st


def device_health_status(pod: Obj, container: str, *, resource_name: str, resource_id: str,
                         health: str = "Unhealthy", message: str = "") -> Obj:
    """The status after one allocated device of `container` reports `health` (Healthy, Unhealthy,
    Unknown) in containerStatuses[].allocatedResourcesStatus; other devices keep theirs."""
    st = copy.deepcopy(pod.get("status") or {})
    for cs in st.get("containerStatuses") or []:
        if cs["name"] != container:
            continue
        statuses = cs.setdefault("allocatedResourcesStatus", [])
        entry = next((s for s in statuses if s["name"] == resource_name), None)
        if entry is None:
            entry = {"name": resource_name, "resources": []}
            statuses.append(entry)
        resource: Obj = {"resourceID": resource_id, "health": health}
        if message:
            resource["message"] = message
        entry["resources"] = [r for r in entry.get("resources") or [] if r["resourceID"] != resource_id] + [resource]
    return st


def ready_taints(node: Obj) -> list[Obj] | None:
    """The spec.taints the node lifecycle controller leaves on `node` for its Ready condition, or None
    when it would change nothing: Ready True drops the `node.kubernetes.io/not-ready` and
    `node.kubernetes.io/unreachable` NoSchedule taints (the first is what kube-apiserver's
    TaintNodesByCondition admission puts on every new Node), False wants not-ready, Unknown
    unreachable. Other taints, and NoExecute ones, are kept. A node without a Ready condition is left
    alone: its kubelet has not reported yet."""
    ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") not in READY_TAINT:
        return None
    wanted = READY_TAINT[str(ready["status"])]
    taints = list((node.get("spec") or {}).get("taints") or [])
    kept = [t for t in taints if t.get("effect") != "NoSchedule" or t.get("key") not in (NOT_READY, UNREACHABLE)
            or t.get("key") == wanted]
    if wanted and not any(t.get("key") == wanted and t.get("effect") == "NoSchedule" for t in kept):
        kept.append({"key": wanted, "effect": "NoSchedule"})
    return None if kept == taints else copy.deepcopy(kept)
