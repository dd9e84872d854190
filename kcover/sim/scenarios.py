"""The named fault scenarios `kcover sim` plays, each with the expectations it checks at the end.

Owns, per scenario: the settings it needs (short cooldowns, a small restart budget), how it injects
its fault(s) into a running `cluster.SimCluster`, what it waits for (detected on a bus, acted on in
an API Event, the job Running again with new pod uids) and the explicit checks that decide whether it
passed. It records into a `playing.Run`: fault records, checks and timeline notes. What a scenario is and
what a run records (`Scenario`, `Run`, the waits, the Event reasons) are `playing`'s; rendering and JSON
are `running`'s business.

Plugins add scenarios through the entry point group `kcover.sim.scenarios` (an object of type
`playing.Scenario`); `catalogue()` lists the built-in ones and those, which kcover never imports by name.

How it fails: a wait that times out raises `cluster.WaitTimeout`, which the runner turns into a
failed check; a scenario never raises anything else on purpose. A plugin scenario that fails to load
is logged and left out.
"""

from __future__ import annotations

import asyncio
import importlib.metadata as md
import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from kcover import model
from kcover.aio import clock as clock_
from kcover.kube import client as client_
from kcover.sim import cluster as cluster_
from kcover.sim import playing

log = structlog.get_logger()

ENTRY_POINT_GROUP = "kcover.sim.scenarios"




# ---------------------------------------------------------------------------------------------- helpers



def _is_restart_of(job: str) -> Callable[[cluster_.ApiEvent], bool]:
    return lambda e: e.reason == playing.RESTARTED and e.kind == "PyTorchJob" and e.name == job


def _about_pod(detector: str, pod: str) -> Callable[[model.CollectorEvent], bool]:
    return lambda e: e.detector == detector and e.target.kind is model.TargetKind.POD and e.target.name == pod


def _worker(c: cluster_.SimCluster, job: str) -> str:
    return str(c.running_pods(job)[1]["metadata"]["name"])


def _fail(c: cluster_.SimCluster, pod: str, message: str) -> None:
    c.kubelets.fail_container(playing.NS, pod, cluster_.CONTAINER, exit_code=1, reason="Error", message=message)


async def _restart_flow(run: playing.Run, f: playing.FaultRecord, job: str, old: set[str], detector: str,
                        pod: str) -> None:
    await run.detected(f, _about_pod(detector, pod), f"{detector} to report Pod {playing.NS}/{pod}")
    await run.acted(f, _is_restart_of(job), f"a {playing.RESTARTED} Event for PyTorchJob {playing.NS}/{job}")
    await run.recovered(f, job, old)


def _once(run: playing.Run, job: str, *, deletes: int = 1) -> None:
    c = run.cluster
    got = len(run.api_events(playing.RESTARTED, job))
    run.check(f"PyTorchJob {playing.NS}/{job} restarted exactly once ({playing.RESTARTED} Events: {got})", got == 1)
    # a PyTorchJob's pods carry no uid label: kcover deletes each pod it verified, with its uid as precondition
    calls = c.srv.request_counts.get("DELETE pods", 0)
    want = deletes * c.size.pods_per_job
    run.check(f"{want} uid-preconditioned pod deletes (made {calls})", calls == want)


def _others_untouched(run: playing.Run, before: Mapping[str, set[str]]) -> None:
    c = run.cluster
    moved = [job for job, uids in before.items() if c.pod_uids(job) != uids]
    run.check("the other jobs were left alone", not moved, ", ".join(moved))


async def _post_event(kube: client_.KubeClient, namespace: str, involved: dict[str, Any], *, reason: str,
                      message: str, controller: str) -> None:
    """POST an annotated Event. The client is made before the fault is recorded: building one loads the CA
    bundle (about 60 ms, blocking), which used to be counted as the event watcher's detection latency."""
    now = clock_.utcnow()
    body = {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{involved['name']}.{uuid.uuid4().hex[:12]}", "namespace": namespace,
                         "annotations": {"kcover.io/need-recovery": "true"}},
            "involvedObject": involved, "reason": reason, "message": message, "type": "Warning",
            "action": "HealthCheck", "eventTime": clock_.micro_time(now),
            "reportingComponent": controller, "reportingInstance": f"{controller.split('/')[0]}-0"}
    await kube.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)


# ---------------------------------------------------------------------------------------------- scenarios

