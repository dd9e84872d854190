"""Table tests of the slim projections: raw API dicts in, only the fields kcover uses out."""

from __future__ import annotations

from typing import Any

import pytest

from kcover.kube import projecting
from kcover.kube import projections as proj


def raw_pod(**over: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {
            "uid": "u1", "resourceVersion": "7", "namespace": "ml", "name": "trainer-0",
            "labels": {"training.kubeflow.org/job-name": "bert", "kcover.io/cascading-recovery": "true",
                       "app": "noise", "pod-template-hash": "abc"},
            "annotations": {"kcover.io/restarting": "r1", "kubectl.kubernetes.io/last-applied": "{...}"},
            "ownerReferences": [
                {"kind": "Service", "name": "x", "uid": "s1", "apiVersion": "v1"},
                {"kind": "PyTorchJob", "name": "bert", "uid": "w1", "apiVersion": "kubeflow.org/v1",
                 "controller": True}],
        },
        "spec": {"nodeName": "gpu-1", "restartPolicy": "OnFailure", "containers": [{"name": "trainer"}]},
        "status": {
            "phase": "Running",
            "initContainerStatuses": [{"name": "init", "restartCount": 0,
                                       "state": {"terminated": {"reason": "Completed", "exitCode": 0,
                                                                "finishedAt": "2026-01-01T00:00:00Z"}}}],
            "containerStatuses": [{
                "name": "trainer", "restartCount": 2,
                "state": {"running": {"startedAt": "2026-01-01T00:01:00Z"}},
                "lastState": {"terminated": {"reason": "Error", "exitCode": 137,
                                             "finishedAt": "2026-01-01T00:00:59Z"}},
                "allocatedResourcesStatus": [{"name": "claim:gpu-claim/gpu", "resources": [
                    {"resourceID": "gpu.nvidia.com/pool-a/gpu-3", "health": "Unhealthy",
                     "message": "XID 79"}]}],
            }],
        },
    }
    pod.update(over)
    return pod


def test_pod_projection_keeps_only_used_fields() -> None:
    p = projecting.pod(raw_pod())
    assert (p.uid, p.rv, p.namespace, p.name, p.node, p.phase, p.restart_policy) == (
        "u1", "7", "ml", "trainer-0", "gpu-1", "Running", "OnFailure")
    assert p.labels == (("kcover.io/cascading-recovery", "true"), ("training.kubeflow.org/job-name", "bert"))
    assert p.annotations == (("kcover.io/restarting", "r1"),)
    assert p.owner == proj.OwnerRef("PyTorchJob", "bert", "w1", "kubeflow.org/v1")
    assert p.deletion_timestamp == ""
    init, main = p.containers
    assert init == proj.ContainerState("init", True, 0, proj.Terminated("Completed", 0, "2026-01-01T00:00:00Z"), None, ())
    assert main.name == "trainer"
    assert not main.init
    assert main.restart_count == 2
    assert main.terminated is None
    assert main.last_terminated == proj.Terminated("Error", 137, "2026-01-01T00:00:59Z")
    assert main.resources == (proj.ResourceHealth("claim:gpu-claim/gpu", "gpu.nvidia.com/pool-a/gpu-3", "Unhealthy", "XID 79"),)


@pytest.mark.parametrize(("raw", "check"), [
    ({}, lambda p: p.uid == "" and p.containers == () and p.owner is None and p.restart_policy == "Always"),
    ({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}, lambda p: p.deletion_timestamp != ""),
    ({"metadata": {"ownerReferences": [{"kind": "ReplicaSet", "uid": "r"}]}}, lambda p: p.owner is None),
    ({"status": {"containerStatuses": [{"name": "c", "allocatedResourcesStatus": [{"name": "n", "resources": [{"resourceID": "d"}]}]}]}},
     lambda p: p.containers[0].resources[0].health == "Unknown"),
    ({"status": {"containerStatuses": "garbage"}}, lambda p: p.containers == ()),
    ({"metadata": {"labels": None}}, lambda p: p.labels == ()),
])
def test_pod_projection_tolerates_odd_input(raw: dict[str, Any], check: Any) -> None:
    assert check(projecting.pod(raw))


def test_repeated_strings_are_interned() -> None:
    a = projecting.pod(raw_pod())
    b = projecting.pod(raw_pod())
    assert a.namespace is b.namespace
    assert a.node is b.node
    assert a.owner is not None
    assert b.owner is not None
    assert a.owner.uid is b.owner.uid


