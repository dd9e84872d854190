"""Table tests of `planning.plan`: which fault leads to which steps, and every refusal and hold.

The cluster is the product's own model (`ClusterCache.offline` of raw objects) and so is the ledger
(`Ledger.offline`); the plan is pure, so each row is one call.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
from harness import objects as o

from kcover import errors, kinds, model, settings
from kcover.kube import caching
from kcover.kube import projections as proj
from kcover.recovery import holding, ledger, ledgerentries, planinputs, planning, rules
from kcover.recovery import steps as st

NOW = dt.datetime(2025, 6, 1, 12, 0, 0, tzinfo=dt.UTC)
T = NOW.timestamp()
OPT = {proj.OPT_IN_LABEL: "true"}
KF = "kubeflow.org/v1"
KF_PT = {kinds.KUBEFLOW_JOB_NAME: "train", kinds.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}


def world(*extra: o.Obj) -> caching.ClusterCache:
    """ml/train as a PyTorchJob (opted in) and as a TFJob (not), a JobSet under a TrainJob, an LWS with
    two groups (its StatefulSet is not cached, as in the product), a batch Job, a Volcano job, a bare
    pod, a ReplicaSet pod; eleven GPU nodes. Built as the product builds it: raw objects into a cache."""
    pt = o.workload(KF, "PyTorchJob", "train", uid="pt-uid", labels=OPT)
    tf = o.workload(KF, "TFJob", "train", uid="tf-uid")
    never = o.workload(KF, "PyTorchJob", "never", uid="never-uid", labels=OPT,
                       spec={"pytorchReplicaSpecs": {"Worker": {"restartPolicy": "Never"}}})
    tj = o.workload("trainer.kubeflow.org/v1alpha1", "TrainJob", "tj", uid="tj-uid", labels=OPT)
    js = o.workload("jobset.x-k8s.io/v1alpha2", "JobSet", "tj", uid="js-uid", owner=tj)
    jsjob = o.workload("batch/v1", "Job", "tj-node-0", uid="jsjob-uid", owner=js)
    lws = o.workload("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "serve", uid="lws-uid", labels=OPT)
    job = o.workload("batch/v1", "Job", "bj", uid="bj-uid", labels=OPT)
    vc = o.workload("batch.volcano.sh/v1alpha1", "Job", "vc", uid="vc-uid", labels=OPT)
    sys_pt = o.workload(KF, "PyTorchJob", "train", uid="sys-pt", namespace="kube-system", labels=OPT)
    sts0 = o.owner("apps/v1", "StatefulSet", "serve", "sts0-uid")
    pods = [
        o.pod("train-master-0", uid="pt-0", node="n1", labels=KF_PT, owner=pt),
        o.pod("train-worker-0", uid="pt-1", node="n2", labels=KF_PT, owner=pt),
        o.pod("train-chief-0", uid="tf-0", node="n1",
              labels={kinds.KUBEFLOW_JOB_NAME: "train", kinds.KUBEFLOW_OPERATOR_NAME: "tfjob-controller"}, owner=tf),
        o.pod("never-worker-0", uid="never-0", node="n3", labels={kinds.KUBEFLOW_JOB_NAME: "never"}, owner=never),
        o.pod("tj-node-0-0", uid="js-0", node="n3", labels={kinds.JOBSET_NAME: "tj", kinds.JOBSET_UID: "js-uid"},
              owner=jsjob),
        o.pod("serve-0", uid="lws-0", node="n4", labels={kinds.LWS_NAME: "serve", kinds.LWS_GROUP_INDEX: "0"},
              owner=sts0),
        o.pod("serve-1", uid="lws-1", node="n4", labels={kinds.LWS_NAME: "serve", kinds.LWS_GROUP_INDEX: "1"},
              owner=sts0),
        o.pod("bj-abc", uid="bj-0", node="n5",
              labels={kinds.BATCH_JOB_NAME: "bj", kinds.BATCH_CONTROLLER_UID: "bj-uid"}, owner=job),
        o.pod("vc-worker-0", uid="vc-0", node="n5", labels={kinds.VOLCANO_JOB_NAME: "vc"}, owner=vc),
        o.pod("bare", uid="bare", node="n6", labels=OPT),
        o.pod("web-abc", uid="rs-0", node="n6", labels=OPT, owner=o.owner("apps/v1", "ReplicaSet", "web-1", "rs-uid")),
        o.pod("train-master-0", uid="sys-0", namespace="kube-system", node="n6",
              labels={kinds.KUBEFLOW_JOB_NAME: "train", **OPT}, owner=sys_pt),
    ]
    nodes = [o.node(f"n{i}", uid=f"node-{i}") for i in range(1, 12)]
    return caching.ClusterCache.offline([pt, tf, never, tj, js, jsjob, lws, job, vc, sys_pt, *pods, *nodes, *extra])


def pod_event(uid: str, *, detector: str = "pod-status", severity: model.Severity = model.Severity.ERROR,
              reason: str = "ContainerError", recommended: model.Action | None = None,
              signal: str = "") -> model.CollectorEvent:
    return model.CollectorEvent(detector=detector, severity=severity, reason=reason, message="exit 1",
                                target=model.Target(kind=model.TargetKind.POD, namespace="ml", name=uid, uid=uid),
                                observed_at=NOW, recommended=recommended, signal=signal)


def node_event(node: str, *, detector: str = "node-condition", severity: model.Severity = model.Severity.ERROR,
               reason: str = "XID79", recommended: model.Action | None = None,
               cleared: bool = False) -> model.CollectorEvent:
    return model.CollectorEvent(detector=detector, severity=severity, reason=reason, message="fell off the bus",
                                target=model.Target(kind=model.TargetKind.NODE, name=node, node=node),
                                observed_at=NOW, recommended=recommended, cleared=cleared)


def summary(planned: list[st.Step]) -> list[str]:
    out = []
    for s in planned:
        if isinstance(s, st.Restart):
            members = ",".join(m.uid for m in s.members)
            out.append(f"restart {s.workload.kind} {s.workload.name} [{s.selector.render()}] {s.unit_key} "
                       f"{s.removal.value} {members}")
        elif isinstance(s, st.Hold):
            out.append(f"hold {s.code.value} {s.restart.unit_key}")
        elif isinstance(s, st.Cordon):
            out.append(f"cordon {s.node}")
        elif isinstance(s, st.Uncordon):
            out.append(f"uncordon {s.node}")
        elif isinstance(s, st.RequestValidation):
            out.append(f"validate {s.node}")
        elif isinstance(s, st.Refuse):
            out.append(f"skip {s.code.value}" + ("" if s.audit else " quiet"))
        elif isinstance(s, st.TaintDevice):
            out.append(f"taint {s.device.resource_id}")
        elif isinstance(s, st.UntaintDevice):
            out.append(f"untaint {s.device.resource_id}")
        else:
            out.append(type(s).__name__.lower())
    return out


def rs(**kw: Any) -> settings.RecoverySettings:
    return settings.RecoverySettings(**kw)


def restarted(key: str, *times: float) -> planinputs.History:
    return planinputs.History(ledger=ledger.Ledger.offline({key: ledgerentries.Unit(restarts=list(times))}))


KF_SEL = "training.kubeflow.org/job-name=train,training.kubeflow.org/operator-name=pytorchjob-controller"
PT = f"restart PyTorchJob train [{KF_SEL}] w.pt-uid delete pt-0,pt-1"
BJ = "restart Job bj [batch.kubernetes.io/job-name=bj,batch.kubernetes.io/controller-uid=bj-uid] w.bj-uid evict bj-0"
TJ = ("restart TrainJob tj [jobset.sigs.k8s.io/jobset-name=tj,jobset.sigs.k8s.io/jobset-uid=js-uid] w.tj-uid "
      "evict js-0")
H0 = planinputs.History()

ROWS: list[tuple[str, model.CollectorEvent, planinputs.History, dict[str, Any], list[str]]] = [
    ("kubeflow pod error restarts its job, selector narrowed by operator, pods deleted", pod_event("pt-0"), H0, {},
     [PT]),
    ("dra-health error restarts too", pod_event("pt-1", detector="dra-health", reason="DeviceUnhealthy"), H0, {}, [PT]),
    ("event-watcher on a pod restarts", pod_event("pt-1", detector="event-watcher"), H0, {}, [PT]),
    ("same-named TFJob not opted in", pod_event("tf-0"), H0, {}, ["skip NotOptedIn quiet"]),
    ("warning is ignored", pod_event("pt-0", severity=model.Severity.WARNING), H0, {}, []),
    ("unknown detector error is reported", pod_event("pt-0", detector="logscan"), H0, {}, ["report"]),
    ("rule can ignore by reason glob", pod_event("pt-0", reason="OOMKilled"), H0,
     {"rules": [{"detector": "pod-status", "reason": "OOM*", "action": "ignore"}]}, []),
    ("rule can report", pod_event("pt-0"), H0, {"rules": [{"detector": "pod-*", "action": "report"}]}, ["report"]),
    ("rule by severity does not match errors", pod_event("pt-0"), H0,
     {"rules": [{"severity": "Warning", "action": "ignore"}]}, [PT]),
    ("restartPolicy Never forbids", pod_event("never-0"), H0, {}, ["skip RestartPolicyForbids"]),
    ("namespace denied", pod_event("sys-0"), H0, {}, ["skip NamespaceDenied quiet"]),
    ("namespace not in allow list", pod_event("pt-0"), H0, {"namespaces_allow": ["other"]},
     ["skip NamespaceDenied quiet"]),
    ("bare pod is never deleted", pod_event("bare"), H0, {}, ["skip NoController"]),
    ("replicaset pod unsupported", pod_event("rs-0"), H0, {}, ["skip UnsupportedOwner"]),
    ("unknown pod", pod_event("ghost"), H0, {}, ["skip TargetUnknown quiet"]),
    ("trainjob restarts through its jobset with the uid label, evicted", pod_event("js-0"), H0, {}, [TJ]),
    ("lws restarts the faulting group only", pod_event("lws-1"), H0, {},
     ["restart LeaderWorkerSet serve [leaderworkerset.sigs.k8s.io/name=serve,leaderworkerset.sigs.k8s.io/group-index=1]"
      " w.lws-uid.g1 delete lws-1"]),
    ("batch job by controller uid, evicted", pod_event("bj-0"), H0, {}, [BJ]),
    ("volcano job by name", pod_event("vc-0"), H0, {}, ["restart Job vc [volcano.sh/job-name=vc] w.vc-uid delete vc-0"]),
    ("cooldown holds the restart until it ends", pod_event("pt-0"), restarted("w.pt-uid", T - 10), {},
     ["hold Cooldown w.pt-uid"]),
    ("cooldown over", pod_event("pt-0"), restarted("w.pt-uid", T - 61), {}, [PT]),
    ("a crash loop's budget frees too late: refused, left to a person", pod_event("pt-0"),
     restarted("w.pt-uid", *(T - 600 + i * 100 for i in range(5))), {}, ["skip BudgetExhausted"]),
    ("a budget that frees within hold_seconds holds the restart", pod_event("pt-0"),
     restarted("w.pt-uid", *(T - 3000 + i * 100 for i in range(5))), {}, ["hold BudgetExhausted w.pt-uid"]),
    ("budget counts only the window", pod_event("pt-0"),
     restarted("w.pt-uid", T - 7200, T - 7100, T - 7000, T - 6900, T - 100), {}, [PT]),
    ("restarts in flight throttle: held, no trip", pod_event("pt-0"),
     planinputs.History(restarts_in_flight={f"w.other-{i}": 1 for i in range(10)}), {}, ["hold Throttled w.pt-uid"]),
    ("a restart of the unit in flight covers the fault", pod_event("pt-0"),
     planinputs.History(restarts_in_flight={"w.pt-uid": 1}), {}, ["skip Cooldown quiet"]),
    ("lws group cooldown is per group", pod_event("lws-0"), restarted("w.lws-uid.g1", T - 5), {},
     ["restart LeaderWorkerSet serve [leaderworkerset.sigs.k8s.io/name=serve,leaderworkerset.sigs.k8s.io/group-index=0]"
      " w.lws-uid.g0 delete lws-0"]),
    ("a signal already acted on is a replay", pod_event("pt-0", signal="ev-1/3"),
     planinputs.History(ledger=ledger.Ledger.offline(signals={"ev-1/3|w.pt-uid": T - 30})), {},
     ["skip AlreadyActedOn quiet"]),
    ("node condition cordons and restarts opted-in workloads on it", node_event("n1"), H0, {}, ["cordon n1", PT]),
    ("node sweep passes over refusals silently", node_event("n6"), H0, {}, ["cordon n6"]),
    ("a cordon of the node in flight from an earlier plan holds the restarts until it lands", node_event("n1"),
     planinputs.History(cordons_in_flight=frozenset({"n1"})), {}, ["skip AlreadyCordoned quiet",
                                                                   "hold AwaitingCordon w.pt-uid"]),
    ("a pod fault's restart waits while an earlier plan cordons another node where its job has a pod",
     pod_event("pt-0"), planinputs.History(cordons_in_flight=frozenset({"n2"})), {}, ["hold AwaitingCordon w.pt-uid"]),
    ("a cordon in flight of a node where the job has no pod holds nothing", pod_event("pt-0"),
     planinputs.History(cordons_in_flight=frozenset({"n7"})), {}, [PT]),
    ("a cordon the API server took, not yet in the cache, holds nothing: no pod is scheduled there",
     pod_event("pt-0"), planinputs.History(cordons_in_flight=frozenset({"n2"}), cordons_written=frozenset({"n2"})),
     {}, [PT]),
    ("recommended cordon-node narrows to cordon only", node_event("n1", recommended=model.Action.CORDON_NODE), H0, {},
     ["cordon n1"]),
    ("recommended restart-workload on a node", node_event("n1", recommended=model.Action.RESTART_WORKLOAD), H0, {},
     [PT]),
    ("recommendation above the rule is not honoured", pod_event("pt-0", recommended=model.Action.CORDON_NODE), H0,
     {}, [PT]),
    ("no recommendation: the rule decides", node_event("n3"), H0, {}, ["cordon n3", "skip RestartPolicyForbids", TJ]),
    ("event-watcher node event cordons", node_event("n2", detector="event-watcher"), H0, {}, ["cordon n2", PT]),
    ("rule can make a node fault cordon only", node_event("n2"), H0,
     {"rules": [{"detector": "node-condition", "action": "cordon-node"}]}, ["cordon n2"]),
    ("node cooldown", node_event("n2"),
     planinputs.History(ledger=ledger.Ledger.offline({"n.n2": ledgerentries.Node(cordoned_at=T - 60)})), {},
     ["skip NodeCooldown", PT]),
    ("unknown node", node_event("n99"), H0, {}, ["skip TargetUnknown quiet"]),
    ("a container's exit blames the workload: a cordon rule only reports", pod_event("vc-0"), H0,
     {"rules": [{"detector": "pod-status", "reason": "ContainerError", "action": "cordon-node"}]}, ["report"]),
    ("with workload_blame off a cordon rule for a pod's fault uses the pod's node", pod_event("vc-0"), H0,
     {"rules": [{"detector": "pod-status", "reason": "ContainerError", "action": "cordon-node"}],
      "judgement": {"workload_blame": "off"}}, ["cordon n5"]),
    ("pod target restart on node with no workloads", node_event("n7", recommended=model.Action.RESTART_WORKLOAD), H0,
     {}, ["skip NoWorkloads quiet"]),
]


@pytest.mark.parametrize(("event", "history", "overrides", "expected"), [r[1:] for r in ROWS],
                         ids=[r[0] for r in ROWS])
def test_plan(event: model.CollectorEvent, history: planinputs.History, overrides: dict[str, Any],
              expected: list[str]) -> None:
    assert summary(planning.plan(event, world(), history, rs(**overrides), NOW)) == expected


def test_terminal_and_terminating_pods_are_never_taken_away() -> None:
    """A Job's pod that already failed is its controller's: evicting it would mark it DisruptionTarget and
    hide the failure from backoffLimit. A terminating pod is going anyway."""
    job = o.workload("batch/v1", "Job", "bj", uid="bj-uid", labels=OPT)
    labels = {kinds.BATCH_JOB_NAME: "bj", kinds.BATCH_CONTROLLER_UID: "bj-uid"}
    snap = world(o.pod("bj-failed", uid="bj-f", node="n5", labels=labels, owner=job, phase="Failed"),
                 o.pod("bj-going", uid="bj-g", node="n5", labels=labels, owner=job, deleting=True),
                 o.pod("bj-done", uid="bj-d", node="n5", labels=labels, owner=job, phase="Succeeded"))
    (restart,) = planning.plan(pod_event("bj-f"), snap, H0, rs(), NOW)
    assert isinstance(restart, st.Restart)
    assert [m.uid for m in restart.members] == ["bj-0"]


def test_a_unit_whose_pods_are_all_terminal_is_left_to_its_controller() -> None:
    job = o.workload("batch/v1", "Job", "solo", uid="solo-uid", labels=OPT)
    snap = caching.ClusterCache.offline([job, o.node("n1"), o.pod(
        "solo-x", uid="solo-0", node="n1", owner=job, phase="Failed",
        labels={kinds.BATCH_JOB_NAME: "solo", kinds.BATCH_CONTROLLER_UID: "solo-uid"})])
    assert summary(planning.plan(pod_event("solo-0"), snap, H0, rs(), NOW)) == ["skip NothingToRemove quiet"]


def test_a_pod_created_before_the_last_restart_was_removed_by_it() -> None:
    """Its late fault does not restart the unit again (creationTimestamp has whole seconds)."""
    pt = o.workload(KF, "PyTorchJob", "train", uid="pt-uid", labels=OPT)
    old = o.pod("train-master-0", uid="pt-old", node="n1", labels=KF_PT, owner=pt)
    old["metadata"]["creationTimestamp"] = "2025-06-01T11:00:00Z"
    new = o.pod("train-worker-9", uid="pt-new", node="n1", labels=KF_PT, owner=pt)
    new["metadata"]["creationTimestamp"] = "2025-06-01T11:59:40Z"
    snap = caching.ClusterCache.offline([pt, old, new, o.node("n1")])
    history = restarted("w.pt-uid", T - 30)
    assert summary(planning.plan(pod_event("pt-old"), snap, history, rs(), NOW)) == ["skip AlreadyRestarted quiet"]
    assert summary(planning.plan(pod_event("pt-new"), snap, history, rs(), NOW)) == ["hold Cooldown w.pt-uid"]


def snapshot_with(*, cordoned: int, gpu_nodes: int = 10) -> caching.ClusterCache:
    nodes = [o.node(f"g{i}", annotations={proj.CORDONED_BY: "kcover"} if i < cordoned else {},
                    unschedulable=i < cordoned) for i in range(gpu_nodes)]
    return caching.ClusterCache.offline(nodes)


@pytest.mark.parametrize(("cordoned", "gpu_nodes", "fraction", "expected"), [
    (0, 10, 0.1, ["cordon g9"]),
    (1, 10, 0.1, ["skip BreakerOpen"]),
    (1, 10, 0.2, ["cordon g9"]),
    (2, 10, 0.2, ["skip BreakerOpen"]),
    (0, 0, 0.1, ["skip TargetUnknown quiet"]),
])
def test_cordon_breaker(cordoned: int, gpu_nodes: int, fraction: float, expected: list[str]) -> None:
    snap = snapshot_with(cordoned=cordoned, gpu_nodes=gpu_nodes)
    planned = planning.plan(node_event("g9", recommended=model.Action.CORDON_NODE), snap, H0,
                            rs(max_cordoned_fraction=fraction), NOW)
    assert summary(planned) == expected


def test_a_node_with_kcovers_marks_alone_does_not_count_as_cordoned_against_the_breaker() -> None:
    """A person un-cordoned g0 and took kcover's taint off, the annotation left: that node is back in service,
    so the breaker's held count must not count it (it held the next cordon back before: 1 of 10 at 0.1)."""
    nodes = [o.node(f"g{i}") for i in range(10)]
    nodes[0]["metadata"]["annotations"] = {proj.CORDONED_BY: "kcover"}
    snap = caching.ClusterCache.offline(nodes)
    planned = planning.plan(node_event("g9", recommended=model.Action.CORDON_NODE), snap, H0,
                            rs(max_cordoned_fraction=0.1), NOW)
    assert summary(planned) == ["cordon g9"]
    nodes[0]["spec"] = {"taints": [{"key": rs().taint_key, "value": "xid-79", "effect": "NoSchedule"}]}
    tainted = caching.ClusterCache.offline(nodes)  # kubectl uncordon alone: kcover's taint still excludes it
    assert summary(planning.plan(node_event("g9", recommended=model.Action.CORDON_NODE), tainted, H0,
                                 rs(max_cordoned_fraction=0.1), NOW)) == ["skip BreakerOpen"]


