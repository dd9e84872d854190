"""Table tests for workload adapters (restart policies, owner resolution, selectors) and ledger encoding."""

from __future__ import annotations

from typing import Any

import pytest
from harness import objects as o

from kcover.kube import caching
from kcover.kube import projections as proj
from kcover.recovery import actions, adapters, ledger


def obj(api_version: str, kind: str, spec: dict[str, Any], **status: Any) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": "j", "namespace": "ml", "uid": "u"},
            "spec": spec, "status": status}


@pytest.mark.parametrize(("raw", "forbidden"), [
    (obj("kubeflow.org/v1", "PyTorchJob", {"pytorchReplicaSpecs": {"Master": {"restartPolicy": "Never"},
                                                                     "Worker": {"restartPolicy": "Never"}}}), True),
    (obj("kubeflow.org/v1", "PyTorchJob", {"pytorchReplicaSpecs": {"Master": {"restartPolicy": "Never"},
                                                                     "Worker": {"restartPolicy": "OnFailure"}}}), False),
    (obj("kubeflow.org/v1", "TFJob", {"tfReplicaSpecs": {"Worker": {"restartPolicy": "ExitCode"}}}), False),
    (obj("kubeflow.org/v1", "MPIJob", {"mpiReplicaSpecs": {"Launcher": {"restartPolicy": "Never"}}}), True),
    (obj("kubeflow.org/v1", "XGBoostJob", {"xgbReplicaSpecs": {"Master": {}}}), False),
    (obj("batch/v1", "Job", {"backoffLimit": 0}), True),
    (obj("batch/v1", "Job", {"backoffLimit": 6}), False),
    (obj("batch/v1", "Job", {}), False),
    (obj("batch.volcano.sh/v1alpha1", "Job", {"maxRetry": 0}), False),
    (obj("jobset.x-k8s.io/v1alpha2", "JobSet", {}, conditions=[{"type": "Failed", "status": "True"}]), True),
    (obj("jobset.x-k8s.io/v1alpha2", "JobSet", {}, conditions=[{"type": "Failed", "status": "False"}]), False),
    (obj("apps/v1", "Deployment", {"replicas": 0}), False),
])
def test_restart_forbidden(raw: dict[str, Any], forbidden: bool) -> None:
    assert bool(adapters.restart_forbidden(proj.workload(raw))) is forbidden


@pytest.mark.parametrize(("group", "kind", "family"), [
    ("kubeflow.org", "PyTorchJob", adapters.Family.KUBEFLOW_V1),
    ("kubeflow.org", "JAXJob", adapters.Family.KUBEFLOW_V1),
    ("kubeflow.org", "Notebook", None),
    ("trainer.kubeflow.org", "TrainJob", adapters.Family.TRAINJOB),
    ("jobset.x-k8s.io", "JobSet", adapters.Family.JOBSET),
    ("batch.volcano.sh", "Job", adapters.Family.VOLCANO),
    ("batch", "Job", adapters.Family.BATCH_JOB),
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet", adapters.Family.LWS),
    ("apps", "StatefulSet", None),
    ("batch", "CronJob", None),
])
def test_family(group: str, kind: str, family: adapters.Family | None) -> None:
    assert adapters.family(group, kind) is family


CRON_JOB = o.workload("batch/v1", "Job", "nightly-1", uid="job-uid", owner=o.owner("batch/v1", "CronJob", "nightly", "cron-uid"))
IMPOSTOR = o.workload("kubeflow.org/v1", "TFJob", "train", uid="pt-uid")
LWS = o.workload("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "serve", uid="lws-uid")
JOBSET = o.workload("jobset.x-k8s.io/v1alpha2", "JobSet", "js", uid="js-uid")


@pytest.mark.parametrize(("pod", "expected"), [
    (o.pod("nightly-1-x", owner=CRON_JOB), "Job nightly-1"),
    (o.pod("x", owner=o.owner("kubeflow.org/v1", "PyTorchJob", "train", "pt-uid")), "OwnerMismatch"),
    (o.pod("x", owner=o.owner("kubeflow.org/v1", "PyTorchJob", "gone", "gone-uid")), "OwnerNotCached"),
    (o.pod("x", owner=o.owner("apps/v1", "DaemonSet", "dcgm", "ds-uid")), "UnsupportedOwner"),
    (o.pod("x"), "NoController"),
    (o.pod("serve-0-1", labels={adapters.LWS_NAME: "serve", adapters.LWS_GROUP_INDEX: "0"},
           owner=o.owner("apps/v1", "StatefulSet", "serve-0", "sts-uncached")), "LeaderWorkerSet serve"),
    # a JobSet's Job left out of the cache: the JobSet its labels name, only with a matching uid label
    (o.pod("js-a-0-0", labels={adapters.JOBSET_NAME: "js", adapters.JOBSET_UID: "js-uid"},
           owner=o.owner("batch/v1", "Job", "js-a-0", "job-uncached")), "JobSet js"),
    (o.pod("js-a-0-0", labels={adapters.JOBSET_NAME: "js", adapters.JOBSET_UID: "other-uid"},
           owner=o.owner("batch/v1", "Job", "js-a-0", "job-uncached")), "OwnerNotCached"),
    (o.pod("x", namespace="other", owner=CRON_JOB), "OwnerMismatch"),
])
def test_resolve(pod: dict[str, Any], expected: str) -> None:
    snap = caching.ClusterCache.offline([CRON_JOB, IMPOSTOR, LWS, JOBSET])
    found = adapters.resolve(snap, proj.pod(pod))
    got = (f"{found.workload.kind} {found.workload.name}" if isinstance(found, adapters.Resolved)
           else found.code.value)
    assert got == expected


def test_legacy_controller_uid_label_and_name_fallback() -> None:
    job = proj.workload(o.workload("batch/v1", "Job", "bj", uid="bj-uid"))
    resolved = adapters.Resolved(job, adapters.Family.BATCH_JOB, (job,))
    legacy = proj.pod(o.pod("x", labels={"controller-uid": "bj-uid", adapters.BATCH_JOB_NAME: "bj"}))
    bare = proj.pod(o.pod("x", labels={adapters.BATCH_JOB_NAME: "bj"}))
    assert adapters.restart_unit(resolved, legacy).selector == actions.MemberSelector(
        (("controller-uid", "bj-uid"),), uid_bearing=True)
    assert adapters.restart_unit(resolved, bare).selector == actions.MemberSelector(
        ((adapters.BATCH_JOB_NAME, "bj"),), uid_bearing=False)


def test_ledger_state_round_trip_and_prune() -> None:
    state = ledger.State(restarts={"w.a": [100.0, 200.0], "w.b": [50.0]}, notes={"w.a": "PyTorchJob ml/a"},
                         cordons={"gpu-1": 150.0, "gpu-2": 10.0}, cordon_reasons={"gpu-1": "XID79"})
    again = ledger.State.decode(state.encode())
    assert again.history() == state.history()
    again.prune(120.0)
    assert again.restarts == {"w.a": [200.0]}
    assert again.cordons == {"gpu-1": 150.0}


def test_ledger_ignores_unreadable_entries() -> None:
    state = ledger.State.decode({"w.a": "{not json", "n.x": '{"c": "soon"}', "w.b": '{"t": [1, "x", 2]}'})
    assert state.restarts == {"w.b": [1.0, 2.0]}
    assert state.cordons == {}


def test_the_cache_keeps_every_label_the_restart_selectors_use() -> None:
    from kcover.kube import projections

    assert adapters.SELECTOR_LABELS <= projections.KEPT_POD_LABELS
