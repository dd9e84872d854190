"""Device-level isolation under DRA on real components (the `cluster` backend): the real scheduler allocates.

A ResourceSlice offers eight devices (gpu-0..gpu-7) of driver gpu.nvidia.com on one kwok node; an
opted-in batch/v1 Job's pod gets its device through a ResourceClaimTemplate whose selector starts at
index 3, so the real kube-scheduler allocates gpu-3. The kubelet's health report (KEP-4680, written by
the test as kwok writes no DRA status) turns gpu-3 Unhealthy. kcover (the controller process with the
chart's RBAC) creates a DeviceTaintRule for gpu-3 only and restarts the Job; the Job controller
recreates the pod, the resource claim controller its claim, and the scheduler allocates it a different
device on the same node; the node is neither cordoned nor node-tainted. While the rule stands, a pod
asking for gpu-3 without tolerating the taint is not scheduled. A validation pod that tolerates kcover's
device taint gets gpu-3, the kubelet reports it Healthy, and kcover removes its rule.

Feature gates: DRADeviceTaints (beta, on by default in 1.36) and DRADeviceTaintRules (beta, off by
default) on kube-apiserver (with `--runtime-config=resource.k8s.io/v1beta2=true`), kube-scheduler and
kube-controller-manager (tests/controlplane/server.py and cluster.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from realkit import NODES, RELEASE_NS, RealCluster

pytestmark = pytest.mark.parametrize("realcluster", ["cluster"], indirect=True)

T = TypeVar("T")
WAIT = 60.0
DRIVER = "gpu.nvidia.com"
NODE = NODES[-1]
RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
OPT_IN = {"kcover.io/cascading-recovery": "true"}


def _until(probe: Callable[[], T | None], what: str, within: float = WAIT) -> T:
    deadline = time.monotonic() + within
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what}")
        time.sleep(0.1)


def _uuid(index: int) -> str:
    """GPU `index`'s UUID as the agent's fake NVML (`kcover agent --fake-nvml`) reports it, published by
    the slice in the `uuid` attribute as NVIDIA's GPU DRA driver does."""
    return f"GPU-fake-{index:04d}"


def _selector(expression: str, *, tolerate: bool = False) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "kcover-test-gpu", "selectors": [{"cel": {"expression": expression}}]}
    if tolerate:
        exactly["tolerations"] = [{"key": "kcover.io/unhealthy", "operator": "Exists", "effect": "NoSchedule"}]
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


@pytest.fixture
def dra(realcluster: RealCluster) -> Iterator[str]:
    """The DeviceClass, the node's ResourceSlice and a namespace with the claim templates."""
    rc = realcluster
    ns = "dra-" + str(int(time.time() * 1000) % 10**8)
    rc.ok("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    rc.ok("POST", "/apis/resource.k8s.io/v1/deviceclasses", {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "kcover-test-gpu"},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}})
    rc.ok("POST", "/apis/resource.k8s.io/v1/resourceslices", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{NODE}-gpus"},
        "spec": {"driver": DRIVER, "nodeName": NODE, "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}, "uuid": {"string": _uuid(i)}}}
                             for i in range(8)]}})
    for name, spec in (("from-3", _selector(f'device.attributes["{DRIVER}"].index >= 3')),
                       ("only-3", _selector(f'device.attributes["{DRIVER}"].index == 3')),
                       ("validate-3", _selector(f'device.attributes["{DRIVER}"].index == 3', tolerate=True))):
        rc.ok("POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": spec}})
    yield ns
    rc.stop_all()
    rc.request("DELETE", f"/api/v1/namespaces/{ns}")
    for path in (f"/apis/resource.k8s.io/v1/resourceslices/{NODE}-gpus", "/apis/resource.k8s.io/v1/deviceclasses/kcover-test-gpu"):
        rc.request("DELETE", path)
    for rule in rc.ok("GET", RULES)["items"]:
        rc.request("DELETE", f"{RULES}/{rule['metadata']['name']}")
    rc.request("DELETE", f"/api/v1/namespaces/{RELEASE_NS}/events")
    rc.request("DELETE", "/api/v1/namespaces/default/events")