def test_cordons_in_flight_count_against_the_breaker() -> None:
    """A cordon planned and not yet in the cache holds its place: the next one is refused."""
    snap = snapshot_with(cordoned=0)
    history = planinputs.History(cordons_in_flight=frozenset({"g1"}))
    planned = planning.plan(node_event("g9", recommended=model.Action.CORDON_NODE), snap, history,
                            rs(max_cordoned_fraction=0.1), NOW)
    assert summary(planned) == ["skip BreakerOpen"]
    assert isinstance(planned[0], st.Refuse)
    assert "1 cordons in flight" in planned[0].text


def test_a_latched_breaker_holds_restarts_and_refuses_cordons() -> None:
    latched = planinputs.History(ledger=ledger.Ledger.offline({ledgerentries.BREAKER_KEY: ledgerentries.Breaker(
        opened_at=T - 100, reason="too many cordons")}))
    assert summary(planning.plan(pod_event("pt-0"), world(), latched, rs(), NOW)) == ["hold BreakerLatched w.pt-uid"]
    assert summary(planning.plan(node_event("n1", recommended=model.Action.CORDON_NODE), world(), latched, rs(),
                                 NOW)) == ["skip BreakerLatched"]
    reset = planinputs.History(ledger=ledger.Ledger.offline({ledgerentries.BREAKER_KEY: ledgerentries.Breaker(closed_at=T - 10)}))
    assert summary(planning.plan(pod_event("pt-0"), world(), reset, rs(), NOW)) == ["hold BreakerCooldown w.pt-uid"]


