"""Ownership and opt-in: one rule, the same answer on the detector path and on the policy path.

The cluster model is the product's (`ClusterCache.offline` over raw API objects). The detector path is
the real pod-status detector following that cache and publishing on a real bus; the policy path is
`planning.plan` over the same cache.
"""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from harness import objects as o

from kcover import bus as bus_
from kcover import metrics, model, settings
from kcover.detectors import contract, pod_status
from kcover.kube import caching, indexing, ownership
from kcover.kube import projections as proj
from kcover.recovery import planinputs, planning
from kcover.recovery import steps as actions

KF = "kubeflow.org/v1"
def _now() -> dt.datetime:
    """The wall clock when a test runs: the detector judges a termination's age on the system clock, and a
    time taken at import would be past `max_age_seconds` by the time a long suite reaches the test."""
    return dt.datetime.now(dt.UTC)


@pytest.mark.parametrize(("value", "opted"), [
    ("true", True), ("True", True), ("TRUE", True), ("tRuE", True),
    ("", False), ("false", False), ("yes", False), ("1", False), ("true ", False),
])
def test_opt_in_value(value: str, opted: bool) -> None:
    assert ownership.opt_in_value(value) is opted


def _failed_pod(owner: o.Obj, labels: dict[str, str], now: dt.datetime) -> o.Obj:
    raw = o.pod("train-worker-0", uid="p0", node="n1", owner=owner,
                labels={"training.kubeflow.org/job-name": "train", **labels})
    raw["status"]["containerStatuses"] = [{"name": "c", "restartCount": 0, "state": {"terminated": {
        "reason": "Error", "exitCode": 1, "finishedAt": now.strftime("%Y-%m-%dT%H:%M:%SZ")}}}]
    return raw


async def _detector_reports(cache: caching.ClusterCache) -> list[model.CollectorEvent]:
    """Run the pod-status detector (opt-in only, its default) over `cache`; what it publishes."""
    bus = bus_.Bus(dedupe_window_seconds=0)
    sub = bus.subscribe("test")
    context = contract.DetectorContext(role=contract.Role.CONTROLLER, metrics=metrics.Metrics(), cluster=cache)
    detector = pod_status.PodStatusDetector("pod-status", pod_status.PodStatusConfig(), context)
    stop = asyncio.Event()
    task = asyncio.create_task(detector.run(bus, stop), name="pod-status")
    await asyncio.sleep(0)  # synced already: the follow loop subscribes and replays the cache at once
    await asyncio.sleep(0)
    stop.set()
    await task
    return sub.get_nowait()


async def _detector_and_policy_agree(cache: caching.ClusterCache, opted: bool, now: dt.datetime) -> None:
    """The pod-status detector reports train-worker-0's failure, and the plan restarts its PyTorchJob, exactly
    when `opted`; otherwise the plan refuses `NotOptedIn`."""
    reported = await _detector_reports(cache)
    assert len(reported) == (1 if opted else 0)
    fault = model.CollectorEvent(detector="pod-status", severity=model.Severity.ERROR, reason="ContainerError",
                                 target=model.Target(kind=model.TargetKind.POD, namespace="ml", name="train-worker-0",
                                                     uid="p0"), observed_at=now)
    [planned] = planning.plan(fault, cache, planinputs.History(), settings.RecoverySettings(), now)
    if opted:
        assert isinstance(planned, actions.Restart)
        assert planned.workload.uid == "pt-uid"
    else:
        assert isinstance(planned, actions.Refuse)
        assert planned.code is actions.Code.NOT_OPTED_IN


@pytest.mark.parametrize("where", ["pod", "workload"])
@pytest.mark.parametrize(("value", "opted"), [("true", True), ("True", True), ("TRUE", True),
                                              ("yes", False), ("", False)])
async def test_opt_in_values_behave_the_same_in_the_detector_and_the_policy(where: str, value: str,
                                                                          opted: bool) -> None:
    label = {proj.OPT_IN_LABEL: value}
    now = _now()
    job = o.workload(KF, "PyTorchJob", "train", uid="pt-uid", labels=label if where == "workload" else {})
    cache = caching.ClusterCache.offline([job, _failed_pod(job, label if where == "pod" else {}, now), o.node("n1")])

    await _detector_and_policy_agree(cache, opted, now)


def _namespace(labels: dict[str, str]) -> o.Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml", "uid": "ns-uid", "labels": labels}}