def _pod_spec(template: str) -> dict[str, Any]:
    return {"restartPolicy": "Never", "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [{"name": "trainer", "image": "trainer:v1", "resources": {"claims": [{"name": "gpu"}]}}]}


def _live_pods(rc: RealCluster, ns: str, selector: str) -> list[dict[str, Any]]:
    listed = rc.ok("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector={selector}")
    return [p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")]


def _allocated(rc: RealCluster, ns: str, pod: dict[str, Any]) -> tuple[str, str] | None:
    """(pool, device) the scheduler allocated to the pod's claim, once it has."""
    statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
    if not statuses or not statuses[0].get("resourceClaimName"):
        return None
    status, claim = rc.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/"
                                      f"{statuses[0]['resourceClaimName']}")
    results = ((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []) \
        if status == 200 else []
    return (results[0]["pool"], results[0]["device"]) if results else None


def _running_on_device(rc: RealCluster, ns: str, selector: str, old: set[str] = frozenset()  # type: ignore[assignment]
                       ) -> tuple[dict[str, Any], tuple[str, str]] | None:
    pods = [p for p in _live_pods(rc, ns, selector) if p["metadata"]["uid"] not in old]
    if len(pods) != 1 or pods[0]["status"].get("phase") != "Running":
        return None
    got = _allocated(rc, ns, pods[0])
    return (pods[0], got) if got else None


def _report(rc: RealCluster, ns: str, pod: dict[str, Any], device: str, health: str) -> None:
    """What the kubelet writes from the DRA driver's health report (KEP-4680)."""
    rc.ok("PATCH", f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}/status", {"status": {"containerStatuses": [{
        "name": "trainer", "image": "trainer:v1", "imageID": "", "ready": True, "started": True, "restartCount": 0,
        "state": {"running": {"startedAt": pod["status"]["startTime"]}},
        "allocatedResourcesStatus": [{"name": "claim:gpu", "resources": [
            {"resourceID": f"{DRIVER}/{NODE}/{device}", "health": health,
             **({"message": "XID 79: GPU has fallen off the bus"} if health == "Unhealthy" else {})}]}]}]}},
        content_type="application/strategic-merge-patch+json")


def _rules_for(rc: RealCluster, device: str) -> list[dict[str, Any]]:
    return [r for r in rc.ok("GET", RULES)["items"]
            if (r["metadata"].get("annotations") or {}).get("kcover.io/device") == f"{DRIVER}/{NODE}/{device}"]


def test_an_unhealthy_dra_device_is_tainted_and_the_job_gets_another_device_on_the_same_node(
        realcluster: RealCluster, dra: str) -> None:
    rc, ns = realcluster, dra
    job = rc.ok("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "labels": OPT_IN},
        "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 1,
                 "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]},
                 "template": {"metadata": {"labels": {**OPT_IN, "kcover.test/long-running": "true"}},
                              "spec": _pod_spec("from-3")}}})
    selector = "batch.kubernetes.io%2Fjob-name%3Dtrain"
    pod, (pool, device) = _until(lambda: _running_on_device(rc, ns, selector), "the Job's pod Running with a device")
    assert (pod["spec"]["nodeName"], pool, device) == (NODE, NODE, "gpu-3")
    controller = rc.start("controller", "kcover-controller-dra")
    rc.wait_ready(controller)

    _report(rc, ns, pod, "gpu-3", "Unhealthy")
    rule = _until(lambda: _rules_for(rc, "gpu-3"), "kcover's DeviceTaintRule for gpu-3")[0]
    assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": NODE, "device": "gpu-3"}
    assert rule["spec"]["taint"]["effect"] == "NoSchedule"
    assert len(rc.ok("GET", RULES)["items"]) == 1, "one device tainted, no other"

    moved, (pool, device) = _until(lambda: _running_on_device(rc, ns, selector, old={pod["metadata"]["uid"]}),
                                   "the Job's new pod Running with a new claim")
    assert (moved["spec"]["nodeName"], pool) == (NODE, NODE)
    assert device != "gpu-3"
    events = rc.ok("GET", f"/api/v1/namespaces/{ns}/events")["items"]
    assert any(e["reason"] == "KcoverRestartedWorkload" and e["involvedObject"]["uid"] == job["metadata"]["uid"]
               for e in events)
    node = rc.ok("GET", f"/api/v1/nodes/{NODE}")
    assert not node["spec"].get("unschedulable")
    assert not [t for t in node["spec"].get("taints") or [] if t["key"].startswith("kcover.io/")]

    # once the old claim is gone gpu-3 is free, yet a pod that does not tolerate the taint is not given it
    def released() -> bool:
        claims = rc.ok("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")["items"]
        return not any(r.get("device") == "gpu-3" for c in claims
                       for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or [])

    _until(released, "the old pod's claim on gpu-3 to be released")
    rc.ok("POST", f"/api/v1/namespaces/{ns}/pods", {"apiVersion": "v1", "kind": "Pod",
                                                    "metadata": {"name": "wants-3", "labels": {"probe": "wants-3"}},
                                                    "spec": _pod_spec("only-3")})

    def unschedulable() -> bool:
        got = rc.ok("GET", f"/api/v1/namespaces/{ns}/pods/wants-3")
        return any(c["type"] == "PodScheduled" and c["status"] == "False"
                   for c in (got.get("status") or {}).get("conditions") or [])

    _until(unschedulable, "the scheduler to refuse gpu-3 to a pod without the toleration")
    assert not rc.ok("GET", f"/api/v1/namespaces/{ns}/pods/wants-3")["spec"].get("nodeName")
    rc.ok("DELETE", f"/api/v1/namespaces/{ns}/pods/wants-3?gracePeriodSeconds=0")

    # a validation pod tolerating kcover's device taint gets gpu-3; the kubelet reports it Healthy
    rc.ok("POST", f"/api/v1/namespaces/{ns}/pods", {"apiVersion": "v1", "kind": "Pod",
                                                    "metadata": {"name": "validate", "labels": {"probe": "validate"}},
                                                    "spec": _pod_spec("validate-3")})
    probe, (_, device) = _until(lambda: _running_on_device(rc, ns, "probe%3Dvalidate"), "the validation pod on gpu-3")
    assert device == "gpu-3"
    _report(rc, ns, probe, "gpu-3", "Healthy")
    _until(lambda: not _rules_for(rc, "gpu-3"), "kcover to remove its DeviceTaintRule")
    assert not rc.ok("GET", f"/api/v1/nodes/{NODE}")["spec"].get("unschedulable")