def test_node_projection() -> None:
    n = projecting.node({
        "metadata": {"name": "gpu-1", "uid": "n1", "resourceVersion": "3",
                     "annotations": {"kcover.io/cordoned-by": "kcover", "other": "x"}, "labels": {"a": "b"}},
        "spec": {"unschedulable": True, "taints": [{"key": "kcover.io/unhealthy", "effect": "NoSchedule"}]},
        "status": {"capacity": {"nvidia.com/gpu": "8", "cpu": "96"},
                   "conditions": [{"type": "KcoverGPUHealthy", "status": "False", "reason": "XID79",
                                   "message": "gone", "lastTransitionTime": "2026-01-01T00:00:00Z",
                                   "lastHeartbeatTime": "x"}]},
    })
    assert n == proj.Node("n1", "3", "gpu-1", True, (proj.Taint("kcover.io/unhealthy", "", "NoSchedule"),),
                          (proj.Condition("KcoverGPUHealthy", "False", "XID79", "gone", "2026-01-01T00:00:00Z"),),
                          (("kcover.io/cordoned-by", "kcover"),), (("nvidia.com/gpu", 8),))


@pytest.mark.parametrize(("raw", "policies", "max_restarts", "finished"), [
    ({"apiVersion": "batch/v1", "kind": "Job",
      "spec": {"backoffLimit": 4, "template": {"spec": {"restartPolicy": "Never"}}}},
     (("template", "Never"),), 4, False),
    ({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
      "spec": {"pytorchReplicaSpecs": {"Master": {"restartPolicy": "OnFailure"}, "Worker": {"restartPolicy": "Never"}},
               "runPolicy": {"backoffLimit": 3}},
      "status": {"conditions": [{"type": "Succeeded", "status": "True"}]}},
     (("Master", "OnFailure"), ("Worker", "Never")), 3, True),
    ({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "spec": {"failurePolicy": {"maxRestarts": 2}}},
     (), 2, False),
    ({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "spec": {"maxRetry": 5}}, (), 5, False),
    ({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
      "spec": {"leaderWorkerTemplate": {"restartPolicy": "RecreateGroupOnPodRestart"}}},
     (("group", "RecreateGroupOnPodRestart"),), None, False),
    ({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
      "status": {"conditions": [{"type": "Failed", "status": "False"}]}}, (), None, False),
])
def test_workload_projection(raw: dict[str, Any], policies: Any, max_restarts: int | None, finished: bool) -> None:
    raw["metadata"] = {"uid": "w", "namespace": "ml", "name": "j", "resourceVersion": "9",
                       "labels": {"kcover.io/cascading-recovery": "true", "x": "y"},
                       "annotations": {"kcover.io/last-restart": "t"}}
    w = projecting.workload(raw)
    assert (w.restart_policies, w.max_restarts, w.finished) == (policies, max_restarts, finished)
    assert w.labels == (("kcover.io/cascading-recovery", "true"),)
    assert w.annotations == (("kcover.io/last-restart", "t"),)
    assert w.group == proj.group_of(raw["apiVersion"])


def test_event_projection_keeps_only_annotated_events() -> None:
    base = {"metadata": {"uid": "e1", "namespace": "ml", "name": "e", "resourceVersion": "1"},
            "involvedObject": {"kind": "Pod", "namespace": "ml", "name": "p", "uid": "u"},
            "reason": "GPUFailed", "message": "bad", "type": "Warning", "count": 3,
            "source": {"component": "kcover.io/agent"}, "lastTimestamp": "2026-01-01T00:00:00Z",
            "series": {"count": 4, "lastObservedTime": "2026-01-01T00:00:01.000000Z"}}
    assert projecting.recovery_event(base) is None
    base["metadata"]["annotations"] = {"kcover.io/need-recovery": "true"}  # type: ignore[index]
    ev = projecting.recovery_event(base)
    assert ev is not None
    assert ev.involved == proj.InvolvedObject("Pod", "ml", "p", "u")
    assert (ev.event_count, ev.series_count, ev.source_component) == (3, 4, "kcover.io/agent")
    assert ev.series_last_observed == "2026-01-01T00:00:01.000000Z"
    base["reportingComponent"] = "kcover.io/agent"
    ev2 = projecting.recovery_event(base)
    assert ev2 is not None
    assert ev2.reporting_controller == "kcover.io/agent"
