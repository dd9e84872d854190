"""`SimCluster`: the simulated cluster with the real kcover running in it, as one async context manager.

Owns composing, for `kcover sim` and the end-to-end tests: a `SimServer`; simulated kubelets (with
the scheduler), Kubeflow operators (`actors`), the garbage collector (`collecting`), the batch/v1
Job controller (`jobs`) and the disruption controller (`disrupting`); N GPU nodes (`nvidia.com/gpu` capacity, `nvidia.com/gpu.present`, GPU
UUIDs, a pod CIDR each); the agent DaemonSet (apps/v1) owning one agent pod per node; J opted-in
PyTorchJobs whose pods the operator creates and the scheduler spreads across nodes; two REAL
controller replicas (leader election, each with its own `KubeClient` and `Metrics`)
and one REAL agent per node over a `FakeNvml` (and a `dcgmi.FakeDcgmi` for its validation runs). It also owns observing what happens: every bus event
of every controller and agent (`detections`), every core/v1 Event written (`api_events`, from a
store watch), and the job pods (`job_pods`, `recovered`). It decides nothing about whether a scenario
passed (`scenarios` does).

How it fails: `start()` raises `TimeoutError` when the cluster is not ready within `ready_timeout`
(no leader, caches unsynced, pods not running); a component that crashes propagates from its task
when the cluster is closed. Closing stops agents, controllers and actors, then the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime as dt
import random
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import structlog
import yaml

from kcover import bus as bus_
from kcover import metrics, model, serving, settings
from kcover.agent import running as agent_running
from kcover.aio import clock as clock_
from kcover.controller import running as controller_running
from kcover.kube import client as client_
from kcover.nvml import fake
from kcover.sim import actors, collecting, dcgmi, discovery, disrupting, jobs, tables
from kcover.sim import server as simserver

log = structlog.get_logger()

NAMESPACE = "ml"
AGENT_NAMESPACE = "kcover-system"
"""Where the agent DaemonSet runs and writes its Node Events (the release namespace)."""
CONFIG_MAP = "kcover-config"
"""The controllers' settings as the chart holds them (`<release>-config`, key config.yaml), in AGENT_NAMESPACE."""
CONTAINER = "pytorch"
GPU_CLAIM = "gpu-claim"
GPU_REQUEST = "gpu"
GPU_RESOURCE_STATUS = f"claim:{GPU_CLAIM}/{GPU_REQUEST}"
"""The `allocatedResourcesStatus[].name` of the job containers' DRA GPUs."""
JOB_LABEL = "training.kubeflow.org/job-name"
OPT_IN = "kcover.io/cascading-recovery"
POLL_SECONDS = 0.01


