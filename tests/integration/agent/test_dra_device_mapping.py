"""An agent's XID on a GPU published through DRA isolates that device, not the node, on every cluster backend.

One node publishes 8 GPUs in a DRA ResourceSlice of driver `gpu.nvidia.com` (pool = the node's name,
devices `gpu-0`..`gpu-7`, each with the `uuid` attribute NVIDIA's GPU DRA driver writes, here the
fake NVML's UUIDs). Two opted-in PyTorchJobs hold a ResourceClaim each, allocated to `gpu-2` (`on2`)
and `gpu-5` (`on5`); the node's kubelet says so through PodResources v1 (DRA claim resources), served
by the kubelet-like gRPC server. The agent's NVML detector (fake NVML) sees an XID on GPU 2; the agent
maps that GPU's UUID to `gpu.nvidia.com/<node>/gpu-2` from its node's ResourceSlices and reports it
with the device and its holders. The same XID 79 read by the agent's DCGM detector from a dcgm-exporter
endpoint (labelled with the GPU's UUID) goes the same way. The controller restarts only `on2` and never cordons the node:
* XID 13 (application error, `restart-workload`): the holders are restarted, nothing is tainted
  (the policy's answer to an application XID on a device);
* XID 79 (fallen off the bus, `cordon-node-and-restart`): kcover's DeviceTaintRule selects exactly
  `gpu-2`, and the node stays schedulable (its KcoverGPUHealthy condition is not set False either).

Trust: an Event shaped exactly as the agent writes it, from the agent's namespace and node, that
names a device only another node's ResourceSlice publishes is refused (`device_not_on_node`), and
nothing is tainted or restarted; the same Event naming a device of its own node is acted on.

Return to service: after XID 79 on the GPU of `gpu-2` and kcover's rule for it, the XID does not
recur for the agent's hold (3 s here); the agent then writes its `kcover.io/device-healthy` Event and
the controller removes the rule, no sooner than the hold, the node never cordoned. Forged healthy
words leave a rule in place: one from a tenant namespace (`namespace_not_allowed`), one from the agent's
namespace and another node's identity naming this node's device (`device_not_on_node`), and one about a
tenant's Pod on the node (`device_healthy_untrusted`); the agent's own word from the device's node then
removes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from harness.podresources_server import Container, Pod, PodResourcesServer

from kcover import codec, layering, metrics, model, serving, settings
from kcover.agent import podresources
from kcover.agent import running as agent_running
from kcover.agent.reporting import event_body
from kcover.controller import running as controller_running
from kcover.nvml import fake
from kcover.recovery import devicetainting

Cluster = Any
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "dcgm-exporter"
WAIT = 25.0
SETTLE = 1.5
RESTARTED = "KcoverRestartedWorkload"
DRIVER = "gpu.nvidia.com"
RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"


@pytest.fixture(autouse=True)
async def _dra_served(cluster: Cluster) -> None:
    """Every test here publishes v1 ResourceSlices and reads kcover's v1beta2 DeviceTaintRules: skipped,
    saying so, on a server that serves them not (before Kubernetes 1.34, or without the runtime-config)."""
    await cluster.require("resource.k8s.io/v1", "resourceslices")
    await cluster.require("resource.k8s.io/v1beta2", "devicetaintrules")


async def _until(probe: Callable[[], Awaitable[bool]], what: str, within: float = WAIT) -> None:
    try:
        async with asyncio.timeout(within):
            while not await probe():  # noqa: ASYNC110  (polling the API server)
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"timed out after {within:g} s waiting for {what}") from None


def _settings(ns: str, node: str, *, exporter_url: str = "", hold: float = 300.0) -> settings.Settings:
    off: dict[str, Any] = {"enabled": False}
    dcgm = {"enabled": True, "config": {"exporter_url": exporter_url, "exporter_interval_seconds": 0.2}} \
        if exporter_url else off
    return layering.layer(file_data={
        "recovery": {"ledger_namespace": ns, "max_cordoned_fraction": 1.0, "namespaces_deny": [],
                     "save_logs": {"enabled": False}},
        "lease": {"namespace": ns, "identity": "controller-a", "lease_duration_seconds": 4,
                  "renew_deadline_seconds": 3, "retry_period_seconds": 0.5},
        "agent": {"node_name": node, "event_namespace": ns, "min_write_interval_seconds": 0,
                  "event_dedupe_seconds": 0, "condition_hold_seconds": hold},
        "kube": {"workload_kinds": ["pytorchjobs.kubeflow.org"]},
        "detectors": {"entries": {"nvml": {"config": {"wait_timeout_ms": 50, "health_interval_seconds": 0.1}},
                                  "dcgm": dcgm, "metax": off, "script": off, "logscan": off}},
    }).settings


async def _node_with_gpus(kube: Any, node: str, uuids: list[str]) -> None:
    """A node whose 8 GPUs are published through DRA, as NVIDIA's GPU DRA driver publishes them."""
    await kube.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
                                                      "status": {"capacity": {"cpu": "64", "pods": "110"}}})
    await kube.request("POST", "/apis/resource.k8s.io/v1/resourceslices", body={
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": f"gpu-{i}", "attributes": {
                     "type": {"string": "gpu"}, "uuid": {"string": uuid}, "index": {"int": i},
                     "productName": {"string": "NVIDIA H100 80GB HBM3"}}} for i, uuid in enumerate(uuids)]}})


