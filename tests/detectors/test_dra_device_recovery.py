"""dra-health: an isolated device's return to service, seen on whichever pod reports it.

The pod that reported a device Unhealthy is usually restarted away before the device recovers; the
next pod that gets the device (a validation pod tolerating kcover's device taint) reports it Healthy.
That first Healthy is a `DeviceRecovered` cleared event naming the device (`fault.dra`), once; a
device never reported Unhealthy gives nothing when a new pod reports it Healthy.
"""

from __future__ import annotations

from harness import objects as o

from kcover import bus as bus_
from kcover import metrics, model
from kcover.detectors import contract, dra_health
from kcover.kube import caching, indexing

DEV3 = "gpu.nvidia.com/n1/gpu-3"


def _pod(name: str, resource_id: str, health: str) -> o.Obj:
    pod = o.pod(name, uid=f"uid-{name}", node="n1")
    pod["status"]["containerStatuses"] = [{"name": "c", "allocatedResourcesStatus": [
        {"name": "claim:gpu/gpu", "resources": [{"resourceID": resource_id, "health": health}]}]}]
    return pod


def test_a_device_reported_healthy_by_another_pod_is_recovered_once() -> None:
    cache = caching.ClusterCache.offline([_pod("sick", DEV3, "Unhealthy"), _pod("other", "gpu.nvidia.com/n1/gpu-5",
                                                                                "Healthy")])
    context = contract.DetectorContext(role=contract.Role.CONTROLLER, metrics=metrics.Metrics(), cluster=cache)
    detector = dra_health.DraHealthDetector("dra-health", dra_health.DraHealthConfig(), context)
    bus = bus_.Bus(dedupe_window_seconds=0)
    sub = bus.subscribe("test")
    detector._bus = bus
    for uid in ("uid-sick", "uid-other"):
        pod = cache.pod(uid)
        assert pod is not None
        detector._on_change(indexing.Kind.POD, None, pod)
    assert [e.reason for e in sub.get_nowait()] == ["DeviceUnhealthy"]
    # the sick pod is restarted away; a validation pod gets the device and the kubelet reports it Healthy
    sick = cache.pod("uid-sick")
    detector._on_change(indexing.Kind.POD, sick, None)
    cache.load([_pod("validate", DEV3, "Healthy"), _pod("fresh", "gpu.nvidia.com/n1/gpu-6", "Healthy")])
    for uid in ("uid-validate", "uid-fresh", "uid-validate"):
        pod = cache.pod(uid)
        assert pod is not None
        detector._on_change(indexing.Kind.POD, None, pod)
    got = sub.get_nowait()
    assert [(e.reason, e.cleared, e.target.name) for e in got] == [("DeviceRecovered", True, "validate")]
    assert got[0].fault.dra == model.DraDevice(driver="gpu.nvidia.com", pool="n1", device="gpu-3")
