"""Node scenarios on real components (the `cluster` backend): a GPU node going NotReady, a restart the
real scheduler cannot place (restart-stalled), a repaired node returning to service after its
validation (node-repaired, with the chart's `returnValidation` RBAC and a real agent process).

NotReady is what kwok's `node-not-ready` Stage writes (Ready=False, as a kubelet that stops reporting
leaves it), and the real kube-controller-manager answers it with its own `node.kubernetes.io/not-ready`
taints. kcover's decision (docs/detectors.md, "Node conditions"): by default it leaves a NotReady
node to Kubernetes (its taints keep new pods off and go when the node is Ready again; NotReady is more
often a kubelet or network blip than a GPU fault, and restarting a large job for a blip wastes its
progress). An operator who wants the job restarted elsewhere sooner adds a `Ready: "False"` rule to
the node-condition detector: kcover then cordons the node, restarts the opted-in jobs on it, and (with
`recovery.uncordon_enabled`) returns it once Ready has held for `recovered_hold_seconds`.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import test_real_components as real
import yaml
from realkit import CHART, KUBE_VERSION, NODES, RELEASE, RELEASE_NS, VALUES, RealCluster
from test_real_components import ns  # noqa: F401  (the fixture)

pytestmark = pytest.mark.parametrize("realcluster", ["cluster"], indirect=True)

STAGE = "node-not-ready.stage.kwok.x-k8s.io"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
KCOVER_TAINT = "kcover.io/unhealthy"
STALLED = "KcoverRecoveryStalled"
ESCALATED = "KcoverEscalated"
UNCORDONED = "KcoverUncordonedNode"
VALIDATION = "KcoverValidation"
SETTLE = 3.0
NO_NODE_COOLDOWN = ("--set", "recovery.node_cooldown_seconds=0")
"""The nodes are shared by the session's tests and kcover keeps cordon cooldowns in the cluster (its
ledger): a test that cordons a node another test cordoned minutes ago must not be held back by it.
(This module runs after test_real_components.py, whose gpu-xid scenario keeps the chart's cooldown.)"""
DIAG_PASS = Path(__file__).resolve().parents[2] / "fixtures" / "dcgmi-diag" / "ramble-r3-pass-dcgm3.3.9-h200x8-table.txt"


def _node(rc: RealCluster, name: str) -> dict[str, Any]:
    return dict(rc.ok("GET", f"/api/v1/nodes/{name}"))


def _ready(node: dict[str, Any]) -> str:
    return next((c["status"] for c in (node.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), "")


def _taints(node: dict[str, Any]) -> set[str]:
    return {t["key"] for t in (node.get("spec") or {}).get("taints") or []}


def _go_not_ready(rc: RealCluster, name: str) -> None:
    """kwok's node-not-ready Stage: Ready=False with the reason and message a kubelet problem leaves."""
    rc.ok("PATCH", f"/api/v1/nodes/{name}", {"metadata": {
        "labels": {STAGE: "true"},
        "annotations": {f"{STAGE}/reason": "KubeletNotReady", f"{STAGE}/message": "PLEG is not healthy",
                        f"{STAGE}/delay": "0", f"{STAGE}/jitter-delay": "0"}}},
        content_type="application/merge-patch+json")
    real._until(lambda: _ready(_node(rc, name)) == "False", f"kwok to mark {name} NotReady")


def _back_to_ready(rc: RealCluster, name: str) -> None:
    rc.ok("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": {STAGE: None}}},
          content_type="application/merge-patch+json")
    real._until(lambda: _ready(_node(rc, name)) == "True" and NOT_READY_TAINT not in _taints(_node(rc, name)),
                f"{name} Ready again without Kubernetes' not-ready taint")


def _node_events(rc: RealCluster, name: str, reason: str) -> list[dict[str, Any]]:
    items = []
    for where in ("default", RELEASE_NS):
        items += rc.ok("GET", f"/api/v1/namespaces/{where}/events")["items"]
    return [e for e in items if e.get("reason") == reason and e["involvedObject"].get("kind") == "Node"
            and e["involvedObject"].get("name") == name]


def test_a_not_ready_node_is_left_to_kubernetes(realcluster: RealCluster, ns: str) -> None:  # noqa: F811
    rc = realcluster
    job = real._pytorchjob(rc, ns, "train")
    pods = real._pods(rc, ns, "train")
    sick = pods[0]["spec"]["nodeName"]
    real._controller(rc)
    try:
        _go_not_ready(rc, sick)
        real._until(lambda: NOT_READY_TAINT in _taints(_node(rc, sick)),
                    "kube-controller-manager's node.kubernetes.io/not-ready taint")
        time.sleep(SETTLE)  # room for kcover to (wrongly) act
        node = _node(rc, sick)
        assert not node["spec"].get("unschedulable")
        assert KCOVER_TAINT not in _taints(node)
        assert not real._restart_events(rc, ns, job["metadata"]["uid"])
        assert real._uids(real._pods(rc, ns, "train")) == real._uids(pods)
    finally:
        _back_to_ready(rc, sick)