async def _claim(cluster: Cluster, name: str, node: str, device: str) -> None:
    """A ResourceClaim allocated to `device`, as the scheduler leaves it."""
    ns, kube = cluster.namespace, cluster.client
    path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
    claim = await kube.request("POST", path, body={
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}})
    claim["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": node, "device": device}]}}}
    await kube.request("PUT", f"{path}/{name}/status", body=claim)


async def _job(cluster: Cluster, name: str, node: str) -> dict[str, Any]:
    ns, kube = cluster.namespace, cluster.client
    job: dict[str, Any] = await kube.request("POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", body={
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": ns, "labels": {"kcover.io/cascading-recovery": "true"}},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "restartPolicy": "OnFailure", "template": {
            "spec": {"nodeName": node, "restartPolicy": "OnFailure",
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}],
                     "containers": [{"name": "pytorch", "image": "trainer",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}}}}})
    await cluster.harness.reconcile_jobs()
    for pod in await _pods(cluster, name):
        await cluster.harness.run_pod(ns, pod["metadata"]["name"])
    return job


async def _pods(cluster: Cluster, job: str) -> list[dict[str, Any]]:
    listed = await cluster.client.request("GET", f"/api/v1/namespaces/{cluster.namespace}/pods",
                                          query={"labelSelector": f"training.kubeflow.org/job-name={job}"})
    return list(listed.get("items") or [])


async def _rules(kube: Any, *nodes: str) -> list[dict[str, Any]]:
    """kcover's DeviceTaintRules for devices of `nodes` (other tests' rules are not this test's)."""
    items = (await kube.request("GET", RULES)).get("items") or []
    return [r for r in items if (r["metadata"].get("annotations") or {}).get(devicetainting.NODE_ANNOTATION) in nodes]


async def _restarted(cluster: Cluster, jobs: dict[str, dict[str, Any]]) -> set[str]:
    events = (await cluster.client.request("GET", f"/api/v1/namespaces/{cluster.namespace}/events"))["items"]
    by_uid = {j["metadata"]["uid"]: name for name, j in jobs.items()}
    return {by_uid.get(e["involvedObject"].get("uid"), "?") for e in events if e.get("reason") == RESTARTED}


@contextlib.asynccontextmanager
async def _controller(cluster: Cluster, cfg: settings.Settings,
                      mets: metrics.Metrics) -> AsyncIterator[controller_running.Controller]:
    stop = asyncio.Event()
    async with cluster.new_client() as kube:
        controller = controller_running.Controller(cfg, client=kube, metrics=mets, health=serving.Health())
        async with asyncio.TaskGroup() as group:
            group.create_task(controller.run(stop), name="controller")
            try:
                await _until(lambda: _ready(controller), "the controller to lead with a synced cache")
                yield controller
            finally:
                stop.set()


async def _ready(controller: controller_running.Controller) -> bool:
    return controller.is_leader() and controller.cache.synced