def test_breaker_text_says_why() -> None:
    planned = planning.plan(node_event("g9"), snapshot_with(cordoned=1), H0, rs(), NOW)
    assert isinstance(planned[0], st.Refuse)
    assert "1 of 10 GPU nodes" in planned[0].text


def test_budget_text_says_why() -> None:
    history = restarted("w.pt-uid", *(T - 600 + i * 100 for i in range(5)))
    (skip,) = planning.plan(pod_event("pt-0"), world(), history, rs(), NOW)
    assert isinstance(skip, st.Refuse)
    assert "5 times in the last 3600s (max 5)" in skip.text
    assert skip.about is not None
    assert skip.about.uid == "pt-uid"


@pytest.mark.parametrize(("annotations", "enabled", "validation", "expected"), [
    ({proj.CORDONED_BY: "kcover"}, True, False, ["uncordon g0"]),
    ({proj.CORDONED_BY: "kcover"}, False, False, []),
    ({}, True, False, []),
    ({proj.CORDONED_BY: "kcover"}, True, True, ["validate g0"]),
    ({proj.CORDONED_BY: "kcover", "kcover.io/paused": "true"}, True, False, ["skip Paused"]),
])
def test_return_to_service(annotations: dict[str, str], enabled: bool, validation: bool,
                           expected: list[str]) -> None:
    snap = caching.ClusterCache.offline([o.node("g0", annotations=annotations, unschedulable=True)])
    event = node_event("g0", severity=model.Severity.INFO, cleared=True)
    planned = planning.plan(event, snap, H0, rs(uncordon_enabled=enabled,
                                                return_validation={"enabled": validation}), NOW)
    assert summary(planned) == expected