async def pod_error(run: playing.Run) -> None:
    c = run.cluster
    job = c.jobs[0]
    pod = _worker(c, job)
    old = c.pod_uids(job)
    others = {j: c.pod_uids(j) for j in c.jobs if j != job}
    f = run.fault("container-error", f"Pod {playing.NS}/{pod}", "container pytorch exits with code 1 (Error)")
    _fail(c, pod, "torch.distributed.elastic.multiprocessing.api: worker group failed (exitcode: 1)")
    await _restart_flow(run, f, job, old, "pod-status", pod)
    await asyncio.sleep(playing.SETTLE)
    _once(run, job)
    _others_untouched(run, others)


async def gpu_xid(run: playing.Run) -> None:
    c = run.cluster
    node = str(c.running_pods(c.jobs[0])[1]["spec"]["nodeName"])
    jobs = c.jobs_on_node(node)
    old = {job: c.pod_uids(job) for job in jobs}
    gpu = 3 % c.size.gpus_per_node
    f = run.fault("gpu-xid-79", f"Node {node}", f"NVML reports XID 79 (GPU fallen off the bus) on GPU "
                  f"{c.gpu_uuids[node][gpu]}")
    c.agents[node].nvml.xid(79, gpu)
    await run.detected(f, lambda e: e.reason == "XID79" and node in (e.target.node, e.target.name),
                       f"the agent on {node} to report XID 79")

    def condition() -> dict[str, Any] | None:
        found = next((cond for cond in c.srv.store.get("nodes", "", node)["status"].get("conditions", [])
                      if cond["type"] == "KcoverGPUHealthy" and cond["status"] == "False"), None)
        return dict(found) if found else None

    cond = await c.until(condition, playing.WAIT, f"KcoverGPUHealthy=False on Node {node}")
    run.note("agent", f"Node {node}: condition KcoverGPUHealthy=False ({cond.get('reason')})")
    await run.acted(f, lambda e: e.reason == playing.CORDONED and e.name == node,
                    f"a {playing.CORDONED} Event for {node}")
    for job in jobs:
        await run.acted(f, _is_restart_of(job), f"a {playing.RESTARTED} Event for PyTorchJob {playing.NS}/{job}")
    for job in jobs:
        await run.recovered(f, job, old[job])
    await asyncio.sleep(playing.SETTLE)
    spec = c.srv.store.get("nodes", "", node)["spec"]
    taints = [t.get("key") for t in spec.get("taints") or []]
    run.check(f"Node {node} is cordoned (spec.unschedulable)", spec.get("unschedulable") is True)
    run.check(f"Node {node} carries the kcover.io/unhealthy taint", "kcover.io/unhealthy" in taints, str(taints))
    agent_events = [e for e in run.api_events("XID79") if e.name == node and e.reporter == "kcover.io/agent"]
    run.check("the agent posted an XID79 Event about the Node", bool(agent_events))
    cordoned = [n for n in c.nodes if c.srv.store.get("nodes", "", n)["spec"].get("unschedulable")]
    run.check("only that node was cordoned", cordoned == [node], ", ".join(cordoned))
    for job in jobs:
        got = len(run.api_events(playing.RESTARTED, job))
        run.check(f"PyTorchJob {playing.NS}/{job} (pods on {node}) restarted exactly once ({got})", got == 1)
        stuck = [p["metadata"]["name"] for p in c.job_pods(job) if p["spec"].get("nodeName") == node]
        run.check(f"PyTorchJob {playing.NS}/{job} came back on other nodes", not stuck, ", ".join(stuck))


async def dra_unhealthy(run: playing.Run) -> None:
    c = run.cluster
    job = c.jobs[0]
    pod = _worker(c, job)
    node = str(c.srv.store.get("pods", playing.NS, pod)["spec"]["nodeName"])
    old = c.pod_uids(job)
    device = f"gpu.nvidia.com/{node}/gpu-2"
    f = run.fault("dra-device-unhealthy", f"Pod {playing.NS}/{pod}",
                  f"allocatedResourcesStatus: {device} turns Unhealthy")
    c.kubelets.set_device_health(playing.NS, pod, cluster_.CONTAINER, resource_name=cluster_.GPU_RESOURCE_STATUS,
                                 resource_id=device, health="Unhealthy",
                                 message="XID 79: GPU has fallen off the bus")
    await _restart_flow(run, f, job, old, "dra-health", pod)
    await asyncio.sleep(playing.SETTLE)
    _once(run, job)


