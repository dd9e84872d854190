"""Every fault from where it starts to what the API server ends up holding, on every cluster backend.

One table: each row injects one fault at its real source (the fake NVML library, a `dcgmi` program, the
MetaX plugin's `mx-smi`, the script plugin's check script, the pod's DRA device health, a node
condition) and lets the product run as it does in a cluster: the agent (real detectors, reporter and
codec) writes what it saw to the API server, the controller (cache, detectors, policy, executor,
Lease) reads it back and acts. The harness plays kubelet and training operator. Each row then asserts
what the API server holds: which jobs were restarted (audit Events, new pod uids), whether the node is
cordoned and tainted, and that nothing else moved.

The cluster: two GPU nodes, `sick` (where every fault happens) and `healthy`. On `sick`, job `hit`
(two workers; worker-0 holds GPU 0, as the node's PodResources lookup says) and job `neighbour` (two
workers on GPUs 4 and 5); on `healthy`, job `spared`. All three opted in.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from kcover import layering, metrics, serving, settings
from kcover.agent import running as agent_running
from kcover.controller import running as controller_running
from kcover.nvml import fake

Cluster = Any  # tests/backends.py's Cluster
Obj = dict[str, Any]

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
METAX_FIXTURES = Path(__file__).resolve().parents[3] / "plugins" / "kcover-metax" / "tests" / "fixtures"
WAIT = 25.0
"""Seconds one awaited outcome may take."""
SETTLE = 1.5
"""Seconds watched after the outcome for actions that must not happen."""
RESTARTED = "KcoverRestartedWorkload"
CLAIM, REQUEST = "gpu-claim", "gpu"
CONTAINER = "pytorch"
HOLD = 1.0
"""Seconds a condition must stay good before kcover returns its node to service (test value)."""


# ------------------------------------------------------------------------------------------ the cluster

@dataclasses.dataclass
class World:
    cluster: Cluster
    sick: str
    healthy: str
    nvml: fake.FakeNvml
    tmp: Path
    jobs: dict[str, Obj] = dataclasses.field(default_factory=dict)
    pod_uids: dict[str, set[str]] = dataclasses.field(default_factory=dict)

    @property
    def kube(self) -> Any:
        return self.cluster.client

    @property
    def ns(self) -> str:
        return str(self.cluster.namespace)

    async def node(self, name: str | None = None) -> Obj:
        got: Obj = await self.kube.request("GET", f"/api/v1/nodes/{name or self.sick}")
        return got

    async def pods(self, job: str) -> list[Obj]:
        listed = await self.kube.request("GET", f"/api/v1/namespaces/{self.ns}/pods",
                                         query={"labelSelector": f"training.kubeflow.org/job-name={job}"})
        return sorted(listed.get("items") or [], key=lambda p: str(p["metadata"]["name"]))

    async def restarted(self) -> set[str]:
        """Names of the jobs kcover says it restarted (audit Events on the workload)."""
        events = (await self.kube.request("GET", f"/api/v1/namespaces/{self.ns}/events"))["items"]
        by_uid = {str(j["metadata"]["uid"]): name for name, j in self.jobs.items()}
        return {by_uid.get(str(e["involvedObject"].get("uid")), "?") for e in events if e.get("reason") == RESTARTED}

    async def replaced(self, job: str) -> bool:
        """All of the job's pods were recreated by its operator: two live pods, none with a uid it started with."""
        pods = await self.pods(job)
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        return len(live) == 2 == len(pods) and not ({str(p["metadata"]["uid"]) for p in live} & self.pod_uids[job])

    async def untouched(self, job: str) -> bool:
        pods = await self.pods(job)
        return {str(p["metadata"]["uid"]) for p in pods} == self.pod_uids[job] \
            and not any(p["metadata"].get("deletionTimestamp") for p in pods)

    async def cordoned(self, name: str | None = None) -> bool:
        node = await self.node(name)
        spec = node.get("spec") or {}
        taints = {(t["key"], t["effect"]) for t in spec.get("taints") or []}
        return bool(spec.get("unschedulable")) and ("kcover.io/unhealthy", "NoSchedule") in taints \
            and (node["metadata"].get("annotations") or {}).get("kcover.io/cordoned-by") == "kcover"

    async def schedulable(self, name: str | None = None) -> bool:
        node = await self.node(name)
        spec = node.get("spec") or {}
        return not spec.get("unschedulable") and not any(t["key"] == "kcover.io/unhealthy"
                                                         for t in spec.get("taints") or [])

    async def set_condition(self, ctype: str, status: str, *, reason: str = "Test", message: str = "") -> None:
        """Write a node condition as node-problem-detector or a cloud agent would (nodes/status, merge by type)."""
        now = self.cluster.harness.now()
        await self.kube.request("PATCH", f"/api/v1/nodes/{self.sick}/status", body={"status": {"conditions": [{
            "type": ctype, "status": status, "reason": reason, "message": message or f"{ctype} is {status}",
            "lastHeartbeatTime": now, "lastTransitionTime": now}]}},
            content_type="application/strategic-merge-patch+json")