def test_already_cordoned_nodes_are_left_alone() -> None:
    snap = caching.ClusterCache.offline([
        o.node("a", unschedulable=True, annotations={proj.CORDONED_BY: "kcover"}),
        o.node("b", unschedulable=True), *[o.node(f"x{i}") for i in range(20)]])
    assert summary(planning.plan(node_event("a"), snap, H0, rs(), NOW)) == ["skip AlreadyCordoned quiet"]
    assert summary(planning.plan(node_event("b"), snap, H0, rs(), NOW)) == ["skip CordonedByOthers quiet"]


@pytest.mark.parametrize(("where", "name"), [
    ("pytorchjobs", "train"), ("pods", "train-master-0"), ("nodes", "n1"), ("namespaces", "ml"), ("controls", "")])
def test_a_pause_at_any_scope_holds_the_restart(where: str, name: str) -> None:
    paused = {"kcover.io/paused": "True"}
    pt = o.workload(KF, "PyTorchJob", "train", uid="pt-uid", labels=OPT)
    objs: list[o.Obj] = [o.pod("train-master-0", uid="pt-0", node="n1", labels=KF_PT, owner=pt), o.node("n1")]
    if where == "pytorchjobs":
        pt["metadata"]["annotations"] = paused
    elif where == "pods":
        objs[0]["metadata"]["annotations"] = paused
    elif where == "nodes":
        objs[1] = o.node("n1", annotations=paused)
    elif where == "namespaces":
        objs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml", "labels": paused}})
    else:
        objs.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "kcover-controls", "namespace": "kcover-system", "annotations": paused}})
    snap = caching.ClusterCache.offline([pt, *objs])
    (held,) = planning.plan(pod_event("pt-0"), snap, H0, rs(), NOW)
    assert isinstance(held, st.Hold)
    assert held.code is st.Code.PAUSED
    assert held.until == T + rs().hold_seconds


