"""The objects `kcover bench` seeds, and the status writes that are its faults.

Owns realistic object bodies (a GPU node, an opted-in PyTorchJob, its worker pods as a Kubeflow
operator creates them, with an 8-GPU trainer container) and the status bodies that make a fault:
a container terminated with `Error`, a DRA device `Unhealthy`. Pure functions over plain dicts: no
I/O, so the same bodies go to the simulated cluster and to a real one through the API.
"""

from __future__ import annotations

from typing import Any

from kcover.aio import clock

Obj = dict[str, Any]

KF = "kubeflow.org/v1"
JOB_NAME = "training.kubeflow.org/job-name"
OPERATOR = "training.kubeflow.org/operator-name"
OPT_IN = "kcover.io/cascading-recovery"
BENCH_LABEL = "kcover.io/bench"
"""Every object the bench creates carries this label, so a real cluster can be cleaned up after it."""
DRA_CLAIM = "claim:gpu-claim/gpu"
CONTAINER = "pytorch"


def namespace(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {BENCH_LABEL: "true"}}}


KWOK_LABELS = {"type": "kwok"}
"""What the tests' kwok manages (`--manage-nodes-with-label-selector=type=kwok`): the fleet's nodes carry it."""
KWOK_ANNOTATIONS = {"kwok.x-k8s.io/node": "fake"}


def node(name: str, *, gpus: int = 8, kwok: bool = False) -> Obj:
    """A GPU node as its kubelet registers it; `kwok`: labelled and annotated for kwok to manage (heartbeats,
    pod lifecycle) as a kubelet would."""
    now = "2026-01-01T00:00:00Z"
    labels = {BENCH_LABEL: "true", "kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true",
              "nvidia.com/gpu.product": "NVIDIA-H200", **(KWOK_LABELS if kwok else {})}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, **({"annotations": dict(KWOK_ANNOTATIONS)} if kwok else {})},
            "spec": {},
            "status": {"capacity": {"nvidia.com/gpu": str(gpus), "cpu": "192", "memory": "2Ti"},
                       "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "190", "memory": "2000Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "lastHeartbeatTime": now, "lastTransitionTime": now}]}}


def pytorchjob(namespace_: str, name: str, *, workers: int, opted_in: bool = True, kind: str = "PyTorchJob",
               restart_policy: str = "OnFailure") -> Obj:
    """A Kubeflow v1 job (`kind`: PyTorchJob, or XGBoostJob, ... of the same shape) whose pods the bench creates;
    `restart_policy` its workers' replica policy (`ExitCode`: the operator gives their pods `Never`, and
    recreates a pod that failed with a retryable exit code)."""
    labels = {BENCH_LABEL: "true"}
    if opted_in:
        labels[OPT_IN] = "true"
    replicas, container = KUBEFLOW_SHAPES[kind]
    template = {"spec": {"containers": [{"name": container, "image": "registry.example.com/ml/trainer:2026.01"}]}}
    return {"apiVersion": KF, "kind": kind,
            "metadata": {"name": name, "namespace": namespace_, "labels": labels},
            "spec": {replicas: {"Worker": {"replicas": workers, "restartPolicy": restart_policy, "template": template}}}}


KUBEFLOW_SHAPES = {"PyTorchJob": ("pytorchReplicaSpecs", "pytorch"), "XGBoostJob": ("xgbReplicaSpecs", "xgboost"),
                   "TFJob": ("tfReplicaSpecs", "tensorflow"), "PaddleJob": ("paddleReplicaSpecs", "paddle")}
"""Kubeflow v1 kinds the bench seeds: where the replicas are, and the container the operator requires (its
defaulting fails on a template without it, and the training operator 1.8 crashes on one with no container)."""


def plural(kind: str) -> str:
    """A Kubeflow v1 kind's resource name (`PyTorchJob` -> `pytorchjobs`)."""
    return f"{kind.lower()}s"