class Exporter:
    """A dcgm-exporter metrics endpoint on localhost: its XID gauge for GPU 2, a line of a real
    dcgm-exporter 580.95.05 scrape (tests/fixtures/dcgm-exporter) with this node's GPU UUID."""

    def __init__(self, uuid: str) -> None:
        line = next(x for x in (FIXTURES / "lke-rtx4000ada-580.95.05-xid-errcode-labels-k8s-pod.prom").read_text()
                    .splitlines() if x.startswith("DCGM_FI_DEV_XID_ERRORS{"))
        labels = line[line.index("{") + 1:line.index(',container=')]  # the pod labels are the device plugin's
        real_uuid = labels.split('UUID="', 1)[1].split('"', 1)[0]
        self.labels = labels.replace('gpu="0"', 'gpu="2"').replace(real_uuid, uuid)
        self.value = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text="# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n"
                                 f"DCGM_FI_DEV_XID_ERRORS{{{self.labels}}} {self.value}\n")

    async def __aenter__(self) -> Exporter:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/metrics"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


@pytest.mark.parametrize(("source", "xid"), [("nvml", 13), ("nvml", 79), ("dcgm-exporter", 79)])
async def test_an_xid_on_a_dra_gpu_restarts_only_its_holders_and_leaves_the_node_schedulable(
        cluster: Cluster, source: str, xid: int, tmp_path: Path) -> None:
    ns, kube = cluster.namespace, cluster.client
    node = f"dra-gpu-{secrets.token_hex(3)}"
    nvml = fake.FakeNvml(8)
    nvml.init()
    await _node_with_gpus(kube, node, [nvml.device_info(i).uuid for i in range(8)])
    await _claim(cluster, "on2-gpu", node, "gpu-2")
    await _claim(cluster, "on5-gpu", node, "gpu-5")
    jobs = {name: await _job(cluster, name, node) for name in ("on2", "on5")}
    before = {name: {p["metadata"]["uid"] for p in await _pods(cluster, name)} for name in jobs}
    exporter = await Exporter(nvml.device_info(2).uuid).__aenter__()
    cfg = _settings(ns, node, exporter_url=exporter.url if source == "dcgm-exporter" else "")
    device = model.DraDevice(driver=DRIVER, pool=node, device="gpu-2")
    stop = asyncio.Event()
    try:
        with PodResourcesServer(tmp_path / "kubelet.sock") as kubelet:
            kubelet.pods = [Pod(ns, (await _pods(cluster, job))[0]["metadata"]["name"],
                                [Container("pytorch", dra=[(DRIVER, node, dev)])])
                            for job, dev in (("on2", "gpu-2"), ("on5", "gpu-5"))]
            await cluster.harness.run_agent_pod(ns, node)
            async with cluster.new_client() as agent_kube, cluster.harness.playing(interval=0.1), \
                    _controller(cluster, cfg, metrics.Metrics()):
                agent = agent_running.Agent(cfg, client=agent_kube, metrics=metrics.Metrics(), health=None,
                                            node=node, nvml=nvml, reporter_tick_seconds=0.1,
                                            pod_lookup=podresources.PodResources(kubelet.socket_path))
                async with asyncio.TaskGroup() as group:
                    group.create_task(agent.run(stop), name="agent")
                    try:
                        await _until(lambda: _listening(nvml, agent), "the agent to listen and know its DRA devices")
                        if source == "nvml":
                            nvml.xid(xid, gpu_index=2)
                        else:
                            exporter.value = xid
                        await _until(lambda: _is(_restarted(cluster, jobs), {"on2"}), "kcover to restart on2")
                        if xid == 79:
                            await _until(lambda: _has_rules(kube, node), "kcover's DeviceTaintRule")
                        await asyncio.sleep(SETTLE)  # room for a wrong restart, cordon or taint
                        assert await _restarted(cluster, jobs) == {"on2"}
                        assert {p["metadata"]["uid"] for p in await _pods(cluster, "on5")} == before["on5"]
                        live = await kube.request("GET", f"/api/v1/nodes/{node}")
                        assert not live["spec"].get("unschedulable"), "a fault on one DRA device cordoned the node"
                        assert not any(t["key"] == "kcover.io/unhealthy" for t in live["spec"].get("taints") or [])
                        assert not any(c["type"] == "KcoverGPUHealthy" and c["status"] == "False"
                                       for c in (live.get("status") or {}).get("conditions") or [])
                        rules = await _rules(kube, node)
                        if xid == 13:
                            assert rules == [], "an application XID tainted a device"
                        else:
                            assert [r["metadata"]["name"] for r in rules] == [devicetainting.rule_name(device)]
                            assert rules[0]["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": node,
                                                                          "device": "gpu-2"}
                        reports = [e for e in (await kube.request("GET", f"/api/v1/namespaces/{ns}/events"))["items"]
                                   if e["metadata"].get("annotations", {}).get(codec.XID) == str(xid)]
                        assert reports
                        assert all(e["metadata"]["annotations"].get(codec.DRA_DEVICE) == "gpu-2" for e in reports)
                        assert kubelet.calls["List"] >= 1
                    finally:
                        stop.set()
    finally:
        await exporter.__aexit__()
        for rule in await _rules(kube, node):
            with contextlib.suppress(Exception):
                await kube.request("DELETE", f"{RULES}/{rule['metadata']['name']}")
        with contextlib.suppress(Exception):
            await kube.request("DELETE", f"/api/v1/nodes/{node}")
        with contextlib.suppress(Exception):
            await kube.request("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{node}-{DRIVER}")