def test_workload_target_restarts_through_its_pods() -> None:
    event = model.CollectorEvent(detector="event-watcher", severity=model.Severity.ERROR, reason="Hang",
                                 target=model.Target(kind=model.TargetKind.WORKLOAD, namespace="ml", name="bj",
                                                     uid="bj-uid", workload_kind="Job"), observed_at=NOW)
    assert summary(planning.plan(event, world(), H0, rs(), NOW)) == [BJ]


def test_a_report_about_a_workload_is_recorded_on_that_workload() -> None:
    """`report` on a Workload target (the preflight plugin's PreflightIncomplete) leaves its Event on the
    workload the cache knows by that uid; an unknown uid has nothing to write it on."""
    def about(uid: str) -> object:
        event = model.CollectorEvent(detector="preflight", severity=model.Severity.ERROR, reason="PreflightIncomplete",
                                     target=model.Target(kind=model.TargetKind.WORKLOAD, namespace="ml", name="train",
                                                         uid=uid, workload_kind="PyTorchJob"),
                                     recommended=model.Action.REPORT, observed_at=NOW)
        (planned,) = planning.plan(event, world(), H0, rs(), NOW)
        assert isinstance(planned, st.Report)
        return planned.about

    found = about("pt-uid")
    assert (getattr(found, "kind", ""), getattr(found, "name", ""), getattr(found, "uid", "")) == (
        "PyTorchJob", "train", "pt-uid")
    assert about("gone-uid") is None


