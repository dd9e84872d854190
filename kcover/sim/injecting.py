"""The faults `kcover sim inject` puts into a running simulated cluster, and how each is made real.

Owns the fault requests (`Fault`: one per kind, with the flags the command takes) and `inject`, which
applies one to a `cluster.SimCluster` the way the fault would arise on a real cluster:

* `pod-error`: a container of a pod exits (the kubelet writes `lastState.terminated`, or with
  restartPolicy Never the terminated state and phase Failed); an optional log text is what the
  container printed before it (what `kubectl logs --previous` and kcover's logscan read).
* `xid`: the NVML driver of a node reports an XID on one of its GPUs, through that node's simulated
  NVML, so the node's kcover agent sees it as it would on hardware.
* `dra-health`: the kubelet reports a DRA device of a pod's container as Unhealthy (or Healthy,
  Unknown) in `allocatedResourcesStatus` (KEP-4680).
* `node-not-ready`: a node's kubelet stops posting Ready (status False, or Unknown as the node
  lifecycle controller writes for a silent node), or posts Ready again (`--status True`).
* `nccl-hang`: an external health checker posts a Warning Event about a pod, annotated
  `kcover.io/need-recovery=true`, as kcover's Events integration documents.

How it fails: `InjectError` with a message naming what is missing (a pod, a node, a container, a
GPU index) and nothing changed; a write the API server would refuse (a DRA resource name the
container has no claim for) is refused the same way, as `status.ApiError`'s message.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal

from kcover.aio import clock as clocks
from kcover.sim import cluster as cluster_
from kcover.sim import status, strategy

KINDS = ("pod-error", "xid", "dra-health", "node-not-ready", "nccl-hang")
HEALTH = ("Unhealthy", "Healthy", "Unknown")
READY = ("False", "Unknown", "True")


class InjectError(Exception):
    """The fault cannot be injected as asked; nothing was changed."""


@dataclass(frozen=True)
class Fault:
    """One fault to inject. Which fields matter depends on `kind` (see the module docstring)."""

    kind: Literal["pod-error", "xid", "dra-health", "node-not-ready", "nccl-hang"]
    namespace: str = cluster_.NAMESPACE
    pod: str = ""
    node: str = ""
    container: str = ""
    exit_code: int = 1
    reason: str = ""
    message: str = ""
    log: str = ""
    gpu: int = 0
    code: int = 79
    device: str = ""
    resource: str = cluster_.GPU_RESOURCE_STATUS
    health: str = "Unhealthy"
    status: str = "False"
    reporter: str = "healthcheck.example.com/checker"

    @staticmethod
    def from_json(doc: Any) -> Fault:
        """A fault from the control endpoint's JSON body; InjectError for an unknown kind or field."""
        if not isinstance(doc, dict) or doc.get("kind") not in KINDS:
            raise InjectError(f"unknown fault kind {doc.get('kind') if isinstance(doc, dict) else doc!r}; "
                              f"known: {', '.join(KINDS)}")
        known = set(Fault.__dataclass_fields__)
        unknown = sorted(set(doc) - known)
        if unknown:
            raise InjectError(f"unknown field(s) {', '.join(unknown)} for a {doc['kind']} fault")
        try:
            return Fault(**doc)
        except TypeError as exc:
            raise InjectError(str(exc)) from None


def inject(c: cluster_.SimCluster, fault: Fault) -> str:
    """Make `fault` happen in `c`; returns one line saying what happened."""
    try:
        return _INJECTORS[fault.kind](c, fault)
    except status.ApiError as err:
        raise InjectError(str(err.status_obj.get("message") or err)) from None


def _pod(c: cluster_.SimCluster, fault: Fault) -> dict[str, Any]:
    if not fault.pod:
        raise InjectError(f"a {fault.kind} fault needs a pod (--pod)")
    try:
        pod = c.srv.store.get("pods", fault.namespace, fault.pod)
    except status.ApiError:
        raise InjectError(f"no pod {fault.namespace}/{fault.pod}") from None
    if not (pod.get("spec") or {}).get("nodeName"):
        raise InjectError(f"pod {fault.namespace}/{fault.pod} is not running on a node")
    return pod


def _container(pod: dict[str, Any], fault: Fault) -> str:
    names = [str(x["name"]) for x in (pod.get("spec") or {}).get("containers") or []]
    if fault.container:
        if fault.container not in names:
            raise InjectError(f"pod {fault.namespace}/{fault.pod} has no container {fault.container!r} "
                              f"(it has {', '.join(names)})")
        return fault.container
    if len(names) != 1:
        raise InjectError(f"pod {fault.namespace}/{fault.pod} has several containers; name one (--container): "
                          f"{', '.join(names)}")
    return names[0]