def owner_ref(job: Obj) -> Obj:
    return {"apiVersion": KF, "kind": job.get("kind") or "PyTorchJob", "name": job["metadata"]["name"],
            "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def pod_restart_policy(replica_policy: str) -> str:
    """The pod `restartPolicy` the training operator writes for a replica's `restartPolicy`."""
    return "Never" if replica_policy == "ExitCode" else replica_policy


def pod(namespace_: str, job: str, index: int, *, node_name: str, owner: Obj | None, dra: bool = False,
        restart_policy: str = "OnFailure") -> Obj:
    """A worker pod as the training operator writes it: labels, owner, one 8-GPU trainer container."""
    operator = f"{str((owner or {}).get('kind') or 'PyTorchJob').lower()}-controller"
    meta: Obj = {"name": f"{job}-worker-{index}", "namespace": namespace_,
                 "labels": {BENCH_LABEL: "true", JOB_NAME: job, OPERATOR: operator,
                            "training.kubeflow.org/replica-type": "worker",
                            "training.kubeflow.org/replica-index": str(index)},
                 "annotations": {"kubectl.kubernetes.io/default-container": CONTAINER}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    spec: Obj = {"nodeName": node_name, "restartPolicy": restart_policy, "schedulerName": "default-scheduler",
                 "containers": [{"name": CONTAINER, "image": "registry.example.com/ml/trainer:2026.01",
                                 "command": ["torchrun", "--nproc-per-node=8", "train.py"],
                                 "resources": {"limits": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"},
                                               "requests": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"}},
                                 "env": [{"name": "MASTER_ADDR", "value": f"{job}-master-0"},
                                         {"name": "WORLD_SIZE", "value": "32"}]}],
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    if dra:  # a DRA claim the container uses: a real server only takes health for resources it has
        spec["resourceClaims"] = [{"name": "gpu-claim", "resourceClaimName": f"{job}-worker-{index}-gpu"}]
        spec["containers"][0]["resources"]["claims"] = [{"name": "gpu-claim", "request": "gpu"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": running_status(index, dra=dra)}


def running_status(index: int, *, dra: bool = False) -> Obj:
    started = "2026-01-01T00:00:01Z"
    cs: Obj = {"name": CONTAINER, "ready": True, "restartCount": 0, "started": True,
               "image": "registry.example.com/ml/trainer:2026.01",
               "imageID": "registry.example.com/ml/trainer@sha256:" + "0" * 64,
               "containerID": f"containerd://{index:064x}", "state": {"running": {"startedAt": started}}}
    if dra:
        cs["allocatedResourcesStatus"] = [dra_entry(index, "Healthy")]
    return {"phase": "Running", "hostIP": "10.0.0.1", "podIP": "10.1.0.1", "qosClass": "Guaranteed",
            "startTime": "2026-01-01T00:00:00Z",
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
                           for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
            "containerStatuses": [cs]}


def dra_entry(index: int, health: str) -> Obj:
    resource: Obj = {"resourceID": f"gpu-{index % 8}", "health": health}
    if health == "Unhealthy":
        resource["message"] = "XID 79: GPU has fallen off the bus"
    return {"name": DRA_CLAIM, "resources": [resource]}


def failed_status(index: int, *, exit_code: int = 1) -> Obj:
    """The container's first instance exited with reason Error, as its kubelet reports it before starting it
    again under `restartPolicy: OnFailure` (`restartCount` 0, `state.terminated`, no `lastState`): a job's
    first failure, the one kcover restarts it for."""
    now = clock.rfc3339(clock.utcnow())
    status = running_status(index)
    cs = status["containerStatuses"][0]
    cs.update(ready=False, restartCount=0, state={"terminated": {
        "exitCode": exit_code, "reason": "Error", "startedAt": now, "finishedAt": now}})
    return status


def failed_never_status(index: int, *, exit_code: int = 1) -> Obj:
    """The container exited with reason Error under `restartPolicy: Never`: stopped for good, the pod Failed."""
    now = clock.rfc3339(clock.utcnow())
    status = running_status(index)
    status["phase"] = "Failed"
    cs = status["containerStatuses"][0]
    cs.update(ready=False, started=False, state={"terminated": {
        "exitCode": exit_code, "reason": "Error", "startedAt": now, "finishedAt": now}})
    return status


def unhealthy_status(index: int) -> Obj:
    status = running_status(index, dra=True)
    status["containerStatuses"][0]["allocatedResourcesStatus"] = [dra_entry(index, "Unhealthy")]
    return status


AGENT_LABELS = {"app.kubernetes.io/name": "kcover", "app.kubernetes.io/component": "agent"}
"""The chart's labels on agent pods: the controller takes a Node's Event only from an agent on it."""


def agent_pod(namespace_: str, node_name: str) -> Obj:
    """The agent pod the chart's DaemonSet runs on `node_name` (the bench's agent runs in its own process)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"kcover-agent-{node_name}", "namespace": namespace_,
                         "labels": {BENCH_LABEL: "true", **AGENT_LABELS}},
            "spec": {"nodeName": node_name, "containers": [{"name": "agent", "image": "kcover:bench"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True",
                                                          "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}


BREAKER_OFF: dict[str, int | float] = {"max_cordoned_fraction": 1.0, "max_cordoned_nodes": 1_000_000,
                                         "max_cordons_per_window": 1_000_000, "max_cordons_per_window_fraction": 1.0,
                                         "max_restarted_workloads_per_window": 1_000_000}
"""The fleet breaker's limits out of the way: the bench cordons a node per XID sample and restarts a job per
sample, which the shipped limits (rightly) call a storm; it measures latency and cost, not the breaker."""