def test_one_restart_per_unit_per_event() -> None:
    pt = o.workload(KF, "PyTorchJob", "train", uid="pt-uid", labels=OPT)
    snap = world(o.pod("train-worker-1", uid="pt-2", node="n1", labels=KF_PT, owner=pt))
    planned = planning.plan(node_event("n1"), snap, H0, rs(), NOW)
    assert summary(planned) == ["cordon n1", f"restart PyTorchJob train [{KF_SEL}] w.pt-uid delete pt-0,pt-1,pt-2"]


def test_concurrency_limit_counts_restarts_planned_in_the_same_event() -> None:
    history = planinputs.History(restarts_in_flight={f"w.other-{i}": 1 for i in range(9)})
    planned = planning.plan(node_event("n5"), world(), history, rs(), NOW)
    assert summary(planned) == ["cordon n5", BJ, "hold Throttled w.vc-uid"]


@pytest.mark.parametrize("raw", [
    [{"action": "explode"}],
    [{"detector": "x"}],
    [{"action": "ignore", "severity": "Fatal"}],
    [{"action": "ignore", "colour": "red"}],
])
def test_invalid_rules(raw: list[dict[str, Any]]) -> None:
    with pytest.raises(errors.ConfigError):
        rules.parse_rules(raw)


# ------------------------------------------------------------------------------------------ held restarts

