"""Table tests of the workload kinds table (restart policies, families), owner resolution and restart units."""

from __future__ import annotations

from typing import Any

import pytest
from harness import objects as o

from kcover import kinds
from kcover.kube import caching, ownership, projecting
from kcover.kube import projections as proj
from kcover.recovery import restartunits
from kcover.recovery import steps as st


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
    w = projecting.workload(raw)
    table = kinds.of(w.group, w.kind)
    got = table.forbidden(restart_policies=[p for _, p in w.restart_policies], max_restarts=w.max_restarts,
                          finished=w.finished) if table is not None else ""
    assert bool(got) is forbidden


@pytest.mark.parametrize(("group", "kind", "family"), [
    ("kubeflow.org", "PyTorchJob", kinds.Family.KUBEFLOW_V1),
    ("kubeflow.org", "JAXJob", kinds.Family.KUBEFLOW_V1),
    ("kubeflow.org", "Notebook", None),
    ("trainer.kubeflow.org", "TrainJob", kinds.Family.TRAINJOB),
    ("jobset.x-k8s.io", "JobSet", kinds.Family.JOBSET),
    ("batch.volcano.sh", "Job", kinds.Family.VOLCANO),
    ("batch", "Job", kinds.Family.BATCH_JOB),
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet", kinds.Family.LWS),
    ("apps", "StatefulSet", None),
    ("batch", "CronJob", None),
])
def test_family(group: str, kind: str, family: kinds.Family | None) -> None:
    assert kinds.family(group, kind) is family


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
    (o.pod("serve-0-1", labels={kinds.LWS_NAME: "serve", kinds.LWS_GROUP_INDEX: "0"},
           owner=o.owner("apps/v1", "StatefulSet", "serve-0", "sts-uncached")), "LeaderWorkerSet serve"),
    # a JobSet's Job left out of the cache: the JobSet its labels name, only with a matching uid label
    (o.pod("js-a-0-0", labels={kinds.JOBSET_NAME: "js", kinds.JOBSET_UID: "js-uid"},
           owner=o.owner("batch/v1", "Job", "js-a-0", "job-uncached")), "JobSet js"),
    (o.pod("js-a-0-0", labels={kinds.JOBSET_NAME: "js", kinds.JOBSET_UID: "other-uid"},
           owner=o.owner("batch/v1", "Job", "js-a-0", "job-uncached")), "OwnerNotCached"),
    (o.pod("x", namespace="other", owner=CRON_JOB), "OwnerMismatch"),
])
def test_resolve(pod: dict[str, Any], expected: str) -> None:
    snap = caching.ClusterCache.offline([CRON_JOB, IMPOSTOR, LWS, JOBSET])
    found = ownership.resolve(snap, projecting.pod(pod))
    got = (f"{found.workload.kind} {found.workload.name}" if isinstance(found, ownership.Resolved)
           else found.problem.value)
    assert got == expected


def test_legacy_controller_uid_label_and_name_fallback() -> None:
    job = projecting.workload(o.workload("batch/v1", "Job", "bj", uid="bj-uid"))
    resolved = ownership.Resolved(job, kinds.Family.BATCH_JOB, (job,))
    legacy = projecting.pod(o.pod("x", labels={"controller-uid": "bj-uid", kinds.BATCH_JOB_NAME: "bj"}))
    bare = projecting.pod(o.pod("x", labels={kinds.BATCH_JOB_NAME: "bj"}))
    assert restartunits.unit_of(resolved, legacy).selector == st.Selector(
        ((kinds.BATCH_JOB_NAME, "bj"), ("controller-uid", "bj-uid")), uid_bearing=True)
    assert restartunits.unit_of(resolved, bare).selector == st.Selector(((kinds.BATCH_JOB_NAME, "bj"),), uid_bearing=False)


def test_every_kind_is_one_table_entry_that_the_settings_and_the_cache_follow() -> None:
    from kcover import settings

    assert settings.KubeSettings().workload_kinds == [k.key for k in kinds.KINDS]
    assert {k.key for k in caching.WORKLOAD_KINDS} == {k.key for k in kinds.KINDS}
    assert kinds.INDEXED_LABELS <= kinds.SELECTOR_LABELS <= proj.KEPT_POD_LABELS
    evicted = {k.kind for k in kinds.KINDS if k.removal is kinds.Removal.EVICT}
    assert evicted == {"Job", "JobSet", "TrainJob"}  # batch/v1 Job counts deletions towards backoffLimit
    assert kinds.of("batch.volcano.sh", "Job").removal is kinds.Removal.DELETE  # type: ignore[union-attr]