async def event_annotation(run: playing.Run) -> None:
    c = run.cluster
    job = c.jobs[0]
    pod = c.srv.store.get("pods", playing.NS, _worker(c, job))
    name = str(pod["metadata"]["name"])
    old = c.pod_uids(job)
    async with client_.from_configuration(c.srv.kube_configuration()) as kube:
        f = run.fault("recovery-event", f"Pod {playing.NS}/{name}",
                      "an external health checker posts an Event annotated kcover.io/need-recovery=true")
        await _post_event(kube, playing.NS, {"kind": "Pod", "apiVersion": "v1", "namespace": playing.NS, "name": name,
                                     "uid": pod["metadata"]["uid"]},
                          reason="NCCLAllReduceHang", message="all-reduce stalled for 300s on rank 1",
                          controller="healthcheck.example.com/checker")
    await _restart_flow(run, f, job, old, "event-watcher", name)
    await asyncio.sleep(playing.SETTLE)
    _once(run, job)


async def restart_storm(run: playing.Run) -> None:
    c = run.cluster
    job = c.jobs[0]
    budget = int(RESTART_STORM.overrides["recovery"]["max_restarts_per_window"])
    for attempt in range(1, budget + 2):
        await asyncio.sleep(0.8)  # longer than the 0.5 s cooldown: only the budget may stop kcover
        pod = _worker(c, job)
        old = c.pod_uids(job)
        f = run.fault("container-error", f"Pod {playing.NS}/{pod}", f"the job fails on start (failure {attempt})")
        _fail(c, pod, "RuntimeError: CUDA out of memory while loading the checkpoint")
        await run.detected(f, _about_pod("pod-status", pod), f"pod-status to report Pod {playing.NS}/{pod}")
        found = await run.acted(f, lambda e: e.reason in (playing.RESTARTED, playing.SKIPPED) and e.name == job,
                                f"kcover to restart or refuse PyTorchJob {playing.NS}/{job}")
        if found.reason == playing.SKIPPED:
            run.note("refused", playing.clip(found.message, 160), found.at)
            break
        await run.recovered(f, job, old)
    await asyncio.sleep(playing.SETTLE)
    restarts = len(run.api_events(playing.RESTARTED, job))
    run.check(f"restarts stopped at the budget of {budget} ({restarts})", restarts == budget)
    why = [e.message for e in run.api_events(playing.SKIPPED, job)]
    run.check(f"a {playing.SKIPPED} Event says the budget is exhausted",
              any("budget exhausted" in m for m in why), playing.clip(why[0], 120) if why else "none")
    calls = c.srv.request_counts.get("DELETE pods", 0)
    run.check(f"{budget} restarts' uid-preconditioned pod deletes ({calls})", calls == budget * c.size.pods_per_job)
    run.check("the job's pods were left in place after the refusal",
              len(c.running_pods(job)) == c.size.pods_per_job)
    # the job's own bug: no node is blamed for it, however often it failed on the same nodes
    cordoned = [n for n in c.nodes if c.srv.store.get("nodes", "", n)["spec"].get("unschedulable")
                or any(t.get("key", "").startswith("kcover.io/")
                       for t in c.srv.store.get("nodes", "", n)["spec"].get("taints") or [])]
    run.check(f"no node was cordoned or tainted ({', '.join(cordoned) or 'none'})", not cordoned)
    run.check(f"no {playing.CORDONED} Event",
              not [e for e in c.api_events if e.at >= run.started and e.reason == playing.CORDONED])


async def leader_failover(run: playing.Run) -> None:
    c = run.cluster
    job = c.jobs[0]
    leader = c.leader()
    assert leader is not None
    pod = _worker(c, job)
    old = c.pod_uids(job)
    f = run.fault("container-error", f"Pod {playing.NS}/{pod}", "container pytorch exits with code 1 (Error)")
    _fail(c, pod, "torch.distributed.elastic.multiprocessing.api: worker group failed (exitcode: 1)")
    c.kill(leader)
    run.note("kill", f"leader {leader.identity} killed mid-recovery; its Lease is not released")
    successor = await c.until(c.leader, playing.WAIT, "a successor to take the Lease")
    run.note("lease", f"{successor.identity} acquired the Lease")
    await run.detected(f, _about_pod("pod-status", pod), f"pod-status to report Pod {playing.NS}/{pod}")
    found = await run.acted(f, _is_restart_of(job), f"a {playing.RESTARTED} Event for PyTorchJob {playing.NS}/{job}")
    await run.recovered(f, job, old)
    await asyncio.sleep(playing.SETTLE)
    run.check(f"the successor acted ({found.instance})", found.instance == successor.identity)
    _once(run, job)