@dataclass(frozen=True)
class Size:
    nodes: int = 4
    gpus_per_node: int = 8
    jobs: int = 2
    seed: int = 0

    @property
    def pods_per_job(self) -> int:
        """One master plus workers: as many pods as nodes (at least two), so every job spans nodes."""
        return max(2, self.nodes)

    @property
    def gpus_per_pod(self) -> int:
        """GPUs each job pod requests: as many as leave room for one node's pods on the others (a cordoned
        node's pods must fit elsewhere, as the scheduler counts GPUs), at least one."""
        pods = self.jobs * self.pods_per_job
        per_node = -(-pods // max(1, self.nodes - 1))
        return max(1, self.gpus_per_node // max(1, per_node))


@dataclass(frozen=True)
class Detection:
    """One event seen on a controller's or an agent's bus."""

    at: dt.datetime
    where: str
    event: model.CollectorEvent


@dataclass(frozen=True)
class ApiEvent:
    """One core/v1 Event the API server stored."""

    at: dt.datetime
    reason: str
    kind: str
    namespace: str
    name: str
    message: str
    reporter: str
    instance: str
    annotations: Mapping[str, str]
    action: str = ""


@dataclass
class Replica:
    identity: str
    kube: client_.KubeClient
    metrics: metrics.Metrics
    controller: controller_running.Controller
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    killed: bool = False


@dataclass
class NodeAgent:
    node: str
    nvml: fake.FakeNvml
    kube: client_.KubeClient
    agent: agent_running.Agent
    dcgmi: dcgmi.FakeDcgmi
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
    return out


def controller_config(log_dir: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The controllers' config.yaml: production defaults, with timings short enough for a simulation (4/3/1 s
    lease). The cluster holds it as the chart would (`CONFIG_MAP`), so `kcover status` reads what they run with."""
    base: dict[str, Any] = {
        "lease": {"lease_duration_seconds": 4.0, "renew_deadline_seconds": 3.0, "retry_period_seconds": 1.0},
        "kube": {"workload_kinds": ["pytorchjobs.kubeflow.org"], "gc_freeze_after_sync": False},
        "bus": {"drain_timeout_seconds": 0.5},
        "detectors": {"entries": {"node-condition": {"config": {"min_duration_seconds": 0.0, "tick_seconds": 0.2}},
                                  "dra-health": {"config": {"tick_seconds": 0.5}}}},
        "recovery": {"workload_cooldown_seconds": 30.0, "max_cordoned_fraction": 0.5,
                     "save_logs": {"directory": log_dir, "timeout_seconds": 2.0}},
    }
    return _merge(base, overrides)


def controller_settings(identity: str, log_dir: str, overrides: Mapping[str, Any]) -> settings.Settings:
    """`controller_config` with this replica's Lease identity (the chart's POD_NAME)."""
    return settings.Settings.model_validate(_merge(controller_config(log_dir, overrides),
                                                   {"lease": {"identity": identity}}))


def agent_settings(node: str, overrides: Mapping[str, Any] | None = None) -> settings.Settings:
    return settings.Settings.model_validate(_merge({
        "agent": {"node_name": node, "min_write_interval_seconds": 0.1, "condition_hold_seconds": 300.0,
                  "pod_resources_socket": "/nonexistent/kcover-sim/kubelet.sock"},
        "bus": {"drain_timeout_seconds": 0.5},
        "detectors": {"entries": {"nvml": {"config": {"wait_timeout_ms": 100, "health_interval_seconds": 2.0}},
                                  "dcgm": {"enabled": False}}},
    }, overrides or {}))


class SimCluster:
    """The simulated cluster plus kcover. `async with SimCluster(Size()) as c:` waits until it is ready."""

    def __init__(self, size: Size = Size(), *, overrides: Mapping[str, Any] | None = None,
                 agent_overrides: Mapping[str, Any] | None = None, ready_timeout: float = 20.0) -> None:
        self.size = size
        self.overrides = dict(overrides or {})
        self.agent_overrides = dict(agent_overrides or {})
        self.ready_timeout = ready_timeout
        self.rng = random.Random(size.seed)
        self.srv = simserver.SimServer(seed=size.seed)
        self.kubelets = actors.Kubelets(self.srv, start_delay=0.05, finish_delay=0.2)
        self.operators = actors.KubeflowOperators(self.srv, interval=0.1)
        self.collector = collecting.GarbageCollector(self.srv)
        self.job_controller = jobs.JobController(self.srv)
        self.disruption = disrupting.DisruptionController(self.srv)
        self.nodes = [f"gpu-node-{i}" for i in range(size.nodes)]
        self.jobs = [f"train-{j}" for j in range(size.jobs)]
        self.replicas: list[Replica] = []
        self.agents: dict[str, NodeAgent] = {}
        self.gpu_uuids: dict[str, list[str]] = {}
        self.detections: list[Detection] = []
        self.api_events: list[ApiEvent] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._observers: list[asyncio.Task[None]] = []
        self._log_dir = tempfile.TemporaryDirectory(prefix="kcover-sim-logs-")
        self.log_dir = self._log_dir.name

    # ------------------------------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> SimCluster:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    def _spawn(self, coro: Any, name: str, *, observer: bool = False, component: str = "") -> asyncio.Task[None]:
        """`component`: every log line of the task (and of the tasks it starts) names it (`sim_component`), so
        one replica's or agent's lines can be told from the others' in a run's logs."""
        context = contextvars.copy_context()
        if component:
            context.run(structlog.contextvars.bind_contextvars, sim_component=component)
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro, name=name, context=context)
        (self._observers if observer else self._tasks).append(task)
        return task

    async def start(self) -> None:
        await self.srv.start()
        self._seed()
        self._spawn(self.kubelets.run(self._stop), "sim:kubelets")
        self._spawn(self.operators.run(self._stop), "sim:operators")
        self._spawn(self.collector.run(self._stop), "sim:garbage-collector")
        self._spawn(self.job_controller.run(self._stop), "sim:job-controller")
        self._spawn(self.disruption.run(self._stop), "sim:disruption-controller")
        self._spawn(self._follow_events(), "sim:events", observer=True)
        for identity in ("kcover-controller-a", "kcover-controller-b"):
            self.start_replica(identity)
        for node in self.nodes:
            self._start_agent(node)
        await self.until(self._ready, self.ready_timeout, "the cluster to be ready")
        await asyncio.sleep(0.3)  # detectors subscribe to the cache right after it synced

    def start_replica(self, identity: str) -> Replica:
        kube = client_.from_configuration(self.srv.kube_configuration())
        mets = metrics.Metrics(role=metrics.CONTROLLER, process=False)
        cfg = controller_settings(identity, self.log_dir, self.overrides)
        ctl = controller_running.Controller(cfg, client=kube, metrics=mets, health=serving.Health())
        replica = Replica(identity, kube, mets, ctl)
        replica.task = self._spawn(ctl.run(replica.stop), f"sim:controller:{identity}", component=identity)
        self._spawn(self._observe(ctl.bus, f"controller {identity}"), f"sim:observe:{identity}", observer=True)
        self.replicas.append(replica)
        return replica

    def _start_agent(self, node: str) -> None:
        nvml = fake.FakeNvml(self.size.gpus_per_node, uuid_prefix=self.gpu_uuids[node][0].rsplit("-", 1)[0])
        kube = client_.from_configuration(self.srv.kube_configuration())
        diag = dcgmi.FakeDcgmi(nvml)
        agent = agent_running.Agent(agent_settings(node, self.agent_overrides), client=kube,
                                    metrics=metrics.Metrics(role=metrics.AGENT, process=False),
                                    health=None, node=node, nvml=nvml, reporter_tick_seconds=0.1, dcgmi=diag)
        entry = NodeAgent(node, nvml, kube, agent, diag)
        entry.task = self._spawn(agent.run(entry.stop), f"sim:agent:{node}", component=f"agent:{node}")
        self._spawn(self._observe(agent.bus, f"agent {node}"), f"sim:observe:{node}", observer=True)
        self.agents[node] = entry

    def _ready(self) -> bool:
        live = [r for r in self.replicas if not r.killed]
        return (any(r.controller.is_leader() for r in live)
                and all(r.controller.cache.synced for r in live)
                and all(state == "running" for r in live for state in r.controller.supervisor.health().values())
                and all(a.nvml.registered for a in self.agents.values())
                and all(len(self.running_pods(job)) == self.size.pods_per_job for job in self.jobs))

    async def close(self) -> None:
        for entry in self.agents.values():
            entry.stop.set()
        for replica in self.replicas:
            replica.stop.set()
        role_tasks = [t for t in (*(a.task for a in self.agents.values()), *(r.task for r in self.replicas))
                      if t is not None]
        if role_tasks:
            _, pending = await asyncio.wait(role_tasks, timeout=10.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        self._stop.set()
        actor_tasks = [t for t in self._tasks if t not in role_tasks]
        if actor_tasks:
            await asyncio.wait(actor_tasks, timeout=5.0)
        for task in (*self._observers, *self._tasks):
            task.cancel()
        await asyncio.gather(*self._observers, *self._tasks, return_exceptions=True)
        for kube in (*(a.kube for a in self.agents.values()), *(r.kube for r in self.replicas)):
            await kube.close()
        await self.srv.stop()
        self._log_dir.cleanup()
        for task in role_tasks:  # a crash of kcover itself is the caller's business
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.error("sim_component_failed", task=task.get_name(), error=repr(task.exception()))

    def kill(self, replica: Replica) -> None:
        """Kill a replica as SIGKILL would: its tasks end, its Lease is NOT released."""
        if replica.controller.elector is not None:
            replica.controller.elector.release_on_exit = False
        replica.killed = True
        if replica.task is not None:
            replica.task.cancel()

    # ------------------------------------------------------------------------------------------ seeding

    def _seed(self) -> None:
        store = self.srv.store
        store.create("configmaps", {"metadata": {"name": CONFIG_MAP, "namespace": AGENT_NAMESPACE,
                                                 "labels": {"app.kubernetes.io/name": "kcover"}},
                                    "data": {"config.yaml": yaml.safe_dump(controller_config(self.log_dir,
                                                                                             self.overrides))}})
        store.create("namespaces", {"metadata": {"name": NAMESPACE}, "spec": {"finalizers": ["kubernetes"]},
                                    "status": {"phase": "Active"}})
        agents = store.create("daemonsets.apps", agent_daemonset(len(self.nodes)))
        for i, node in enumerate(self.nodes):
            base = f"GPU-{self.rng.getrandbits(32):08x}-{self.rng.getrandbits(16):04x}-{i:04x}"
            self.gpu_uuids[node] = [f"{base}-{g:04d}" for g in range(self.size.gpus_per_node)]
            gpus = str(self.size.gpus_per_node)
            resources = {"cpu": "192", "memory": "2Ti", "nvidia.com/gpu": gpus, "pods": "110"}
            store.create("nodes", {
                "metadata": {"name": node, "labels": {
                    "kubernetes.io/hostname": node, "nvidia.com/gpu.present": "true",
                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": gpus},
                    "annotations": {"kcover.io/sim-gpu-uuids": ",".join(self.gpu_uuids[node])}},
                "spec": {"podCIDR": f"10.244.{i}.0/24", "podCIDRs": [f"10.244.{i}.0/24"]},
                "status": {"capacity": resources, "allocatable": resources,
                           "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                           "lastTransitionTime": clock_.rfc3339(clock_.utcnow())}],
                           # what `kubectl get nodes -o wide` shows (VERSION, INTERNAL-IP, OS-IMAGE, ...)
                           "addresses": [{"type": "InternalIP", "address": f"10.0.{i // 250}.{i % 250 + 1}"},
                                         {"type": "Hostname", "address": node}],
                           "nodeInfo": {"kubeletVersion": discovery.GIT_VERSION, "architecture": "amd64",
                                        "operatingSystem": "linux", "osImage": "Ubuntu 24.04 LTS",
                                        "kernelVersion": "6.8.0-kcover-sim",
                                        "containerRuntimeVersion": "containerd://2.1.0"}}})
            # the agent DaemonSet's pod on this node, labelled as the chart labels it: the controller
            # accepts Node Events only from kcover's namespace and for nodes where such a pod runs
            store.create("pods", agent_pod(agents, node, f"10.0.{i // 250}.{i % 250 + 1}"))
        for job in self.jobs:
            # GPUs both ways: a device-plugin limit and a DRA claim, so device health may be reported
            # as "claim:gpu-claim/gpu" (a real server refuses a name the container has no claim for).
            template = {"spec": {"restartPolicy": "OnFailure",
                                 "resourceClaims": [{"name": GPU_CLAIM, "resourceClaimTemplateName": "gpu"}],
                                 "containers": [{
                "name": CONTAINER, "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                "command": ["torchrun", "train.py"],
                "resources": {"limits": {"nvidia.com/gpu": str(self.size.gpus_per_pod)},
                              "claims": [{"name": GPU_CLAIM, "request": GPU_REQUEST}]}}]}}
            store.create("pytorchjobs.kubeflow.org", {
                "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                "metadata": {"name": job, "namespace": NAMESPACE, "labels": {OPT_IN: "true"}},
                "spec": {"pytorchReplicaSpecs": {
                    "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template},
                    "Worker": {"replicas": self.size.pods_per_job - 1, "restartPolicy": "OnFailure",
                               "template": template}}}})

    # ------------------------------------------------------------------------------------------ observing

    async def _observe(self, bus: bus_.Bus, where: str) -> None:
        async for event in bus.subscribe("sim-observer"):
            self.detections.append(Detection(clock_.utcnow(), where, event))

    async def _follow_events(self) -> None:
        watcher = self.srv.store.watch("events", tables.Filter(), None)
        try:
            while True:
                change = watcher.initial.popleft() if watcher.initial else await watcher.queue.get()
                if change is None:
                    watcher = self.srv.store.watch("events", tables.Filter(), self.srv.store.resource_version)
                    continue
                if change.type == "ADDED":
                    self.api_events.append(_api_event(change.new.obj()))
        finally:
            watcher.close()

    def job_pods(self, job: str) -> list[dict[str, Any]]:
        return sorted((p for p in self.srv.store.iter_objects("pods")
                       if p["metadata"].get("namespace") == NAMESPACE
                       and (p["metadata"].get("labels") or {}).get(JOB_LABEL) == job),
                      key=lambda p: str(p["metadata"]["name"]))

    def running_pods(self, job: str) -> list[dict[str, Any]]:
        return [p for p in self.job_pods(job) if not p["metadata"].get("deletionTimestamp")
                and (p.get("status") or {}).get("phase") == "Running"]

    def pod_uids(self, job: str) -> set[str]:
        return {str(p["metadata"]["uid"]) for p in self.job_pods(job)}

    def jobs_on_node(self, node: str) -> list[str]:
        return [job for job in self.jobs if any(p["spec"].get("nodeName") == node for p in self.job_pods(job))]

    def leader(self) -> Replica | None:
        return next((r for r in self.replicas if not r.killed and r.controller.is_leader()), None)

    def metric(self, name: str, labels: Mapping[str, str]) -> float:
        """Sum of a sample over the live replicas' registries."""
        return sum(r.metrics.registry.get_sample_value(name, dict(labels)) or 0.0
                   for r in self.replicas if not r.killed)

    async def until(self, predicate: Callable[[], Any], within: float, what: str) -> Any:
        """Poll `predicate` until truthy; raises `WaitTimeout` naming `what`."""
        try:
            async with asyncio.timeout(within):
                while not (value := predicate()):  # noqa: ASYNC110  (polling in-process state)
                    await asyncio.sleep(POLL_SECONDS)
        except TimeoutError:
            raise WaitTimeout(f"timed out after {within:g}s waiting for {what}") from None
        return value

    def detection(self, match: Callable[[model.CollectorEvent], bool], after: dt.datetime) -> Detection | None:
        return next((d for d in self.detections if d.event.observed_at >= after and match(d.event)), None)

    def api_event(self, match: Callable[[ApiEvent], bool], after: dt.datetime) -> ApiEvent | None:
        return next((e for e in self.api_events if e.at >= after and match(e)), None)

    def recovered(self, job: str, old_uids: set[str]) -> bool:
        """All the job's pods Running again, none of them an old one."""
        pods = self.running_pods(job)
        return (len(pods) == self.size.pods_per_job and len(self.job_pods(job)) == len(pods)
                and not any(p["metadata"]["uid"] in old_uids for p in pods))


class WaitTimeout(Exception):
    """An expected state did not come about in time."""


def _api_event(obj: Mapping[str, Any]) -> ApiEvent:
    inv = obj.get("involvedObject") or {}
    meta = obj.get("metadata") or {}
    stamp = obj.get("eventTime") or obj.get("lastTimestamp") or meta.get("creationTimestamp") or ""
    at = clock_.utcnow()
    if stamp:
        with contextlib.suppress(ValueError):
            at = clock_.parse_time(stamp)
    return ApiEvent(at=at, reason=str(obj.get("reason", "")), kind=str(inv.get("kind", "")),
                    namespace=str(inv.get("namespace", "")), name=str(inv.get("name", "")),
                    message=str(obj.get("message", "")),
                    reporter=str(obj.get("reportingComponent") or (obj.get("source") or {}).get("component") or ""),
                    instance=str(obj.get("reportingInstance", "")),
                    annotations=dict(meta.get("annotations") or {}), action=str(obj.get("action") or ""))


AGENT_LABELS = {"app.kubernetes.io/name": "kcover", "app.kubernetes.io/component": "agent"}
AGENT_REVISION = "kcover-agent-1"
"""The `controller-revision-hash` of the agent pods (one template revision: nothing rolls them)."""


def agent_daemonset(nodes: int) -> dict[str, Any]:
    """The chart's agent DaemonSet (apps/v1), with the status its controller would write for `nodes` nodes."""
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "kcover-agent", "namespace": AGENT_NAMESPACE, "labels": dict(AGENT_LABELS)},
            "spec": {"selector": {"matchLabels": dict(AGENT_LABELS)},
                     "template": {"metadata": {"labels": dict(AGENT_LABELS)}, "spec": {
                         "containers": [{"name": "agent", "image": "kcover-agent"}],
                         "tolerations": [{"operator": "Exists"}]}},
                     "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
                     "revisionHistoryLimit": 10},
            "status": {"currentNumberScheduled": nodes, "desiredNumberScheduled": nodes, "numberAvailable": nodes,
                       "numberMisscheduled": 0, "numberReady": nodes, "observedGeneration": 1,
                       "updatedNumberScheduled": nodes}}