async def _until(probe: Callable[[], Awaitable[bool]], what: str, within: float = WAIT) -> None:
    try:
        async with asyncio.timeout(within):
            while not await probe():  # noqa: ASYNC110  (polling the API server)
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"timed out after {within:g} s waiting for {what}") from None


async def _add_node(kube: Any, name: str) -> None:
    await kube.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    node = await kube.request("GET", f"/api/v1/nodes/{name}")
    resources = {"nvidia.com/gpu": "8", "metax-tech.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"}
    node["status"] = {"capacity": resources, "allocatable": resources,
                      "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                      "message": "kubelet is posting ready status"}]}
    await kube.request("PUT", f"/api/v1/nodes/{name}/status", body=node)


async def _add_job(world: World, name: str, node: str) -> None:
    """A PyTorchJob with two workers on `node`, each with a DRA claim, running."""
    job: Obj = await world.kube.request("POST", f"/apis/kubeflow.org/v1/namespaces/{world.ns}/pytorchjobs", body={
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": world.ns, "labels": {"kcover.io/cascading-recovery": "true"}},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "restartPolicy": "OnFailure", "template": {
            "spec": {"nodeName": node, "restartPolicy": "OnFailure",
                     "resourceClaims": [{"name": CLAIM, "resourceClaimTemplateName": "gpu"}],
                     "containers": [{"name": CONTAINER, "image": "trainer",
                                     "resources": {"claims": [{"name": CLAIM, "request": REQUEST}]}}]}}}}}})
    world.jobs[name] = job
    await world.cluster.harness.reconcile_jobs()
    pods = await world.pods(name)
    for pod in pods:
        await world.cluster.harness.run_pod(world.ns, pod["metadata"]["name"])
    world.pod_uids[name] = {str(p["metadata"]["uid"]) for p in pods}


class GpuPods:
    """The node's PodResources answer: GPU 0 is hit-worker-0's, GPUs 4 and 5 the neighbour's workers'."""

    def __init__(self, world: World) -> None:
        self._world = world

    async def pods_for_device(self, device_id: str) -> list[str]:
        index = int(device_id.rsplit("-", 1)[1])
        ns = self._world.ns
        return {0: [f"{ns}/hit-worker-0"], 4: [f"{ns}/neighbour-worker-0"],
                5: [f"{ns}/neighbour-worker-1"]}.get(index, [])


def _program(tmp: Path, name: str, body: str) -> str:
    path = tmp / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def _settings(world: World, detectors: dict[str, Any], recovery: dict[str, Any]) -> settings.Settings:
    entries = {
        "nvml": {"config": {"wait_timeout_ms": 50, "health_interval_seconds": 0.1}},
        "dcgm": {"enabled": False},
        "node-condition": {"config": {"min_duration_seconds": 0, "tick_seconds": 0.2,
                                      "recovered_hold_seconds": HOLD}},
        "metax": {"enabled": False},
        "script": {"enabled": False},
        "logscan": {"enabled": False},
    }
    for name, entry in detectors.items():
        entries[name] = entry
    return layering.layer(file_data={
        "recovery": {"ledger_namespace": world.ns, "max_cordoned_fraction": 1.0, "namespaces_deny": [],
                     "save_logs": {"enabled": False}, "uncordon_enabled": True, **recovery},
        "lease": {"namespace": world.ns, "identity": "controller-a", "lease_duration_seconds": 4,
                  "renew_deadline_seconds": 3, "retry_period_seconds": 0.5},
        "agent": {"node_name": world.sick, "event_namespace": world.ns, "min_write_interval_seconds": 0, "condition_hold_seconds": 0.5,
                  "event_dedupe_seconds": 0},
        "kube": {"workload_kinds": ["pytorchjobs.kubeflow.org"]},
        "detectors": {"entries": entries},
    }).settings


# ------------------------------------------------------------------------------------------ the rows

async def _xid13_once(world: World) -> None:
    world.nvml.xid(13, gpu_index=0)
    await _until(lambda: world.replaced("hit"), "job hit (on GPU 0) to come back with new pods")
    await asyncio.sleep(SETTLE)
    assert await world.restarted() == {"hit"}
    assert await world.untouched("neighbour"), "a job on another GPU of the node was restarted"
    assert await world.schedulable(), "an application XID seen once cordoned the node"