async def test_an_agent_event_naming_another_nodes_device_is_refused(cluster: Cluster) -> None:
    ns, kube = cluster.namespace, cluster.client
    suffix = secrets.token_hex(3)
    here, there = f"dra-here-{suffix}", f"dra-there-{suffix}"
    for node in (here, there):
        await _node_with_gpus(kube, node, [f"GPU-{node}-{i}" for i in range(8)])
    await _job(cluster, "bystander", here)
    cfg = _settings(ns, here)
    mets = metrics.Metrics()

    def report(device: model.DraDevice) -> dict[str, Any]:
        """What the agent on `here` writes for XID 79 on a GPU it maps to `device`."""
        event = model.CollectorEvent(
            detector="nvml", severity=model.Severity.ERROR, reason="XID79", message="XID 79 on GPU 2",
            target=model.Target(kind=model.TargetKind.DEVICE, node=here, name=here, device_id=f"GPU-{here}-2"),
            fault=model.Fault(xid=79, gpu_index=2, gpu_uuid=f"GPU-{here}-2", dra=device),
            recommended=model.Action.CORDON_NODE_AND_RESTART)
        return event_body(event, node=here, namespace=ns, reporter="kcover.io/agent", when=dt.datetime.now(dt.UTC))

    forged = model.DraDevice(driver=DRIVER, pool=there, device="gpu-2")
    honest = model.DraDevice(driver=DRIVER, pool=here, device="gpu-2")
    try:
        await cluster.harness.run_agent_pod(ns, here)
        async with cluster.harness.playing(interval=0.1), _controller(cluster, cfg, mets):
            await kube.request("POST", f"/api/v1/namespaces/{ns}/events", body=report(forged))
            await _until(lambda: _rejected(mets, "device_not_on_node"), "the forged device report to be refused")
            await asyncio.sleep(SETTLE)
            assert await _rules(kube, here, there) == [], "a device of another node was tainted on an agent's word"
            assert await _restarted(cluster, {}) == set()
            for node in (here, there):
                assert not (await kube.request("GET", f"/api/v1/nodes/{node}"))["spec"].get("unschedulable")
            await kube.request("POST", f"/api/v1/namespaces/{ns}/events", body=report(honest))
            await _until(lambda: _has_rules(kube, here), "the honest device report to taint its device")
            assert [r["metadata"]["name"] for r in await _rules(kube, here, there)] == [devicetainting.rule_name(honest)]
            assert not (await kube.request("GET", f"/api/v1/nodes/{here}"))["spec"].get("unschedulable")
    finally:
        for rule in await _rules(kube, here, there):
            with contextlib.suppress(Exception):
                await kube.request("DELETE", f"{RULES}/{rule['metadata']['name']}")
        for node in (here, there):
            with contextlib.suppress(Exception):
                await kube.request("DELETE", f"/api/v1/nodes/{node}")
            with contextlib.suppress(Exception):
                await kube.request("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{node}-{DRIVER}")


async def _rejected(mets: metrics.Metrics, reason: str) -> bool:
    value = mets.registry.get_sample_value("kcover_events_rejected_total", {"reason": reason})
    return bool(value)


