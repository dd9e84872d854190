"""Training workloads for the `node` backend: real containers on the real kubelet that fail when told to.

Each worker is a Python program in the workload base image (Debian's python3, the base kcover's images
are built on). It prints a line per second and polls a trigger file in a hostPath directory
(`nodekit.CTL`); the first worker to rename `<namespace>.<job>.fail` away prints "loss is nan ... exiting with 1" and
exits 1. So `trigger(job)` makes exactly one real container of the job exit 1, at a moment the test
chooses; the kubelet restarts it in place (restartPolicy OnFailure) and reports the exit as it does, and
every later incarnation runs on. Nothing in a pod's status is written by the test.

Builders for a batch/v1 Job, a JobSet and a Kubeflow PyTorchJob of `workers` pods each, opted in to
kcover (`kcover.io/cascading-recovery=true` on the workload and its pods), on the real node; and
`running(...)`, the job's pods when every one runs (new uids when `old` is given).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from nodekit import CTL, OPT_IN, RealNode

WORKER = r"""
import os, socket, sys, time
job, trigger, me = os.environ["KCOVER_TEST_JOB"], os.environ["KCOVER_TEST_TRIGGER"], socket.gethostname()
print(f"{job} worker {me} starting on GPUs {os.environ.get('NVIDIA_VISIBLE_DEVICES', '-')}", flush=True)
step = 0
while True:
    try:
        os.rename(f"/ctl/{trigger}.fail", f"/ctl/{trigger}.failed-by-{me}")
    except FileNotFoundError:
        pass
    else:
        print(f"{job} worker {me}: loss is nan at step {step}, exiting with 1", flush=True)
        sys.exit(1)
    if step % 5 == 0:
        print(f"{job} worker {me}: step {step}", flush=True)
    step += 1
    time.sleep(0.2)
"""


@dataclasses.dataclass(frozen=True)
class Kind:
    name: str
    path: str  # the collection, with {ns}
    selector: str  # label selector of the job's pods, with {job}


BATCH = Kind("Job", "/apis/batch/v1/namespaces/{ns}/jobs", "batch.kubernetes.io%2Fjob-name%3D{job}")
JOBSET = Kind("JobSet", "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets", "jobset.sigs.k8s.io%2Fjobset-name%3D{job}")
PYTORCH = Kind("PyTorchJob", "/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs",
               "training.kubeflow.org%2Fjob-name%3D{job}")
KINDS = {"batch": BATCH, "jobset": JOBSET, "pytorchjob": PYTORCH}


def pod_spec(rn: RealNode, ns: str, job: str, *, container: str = "worker", restart: str = "OnFailure",
             gpus: int = 0) -> dict[str, Any]:
    c: dict[str, Any] = {"name": container, "image": rn.workload_image, "imagePullPolicy": "IfNotPresent",
                         "command": ["python3", "-c", WORKER],
                         "env": [{"name": "KCOVER_TEST_JOB", "value": job},
                                 {"name": "KCOVER_TEST_TRIGGER", "value": f"{ns}.{job}"}],
                         "volumeMounts": [{"name": "ctl", "mountPath": "/ctl"}]}
    if gpus:
        c["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {"restartPolicy": restart, "terminationGracePeriodSeconds": 5,
            "nodeSelector": {"kcover.test/node": "real"}, "containers": [c],
            "volumes": [{"name": "ctl", "hostPath": {"path": str(CTL), "type": "Directory"}}]}


def create(rn: RealNode, kind: str, ns: str, job: str, *, workers: int = 2, **spec: Any) -> dict[str, Any]:
    """An opted-in workload of `workers` pods on the real node; returns it as created."""
    template = {"metadata": {"labels": dict(OPT_IN)}, "spec": pod_spec(rn, ns, job, **spec)}
    meta = {"name": job, "namespace": ns, "labels": dict(OPT_IN)}
    if kind == "batch":
        body: dict[str, Any] = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {
            "parallelism": workers, "completions": workers, "backoffLimit": 6, "template": template}}
    elif kind == "jobset":
        body = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": meta, "spec": {
            "replicatedJobs": [{"name": "workers", "replicas": 1, "template": {"spec": {
                "parallelism": workers, "completions": workers, "backoffLimit": 6, "template": template}}}]}}
    else:
        template["spec"]["containers"][0]["name"] = "pytorch"  # the training operator's container name
        body = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta, "spec": {
            "pytorchReplicaSpecs": {"Worker": {"replicas": workers, "restartPolicy": "OnFailure",
                                               "template": template}}}}
    got: dict[str, Any] = rn.ok("POST", KINDS[kind].path.format(ns=ns), body)
    return got


def pods(rn: RealNode, kind: str, ns: str, job: str, *, live: bool = True) -> list[dict[str, Any]]:
    return rn.pods(ns, KINDS[kind].selector.format(job=job), live=live)


def uids(pods_: list[dict[str, Any]]) -> set[str]:
    return {str(p["metadata"]["uid"]) for p in pods_}


def running(rn: RealNode, kind: str, ns: str, job: str, workers: int = 2,
            old: frozenset[str] = frozenset()) -> list[dict[str, Any]] | None:
    """The job's pods when `workers` of them, none of `old`, all run with every container started (and, for
    a PyTorchJob, the operator says Running)."""
    got = pods(rn, kind, ns, job)
    if len(got) != workers or uids(got) & old:
        return None
    for p in got:
        statuses = p["status"].get("containerStatuses") or []
        if p["status"].get("phase") != "Running" or not statuses or not all(
                "running" in (s.get("state") or {}) for s in statuses):
            return None
    if kind == "pytorchjob":
        status = rn.ok("GET", f"{KINDS[kind].path.format(ns=ns)}/{job}").get("status") or {}
        last = (status.get("conditions") or [{}])[-1]
        if (last.get("type"), last.get("status")) != ("Running", "True"):
            return None
    return got


def trigger(ns: str, job: str) -> float:
    """Make one worker of `ns`'s `job` exit 1 (the first to see the file); returns the monotonic time."""
    (CTL / f"{ns}.{job}.fail").write_text("fail\n")
    return time.monotonic()


def failed_by(ns: str, job: str) -> str:
    """The hostname (the pod's name, or its spec.hostname) of the worker that took the last trigger."""
    taken = sorted(CTL.glob(f"{ns}.{job}.failed-by-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    return taken[0].name.split(".failed-by-", 1)[1] if taken else ""