def _node(c: cluster_.SimCluster, fault: Fault) -> dict[str, Any]:
    if not fault.node:
        raise InjectError(f"a {fault.kind} fault needs a node (--node)")
    try:
        return c.srv.store.get("nodes", "", fault.node)
    except status.ApiError:
        raise InjectError(f"no node {fault.node}") from None


def _pod_error(c: cluster_.SimCluster, fault: Fault) -> str:
    pod = _pod(c, fault)
    container = _container(pod, fault)
    if fault.log:
        c.srv.append_log(fault.namespace, fault.pod, container, fault.log)
    reason = fault.reason or ("Completed" if fault.exit_code == 0 else "Error")
    c.kubelets.fail_container(fault.namespace, fault.pod, container, exit_code=fault.exit_code, reason=reason,
                              message=fault.message)
    return f"container {container} of pod {fault.namespace}/{fault.pod} exited with code {fault.exit_code} ({reason})"


def _xid(c: cluster_.SimCluster, fault: Fault) -> str:
    _node(c, fault)
    agent = c.agents.get(fault.node)
    if agent is None:
        raise InjectError(f"node {fault.node} runs no simulated GPU agent")
    gpus = agent.nvml.device_count()
    if not 0 <= fault.gpu < gpus:
        raise InjectError(f"node {fault.node} has GPUs 0-{gpus - 1}, not {fault.gpu}")
    if fault.code <= 0:
        raise InjectError(f"an XID code is a positive number, not {fault.code}")
    agent.nvml.xid(fault.code, fault.gpu)
    uuid_ = c.gpu_uuids.get(fault.node, [""] * gpus)[fault.gpu]
    return f"NVML on node {fault.node} reported XID {fault.code} on GPU {fault.gpu} ({uuid_})"


def _dra_health(c: cluster_.SimCluster, fault: Fault) -> str:
    pod = _pod(c, fault)
    container = _container(pod, fault)
    if fault.health not in HEALTH:
        raise InjectError(f"health is one of {', '.join(HEALTH)}, not {fault.health!r}")
    device = fault.device or f"gpu.nvidia.com/{pod['spec']['nodeName']}/gpu-0"
    c.kubelets.set_device_health(fault.namespace, fault.pod, container, resource_name=fault.resource,
                                 resource_id=device, health=fault.health, message=fault.message)
    return f"device {device} ({fault.resource}) of pod {fault.namespace}/{fault.pod} is {fault.health}"


def _node_not_ready(c: cluster_.SimCluster, fault: Fault) -> str:
    _node(c, fault)
    if fault.status not in READY:
        raise InjectError(f"the Ready status is one of {', '.join(READY)}, not {fault.status!r}")
    now = clocks.rfc3339(c.srv.store.clock.now())
    reason = fault.reason or {"False": "KubeletNotReady", "Unknown": "NodeStatusUnknown", "True": "KubeletReady"}[
        fault.status]
    message = fault.message or {"False": "container runtime network not ready: NetworkReady=false",
                                "Unknown": "Kubelet stopped posting node status.",
                                "True": "kubelet is posting ready status"}[fault.status]

    def change(node: dict[str, Any]) -> None:
        conditions = [cond for cond in (node.get("status") or {}).get("conditions") or [] if cond.get("type") != "Ready"]
        node.setdefault("status", {})["conditions"] = [*conditions, {
            "type": "Ready", "status": fault.status, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": now}]

    c.srv.store.mutate("nodes", "", fault.node, change)
    return f"node {fault.node} is Ready={fault.status} ({reason})"


def _nccl_hang(c: cluster_.SimCluster, fault: Fault) -> str:
    pod = _pod(c, fault)
    now = c.srv.store.clock.now()
    message = fault.message or "all-reduce stalled for 300s"
    body = {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{fault.pod}.{uuid.uuid4().hex[:12]}", "namespace": fault.namespace,
                         "annotations": {"kcover.io/need-recovery": "true"}},
            "involvedObject": {"kind": "Pod", "apiVersion": "v1", "namespace": fault.namespace, "name": fault.pod,
                               "uid": pod["metadata"]["uid"]},
            "reason": fault.reason or "NCCLAllReduceHang", "message": message, "type": "Warning",
            "action": "HealthCheck", "eventTime": clocks.micro_time(now),
            "reportingComponent": fault.reporter, "reportingInstance": f"{fault.reporter.split('/')[0]}-0"}
    store = c.srv.store
    created = store.create("events", strategy.prepare_create(store.registry.by_key("events"), body))
    return (f"Event {fault.namespace}/{created['metadata']['name']} ({body['reason']}, annotated "
            f"kcover.io/need-recovery=true) posted about pod {fault.namespace}/{fault.pod} by {fault.reporter}")


_INJECTORS = {"pod-error": _pod_error, "xid": _xid, "dra-health": _dra_health, "node-not-ready": _node_not_ready,
              "nccl-hang": _nccl_hang}