def _held(cause: model.CollectorEvent, *, at: float = T - 60, until: float = T + 600) -> ledgerentries.HeldRestart:
    return ledgerentries.HeldRestart(code="Paused", text="paused", at=at, until=until, cause=cause.model_dump_json())


def test_a_held_restart_runs_once_its_blocker_lifted() -> None:
    steps, dropped = holding.replan_held("w.pt-uid", _held(pod_event("pt-0")), world(), H0, rs(), NOW)
    assert (summary(steps), dropped) == ([PT], "")


def test_a_held_restart_stays_held_while_paused() -> None:
    snap = world({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml",
                                                                         "labels": {"kcover.io/paused": "true"}}})
    steps, dropped = holding.replan_held("w.pt-uid", _held(pod_event("pt-0"), until=T + 60), snap, H0, rs(), NOW)
    assert (summary(steps), dropped) == (["hold Paused w.pt-uid"], "")
    assert isinstance(steps[0], st.Hold)
    assert steps[0].until == T + 60  # never longer than the first hold said


def test_a_restart_held_for_an_earlier_cordon_runs_once_the_node_is_cordoned_or_cordons_it_itself() -> None:
    """Held `AwaitingCordon` (another plan's cordon of its node in flight): planned again, it waits while that
    cordon is still in flight, runs once the node shows kcover's cordon, and cordons the node itself first
    when that cordon did not land (no longer in flight, the node schedulable)."""
    held = dataclasses.replace(_held(node_event("n1")), code="AwaitingCordon", text="n1 being cordoned")
    in_flight = planinputs.History(cordons_in_flight=frozenset({"n1"}))
    steps, dropped = holding.replan_held("w.pt-uid", held, world(), in_flight, rs(), NOW)
    assert (summary(steps), dropped) == (["hold AwaitingCordon w.pt-uid"], "")
    cordoned = o.node("n1", uid="node-1", unschedulable=True, annotations={proj.CORDONED_BY: "kcover"})
    snap = world(cordoned)  # n1 again, later in the list: the cache keeps it, as a watch's MODIFIED
    node = snap.node("n1")
    assert node is not None
    assert node.cordoned_by_kcover
    steps, dropped = holding.replan_held("w.pt-uid", held, snap, H0, rs(), NOW)
    assert (summary(steps), dropped) == ([PT], "")
    steps, dropped = holding.replan_held("w.pt-uid", held, world(), H0, rs(), NOW)
    assert (summary(steps), dropped) == (["cordon n1", PT], "")


def test_a_held_restart_is_dropped_when_the_workload_recovered_by_itself_or_it_expired() -> None:
    gone = pod_event("replaced-uid")  # the faulting pod was replaced and no pod of the unit failed since
    steps, dropped = holding.replan_held("w.pt-uid", _held(gone), world(), H0, rs(), NOW)
    assert steps == []
    assert "recovered by itself" in dropped
    steps, dropped = holding.replan_held("w.pt-uid", _held(pod_event("pt-0"), until=T - 1), world(), H0, rs(), NOW)
    assert steps == []
    assert "hold_seconds" in dropped


def test_the_cache_keeps_every_label_the_restart_selectors_use() -> None:
    assert kinds.SELECTOR_LABELS <= proj.KEPT_POD_LABELS


def _own_policy_world(js_spec: dict[str, Any], js_status: dict[str, Any], job_spec: dict[str, Any],
                      exit_code: int) -> caching.ClusterCache:
    js = o.workload("jobset.x-k8s.io/v1alpha2", "JobSet", "gang", uid="gang-uid", labels=OPT, spec=js_spec,
                    status=js_status)
    child = o.workload("batch/v1", "Job", "gang-w-0", uid="gang-child", owner=js)
    job = o.workload("batch/v1", "Job", "fj", uid="fj-uid", labels=OPT, spec=job_spec)
    terminated = {"name": "c", "restartCount": 0, "state": {"terminated": {
        "exitCode": exit_code, "reason": "Error", "finishedAt": "2025-06-01T12:00:00Z"}}}
    gang = o.pod("gang-w-0-0", uid="gang-0", node="n1", phase="Failed", owner=child,
                 labels={kinds.JOBSET_NAME: "gang", kinds.JOBSET_UID: "gang-uid"})
    gang_peer = o.pod("gang-w-0-1", uid="gang-1", node="n2", owner=child,
                      labels={kinds.JOBSET_NAME: "gang", kinds.JOBSET_UID: "gang-uid"})
    fj = o.pod("fj-a", uid="fj-0", node="n3", owner=job, labels={kinds.BATCH_JOB_NAME: "fj",
                                                                  kinds.BATCH_CONTROLLER_UID: "fj-uid"})
    fj_peer = o.pod("fj-b", uid="fj-1", node="n3", owner=job, labels={kinds.BATCH_JOB_NAME: "fj",
                                                                       kinds.BATCH_CONTROLLER_UID: "fj-uid"})
    for pod in (gang, fj):
        pod["status"]["containerStatuses"] = [terminated]
    return caching.ClusterCache.offline([js, child, job, gang, gang_peer, fj, fj_peer,
                                         *(o.node(f"n{i}") for i in range(1, 4))])


