"""Conformance: the workload kinds the playground's controllers act on, as kube-apiserver stores them: a
batch/v1 Job's defaults and generated selector (what the Job controller selects its pods by), and
apps/v1 DaemonSets (what `kubectl drain --ignore-daemonsets` looks up for a DaemonSet-owned pod)."""

# ruff: noqa: PT018  (compound asserts read as one expectation about one answer)
from __future__ import annotations

from typing import Any

from conformance_client import Api, skip_unless_recorded_minor
from test_tables import table_of

TEMPLATE = {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}


async def test_a_job_gets_its_defaults_and_a_selector_on_its_uid(conformance_api: Api, ns: str) -> None:
    made = await conformance_api.ok("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", body={
        "metadata": {"name": "plain"}, "spec": {"suspend": True, "template": TEMPLATE}})
    uid, spec = made["metadata"]["uid"], made["spec"]
    assert (spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (1, 1, 6)
    assert (spec["completionMode"], spec["suspend"], spec["manualSelector"]) == ("NonIndexed", True, False)
    assert spec["podReplacementPolicy"] == "TerminatingOrFailed"
    assert spec["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    assert spec["template"]["metadata"]["labels"] == {
        "batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": "plain",
        "controller-uid": uid, "job-name": "plain"}
    assert made["metadata"]["labels"] == spec["template"]["metadata"]["labels"]  # the template's, as it had none
    assert made["metadata"]["generation"] == 1
    assert not made.get("status")


async def test_a_job_with_a_pod_failure_policy_replaces_only_failed_pods(conformance_api: Api, ns: str) -> None:
    policy: dict[str, Any] = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    made = await conformance_api.ok("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", body={
        "metadata": {"name": "tolerant", "labels": {"team": "ml"}},
        "spec": {"suspend": True, "parallelism": 3, "podFailurePolicy": policy, "template": TEMPLATE}})
    spec = made["spec"]
    assert spec["podReplacementPolicy"] == "Failed"
    assert "completions" not in spec and spec["parallelism"] == 3
    assert spec["podFailurePolicy"]["rules"][0]["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    assert made["metadata"]["labels"] == {"team": "ml"}  # its own labels are kept


async def test_daemonsets_are_served_under_apps_v1(conformance_api: Api, ns: str) -> None:
    await skip_unless_recorded_minor(conformance_api, "the DaemonSet Table's column descriptions")
    apps = await conformance_api.ok("GET", "/apis/apps/v1")
    by_name = {r["name"]: r for r in apps["resources"]}
    assert by_name["daemonsets"]["kind"] == "DaemonSet" and by_name["daemonsets"]["namespaced"] is True
    assert "ds" in by_name["daemonsets"]["shortNames"] and "daemonsets/status" in by_name
    groups = await conformance_api.ok("GET", "/apis")
    assert "apps" in {g["name"] for g in groups["groups"]}
    labels = {"app.kubernetes.io/name": "agent"}
    made = await conformance_api.ok("POST", f"/apis/apps/v1/namespaces/{ns}/daemonsets", body={
        "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
            "nodeSelector": {"gpu": "true"}, "containers": [{"name": "agent", "image": "kcover-agent"}]}}}})
    assert made["metadata"]["generation"] == 1
    got = await conformance_api.ok("GET", f"/apis/apps/v1/namespaces/{ns}/daemonsets/agent")
    assert got["metadata"]["uid"] == made["metadata"]["uid"]
    rows = await table_of(conformance_api, f"/apis/apps/v1/namespaces/{ns}/daemonsets", "daemonsets.apps")
    assert [r[:7] for r in rows] == [["agent", 0, 0, 0, 0, 0, "gpu=true"]]
    assert rows[0][8:] == ["agent", "kcover-agent", "app.kubernetes.io/name=agent"]