async def _xid13_thrice(world: World) -> None:
    """XID 13 is an application fault (config/xid-policy.yaml): repeated on one GPU it restarts the job
    holding that GPU and never moves the node."""
    for _ in range(3):
        world.nvml.xid(13, gpu_index=0)
        await asyncio.sleep(0.3)
    await _until(lambda: world.replaced("hit"), "job hit to come back after XID 13 on its GPU")
    await asyncio.sleep(SETTLE)
    assert "hit" in await world.restarted()
    assert await world.untouched("spared")
    assert await world.schedulable()


async def _xid79(world: World) -> None:
    world.nvml.xid(79, gpu_index=3)  # the GPU fell off the bus: NVML also loses it until it is reset
    world.nvml.gpu_lost(3)
    await _until(world.cordoned, "the node to be cordoned after XID 79")
    await _until(lambda: world.replaced("hit"), "job hit to come back")
    await _until(lambda: world.replaced("neighbour"), "job neighbour to come back")
    await asyncio.sleep(SETTLE)
    assert await world.restarted() == {"hit", "neighbour"}
    assert await world.untouched("spared")
    assert await world.schedulable(world.healthy)


async def _cordon_only(world: World, what: str) -> None:
    await _until(world.cordoned, f"the node to be cordoned after {what}")
    assert await world.untouched("spared")
    assert await world.schedulable(world.healthy)


async def _dcgm_diag_fail(world: World) -> None:
    await _cordon_only(world, "a failed dcgmi diag")


async def _metax_day2_fail(world: World) -> None:
    await _cordon_only(world, "a failed MetaX day-2 check")


async def _script_critical(world: World) -> None:
    await _cordon_only(world, "the check script reporting critical")


async def _dra_unhealthy(world: World) -> None:
    await world.cluster.harness.set_device_health(world.ns, "hit-worker-1", CONTAINER,
                                                  resource_name=f"claim:{CLAIM}/{REQUEST}",
                                                  resource_id="gpu.nvidia.com/pool-a/gpu-1", health="Unhealthy",
                                                  message="XID 79: GPU has fallen off the bus")
    await _until(lambda: world.replaced("hit"), "job hit to come back after its DRA device went Unhealthy")
    await asyncio.sleep(SETTLE)
    assert await world.restarted() == {"hit"}
    assert await world.untouched("neighbour")
    assert await world.schedulable(), "a DRA device fault of one pod cordoned the node"


async def _condition_bad_then_good(world: World) -> None:
    await world.set_condition("AcceleratedHardwareReady", "False", reason="NvidiaXID79Error",
                              message="XID 79 on GPU 2")
    await _until(world.cordoned, "the node to be cordoned while its condition is bad")
    await world.set_condition("AcceleratedHardwareReady", "True", reason="Healthy")
    await _until(world.schedulable, f"the node to return to service {HOLD:g} s after its condition is good")
    node = await world.node()
    assert "kcover.io/cordoned-by" not in (node["metadata"].get("annotations") or {})


async def _admin_cordoned(world: World) -> None:
    # the admin's cordon, before any fault: `kubectl cordon` is a patch, so the agent's status writes cannot
    # turn it into a 409 as a read-then-PUT could
    await world.kube.request("PATCH", f"/api/v1/nodes/{world.sick}", body={"spec": {"unschedulable": True}},
                             content_type="application/merge-patch+json")
    await world.set_condition("AcceleratedHardwareReady", "False", reason="NvidiaXID79Error")
    await asyncio.sleep(1.0)
    await world.set_condition("AcceleratedHardwareReady", "True", reason="Healthy")
    await asyncio.sleep(HOLD + 2 * SETTLE)
    node = await world.node()
    assert node["spec"].get("unschedulable") is True, "kcover un-cordoned a node an admin cordoned"
    assert "kcover.io/cordoned-by" not in (node["metadata"].get("annotations") or {})


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    play: Callable[[World], Awaitable[None]]
    detectors: Callable[[World], dict[str, Any]] = lambda world: {}
    recovery: dict[str, Any] = dataclasses.field(default_factory=dict)
    device_health: bool = False
    """The row writes `allocatedResourcesStatus` naming a DRA claim: skipped where the server keeps none."""