def test_an_agent_xid_on_a_dra_gpu_taints_that_device_and_restarts_its_job(realcluster: RealCluster,
                                                                            dra: str) -> None:
    rc, ns = realcluster, dra
    job = rc.ok("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "xid", "labels": OPT_IN},
        "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 1,
                 "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]},
                 "template": {"metadata": {"labels": {**OPT_IN, "kcover.test/long-running": "true"}},
                              "spec": _pod_spec("from-3")}}})
    selector = "batch.kubernetes.io%2Fjob-name%3Dxid"
    pod, (pool, device) = _until(lambda: _running_on_device(rc, ns, selector), "the Job's pod Running with a device")
    assert (pod["spec"]["nodeName"], pool) == (NODE, NODE)
    _report(rc, ns, pod, device, "Healthy")  # the kubelet's record of who holds it (kwok has no PodResources)
    controller = rc.start("controller", "kcover-controller-dra-xid")
    agent = rc.start("agent", f"kcover-agent-{NODE}", node=NODE)
    rc.wait_ready(controller, agent)
    _until(lambda: any(e.get("event") == "dra_slice_read" for e in agent.logs()), "the agent to read its node's slice")

    agent.inject(f"xid 79 {int(device.removeprefix('gpu-'))}")
    rule = _until(lambda: _rules_for(rc, device), f"kcover's DeviceTaintRule for {device}")[0]
    assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": NODE, "device": device}
    assert len(rc.ok("GET", RULES)["items"]) == 1, "one device tainted, no other"
    moved, (_, now) = _until(lambda: _running_on_device(rc, ns, selector, old={pod["metadata"]["uid"]}),
                             "the Job's new pod Running with a new claim")
    assert moved["spec"]["nodeName"] == NODE
    assert now != device
    events = rc.ok("GET", f"/api/v1/namespaces/{ns}/events")["items"]
    assert any(e["reason"] == "KcoverRestartedWorkload" and e["involvedObject"]["uid"] == job["metadata"]["uid"]
               for e in events)
    node = rc.ok("GET", f"/api/v1/nodes/{NODE}")
    assert not node["spec"].get("unschedulable"), "an XID on one DRA GPU cordoned the node"
    assert not [t for t in node["spec"].get("taints") or [] if t["key"].startswith("kcover.io/")]
    assert any(e.get("event") == "dra_devices_attached" for e in agent.logs())