def agent_pod(daemonset: Mapping[str, Any], node: str, host_ip: str) -> dict[str, Any]:
    """The agent pod the DaemonSet controller runs on `node`: its labels and controller ownerReference, the
    node affinity and tolerations it adds, host networking (the pod's IP is the node's), Running."""
    now = clock_.rfc3339(clock_.utcnow())
    meta = daemonset["metadata"]
    tolerations = [{"operator": "Exists"},
                   *({"key": f"node.kubernetes.io/{key}", "operator": "Exists", "effect": effect}
                     for key, effect in (("not-ready", "NoExecute"), ("unreachable", "NoExecute"),
                                         ("disk-pressure", "NoSchedule"), ("memory-pressure", "NoSchedule"),
                                         ("pid-pressure", "NoSchedule"), ("unschedulable", "NoSchedule"),
                                         ("network-unavailable", "NoSchedule")))]
    return {
        "metadata": {"name": f"kcover-agent-{node}", "namespace": AGENT_NAMESPACE,
                     "labels": {**AGENT_LABELS, "controller-revision-hash": AGENT_REVISION,
                                "pod-template-generation": "1"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": meta["name"],
                                          "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"nodeName": node, "hostNetwork": True, "containers": [{"name": "agent", "image": "kcover-agent"}],
                 "tolerations": tolerations, "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
                 "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                     {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}},
        "status": {"phase": "Running", "hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "podIP": host_ip,
                   "podIPs": [{"ip": host_ip}], "startTime": now,
                   "conditions": [{"type": t, "status": "True", "lastTransitionTime": now}
                                  for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
                   "containerStatuses": [{
                       "name": "agent", "image": "kcover-agent", "imageID": "", "ready": True, "started": True,
                       "restartCount": 0, "state": {"running": {"startedAt": now}}}]}}