async def leader_crash_after_intent(run: playing.Run) -> None:
    c = run.cluster
    job = c.jobs[0]
    leader = c.leader()
    assert leader is not None
    pod = _worker(c, job)
    old = c.pod_uids(job)
    request = leader.kube.request

    async def dies_at_the_delete(method: str, path: str, **kwargs: Any) -> Any:
        if method == "DELETE" and "/pods" in path:  # the restart's first delete (per pod for a PyTorchJob)
            run.note("kill", f"leader {leader.identity} killed after its ledger write, before its first pod delete "
                             "(Lease not released)")
            c.kill(leader)
            await asyncio.Event().wait()  # never sent: the kill cancels this task
        return await request(method, path, **kwargs)

    vars(leader.kube)["request"] = dies_at_the_delete  # the fault: this replica's process dies right here
    f = run.fault("container-error", f"Pod {playing.NS}/{pod}", "container pytorch exits with code 1 (Error)")
    _fail(c, pod, "torch.distributed.elastic.multiprocessing.api: worker group failed (exitcode: 1)")
    await run.detected(f, _about_pod("pod-status", pod), f"pod-status to report Pod {playing.NS}/{pod}")
    await c.until(lambda: leader.killed, playing.WAIT, f"the leader {leader.identity} to record the restart and die")
    intent = _ledger_intent(c, job)
    run.check(f"the dead leader left a pending restart intent in the ledger ({intent.get('l')})",
              intent.get("l") == leader.identity)
    successor = await c.until(c.leader, playing.WAIT, "a successor to take the Lease")
    run.note("lease", f"{successor.identity} acquired the Lease")
    found = await run.acted(f, _is_restart_of(job), f"a {playing.RESTARTED} Event for PyTorchJob {playing.NS}/{job}")
    await run.recovered(f, job, old)
    await asyncio.sleep(playing.SETTLE)
    run.check(f"the successor finished the restart ({found.instance})", found.instance == successor.identity)
    run.check("its Event says it finished the dead leader's restart", "finishing the restart" in found.message,
              playing.clip(found.message, 160))
    _once(run, job)


def _ledger_intent(c: cluster_.SimCluster, job: str) -> dict[str, Any]:
    """The pending restart intent of `job` in the ledger (its LedgerEntry objects, or a ConfigMap), or {}."""
    objects = [*c.srv.store.iter_objects("ledgerentries.kcover.io"), *c.srv.store.iter_objects("configmaps")]
    for cm in objects:
        for raw in (cm.get("data") or {}).values():
            entry = json.loads(raw)
            intent = entry.get("p") if isinstance(entry, dict) else None
            if isinstance(intent, dict) and intent.get("w", [None] * 4)[3] == job:
                return intent
    return {}


async def forged_event(run: playing.Run) -> None:
    c = run.cluster
    node = c.nodes[0]
    before = c.metric("kcover_events_rejected_total", {"reason": "namespace_not_allowed"})
    async with client_.from_configuration(c.srv.kube_configuration()) as kube:
        f = run.fault("forged-event", f"Node {node}",
                      "a tenant posts an Event annotated kcover.io/need-recovery=true about the Node in `default`, "
                      "naming kcover's agent as its reporter")
        await _post_event(kube, "default", {"kind": "Node", "apiVersion": "v1", "name": node},
                          reason="GPUFailure", message="all GPUs failed, cordon now",
                          controller="kcover.io/agent")
    await c.until(lambda: c.metric("kcover_events_rejected_total", {"reason": "namespace_not_allowed"}) > before,
                  playing.WAIT, "the event watcher to refuse the Event")
    f.detected_at = clock_.utcnow()
    f.action = "refused"
    run.note("refused", "event-watcher refused the Event: namespace_not_allowed "
                        "(kcover_events_rejected_total{reason=\"namespace_not_allowed\"} +1)", f.detected_at)
    await asyncio.sleep(playing.SETTLE * 1.5)
    cordoned = [n for n in c.nodes if c.srv.store.get("nodes", "", n)["spec"].get("unschedulable")]
    run.check("no node was cordoned", not cordoned, ", ".join(cordoned))
    acted = [e.reason for e in c.api_events
             if e.at >= run.started and e.reason in (playing.RESTARTED, playing.CORDONED)]
    run.check("no recovery action was taken", not acted, ", ".join(acted))
    leader = c.leader()
    counted = (leader.metrics.registry.get_sample_value("kcover_events_rejected_total",
                                                        {"reason": "namespace_not_allowed"}) or 0.0) if leader else 0.0
    run.check(f"the leader counted the refusal in kcover_events_rejected_total ({counted:g})", counted >= 1)