def test_a_ready_rule_cordons_a_not_ready_node_restarts_elsewhere_and_returns_it(realcluster: RealCluster,
                                                                                 ns: str) -> None:  # noqa: F811
    rc = realcluster
    job = real._pytorchjob(rc, ns, "train")
    pods = real._pods(rc, ns, "train")
    sick = pods[0]["spec"]["nodeName"]
    rules = {"conditions": [{"type": "KcoverGPUHealthy", "bad_status": "False"},
                            {"type": "Ready", "bad_status": "False", "min_duration_seconds": 1}],
             "min_duration_seconds": 0, "tick_seconds": 0.2, "recovered_hold_seconds": 1}
    real._controller(rc, extra=("--set", f"detectors.entries.node-condition.config={json.dumps(rules)}",
                                "--set", "recovery.uncordon_enabled=true", *NO_NODE_COOLDOWN))
    tl = real.Timeline("node-not-ready")
    try:
        _go_not_ready(rc, sick)
        tl.mark("NotReady (kwok)")

        def cordoned() -> bool:
            node = _node(rc, sick)
            return bool(node["spec"].get("unschedulable")) and KCOVER_TAINT in _taints(node)

        real._until(cordoned, f"kcover to cordon {sick}")
        tl.mark("cordoned")
        moved = real._recovered(rc, ns, job, real._uids(pods), tl, avoid=sick)
        assert sick not in {p["spec"]["nodeName"] for p in moved}
    finally:
        _back_to_ready(rc, sick)
    tl.mark("Ready again (kwok)")
    real._until(lambda: not _node(rc, sick)["spec"].get("unschedulable"), f"kcover to un-cordon {sick}")
    tl.mark("un-cordoned")
    tl.report()
    assert KCOVER_TAINT not in _taints(_node(rc, sick))
    assert _node_events(rc, sick, UNCORDONED)


