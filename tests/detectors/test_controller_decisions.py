"""Table tests of the controller detectors' pure decisions."""

from __future__ import annotations

import datetime as dt

import pytest

from kcover import model
from kcover.detectors import dra_health, event_watcher, node_condition, pod_status
from kcover.kube import projections as proj

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


def _ts(seconds_ago: float) -> str:
    return (NOW - dt.timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _container(name: str = "c", *, init: bool = False, restarts: int = 0,
               term: proj.Terminated | None = None, last: proj.Terminated | None = None) -> proj.ContainerState:
    return proj.ContainerState(name, init, restarts, term, last, ())


def _pod(*containers: proj.ContainerState, deleting: bool = False, annotations: proj.Pairs = ()) -> proj.Pod:
    return proj.Pod("u", "1", "ns", "p", "n1", "Running", (), annotations, None,
                    "2026-01-01T00:00:00Z" if deleting else "", "Always", containers)


ERR = proj.Terminated("Error", 1, _ts(5))
OOM = proj.Terminated("OOMKilled", 137, _ts(5))
OK = proj.Terminated("Completed", 0, _ts(5))
OLD = proj.Terminated("Error", 1, _ts(3600))
CODE42 = proj.Terminated("Whatever", 42, _ts(5))


@pytest.mark.parametrize(("pod", "config", "expected"), [
    (_pod(_container(term=ERR)), {}, [("c", 0)]),
    (_pod(_container(restarts=3, last=ERR)), {}, [("c", 2)]),
    (_pod(_container(restarts=1, term=ERR, last=ERR)), {}, [("c", 1), ("c", 0)]),
    (_pod(_container(term=OK)), {}, []),
    (_pod(_container(term=OOM)), {}, []),
    (_pod(_container(term=OOM)), {"oom_killed": True}, [("c", 0)]),
    (_pod(_container(term=CODE42)), {}, []),
    (_pod(_container(term=CODE42)), {"exit_codes": [42]}, [("c", 0)]),
    (_pod(_container(term=ERR)), {"ignore_exit_codes": [1]}, []),
    (_pod(_container("i", init=True, term=ERR)), {}, [("i", 0)]),
    (_pod(_container("i", init=True, term=ERR)), {"init_containers": False}, []),
    (_pod(_container(term=OLD)), {}, []),
    (_pod(_container(term=ERR), deleting=True), {}, []),
    # nothing writes kcover.io/restarting (a pod's owner could): it exempts no failure
    (_pod(_container(term=ERR), annotations=(("kcover.io/restarting", "x"),)), {}, [("c", 0)]),
    (_pod(_container(term=proj.Terminated("Error", 1, ""))), {}, [("c", 0)]),
])
def test_pod_status_failures(pod: proj.Pod, config: dict[str, object], expected: list[tuple[str, int]]) -> None:
    found = pod_status.failures(pod, pod_status.PodStatusConfig.model_validate(config), NOW)
    assert [(f.container, f.ordinal) for f in found] == expected


def test_seen_set_is_bounded() -> None:
    seen = pod_status.SeenSet(2)
    assert seen.add(("a",))
    assert seen.add(("b",))
    assert not seen.add(("a",))
    assert seen.add(("c",))
    assert len(seen) == 2
    assert seen.add(("a",))  # evicted, so new again


U, H, K = dra_health.UNHEALTHY, dra_health.HEALTHY, dra_health.UNKNOWN
E = dra_health.Emit


@pytest.mark.parametrize(("observations", "expected"), [
    ([(0, H), (1, H)], [None, None]),
    ([(0, U), (1, U), (2, U)], [E.UNHEALTHY, None, None]),
    ([(0, H), (1, U), (2, H), (3, U)], [None, E.UNHEALTHY, E.RECOVERED, E.UNHEALTHY]),
    ([(0, K), (100, K), (300, K), (400, K)], [None, None, E.UNKNOWN, None]),
    ([(0, K), (299, K), (310, H)], [None, None, None]),
    ([(0, K), (300, K), (301, H)], [None, E.UNKNOWN, E.RECOVERED]),
    ([(0, U), (10, K), (400, K), (500, U), (600, H)], [E.UNHEALTHY, None, None, None, E.RECOVERED]),
    ([(0, K), (300, K), (301, U)], [None, E.UNKNOWN, E.UNHEALTHY]),
])
def test_dra_health_step(observations: list[tuple[float, str]], expected: list[dra_health.Emit | None]) -> None:
    track = None
    got = []
    for now, health in observations:
        track, emit = dra_health.step(track, health, now, 300.0)
        got.append(emit)
    assert got == expected


def _event(**over: object) -> proj.KubeEvent:
    base = proj.KubeEvent("e1", "1", "ml", "ev", proj.InvolvedObject("Pod", "ml", "p", "u"), "GPUFailed", "m",
                          "Warning", "", "", 1, 0, _ts(10), "", "", "")
    return base._replace(**over)


LIVE = proj.Pod("u", "1", "ml", "p", "n1", "Running", (), (), None, "", "Always", ())
NODE = proj.Node("nu", "1", "n1", False, (), (), (), ())


AGENT_NS = "kcover-system"
AGENT = dict(namespace=AGENT_NS, reporting_controller="kcover.io/agent", reporting_instance="n1")
"""An Event as the agent on n1 writes it: in kcover's namespace, its reporter, its node as instance."""
NODE_REF = proj.InvolvedObject("Node", AGENT_NS, "n1", "")


def _future(seconds: float) -> str:
    return (NOW + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.mark.parametrize(("ev", "expected"), [
    (_event(), "accept:Pod"),
    (_event(last_timestamp=_ts(200)), "stale"),
    (_event(last_timestamp=_ts(200), series_last_observed=_ts(5)), "accept:Pod"),
    (_event(last_timestamp="", event_time="2026-01-01T11:59:50.000000Z"), "accept:Pod"),
    (_event(last_timestamp=""), "no_timestamp"),
    (_event(last_timestamp=_future(30)), "accept:Pod"),  # within the clock skew
    (_event(last_timestamp="", event_time=_future(61)), "future_timestamp"),
    (_event(event_time="2099-01-01T00:00:00.000000Z"), "future_timestamp"),  # the latest time counts
    (_event(namespace="other"), "namespace_mismatch"),  # an Event in another namespace about ml/p
    (_event(involved=proj.InvolvedObject("Pod", "ml", "gone", "")), "pod_not_found"),
    (_event(involved=proj.InvolvedObject("Pod", "ml", "p", "old-uid")), "uid_mismatch"),
    (_event(involved=proj.InvolvedObject("Pod", "ml", "p", "")), "accept:Pod"),
    # Node Events: only from kcover's namespace, its reporter, naming its own node, where an agent runs
    (_event(involved=NODE_REF, **AGENT), "accept:Node"),
    (_event(involved=proj.InvolvedObject("Node", "", "n1", ""), **AGENT), "accept:Node"),
    (_event(involved=proj.InvolvedObject("Node", "", "n1", ""), reporting_controller="kcover.io/agent"),
     "namespace_not_allowed"),  # the Go project's forged Event: a tenant namespace, the agent's name
    (_event(involved=NODE_REF, **{**AGENT, "namespace": "default"}), "namespace_not_allowed"),
    (_event(involved=proj.InvolvedObject("Node", "ml", "n1", ""), **AGENT), "namespace_mismatch"),
    (_event(involved=NODE_REF, namespace=AGENT_NS, reporting_instance="n1"), "untrusted_reporter"),
    (_event(involved=NODE_REF, namespace=AGENT_NS, source_component="kcover.io/agent", source_host="n1"),
     "accept:Node"),
    (_event(involved=NODE_REF, **{**AGENT, "reporting_instance": "n2"}), "identity_mismatch"),
    (_event(involved=NODE_REF, **{**AGENT, "reporting_instance": ""}), "identity_mismatch"),
    (_event(involved=proj.InvolvedObject("Node", AGENT_NS, "n2", ""), **{**AGENT, "reporting_instance": "n2"}),
     "no_agent_on_node"),
    (_event(involved=proj.InvolvedObject("Node", AGENT_NS, "n9", ""), **{**AGENT, "reporting_instance": "n9"}),
     "node_not_found"),
    (_event(involved=proj.InvolvedObject("Node", AGENT_NS, "n1", "other-uid"), **AGENT), "uid_mismatch"),
    (_event(involved=proj.InvolvedObject("Deployment", "ml", "d", "")), "unsupported_kind"),
    (_event(involved=proj.InvolvedObject("PyTorchJob", "ml", "job", "")), "unsupported_kind"),
])
def test_event_watcher_judge(ev: proj.KubeEvent, expected: str) -> None:
    verdict = event_watcher.judge(ev, now=NOW, config=event_watcher.EventWatcherConfig(), lookups=LOOKUPS)
    got = f"accept:{verdict.target.kind.value}" if verdict.target is not None else verdict.reason
    assert got == expected
    if verdict.target is not None and verdict.target.kind is model.TargetKind.POD:
        assert (verdict.target.uid, verdict.target.node) == ("u", "n1")


AGENT_POD = proj.Pod("a1", "1", AGENT_NS, "kcover-agent-x", "n1", "Running",
                     (("app.kubernetes.io/component", "agent"), ("app.kubernetes.io/name", "kcover")),
                     (), None, "", "Always", ())
LOOKUPS = event_watcher.Lookups(
    pod=lambda ns, name: LIVE if (ns, name) == ("ml", "p") else None,
    node=lambda name: NODE if name in ("n1", "n2") else None,
    agent_on_node=lambda ns, node: event_watcher.agent_on_node(
        lambda n: [AGENT_POD._replace(node=n)] if n in ("n1", "n9") else [], event_watcher.AGENT_POD_LABELS, ns, node),
    namespace=AGENT_NS)


@pytest.mark.parametrize(("pod", "found"), [
    (AGENT_POD, True),
    (AGENT_POD._replace(namespace="ml"), False),  # a look-alike in a tenant namespace
    (AGENT_POD._replace(labels=(("app.kubernetes.io/component", "agent"),)), False),
    (AGENT_POD._replace(deletion_timestamp="2026-01-01T00:00:00Z"), False),
    (AGENT_POD._replace(phase="Failed"), False),
    (AGENT_POD._replace(phase="Pending"), True),
])
def test_agent_on_node(pod: proj.Pod, found: bool) -> None:
    assert event_watcher.agent_on_node(lambda n: [pod], event_watcher.AGENT_POD_LABELS, AGENT_NS, "n1") is found


def test_node_event_namespaces_setting_widens_the_allowlist() -> None:
    config = event_watcher.EventWatcherConfig(node_event_namespaces=["default"], require_agent_pod=False)
    ev = _event(involved=proj.InvolvedObject("Node", "", "n1", ""), namespace="default",
                reporting_controller="kcover.io/agent")
    assert event_watcher.judge(ev, now=NOW, config=config, lookups=LOOKUPS).reason == "kcover.io/agent"
    with pytest.raises(ValueError, match="kept on cached pods"):
        event_watcher.EventWatcherConfig(agent_pod_labels={"app": "kcover-agent"})


def test_signal_names_the_event_and_its_count() -> None:
    assert event_watcher.signal_of(_event()) == "event/e1/1"
    assert event_watcher.signal_of(_event(uid="", event_count=0, series_count=4)) == "event/ml/ev/4"


def _node(*conds: proj.Condition) -> proj.Node:
    return proj.Node("nu", "1", "n1", False, (), conds, (), ())


RULES = node_condition.default_rules()


@pytest.mark.parametrize(("node", "expected", "waiting"), [
    (_node(proj.Condition("KcoverGPUHealthy", "True", "", "", _ts(100))), [], False),
    (_node(proj.Condition("KcoverGPUHealthy", "False", "XID", "", _ts(100))), ["KcoverGPUHealthy"], False),
    (_node(proj.Condition("KcoverGPUHealthy", "False", "XID", "", _ts(3))), [], True),
    (_node(proj.Condition("AcceleratedHardwareReady", "False", "", "", _ts(60))), ["AcceleratedHardwareReady"], False),
    (_node(proj.Condition("Ready", "False", "", "", _ts(60))), [], False),
    (_node(proj.Condition("KcoverGPUHealthy", "False", "", "", "")), [], True),
])
def test_node_condition_bad_conditions(node: proj.Node, expected: list[str], waiting: bool) -> None:
    found, still = node_condition.bad_conditions(node, RULES, now=NOW, default_min=10.0, first_seen={})
    assert sorted(found) == expected
    assert still is waiting


def test_node_condition_rule_override_and_first_seen() -> None:
    rules = [node_condition.ConditionRule(type="GPUProblem", bad_status="True", min_duration_seconds=0)]
    found, _ = node_condition.bad_conditions(_node(proj.Condition("GPUProblem", "True", "", "", "")), rules,
                                             now=NOW, default_min=60, first_seen={})
    assert list(found) == ["GPUProblem"]
    cond = proj.Condition("KcoverGPUHealthy", "False", "", "", "")
    found, _ = node_condition.bad_conditions(_node(cond), RULES, now=NOW, default_min=10,
                                             first_seen={"KcoverGPUHealthy": NOW - dt.timedelta(seconds=11)})
    assert list(found) == ["KcoverGPUHealthy"]
