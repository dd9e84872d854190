"""Table tests for workload adapters (restart policies, owner resolution, selectors) and ledger encoding."""

from __future__ import annotations

from typing import Any

import pytest

from kcover.recovery import actions, adapters, ledger, views


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
    assert bool(adapters.restart_forbidden(raw)) is forbidden


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


def own(kind: str, api_version: str, name: str, uid: str) -> views.OwnerRef:
    return views.OwnerRef(kind=kind, api_version=api_version, name=name, uid=uid)


CRON_JOB = views.WorkloadView("Job", "batch/v1", "ml", "nightly-1", "job-uid",
                              owner=own("CronJob", "batch/v1", "nightly", "cron-uid"))
IMPOSTOR = views.WorkloadView("TFJob", "kubeflow.org/v1", "ml", "train", "pt-uid")
LWS = views.WorkloadView("LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1", "ml", "serve", "lws-uid")


@pytest.mark.parametrize(("pod", "expected"), [
    (views.PodView("p", "ml", "nightly-1-x", owner=own("Job", "batch/v1", "nightly-1", "job-uid")), "Job nightly-1"),
    (views.PodView("p", "ml", "x", owner=own("PyTorchJob", "kubeflow.org/v1", "train", "pt-uid")), "OwnerMismatch"),
    (views.PodView("p", "ml", "x", owner=own("PyTorchJob", "kubeflow.org/v1", "gone", "gone-uid")), "OwnerNotCached"),
    (views.PodView("p", "ml", "x", owner=own("DaemonSet", "apps/v1", "dcgm", "ds-uid")), "UnsupportedOwner"),
    (views.PodView("p", "ml", "x"), "NoController"),
    (views.PodView("p", "ml", "serve-0-1", labels={adapters.LWS_NAME: "serve", adapters.LWS_GROUP_INDEX: "0"},
                   owner=own("StatefulSet", "apps/v1", "serve-0", "sts-uncached")), "LeaderWorkerSet serve"),
    (views.PodView("p", "other", "x", owner=own("Job", "batch/v1", "nightly-1", "job-uid")), "OwnerMismatch"),
])
def test_resolve(pod: views.PodView, expected: str) -> None:
    snap = views.MemorySnapshot(workloads=[CRON_JOB, IMPOSTOR, LWS])
    found = adapters.resolve(snap, pod)
    got = (f"{found.workload.kind} {found.workload.name}" if isinstance(found, adapters.Resolved)
           else found.code.value)
    assert got == expected


def test_legacy_controller_uid_label_and_name_fallback() -> None:
    job = views.WorkloadView("Job", "batch/v1", "ml", "bj", "bj-uid")
    resolved = adapters.Resolved(job, adapters.Family.BATCH_JOB, (job,))
    legacy = views.PodView("p", "ml", "x", labels={"controller-uid": "bj-uid", adapters.BATCH_JOB_NAME: "bj"})
    bare = views.PodView("p", "ml", "x", labels={adapters.BATCH_JOB_NAME: "bj"})
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