GANG = {"failurePolicy": {"maxRestarts": 3}, "replicatedJobs": [{"name": "w", "template": {"spec": {"backoffLimit": 0}}}]}
FAIL_ON_42 = {"backoffLimit": 3, "podFailurePolicy": {"rules": [
    {"action": "FailJob", "onExitCodes": {"containerName": "c", "operator": "In", "values": [42]}},
    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}}


@pytest.mark.parametrize(("js_spec", "js_status", "exit_code", "pod", "expected"), [
    (GANG, {}, 1, "gang-0", ["skip WorkloadPolicyRestarts"]),
    (GANG, {"restarts": 3}, 1, "gang-0", ["restart JobSet gang"]),
    ({**GANG, "replicatedJobs": [{"name": "w", "template": {"spec": {"backoffLimit": 2}}}]}, {}, 1, "gang-0",
     ["restart JobSet gang"]),
    ({"replicatedJobs": [{"name": "w", "template": {"spec": {"backoffLimit": 0}}}]}, {}, 1, "gang-0",
     ["restart JobSet gang"]),
    (GANG, {}, 42, "fj-0", ["skip WorkloadPolicyRestarts"]),
    (GANG, {}, 1, "fj-0", ["restart Job fj"]),
], ids=["jobset restarts itself for a failed pod of a backoffLimit 0 Job",
        "jobset out of its own restarts: kcover restarts it",
        "the child Job retries the pod itself first: kcover restarts the gang",
        "jobset without a failurePolicy: kcover restarts it",
        "a FailJob exit code: the Job's own decision",
        "another exit code: kcover restarts the Job"])
def test_a_workloads_own_failure_policy_is_not_answered_twice(js_spec: dict[str, Any], js_status: dict[str, Any],
                                                               exit_code: int, pod: str, expected: list[str]) -> None:
    snap = _own_policy_world(js_spec, js_status, FAIL_ON_42, exit_code)
    got = [" ".join(line.split(" ")[:3]) for line in summary(planning.plan(pod_event(pod), snap, H0, rs(), NOW))]
    assert got == expected


def test_own_policy_exit_rules_follow_the_operator_and_container() -> None:
    rule = kinds.ExitRule("c", "NotIn", (0, 1))
    assert rule.matches("c", 2)
    assert not rule.matches("c", 1)
    assert not rule.matches("other", 2)
    assert kinds.ExitRule("", "In", (7,)).matches("any", 7)


@pytest.mark.parametrize(("policy", "phase", "terminated", "expected"), [
    ("Never", "Running", True, "skip NothingToRemove quiet"),  # the kubelet starts it no more: the phase follows
    ("Never", "Failed", True, "skip NothingToRemove quiet"),
    ("OnFailure", "Running", True, "restart Job solo"),  # the kubelet restarts it in place: a member
    ("Never", "Running", False, "restart Job solo"),
], ids=["never-exited-phase-not-yet-failed", "never-failed", "onfailure-exited", "never-running"])
def test_a_pod_that_will_not_run_again_is_no_member_of_its_restart(policy: str, phase: str, terminated: bool,
                                                                   expected: str) -> None:
    """A batch Job's only pod exits 1 under restartPolicy Never: its controller counts it, and evicting it
    (its phase still Running for a moment on a real kubelet) would mark it DisruptionTarget and hide the
    failure from backoffLimit, a free retry."""
    job = o.workload("batch/v1", "Job", "solo", uid="solo-uid", labels=OPT,
                     spec={"backoffLimit": 1, "template": {"spec": {"restartPolicy": policy}}})
    pod = o.pod("solo-x", uid="solo-0", node="n1", owner=job, phase=phase,
                labels={kinds.BATCH_JOB_NAME: "solo", kinds.BATCH_CONTROLLER_UID: "solo-uid"})
    pod["spec"]["restartPolicy"] = policy
    state = {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": "2025-06-01T12:00:00Z"}} if terminated \
        else {"running": {}}
    pod["status"]["containerStatuses"] = [{"name": "c", "restartCount": 0, "state": state}]
    snap = caching.ClusterCache.offline([job, pod, o.node("n1")])
    got = [" ".join(line.split(" ")[:3]) for line in summary(planning.plan(pod_event("solo-0"), snap, H0, rs(), NOW))]
    assert got == [expected]