LOG_TAIL = """[rank1]:[W] ProcessGroupNCCL.cpp:1250] NCCL WARN Net : Connection closed by remote peer 10.1.0.7<52344>
[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, NCCL version 2.20.5
[rank1]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED"""


async def log_classified(run: playing.Run) -> None:
    c = run.cluster
    job = c.jobs[0]
    pod = _worker(c, job)
    old = c.pod_uids(job)
    f = run.fault("container-error", f"Pod {playing.NS}/{pod}",
                  "container pytorch exits with an NCCL error in its log")
    c.srv.append_log(playing.NS, pod, cluster_.CONTAINER, LOG_TAIL)
    _fail(c, pod, "exit status 1")
    await run.detected(f, _about_pod("pod-status", pod), f"pod-status to report Pod {playing.NS}/{pod}")
    classified = await c.until(lambda: c.detection(_about_pod("logscan", pod), f.injected_at), playing.WAIT,
                               "logscan to classify the log")
    run.check("logscan classified the failure as communication",
              classified.event.reason == "LogClassifiedCommunication", classified.event.reason)
    await run.acted(f, _is_restart_of(job), f"a {playing.RESTARTED} Event for PyTorchJob {playing.NS}/{job}")
    await run.recovered(f, job, old)
    await asyncio.sleep(playing.SETTLE)
    _once(run, job)


RESTART_STORM = playing.Scenario(
    "restart-storm", "a job that fails on every start: restarts stop at the budget (3), a KcoverRecoverySkipped "
    "Event says why", restart_storm,
    overrides={"recovery": {"max_restarts_per_window": 3, "workload_cooldown_seconds": 0.5}})

SCENARIOS: dict[str, playing.Scenario] = {s.name: s for s in (
    playing.Scenario("pod-error", "a worker exits with Error: its job is restarted exactly once and runs again",
                     pod_error),
    playing.Scenario("gpu-xid", "XID 79 on one GPU: the agent marks the node, kcover cordons and taints it and "
                     "restarts the jobs with pods there, which come back on other nodes", gpu_xid),
    playing.Scenario("dra-unhealthy", "a pod's allocated DRA device turns Unhealthy: its job is restarted",
                     dra_unhealthy),
    playing.Scenario("event-annotation", "an external system posts an Event annotated "
                     "kcover.io/need-recovery=true about a pod: its job is restarted", event_annotation),
    RESTART_STORM,
    playing.Scenario("leader-failover", "the leader is killed right after a fault (Lease not released): the "
                     "successor restarts the job exactly once", leader_failover),
    playing.Scenario("leader-crash-after-intent", "the leader dies after recording a restart in the ledger but "
                     "before deleting the pods: the successor finishes that restart, exactly once, within the "
                     "cooldown", leader_crash_after_intent),
    playing.Scenario("forged-event", "a tenant posts an annotated Event about a Node naming kcover's agent: "
                     "nothing is cordoned, the refusal is counted", forged_event),
    playing.Scenario("log-classified", "a worker exits with an NCCL error in its log: pod-status reports it, the "
                     "logscan plugin classifies it as communication, the job is restarted", log_classified,
                     overrides={"detectors": {"entries": {"logscan": {}}}}, plugin="logscan"),
)}

from kcover.sim import loopscenarios  # noqa: E402  (they build on this module's helpers)

SCENARIOS.update({s.name: s for s in loopscenarios.SCENARIOS})
DEFAULT = "pod-error"


def catalogue() -> dict[str, playing.Scenario]:
    """The built-in scenarios, then those plugins register in `kcover.sim.scenarios` (built-in names win)."""
    found = dict(SCENARIOS)
    for ep in md.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in found:
            continue
        try:
            scenario = ep.load()
        except Exception as exc:  # a broken plugin must not take the sim down
            log.error("sim_scenario_plugin_failed", scenario=ep.name, entry_point=ep.value, error=repr(exc))
            continue
        if not isinstance(scenario, playing.Scenario) or scenario.name != ep.name:
            log.error("sim_scenario_plugin_invalid", scenario=ep.name, entry_point=ep.value)
            continue
        found[ep.name] = scenario
    return found
