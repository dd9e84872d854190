"""Verification's pure decisions, as tables over the cache's own projections: when a restarted unit is
back (new uids, all Running), finished, or Stalled, and which cause a Stalled recovery reports."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kcover import settings
from kcover.kube import caching, projecting
from kcover.kube import projections as proj
from kcover.recovery import steps as actions
from kcover.recovery import verifying

JOB = "training.kubeflow.org/job-name"
SEL = actions.Selector(labels=((JOB, "train"),))
OLD = frozenset({"old-0", "old-1"})


def _followed(expected: int = 2) -> verifying.Followed:
    return verifying.Followed(key="w.u", workload=actions.WorkloadRef("PyTorchJob", "kubeflow.org/v1", "train", "ml", "u"),
                              selector=SEL, what="PyTorchJob ml/train", old_uids=OLD, expected=expected,
                              fault_at=0.0, restarted_at=1.0, deadline=10.0, fault="ContainerError")


def _pod(uid: str, phase: str = "Running", *, status: dict[str, Any] | None = None, deleting: bool = False) -> proj.Pod:
    meta: dict[str, Any] = {"uid": uid, "name": f"train-{uid}", "namespace": "ml", "labels": {JOB: "train"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return projecting.pod({"metadata": meta, "spec": {"nodeName": "n1"}, "status": {"phase": phase, **(status or {})}})


UNSCHEDULABLE = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                 "message": "0/4 nodes are available: 4 node(s) were unschedulable."}]}
IMAGE = {"containerStatuses": [{"name": "pytorch", "state": {"waiting": {"reason": "ImagePullBackOff",
                                                                         "message": "Back-off pulling image"}}}]}
CRASH = {"containerStatuses": [{"name": "pytorch", "restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}


@pytest.mark.parametrize(("pods", "expected"), [
    ([_pod("new-0"), _pod("new-1")], verifying.Outcome.RECOVERED),
    ([_pod("new-0"), _pod("new-1", "Pending")], None),  # not all running
    ([_pod("new-0")], None),  # the operator has recreated one of two
    ([_pod("new-0"), _pod("new-1"), _pod("old-0", deleting=True)], verifying.Outcome.RECOVERED),  # old one terminating
    ([_pod("new-0"), _pod("old-1")], None),  # an old pod is still there
    ([], None),
])
def test_assess(pods: list[proj.Pod], expected: verifying.Outcome | None) -> None:
    assert verifying.assess(_followed(), pods, None) is expected


def test_a_finished_workload_is_finished_not_stalled() -> None:
    done = projecting.workload({"kind": "PyTorchJob", "apiVersion": "kubeflow.org/v1", "metadata": {"uid": "u"},
                                "status": {"conditions": [{"type": "Succeeded", "status": "True"}]}})
    assert verifying.assess(_followed(), [], done) is verifying.Outcome.FINISHED


@pytest.mark.parametrize(("pods", "cause", "says"), [
    ([_pod("new-0", "Pending", status=UNSCHEDULABLE), _pod("new-1", "Pending", status=UNSCHEDULABLE)],
     verifying.StallCause.UNSCHEDULABLE, "0/4 nodes are available"),
    ([_pod("new-0", "Pending", status=IMAGE), _pod("new-1")], verifying.StallCause.IMAGE_PULL, "ImagePullBackOff"),
    ([_pod("new-0", status=CRASH), _pod("new-1")], verifying.StallCause.CRASHED_AGAIN, "CrashLoopBackOff"),
    ([_pod("new-0")], verifying.StallCause.NOT_RECREATED, "1 of 2 pods"),
    ([], verifying.StallCause.NOT_RECREATED, "0 of 2 pods"),
    ([_pod("new-0", "Pending"), _pod("new-1", "Pending")], verifying.StallCause.NOT_RUNNING, "2 Pending"),
])
def test_diagnose_reads_the_cause_from_the_pods(pods: list[proj.Pod], cause: verifying.StallCause, says: str) -> None:
    got, detail = verifying.diagnose(_followed(), pods)
    assert got is cause
    assert says in detail


class CountingCache(caching.ClusterCache):
    """The product's cache, counting the unit lookups verification makes."""

    lookups = 0

    def pods_of_workload(self, workload_uid: str) -> list[proj.Pod]:
        self.lookups += 1
        return super().pods_of_workload(workload_uid)


def _job(name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": "ml", "uid": uid}}


def _member(job: str, job_uid: str, uid: str, phase: str = "Running") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{job}-{uid}", "namespace": "ml", "uid": uid, "labels": {JOB: job},
                         "resourceVersion": "1",
                         "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": job,
                                              "uid": job_uid, "controller": True}]},
            "spec": {"nodeName": "n1"}, "status": {"phase": phase}}


def test_a_followed_restart_is_assessed_on_its_own_pods_changes_only() -> None:
    """Another job's pods in the same namespace do not make verification look the followed unit up again; its
    own pods coming back running end it as recovered."""
    others = [_job("other", "v"), _member("other", "v", "o-0"), _member("other", "v", "o-1")]
    cache = CountingCache.offline([_job("train", "u"), _member("train", "u", "old-0"), _member("train", "u", "old-1"),
                                   *others])

    verifier = verifying.Verifier(cache, verifying.VerifyMetrics(CollectorRegistry()),
                                  settings_=lambda: settings.VerifySettings())
    verifier.follow(_followed(), lambda: 5.0)
    assert cache.lookups == 1  # the first look, when following starts
    others[1]["status"]["phase"] = "Failed"
    others[1]["metadata"]["resourceVersion"] = "2"
    cache.load([_job("train", "u"), _member("train", "u", "old-0"), _member("train", "u", "old-1"), *others])
    assert cache.lookups == 1
    assert list(verifier.followed) == ["w.u"]
    cache.load([_job("train", "u"), _member("train", "u", "new-0"), _member("train", "u", "new-1"), *others])
    assert [(r.key, r.outcome) for r in verifier.history] == [("w.u", verifying.Outcome.RECOVERED)]
    assert verifier.followed == {}
    (event,) = verifier.flush(6.0)
    assert isinstance(event, actions.Emit)
    assert event.reason == "KcoverRecoveryVerified"
    assert "5.000s after the fault (MTTR)" in event.message
