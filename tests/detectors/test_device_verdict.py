"""The controller's check on a device an Event names: only a ResourceSlice of the node it is about counts.

A table over `event_watcher.device_verdict` with the cluster cache's own `publishes_device`, read from
ResourceSlices loaded through the cache's list path. The same check through the API server and the
controller is tests/integration/agent/test_dra_device_mapping.py. Also the rule on an Event saying a
device is healthy again (`return_verdict`): only the agent's `kcover.io/device-healthy` word about a
Node counts, and the cluster cache keeps such Events; and evidence (`evidence_verdict`, an agent's RDMA
link-down) counts only as the agent's word about a Node that asks for nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from kcover import codec, model
from kcover.detectors import event_watcher
from kcover.kube import caching, projecting
from kcover.kube import projections as proj

DRIVER = "gpu.nvidia.com"


def _slice(node: str, pool: str, devices: Any, *, driver: str = DRIVER, uid: str = "") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{pool}", "uid": uid or f"{node}-{pool}", "resourceVersion": "1"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": pool, "generation": 1,
                                                                   "resourceSliceCount": 1}, "devices": devices}}


CACHE = caching.ClusterCache.offline([
    _slice("a", "a", [{"name": f"gpu-{i}"} for i in range(8)]),
    _slice("b", "b", [{"name": "gpu-2"}]),
    _slice("c", "c", "not a list"),
    _slice("", "shared", [{"name": "nic-0"}]),  # network-attached devices: no node
])


def _verdict(kind: model.TargetKind, node: str) -> event_watcher.Verdict:
    return event_watcher.Verdict(model.Target(kind=kind, name=node if kind is model.TargetKind.NODE else "p",
                                              namespace="" if kind is model.TargetKind.NODE else "ml", node=node),
                                 "kcover.io/agent")


CASES = [
    ("its own node's device", model.TargetKind.NODE, "a", ("a", "gpu-2"), True),
    ("another node's device", model.TargetKind.NODE, "a", ("b", "gpu-2"), False),
    ("a device its slice does not publish", model.TargetKind.NODE, "b", ("b", "gpu-3"), False),
    ("a pool of its own name that publishes nothing readable", model.TargetKind.NODE, "c", ("c", "gpu-0"), False),
    ("a device of no node", model.TargetKind.NODE, "a", ("shared", "nic-0"), False),
    ("a Pod's Event: a device of the pod's node", model.TargetKind.POD, "a", ("a", "gpu-5"), True),
    ("a Pod's Event: a device of another node", model.TargetKind.POD, "a", ("b", "gpu-2"), False),
    ("a Pod not bound to a node", model.TargetKind.POD, "", ("a", "gpu-5"), False),
]


@pytest.mark.parametrize(("kind", "node", "device", "accepted"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_an_event_may_name_only_devices_of_the_node_it_is_about(kind: model.TargetKind, node: str,
                                                                device: tuple[str, str], accepted: bool) -> None:
    dra = model.DraDevice(driver=DRIVER, pool=device[0], device=device[1])
    verdict = event_watcher.device_verdict(_verdict(kind, node), dra, CACHE.publishes_device)
    assert (verdict.target is not None) is accepted
    if not accepted:
        assert verdict.reason == "device_not_on_node"


def test_another_drivers_device_of_the_same_name_is_not_the_one_named() -> None:
    dra = model.DraDevice(driver="gpu.amd.com", pool="a", device="gpu-2")
    assert event_watcher.device_verdict(_verdict(model.TargetKind.NODE, "a"), dra, CACHE.publishes_device).target is None


DEV = model.DraDevice(driver=DRIVER, pool="a", device="gpu-2")
RETURNS = [
    ("the agent's device-healthy word about its Node", model.TargetKind.NODE, True, True, DEV, True),
    ("device-healthy about a Pod (a tenant can write those)", model.TargetKind.POD, True, True, DEV, False),
    ("a cleared Node Event naming a device without the word", model.TargetKind.NODE, False, True, DEV, False),
    ("a cleared Pod Event naming a device", model.TargetKind.POD, False, True, DEV, False),
    ("a fault on a device (not a return): not this rule's", model.TargetKind.POD, False, False, DEV, True),
    ("a cleared Node Event naming no device: not this rule's", model.TargetKind.NODE, False, True, None, True),
]


@pytest.mark.parametrize(("kind", "healthy", "cleared", "dra", "accepted"), [c[1:] for c in RETURNS],
                         ids=[c[0] for c in RETURNS])
def test_a_device_returns_to_service_only_on_the_agents_word_about_a_node(
        kind: model.TargetKind, healthy: bool, cleared: bool, dra: model.DraDevice | None, accepted: bool) -> None:
    decoded = codec.Decoded(device_healthy=healthy, cleared=cleared, fault=model.Fault(dra=dra))
    verdict = event_watcher.return_verdict(_verdict(kind, "a"), decoded)
    assert (verdict.target is not None) is accepted
    if not accepted:
        assert verdict.reason == "device_healthy_untrusted"


def test_the_cache_keeps_device_healthy_and_evidence_events_and_nothing_else_new() -> None:
    def raw(annotations: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"name": "e", "namespace": "kcover", "uid": "u", "annotations": annotations},
                "involvedObject": {"kind": "Node", "name": "a"}}

    assert projecting.recovery_event(raw({codec.DEVICE_HEALTHY: "true"})) is not None
    assert projecting.recovery_event(raw({codec.NEED_RECOVERY: "true"})) is not None
    assert projecting.recovery_event(raw({codec.DEVICE_HEALTHY: "false"})) is None
    assert projecting.recovery_event(raw({codec.FAULT_CLEARED: "true", codec.DRA_DEVICE: "gpu-2"})) is None
    assert projecting.recovery_event(raw({codec.EVIDENCE: "link-down"})) is not None
    assert projecting.recovery_event(raw({codec.EVIDENCE: ""})) is None


LINK = model.Evidence.LINK_DOWN
REPORT = model.Action.REPORT
EVIDENCE = [
    ("the agent's link-down about its Node, asking for nothing", model.TargetKind.NODE, LINK, REPORT, False, True),
    ("the same with no recommendation", model.TargetKind.NODE, LINK, None, False, True),
    ("a link-down about a Pod (a tenant can write those)", model.TargetKind.POD, LINK, REPORT, False, False),
    ("a link-down that also asks for a cordon", model.TargetKind.NODE, LINK, model.Action.CORDON_NODE, False, False),
    ("a link-down that is a fault's end", model.TargetKind.NODE, LINK, REPORT, True, False),
    ("no evidence: not this rule's", model.TargetKind.POD, None, model.Action.RESTART_WORKLOAD, False, True),
]


@pytest.mark.parametrize(("kind", "evidence", "recommended", "cleared", "accepted"), [c[1:] for c in EVIDENCE],
                         ids=[c[0] for c in EVIDENCE])
def test_evidence_counts_only_as_the_agents_word_about_a_node_asking_for_nothing(
        kind: model.TargetKind, evidence: model.Evidence | None, recommended: model.Action | None, cleared: bool,
        accepted: bool) -> None:
    decoded = codec.Decoded(evidence=evidence, recommended=recommended, cleared=cleared,
                            need_recovery=recommended not in (None, REPORT) and not cleared)
    verdict = event_watcher.evidence_verdict(_verdict(kind, "a"), decoded)
    assert (verdict.target is not None) is accepted
    if not accepted:
        assert verdict.reason == "evidence_untrusted"


def _pod(uid: str, *, holds: str = "", opted: bool = True) -> dict[str, Any]:
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": f"job-{uid}", "namespace": "ml", "uid": f"job-{uid}", "resourceVersion": "1",
                        "labels": {proj.OPT_IN_LABEL: "true"} if opted else {}}, "spec": {}}
    status: dict[str, Any] = {"phase": "Running"}
    if holds:
        status["containerStatuses"] = [{"name": "c", "allocatedResourcesStatus": [
            {"name": "claim:gpu/gpu", "resources": [{"resourceID": holds, "health": "Healthy"}]}]}]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": uid, "namespace": "ml", "uid": uid, "resourceVersion": "1",
                        "labels": {"training.kubeflow.org/job-name": f"job-{uid}"},
                        "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": f"job-{uid}",
                                             "uid": f"job-{uid}", "controller": True}]},
           "spec": {"nodeName": "a"}, "status": status}
    return {"job": job, "pod": pod}


HOLDERS = caching.ClusterCache.offline([
    *_pod("holder", holds=DEV.resource_id).values(),
    *_pod("neighbour", holds="gpu.nvidia.com/a/gpu-5").values(),
    *_pod("bare").values(),
    *_pod("unopted", holds=DEV.resource_id, opted=False).values(),
])
HELD = [
    ("its opted-in pod holds the device", "holder", model.TargetKind.POD, None),
    ("another device of the same node, held by a neighbour", "neighbour", model.TargetKind.POD, "device_not_held"),
    ("a pod holding no device at all", "bare", model.TargetKind.POD, "device_not_held"),
    ("a pod gone from the cache", "gone", model.TargetKind.POD, "device_not_held"),
    ("its pod holds the device but is not opted in", "unopted", model.TargetKind.POD, "device_holder_not_opted_in"),
    ("the agent's Event about its Node: not this rule's", "", model.TargetKind.NODE, None),
]


@pytest.mark.parametrize(("pod", "kind", "refused"), [c[1:] for c in HELD], ids=[c[0] for c in HELD])
def test_a_pods_event_may_name_only_a_device_its_opted_in_pod_holds(pod: str, kind: model.TargetKind,
                                                                    refused: str | None) -> None:
    """A tenant who may write Events in its namespace names a device of its pod's node: kcover isolates it
    only when the kubelet says that pod holds it, and the pod is opted in."""
    target = (model.Target(kind=kind, namespace="ml", name=pod, uid=pod, node="a") if kind is model.TargetKind.POD
              else model.Target(kind=kind, name="a", node="a"))
    verdict = event_watcher.holder_verdict(event_watcher.Verdict(target, "someone"), DEV,
                                           HOLDERS.pod(pod) if pod else None, HOLDERS.opted_in)
    assert verdict.reason == (refused or "someone")
    assert (verdict.target is None) is (refused is not None)