@pytest.mark.parametrize(("ns_value", "own", "opted"), [
    ("true", {}, True),                                   # the Namespace opts in every workload in it
    ("TRUE", {}, True),
    ("true", {"pod": "false"}, False),                    # ... but a pod that says false stays out
    ("true", {"workload": "False"}, False),               # ... and so does a workload that says so
    ("true", {"pod": "no"}, True),                        # only false opts out
    ("yes", {}, False),
    ("", {}, False),
    ("false", {"workload": "true"}, True),                # the workload's own word stands
    (None, {}, False),                                    # no Namespace object cached
])
async def test_a_namespace_label_opts_in_every_workload_in_it_in_the_detector_and_the_policy(
        ns_value: str | None, own: dict[str, str], opted: bool) -> None:
    now = _now()
    job = o.workload(KF, "PyTorchJob", "train", uid="pt-uid",
                     labels={proj.OPT_IN_LABEL: own["workload"]} if "workload" in own else {})
    pod = _failed_pod(job, {proj.OPT_IN_LABEL: own["pod"]} if "pod" in own else {}, now)
    objects = [job, pod, o.node("n1")]
    if ns_value is not None:
        objects.append(_namespace({proj.OPT_IN_LABEL: ns_value} if ns_value else {}))
    cache = caching.ClusterCache.offline(objects)

    await _detector_and_policy_agree(cache, opted, now)


def test_another_namespaces_label_opts_nothing_in() -> None:
    """`opted_in` is given the pod's own Namespace; handed another one, it does not count."""
    job = o.workload(KF, "PyTorchJob", "train", uid="pt-uid")
    cache = caching.ClusterCache.offline([job, _failed_pod(job, {}, _now())])
    pod = cache.pod_by_name("ml", "train-worker-0")
    assert pod is not None
    other = proj.Namespace(uid="u", rv="1", name="team-b", labels=((proj.OPT_IN_LABEL, "true"),), annotations=())
    assert ownership.opted_in(pod, cache.resolve(pod), namespace=other) is False
    assert ownership.opted_in(pod, cache.resolve(pod), namespace=other._replace(name="ml")) is True


def test_pods_of_workload_means_every_pod_under_it() -> None:
    """TrainJob -> JobSet -> Job -> Pod, JobSet -> Job -> Pod, LWS -> (uncached) StatefulSet -> Pod."""
    tj = o.workload("trainer.kubeflow.org/v1alpha1", "TrainJob", "tj", uid="tj-uid")
    js = o.workload("jobset.x-k8s.io/v1alpha2", "JobSet", "tj", uid="js-uid", owner=tj)
    jobs = [o.workload("batch/v1", "Job", f"tj-worker-{i}", uid=f"job-{i}", owner=js) for i in range(2)]
    js_pods = [o.pod(f"tj-worker-{i}-{p}", owner=jobs[i], labels={"jobset.sigs.k8s.io/jobset-name": "tj"})
               for i in range(2) for p in range(2)]
    lws = o.workload("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "serve", uid="lws-uid")
    sts = o.owner("apps/v1", "StatefulSet", "serve", "sts-uid")
    lws_pods = [o.pod(f"serve-{i}", owner=sts, labels={"leaderworkerset.sigs.k8s.io/name": "serve"}) for i in range(2)]
    # same LWS name, another owner kind: not a member
    impostor = o.pod("serve-x", owner=o.owner("apps/v1", "ReplicaSet", "serve", "rs-uid"),
                     labels={"leaderworkerset.sigs.k8s.io/name": "serve"})
    cache = caching.ClusterCache.offline([tj, js, *jobs, *js_pods, lws, *lws_pods, impostor])

    everyone = sorted(p["metadata"]["name"] for p in js_pods)
    assert [p.name for p in cache.pods_of_workload("tj-uid")] == everyone
    assert [p.name for p in cache.pods_of_workload("js-uid")] == everyone
    assert [p.name for p in cache.pods_of_workload("job-1")] == ["tj-worker-1-0", "tj-worker-1-1"]
    assert [p.name for p in cache.pods_of_workload("lws-uid")] == ["serve-0", "serve-1"]
    pod = cache.pod_by_name("ml", "tj-worker-1-0")
    assert pod is not None
    assert [w.kind for w in cache.owner_chain(pod)] == ["Job", "JobSet", "TrainJob"]


def test_load_delivers_only_differences_like_a_relist() -> None:
    cache = caching.ClusterCache.offline([o.node("a"), o.node("b")])
    seen: list[tuple[indexing.Kind, str | None, str | None]] = []
    cache.subscribe(lambda kind, old, new: seen.append((kind, old and old.name, new and new.name)), replay=False)
    cache.load([o.node("a"), o.node("b", rv="2", unschedulable=True), o.node("c")])
    assert seen == [(indexing.Kind.NODE, "b", "b"), (indexing.Kind.NODE, None, "c")]
    assert cache.synced
    with pytest.raises(ValueError, match="Secret"):
        cache.load([{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}}])