def _dcgm(world: World) -> dict[str, Any]:
    # GPU Memory fails on every GPU (CUDA cannot initialise): a hardware verdict, not a diag internal error.
    table = (FIXTURES / "dcgmi-diag" / "nccl-tests-264-r3-fail-cuda-init-dcgm3.3.8-h100x8-table.txt").read_text()
    (world.tmp / "diag.txt").write_text(table)
    dcgmi = _program(world.tmp, "dcgmi", f'case "$1" in diag) cat "{world.tmp}/diag.txt";; *) exit 1;; esac\n')
    return {"dcgm": {"enabled": True, "config": {"dcgmi_path": dcgmi, "diag_interval_seconds": 3600,
                                                 "health_interval_seconds": 3600}}}


def _metax(world: World) -> dict[str, Any]:
    listing = (METAX_FIXTURES / "kcover-mx-smi-L-excerpt.txt").read_text()  # 2 of 8 GPUs listed
    temps = (METAX_FIXTURES / "kcover-mx-smi-show-temperature-2gpu-mxc500.txt").read_text()
    ecc = (METAX_FIXTURES / "kcover-mx-smi-count-ecc-3gpu-mxc500-test.txt").read_text()
    for name, text in (("L.txt", listing), ("temp.txt", temps), ("ecc.txt", ecc)):
        (world.tmp / name).write_text(text)
    mx = _program(world.tmp, "mx-smi", f'case "$1" in -L) cat "{world.tmp}/L.txt";; '
                  f'--show-temperature) cat "{world.tmp}/temp.txt";; --count-ecc) cat "{world.tmp}/ecc.txt";; '
                  '*) exit 1;; esac\n')
    return {"metax": {"enabled": True, "config": {"mx_smi": mx, "force": True, "run_at_start": True}}}


def _script(world: World) -> dict[str, Any]:
    check = _program(world.tmp, "check-ib.sh", 'echo "critical: ib0 link down"\nexit 1\n')
    return {"script": {"enabled": True, "config": {"scripts": [{
        "name": "ib-link", "path": check, "interval_seconds": 3600, "reason": "InfinibandLinkDown",
        "action": "cordon-node"}]}}}


ROWS = (
    Row("xid13-once", _xid13_once),
    Row("xid13-thrice", _xid13_thrice, recovery={"workload_cooldown_seconds": 0}),
    Row("xid79", _xid79),
    Row("dcgm-diag-fail", _dcgm_diag_fail, detectors=_dcgm),
    Row("metax-day2-fail", _metax_day2_fail, detectors=_metax),
    Row("script-critical", _script_critical, detectors=_script),
    Row("dra-unhealthy", _dra_unhealthy, device_health=True),
    Row("condition-bad-then-good", _condition_bad_then_good),
    Row("admin-cordoned", _admin_cordoned),
)


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
async def test_fault_from_source_to_api_effect(cluster: Cluster, row: Row, tmp_path: Path) -> None:
    suffix = secrets.token_hex(3)
    world = World(cluster, sick=f"e2e-sick-{suffix}", healthy=f"e2e-healthy-{suffix}", nvml=fake.FakeNvml(8),
                  tmp=tmp_path)
    kube = cluster.client
    if row.device_health and (why := await cluster.device_health_refused()):
        pytest.skip(why)
    stop = asyncio.Event()
    try:
        await _add_node(kube, world.sick)
        await _add_node(kube, world.healthy)
        await _add_job(world, "hit", world.sick)
        await _add_job(world, "neighbour", world.sick)
        await _add_job(world, "spared", world.healthy)
        await cluster.harness.run_agent_pod(world.ns, world.sick)
        cfg = _settings(world, row.detectors(world), row.recovery)
        async with cluster.new_client() as agent_kube, cluster.new_client() as controller_kube, \
                cluster.harness.playing(interval=0.1):
            agent = agent_running.Agent(cfg, client=agent_kube, metrics=metrics.Metrics(), health=None,
                                        node=world.sick, nvml=world.nvml, reporter_tick_seconds=0.1,
                                        pod_lookup=GpuPods(world))
            controller = controller_running.Controller(cfg, client=controller_kube, metrics=metrics.Metrics(),
                                                       health=serving.Health())
            async with asyncio.TaskGroup() as group:
                group.create_task(controller.run(stop), name="controller")
                try:
                    await _until(lambda: _ready(controller), "the controller to lead with a synced cache")
                    group.create_task(agent.run(stop), name="agent")
                    await _until(lambda: _registered(world.nvml), "the agent's NVML detector to listen")
                    await row.play(world)
                finally:
                    stop.set()
    finally:
        for name in (world.sick, world.healthy):
            with contextlib.suppress(Exception):
                await kube.request("DELETE", f"/api/v1/nodes/{name}")


async def _ready(controller: controller_running.Controller) -> bool:
    return controller.is_leader() and controller.cache.synced


async def _registered(nvml: fake.FakeNvml) -> bool:
    return bool(nvml.registered)