async def _has_rules(kube: Any, *nodes: str) -> bool:
    return bool(await _rules(kube, *nodes))


async def _is(probe: Awaitable[set[str]], wanted: set[str]) -> bool:
    return await probe == wanted


async def _listening(nvml: fake.FakeNvml, agent: agent_running.Agent) -> bool:
    return bool(nvml.registered) and len(agent.devices.reflector.store) == 1


HOLD = 3.0


async def _said_untainted(kube: Any, node: str, count: int) -> bool:
    events = (await kube.request("GET", "/api/v1/events"))["items"]
    return len([e for e in events if e.get("reason") == "KcoverUntaintedDevice"
                and e["involvedObject"].get("name") == node]) == count


async def test_a_dra_device_the_agent_reported_returns_to_service_after_the_hold(
        cluster: Cluster, tmp_path: Path) -> None:
    ns, kube = cluster.namespace, cluster.client
    node = f"dra-back-{secrets.token_hex(3)}"
    nvml = fake.FakeNvml(8)
    nvml.init()
    await _node_with_gpus(kube, node, [nvml.device_info(i).uuid for i in range(8)])
    cfg = _settings(ns, node, hold=HOLD)
    device = model.DraDevice(driver=DRIVER, pool=node, device="gpu-2")
    stop = asyncio.Event()

    async def tainted() -> bool:
        await _never_cordoned(kube, node)
        return [r["metadata"]["name"] for r in await _rules(kube, node)] == [devicetainting.rule_name(device)]

    async def untainted() -> bool:
        await _never_cordoned(kube, node)
        return await _rules(kube, node) == []

    try:
        with PodResourcesServer(tmp_path / "kubelet.sock") as kubelet:
            await cluster.harness.run_agent_pod(ns, node)
            async with cluster.new_client() as agent_kube, cluster.harness.playing(interval=0.1), \
                    _controller(cluster, cfg, metrics.Metrics()):
                agent = agent_running.Agent(cfg, client=agent_kube, metrics=metrics.Metrics(), health=None,
                                            node=node, nvml=nvml, reporter_tick_seconds=0.1,
                                            pod_lookup=podresources.PodResources(kubelet.socket_path))
                async with asyncio.TaskGroup() as group:
                    group.create_task(agent.run(stop), name="agent")
                    try:
                        await _until(lambda: _listening(nvml, agent), "the agent to listen and know its DRA devices")
                        nvml.xid(79, gpu_index=2)
                        since = time.monotonic()
                        await _until(tainted, "kcover's DeviceTaintRule for gpu-2")
                        await _until(untainted, "kcover to remove the rule once the XID has not recurred for the hold")
                        assert time.monotonic() - since >= HOLD, "the rule went before the hold had passed"
                        words = [e for e in (await kube.request("GET", f"/api/v1/namespaces/{ns}/events"))["items"]
                                 if (e["metadata"].get("annotations") or {}).get(codec.DEVICE_HEALTHY) == "true"]
                        assert [(e["involvedObject"]["name"], e["metadata"]["annotations"][codec.DRA_DEVICE])
                                for e in words] == [(node, "gpu-2")]
                        # the step's Event is written after its rule's removal: waited for, then counted
                        await _until(lambda: _said_untainted(kube, node, 1), "kcover's KcoverUntaintedDevice Event")
                        await asyncio.sleep(SETTLE)
                        assert await _said_untainted(kube, node, 1), "one KcoverUntaintedDevice Event, not more"
                        await _never_cordoned(kube, node)
                    finally:
                        stop.set()
    finally:
        for rule in await _rules(kube, node):
            with contextlib.suppress(Exception):
                await kube.request("DELETE", f"{RULES}/{rule['metadata']['name']}")
        with contextlib.suppress(Exception):
            await kube.request("DELETE", f"/api/v1/nodes/{node}")
        with contextlib.suppress(Exception):
            await kube.request("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{node}-{DRIVER}")


async def _never_cordoned(kube: Any, node: str) -> None:
    live = await kube.request("GET", f"/api/v1/nodes/{node}")
    assert not live["spec"].get("unschedulable"), "a device's fault or return cordoned the node"
    assert not any(t["key"] == "kcover.io/unhealthy" for t in live["spec"].get("taints") or [])