def test_restart_stalled_reports_the_real_schedulers_message(realcluster: RealCluster, ns: str) -> None:  # noqa: F811
    """Every node cordoned by a person for maintenance (running pods stay): kcover's restart leaves the new
    pods Pending, the real kube-scheduler says why, and kcover reports the recovery Stalled with its words."""
    rc = realcluster
    job = real._pytorchjob(rc, ns, "train")
    old = real._uids(real._pods(rc, ns, "train"))
    for node in real._nodes(rc):
        rc.ok("PATCH", f"/api/v1/nodes/{node['metadata']['name']}", {"spec": {"unschedulable": True}},
              content_type="application/merge-patch+json")
    real._controller(rc, extra=("--set", "recovery.verify.deadline_seconds=3",
                                "--set", "recovery.resume_interval_seconds=0.3"))
    tl = real.Timeline("restart-stalled")
    real._fail_container(rc, real._pods(rc, ns, "train")[1], message="worker group failed (exitcode: 1)")
    uid = job["metadata"]["uid"]
    real._until(lambda: real._restart_events(rc, ns, uid), "kcover's restart Event")
    tl.mark("acted (restart Event)")

    def unschedulable() -> str:
        for pod in real._pods(rc, ns, "train"):
            if pod["metadata"]["uid"] in old:
                continue
            cond = next((c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"), {})
            if cond.get("reason") == "Unschedulable":
                return str(cond["message"])
        return ""

    message = real._until(unschedulable, "the scheduler to leave a new pod Unschedulable")
    tl.mark("Unschedulable (kube-scheduler)")

    def stalled() -> list[dict[str, Any]]:
        items = rc.ok("GET", f"/api/v1/namespaces/{ns}/events")["items"]
        return [e for e in items if e.get("reason") == STALLED and e["involvedObject"].get("uid") == uid]

    events = real._until(stalled, "a KcoverRecoveryStalled Event", within=30)
    tl.mark("Stalled reported")
    tl.report()
    print(f"kube-scheduler: {message}\nkcover: {events[0]['message']}")
    n = len(NODES)
    assert message.startswith(f"0/{n} nodes are available: {n} node(s) were unschedulable."), message
    assert "Stalled: Unschedulable" in events[0]["message"]
    assert message.split(" preemption:")[0] in events[0]["message"]


def _agent_role_with_validation(rc: RealCluster, tmp: Path) -> dict[str, Any]:
    """The agent's ClusterRole as the chart renders it with `returnValidation.enabled=true`."""
    values = {**VALUES, "returnValidation": {"enabled": True, "diagLevel": 3}}
    proc = subprocess.run([rc.helm, "template", RELEASE, str(CHART), "--namespace", RELEASE_NS, "--values", "-",
                           "--kube-version", KUBE_VERSION], input=json.dumps(values), capture_output=True, text=True,
                          check=True, timeout=120, env={**os.environ, "HELM_CACHE_HOME": str(tmp / "hc"),
                                                        "HELM_CONFIG_HOME": str(tmp / "hcfg"),
                                                        "HELM_DATA_HOME": str(tmp / "hd")})
    return next(doc for doc in yaml.safe_load_all(proc.stdout) if doc and doc["kind"] == "ClusterRole"
                and doc["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "agent")


def test_node_repaired_returns_after_its_validation(realcluster: RealCluster, ns: str,  # noqa: F811
                                                    tmp_path: Path) -> None:
    """An XID 79 from the agent's (fake) NVML cordons the node and moves the job; the GPU is reset (the
    agent's condition good again); kcover asks the node's agent for `dcgmi diag -r 3`, the agent's fake
    dcgmi prints a real passing run, and kcover un-cordons the node: the real scheduler places a pod
    there again."""
    rc = realcluster
    role = _agent_role_with_validation(rc, tmp_path)
    path = f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role['metadata']['name']}"
    installed = rc.ok("GET", path)
    rc.ok("PUT", path, {**role, "metadata": {**role["metadata"], "resourceVersion": installed["metadata"]["resourceVersion"]}})
    dcgmi = tmp_path / "dcgmi"
    dcgmi.write_text(f"#!/bin/sh\ncat {DIAG_PASS}\n")
    dcgmi.chmod(0o755)
    try:
        job = real._pytorchjob(rc, ns, "train")
        pods = real._pods(rc, ns, "train")
        sick = pods[0]["spec"]["nodeName"]
        agent = rc.start("agent", f"kcover-agent-{sick}", node=sick, extra=(
            "--set", "agent.validation.enabled=true", "--set", f"agent.validation.dcgmi_path={dcgmi}",
            "--set", "agent.validation.timeout_seconds=10"))
        rc.wait_ready(agent)
        hold = {"min_duration_seconds": 0, "tick_seconds": 0.2, "recovered_hold_seconds": 1}
        real._controller(rc, extra=(
            "--set", "recovery.uncordon_enabled=true", "--set", "recovery.return_validation.enabled=true",
            "--set", "recovery.return_validation.diag_level=3", "--set", "recovery.return_validation.timeout_seconds=15",
            "--set", f"detectors.entries.node-condition.config={json.dumps(hold)}", *NO_NODE_COOLDOWN))
        tl = real.Timeline("node-repaired")
        agent.inject("xid 79 0")
        real._until(lambda: bool(_node(rc, sick)["spec"].get("unschedulable")), f"kcover to cordon {sick}")
        tl.mark("cordoned")
        real._recovered(rc, ns, job, real._uids(pods), tl, avoid=sick)
        agent.inject("clear 0")
        tl.mark("repaired (GPU reset)")
        real._until(lambda: not _node(rc, sick)["spec"].get("unschedulable"), f"kcover to un-cordon {sick}", within=60)
        tl.mark("un-cordoned")
        tl.report()
        node = _node(rc, sick)
        asked = _node_events(rc, sick, VALIDATION)
        validated = next(c for c in node["status"]["conditions"] if c["type"] == "KcoverGPUValidated")
        assert validated["status"] == "True"
        assert any("dcgmi diag -r 3" in e.get("message", "") for e in asked), asked
        assert KCOVER_TAINT not in _taints(node)
        assert _node_events(rc, sick, UNCORDONED)
        # the scheduler uses the node again: a pod that requires it is placed there (with a preferred affinity
        # the pod once went to another of the nine nodes, likely placed before the scheduler saw the un-cordon)
        again = real._pytorchjob(rc, ns, "again", on=sick, workers=1)
        assert [p["spec"]["nodeName"] for p in real._pods(rc, ns, "again")] == [sick], again["metadata"]["name"]
    finally:
        current = rc.ok("GET", path)
        rc.ok("PUT", path, {**installed, "metadata": {**installed["metadata"],
                                                      "resourceVersion": current["metadata"]["resourceVersion"]}})
