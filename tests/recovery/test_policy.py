"""Table tests of `policy.plan`: which fault leads to which action, and every refusal."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from harness import objects as o

from kcover import errors, model, settings
from kcover.kube import caching
from kcover.kube import projections as proj
from kcover.recovery import actions, adapters, policy

NOW = dt.datetime(2025, 6, 1, 12, 0, 0, tzinfo=dt.UTC)
T = NOW.timestamp()
OPT = {proj.OPT_IN_LABEL: "true"}
KF = "kubeflow.org/v1"
KF_PT = {adapters.KUBEFLOW_JOB_NAME: "train", adapters.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}


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
              labels={adapters.KUBEFLOW_JOB_NAME: "train", adapters.KUBEFLOW_OPERATOR_NAME: "tfjob-controller"},
              owner=tf),
        o.pod("never-worker-0", uid="never-0", node="n3", labels={adapters.KUBEFLOW_JOB_NAME: "never"}, owner=never),
        o.pod("tj-node-0-0", uid="js-0", node="n3", labels={adapters.JOBSET_NAME: "tj", adapters.JOBSET_UID: "js-uid"},
              owner=jsjob),
        o.pod("serve-0", uid="lws-0", node="n4", labels={adapters.LWS_NAME: "serve", adapters.LWS_GROUP_INDEX: "0"},
              owner=sts0),
        o.pod("serve-1", uid="lws-1", node="n4", labels={adapters.LWS_NAME: "serve", adapters.LWS_GROUP_INDEX: "1"},
              owner=sts0),
        o.pod("bj-abc", uid="bj-0", node="n5",
              labels={adapters.BATCH_JOB_NAME: "bj", adapters.BATCH_CONTROLLER_UID: "bj-uid"}, owner=job),
        o.pod("vc-worker-0", uid="vc-0", node="n5", labels={adapters.VOLCANO_JOB_NAME: "vc"}, owner=vc),
        o.pod("bare", uid="bare", node="n6", labels=OPT),
        o.pod("web-abc", uid="rs-0", node="n6", labels=OPT, owner=o.owner("apps/v1", "ReplicaSet", "web-1", "rs-uid")),
        o.pod("train-master-0", uid="sys-0", namespace="kube-system", node="n6",
              labels={adapters.KUBEFLOW_JOB_NAME: "train", **OPT}, owner=sys_pt),
    ]
    nodes = [o.node(f"n{i}", uid=f"node-{i}") for i in range(1, 12)]
    return caching.ClusterCache.offline([pt, tf, never, tj, js, jsjob, lws, job, vc, sys_pt, *pods, *nodes, *extra])


def pod_event(uid: str, *, detector: str = "pod-status", severity: model.Severity = model.Severity.ERROR,
              reason: str = "ContainerError", recommended: model.Action | None = None) -> model.CollectorEvent:
    return model.CollectorEvent(detector=detector, severity=severity, reason=reason, message="exit 1",
                                target=model.Target(kind=model.TargetKind.POD, namespace="ml", name=uid, uid=uid),
                                observed_at=NOW, recommended=recommended)


def node_event(node: str, *, detector: str = "node-condition", severity: model.Severity = model.Severity.ERROR,
               reason: str = "XID79", recommended: model.Action | None = None,
               cleared: bool = False) -> model.CollectorEvent:
    return model.CollectorEvent(detector=detector, severity=severity, reason=reason, message="fell off the bus",
                                target=model.Target(kind=model.TargetKind.NODE, name=node, node=node),
                                observed_at=NOW, recommended=recommended, cleared=cleared)


def summary(planned: list[actions.Action]) -> list[str]:
    out = []
    for a in planned:
        if isinstance(a, actions.RestartWorkload):
            # uid-bearing selectors: one DeleteCollection; others: uid-preconditioned deletes of the verified pods
            mode = a.selector.render() + ("" if a.selector.pods is None
                                          else " by-uid=" + ",".join(p.uid for p in a.selector.pods))
            out.append(f"restart {a.workload.kind} {a.workload.name} [{mode}] {a.ledger_key}")
        elif isinstance(a, actions.CordonNode):
            out.append(f"cordon {a.node}")
        elif isinstance(a, actions.UncordonNode):
            out.append(f"uncordon {a.node}")
        elif isinstance(a, actions.Skip):
            out.append(f"skip {a.code.value}" + ("" if a.audit else " quiet"))
        else:
            out.append("report")
    return out


def rs(**kw: Any) -> settings.RecoverySettings:
    return settings.RecoverySettings(**kw)


KF_SEL = "training.kubeflow.org/job-name=train,training.kubeflow.org/operator-name=pytorchjob-controller"
H0 = policy.History()

ROWS: list[tuple[str, model.CollectorEvent, policy.History, dict[str, Any], list[str]]] = [
    ("kubeflow pod error restarts its job, selector narrowed by operator", pod_event("pt-0"), H0, {},
     [f"restart PyTorchJob train [{KF_SEL} by-uid=pt-0,pt-1] w.pt-uid"]),
    ("dra-health error restarts too", pod_event("pt-1", detector="dra-health", reason="DeviceUnhealthy"), H0, {},
     [f"restart PyTorchJob train [{KF_SEL} by-uid=pt-0,pt-1] w.pt-uid"]),
    ("event-watcher on a pod restarts", pod_event("pt-1", detector="event-watcher"), H0, {},
     [f"restart PyTorchJob train [{KF_SEL} by-uid=pt-0,pt-1] w.pt-uid"]),
    ("same-named TFJob not opted in", pod_event("tf-0"), H0, {}, ["skip NotOptedIn quiet"]),
    ("warning is ignored", pod_event("pt-0", severity=model.Severity.WARNING), H0, {}, []),
    ("unknown detector error is reported", pod_event("pt-0", detector="logscan"), H0, {}, ["report"]),
    ("rule can ignore by reason glob", pod_event("pt-0", reason="OOMKilled"), H0,
     {"rules": [{"detector": "pod-status", "reason": "OOM*", "action": "ignore"}]}, []),
    ("rule can report", pod_event("pt-0"), H0, {"rules": [{"detector": "pod-*", "action": "report"}]}, ["report"]),
    ("rule by severity does not match errors", pod_event("pt-0"), H0,
     {"rules": [{"severity": "Warning", "action": "ignore"}]}, [f"restart PyTorchJob train [{KF_SEL} by-uid=pt-0,pt-1] w.pt-uid"]),
    ("restartPolicy Never forbids", pod_event("never-0"), H0, {}, ["skip RestartPolicyForbids"]),
    ("namespace denied", pod_event("sys-0"), H0, {}, ["skip NamespaceDenied quiet"]),
    ("namespace not in allow list", pod_event("pt-0"), H0, {"namespaces_allow": ["other"]}, ["skip NamespaceDenied quiet"]),
    ("bare pod is never deleted", pod_event("bare"), H0, {}, ["skip NoController"]),
    ("replicaset pod unsupported", pod_event("rs-0"), H0, {}, ["skip UnsupportedOwner"]),
    ("unknown pod", pod_event("ghost"), H0, {}, ["skip TargetUnknown quiet"]),
    ("trainjob restarts through its jobset with the uid label", pod_event("js-0"), H0, {},
     ["restart TrainJob tj [jobset.sigs.k8s.io/jobset-name=tj,jobset.sigs.k8s.io/jobset-uid=js-uid] w.tj-uid"]),
    ("lws restarts the faulting group only", pod_event("lws-1"), H0, {},
     ["restart LeaderWorkerSet serve [leaderworkerset.sigs.k8s.io/name=serve,leaderworkerset.sigs.k8s.io/group-index=1 by-uid=lws-1] w.lws-uid.g1"]),
    ("batch job by controller uid", pod_event("bj-0"), H0, {},
     ["restart Job bj [batch.kubernetes.io/controller-uid=bj-uid] w.bj-uid"]),
    ("volcano job by name", pod_event("vc-0"), H0, {}, ["restart Job vc [volcano.sh/job-name=vc by-uid=vc-0] w.vc-uid"]),
    ("cooldown", pod_event("pt-0"), policy.History(restarts={"w.pt-uid": (T - 10,)}), {}, ["skip Cooldown quiet"]),
    ("cooldown over", pod_event("pt-0"), policy.History(restarts={"w.pt-uid": (T - 61,)}), {},
     [f"restart PyTorchJob train [{KF_SEL} by-uid=pt-0,pt-1] w.pt-uid"]),
    ("budget exhausted", pod_event("pt-0"),
     policy.History(restarts={"w.pt-uid": tuple(T - 3000 + i * 100 for i in range(5))}), {}, ["skip BudgetExhausted"]),
    ("budget counts only the window", pod_event("pt-0"),
     policy.History(restarts={"w.pt-uid": (T - 7200, T - 7100, T - 7000, T - 6900, T - 100)}), {},
     [f"restart PyTorchJob train [{KF_SEL} by-uid=pt-0,pt-1] w.pt-uid"]),
    ("concurrent restarts open the breaker", pod_event("pt-0"), policy.History(in_flight_restarts=10), {},
     ["skip BreakerOpen"]),
    ("lws group cooldown is per group", pod_event("lws-0"), policy.History(restarts={"w.lws-uid.g1": (T - 5,)}), {},
     ["restart LeaderWorkerSet serve [leaderworkerset.sigs.k8s.io/name=serve,leaderworkerset.sigs.k8s.io/group-index=0 by-uid=lws-0] w.lws-uid.g0"]),
    ("node condition cordons and restarts opted-in workloads on it", node_event("n1"), H0, {},
     ["cordon n1", f"restart PyTorchJob train [{KF_SEL} by-uid=pt-0,pt-1] w.pt-uid"]),
    ("node sweep passes over refusals silently", node_event("n6"), H0, {}, ["cordon n6"]),
    ("recommended cordon-node narrows to cordon only", node_event("n1", recommended=model.Action.CORDON_NODE), H0, {},
     ["cordon n1"]),
    ("recommended restart-workload on a node", node_event("n1", recommended=model.Action.RESTART_WORKLOAD), H0, {},
     [f"restart PyTorchJob train [{KF_SEL} by-uid=pt-0,pt-1] w.pt-uid"]),
    ("recommendation above the rule is not honoured", pod_event("pt-0", recommended=model.Action.CORDON_NODE), H0, {},
     [f"restart PyTorchJob train [{KF_SEL} by-uid=pt-0,pt-1] w.pt-uid"]),
    ("no recommendation: the rule decides", node_event("n3"), H0, {},
     ["cordon n3", "skip RestartPolicyForbids",
      "restart TrainJob tj [jobset.sigs.k8s.io/jobset-name=tj,jobset.sigs.k8s.io/jobset-uid=js-uid] w.tj-uid"]),
    ("event-watcher node event cordons", node_event("n2", detector="event-watcher"), H0, {},
     ["cordon n2", f"restart PyTorchJob train [{KF_SEL} by-uid=pt-0,pt-1] w.pt-uid"]),
    ("rule can make a node fault cordon only", node_event("n2"), H0,
     {"rules": [{"detector": "node-condition", "action": "cordon-node"}]}, ["cordon n2"]),
    ("node cooldown", node_event("n2"), policy.History(cordons={"n2": T - 60}), {},
     ["skip Cooldown quiet", f"restart PyTorchJob train [{KF_SEL} by-uid=pt-0,pt-1] w.pt-uid"]),
    ("unknown node", node_event("n99"), H0, {}, ["skip TargetUnknown"]),
    ("pod fault routed to cordon by rule uses the pod's node", pod_event("vc-0"), H0,
     {"rules": [{"detector": "pod-status", "reason": "ContainerError", "action": "cordon-node"}]}, ["cordon n5"]),
    ("pod target restart on node with no workloads", node_event("n7", recommended=model.Action.RESTART_WORKLOAD), H0, {},
     ["skip NoWorkloads quiet"]),
]


@pytest.mark.parametrize(("event", "history", "overrides", "expected"), [r[1:] for r in ROWS],
                         ids=[r[0] for r in ROWS])
def test_plan(event: model.CollectorEvent, history: policy.History, overrides: dict[str, Any],
              expected: list[str]) -> None:
    assert summary(policy.plan(event, world(), history, rs(**overrides), NOW)) == expected


def snapshot_with(*, cordoned: int, gpu_nodes: int = 10) -> caching.ClusterCache:
    nodes = [o.node(f"g{i}", annotations={proj.CORDONED_BY: "kcover"} if i < cordoned else {},
                    unschedulable=i < cordoned) for i in range(gpu_nodes)]
    return caching.ClusterCache.offline(nodes)


@pytest.mark.parametrize(("cordoned", "gpu_nodes", "fraction", "expected"), [
    (0, 10, 0.1, ["cordon g9"]),
    (1, 10, 0.1, ["skip BreakerOpen"]),
    (1, 10, 0.2, ["cordon g9"]),
    (2, 10, 0.2, ["skip BreakerOpen"]),
    (0, 0, 0.1, ["skip TargetUnknown"]),
])
def test_cordon_breaker(cordoned: int, gpu_nodes: int, fraction: float, expected: list[str]) -> None:
    snap = snapshot_with(cordoned=cordoned, gpu_nodes=gpu_nodes)
    planned = policy.plan(node_event("g9", recommended=model.Action.CORDON_NODE), snap, H0,
                          rs(max_cordoned_fraction=fraction), NOW)
    assert summary(planned) == expected


def test_breaker_text_says_why() -> None:
    planned = policy.plan(node_event("g9"), snapshot_with(cordoned=1), H0, rs(), NOW)
    assert isinstance(planned[0], actions.Skip)
    assert "1 of 10 GPU nodes" in planned[0].text


def test_budget_text_says_why() -> None:
    history = policy.History(restarts={"w.pt-uid": tuple(T - 3000 + i * 100 for i in range(5))})
    (skip,) = policy.plan(pod_event("pt-0"), world(), history, rs(), NOW)
    assert isinstance(skip, actions.Skip)
    assert "5 times in the last 3600s (max 5)" in skip.text
    assert skip.about is not None
    assert skip.about.uid == "pt-uid"


@pytest.mark.parametrize(("node", "annotations", "history", "enabled", "expected"), [
    ("g0", {proj.CORDONED_BY: "kcover"}, {"g0": T - 700}, True, ["uncordon g0"]),
    # the node-condition detector holds the cleared event back (recovered_hold_seconds): none here
    ("g0", {proj.CORDONED_BY: "kcover"}, {"g0": T - 100}, True, ["uncordon g0"]),
    ("g0", {proj.CORDONED_BY: "kcover"}, {"g0": T - 700}, False, []),
    ("g0", {}, {}, True, []),
    ("g0", {proj.CORDONED_BY: "kcover", proj.CORDONED_AT: "2025-06-01T11:00:00Z"}, {}, True, ["uncordon g0"]),
])
def test_uncordon(node: str, annotations: dict[str, str], history: dict[str, float], enabled: bool,
                  expected: list[str]) -> None:
    snap = caching.ClusterCache.offline([o.node(node, annotations=annotations, unschedulable=True)])
    event = node_event(node, severity=model.Severity.INFO, cleared=True)
    planned = policy.plan(event, snap, policy.History(cordons=history), rs(uncordon_enabled=enabled), NOW)
    assert summary(planned) == expected


def test_already_cordoned_nodes_are_left_alone() -> None:
    snap = caching.ClusterCache.offline([
        o.node("a", unschedulable=True, annotations={proj.CORDONED_BY: "kcover"}),
        o.node("b", unschedulable=True), *[o.node(f"x{i}") for i in range(20)]])
    assert summary(policy.plan(node_event("a"), snap, H0, rs(), NOW)) == ["skip AlreadyCordoned quiet"]
    assert summary(policy.plan(node_event("b"), snap, H0, rs(), NOW)) == ["skip CordonedByOthers quiet"]


def test_stray_pod_with_the_same_label_forces_per_pod_deletes() -> None:
    snap = world(o.pod("debug", uid="stray", node="n9", labels=KF_PT,
                       owner=o.owner("apps/v1", "ReplicaSet", "dbg", "rs-x")))
    (restart,) = policy.plan(pod_event("pt-0"), snap, H0, rs(), NOW)
    assert summary([restart]) == [f"restart PyTorchJob train [{KF_SEL} by-uid=pt-0,pt-1] w.pt-uid"]


def test_workload_target_restarts_through_its_pods() -> None:
    event = model.CollectorEvent(detector="event-watcher", severity=model.Severity.ERROR, reason="Hang",
                                 target=model.Target(kind=model.TargetKind.WORKLOAD, namespace="ml", name="bj",
                                                     uid="bj-uid", workload_kind="Job"), observed_at=NOW)
    assert summary(policy.plan(event, world(), H0, rs(), NOW)) == [
        "restart Job bj [batch.kubernetes.io/controller-uid=bj-uid] w.bj-uid"]


def test_a_report_about_a_workload_is_recorded_on_that_workload() -> None:
    """`report` on a Workload target (the preflight plugin's PreflightIncomplete) leaves its Event on the
    workload the cache knows by that uid; an unknown uid has nothing to write it on."""
    def about(uid: str) -> object:
        event = model.CollectorEvent(detector="preflight", severity=model.Severity.ERROR, reason="PreflightIncomplete",
                                     target=model.Target(kind=model.TargetKind.WORKLOAD, namespace="ml", name="train",
                                                         uid=uid, workload_kind="PyTorchJob"),
                                     recommended=model.Action.REPORT, observed_at=NOW)
        (planned,) = policy.plan(event, world(), H0, rs(), NOW)
        assert isinstance(planned, actions.RecordOnly)
        return planned.about

    found = about("pt-uid")
    assert (getattr(found, "kind", ""), getattr(found, "name", ""), getattr(found, "uid", "")) == (
        "PyTorchJob", "train", "pt-uid")
    assert about("gone-uid") is None


def test_one_restart_per_unit_per_event() -> None:
    pt = o.workload(KF, "PyTorchJob", "train", uid="pt-uid", labels=OPT)
    snap = world(o.pod("train-worker-1", uid="pt-2", node="n1", labels=KF_PT, owner=pt))
    planned = policy.plan(node_event("n1"), snap, H0, rs(), NOW)
    assert summary(planned) == ["cordon n1", f"restart PyTorchJob train [{KF_SEL} by-uid=pt-0,pt-1,pt-2] w.pt-uid"]


def test_concurrency_limit_counts_restarts_planned_in_the_same_event() -> None:
    snap = world()
    planned = policy.plan(node_event("n5"), snap, policy.History(in_flight_restarts=9), rs(), NOW)
    assert summary(planned) == ["cordon n5", "restart Job bj [batch.kubernetes.io/controller-uid=bj-uid] w.bj-uid",
                                "skip BreakerOpen"]


@pytest.mark.parametrize("raw", [
    [{"action": "explode"}],
    [{"detector": "x"}],
    [{"action": "ignore", "severity": "Fatal"}],
    [{"action": "ignore", "colour": "red"}],
])
def test_invalid_rules(raw: list[dict[str, Any]]) -> None:
    with pytest.raises(errors.ConfigError):
        policy.parse_rules(raw)