async def test_a_forged_device_healthy_word_leaves_the_rule_in_place(cluster: Cluster) -> None:
    ns, kube = cluster.namespace, cluster.client
    suffix = secrets.token_hex(3)
    here, there, tenant = f"dra-here-{suffix}", f"dra-there-{suffix}", f"tenant-{suffix}"
    for node in (here, there):
        await _node_with_gpus(kube, node, [f"GPU-{node}-{i}" for i in range(8)])
    await kube.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                           "metadata": {"name": tenant}})
    await kube.request("POST", f"/api/v1/namespaces/{tenant}/pods", body={
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mine", "namespace": tenant},
        "spec": {"containers": [{"name": "c", "image": "tenant"}]}})
    cfg = _settings(ns, here)
    mets = metrics.Metrics()
    device = model.DraDevice(driver=DRIVER, pool=here, device="gpu-2")

    def word(*, cleared: bool, writer: str, namespace: str) -> dict[str, Any]:
        """The agent's Event (as `writer`'s agent writes it, in `namespace`) for XID 79 on `device`, or
        its device-healthy word."""
        event = model.CollectorEvent(
            detector="nvml", severity=model.Severity.INFO if cleared else model.Severity.ERROR,
            reason="GPUDeviceHealthy" if cleared else "XID79", message="gpu-2",
            target=model.Target(kind=model.TargetKind.DEVICE, node=writer, name=writer, device_id=f"GPU-{here}-2"),
            fault=model.Fault(xid=None if cleared else 79, gpu_index=2, gpu_uuid=f"GPU-{here}-2", dra=device),
            recommended=None if cleared else model.Action.CORDON_NODE_AND_RESTART, cleared=cleared)
        return event_body(event, node=writer, namespace=namespace, reporter="kcover.io/agent",
                          when=dt.datetime.now(dt.UTC), device_healthy=cleared)

    async def refused(body: dict[str, Any], namespace: str, reason: str) -> None:
        await kube.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)
        await _until(lambda: _rejected(mets, reason), f"the forged healthy word to be refused ({reason})")
        await asyncio.sleep(SETTLE)
        assert [r["metadata"]["name"] for r in await _rules(kube, here, there)] == [devicetainting.rule_name(device)]

    try:
        await cluster.harness.run_agent_pod(ns, here)
        await cluster.harness.run_agent_pod(ns, there)
        await cluster.harness.run_pod(tenant, "mine", here)
        async with cluster.harness.playing(interval=0.1), _controller(cluster, cfg, mets):
            await kube.request("POST", f"/api/v1/namespaces/{ns}/events",
                               body=word(cleared=False, writer=here, namespace=ns))
            await _until(lambda: _has_rules(kube, here), "the agent's report to taint gpu-2")
            await refused(word(cleared=True, writer=here, namespace=tenant), tenant, "namespace_not_allowed")
            await refused(word(cleared=True, writer=there, namespace=ns), ns, "device_not_on_node")
            on_pod = word(cleared=True, writer=here, namespace=tenant)
            on_pod["involvedObject"] = {"apiVersion": "v1", "kind": "Pod", "namespace": tenant, "name": "mine"}
            await refused(on_pod, tenant, "device_healthy_untrusted")
            await kube.request("POST", f"/api/v1/namespaces/{ns}/events",
                               body=word(cleared=True, writer=here, namespace=ns))
            await _until(lambda: _no_rules(kube, here, there), "the agent's own word to remove the rule")
            for node in (here, there):
                assert not (await kube.request("GET", f"/api/v1/nodes/{node}"))["spec"].get("unschedulable")
    finally:
        for rule in await _rules(kube, here, there):
            with contextlib.suppress(Exception):
                await kube.request("DELETE", f"{RULES}/{rule['metadata']['name']}")
        with contextlib.suppress(Exception):
            await kube.request("DELETE", f"/api/v1/namespaces/{tenant}")
        for node in (here, there):
            with contextlib.suppress(Exception):
                await kube.request("DELETE", f"/api/v1/nodes/{node}")
            with contextlib.suppress(Exception):
                await kube.request("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{node}-{DRIVER}")


async def _no_rules(kube: Any, *nodes: str) -> bool:
    return not await _rules(kube, *nodes)
