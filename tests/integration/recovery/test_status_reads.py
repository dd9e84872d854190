"""`kcover status` and `kcover breaker reset` read the running kcover where the chart keeps it, on every backend
(the simulated server and a real kube-apiserver), through a kubeconfig as a person runs them.

The release namespace holds the chart's config ConfigMap (`kcover-config`, the controllers' config.yaml: limits
unlike the defaults), the controls ConfigMap (the global pause) and the ledger (LedgerEntry objects written
through `ledger.Ledger`, as the leader writes them): a latched breaker, a held restart, workloads restarted and
nodes cordoned within the breaker's window, a restart's intent (which may outlive its restart: no count of
restarts in flight), a suspect node and a validated one. Status must
show each with the limits of that ConfigMap, not its own defaults. A reset of a breaker that is not latched must
write nothing; one of a latched breaker writes its request in the release namespace given.
On kube-apiserver nodes are shared between tests: the GPU nodes are those of a resource name unique to the test,
and what other tests left (cordoned or paused nodes) may show beside this test's.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable
from typing import Any

import yaml
from enginekit import run_cli as _cli

from kcover.kube import gateway
from kcover.kube import projections as proj
from kcover.recovery import controls, ledger, ledgerentries

Cluster = Any


async def _node(cluster: Cluster, name: str, capacity: dict[str, str], annotations: dict[str, str], *,
                unschedulable: bool = False) -> None:
    kube = cluster.client
    await kube.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node",
                                                      "metadata": {"name": name, "annotations": annotations},
                                                      "spec": {"unschedulable": unschedulable}})
    node = await kube.request("GET", f"/api/v1/nodes/{name}")
    node["status"] = {"capacity": capacity, "allocatable": capacity,
                      "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": ""}]}
    await kube.request("PUT", f"/api/v1/nodes/{name}/status", body=node)


def _book(cluster: Cluster) -> ledger.Ledger:
    return ledger.Ledger(gateway.Http(cluster.client), namespace=cluster.namespace, name="kcover-ledger",
                         retention_seconds=lambda: 86400.0)


def _set(**fields: Any) -> Callable[[ledgerentries.Entry, dict[str, float]], None]:
    def mutate(entry: ledgerentries.Entry, signals: dict[str, float]) -> None:
        for key, value in fields.items():
            if key == "record":
                assert isinstance(entry, ledgerentries.Unit)
                entry.record(*value)
            else:
                setattr(entry, key, value)
    return mutate


async def _config_map(cluster: Cluster, name: str, *, data: dict[str, str] | None = None,
                      annotations: dict[str, str] | None = None) -> None:
    await cluster.client.request("POST", f"/api/v1/namespaces/{cluster.namespace}/configmaps", body={
        "apiVersion": "v1", "kind": "ConfigMap", "data": data or {},
        "metadata": {"name": name, "annotations": annotations or {}, "labels": {"app.kubernetes.io/name": "kcover"}}})


async def test_status_shows_the_controllers_breaker_limits_pauses_held_restarts_and_suspects(cluster: Cluster) -> None:
    ns, tag = cluster.namespace, secrets.token_hex(3)
    gpu = f"gpu-{tag}.kcover-test.io/gpu"
    nodes = [f"st-{tag}-{i}" for i in range(4)]
    now = time.time()
    cordon = {proj.CORDONED_BY: "kcover", proj.CORDON_REASON: "XID 79 on GPU 3", proj.CORDONED_AT: "2026-05-01T03:12:09Z"}
    for i, name in enumerate(nodes):
        marks = cordon if i < 2 else {controls.PAUSED: "true"} if i == 3 else {}
        await _node(cluster, name, {gpu: "8", "cpu": "64"}, marks, unschedulable=i < 2)  # kcover's cordons
    config = {"kube": {"gpu_resources": [gpu], "gpu_dra_drivers": [], "workload_kinds": ["pytorchjobs.kubeflow.org"]},
              "recovery": {"max_cordoned_fraction": 0.5, "max_cordons_per_window": 3,
                           "max_cordons_per_window_fraction": 1.0, "max_restarted_workloads_per_window": 7,
                           "max_concurrent_restarts": 4, "breaker_cooldown_seconds": 120,
                           "record_only": ["cordon", "drain"], "judgement": {"suspect_device": "record"}}}
    await _config_map(cluster, "kcover-config", data={"config.yaml": yaml.safe_dump(config)})
    await _config_map(cluster, "kcover-controls", annotations={controls.PAUSED: "true"})
    await cluster.client.request("PATCH", f"/api/v1/namespaces/{ns}", body={"metadata": {"labels": {
        controls.PAUSED: "true"}}}, content_type="application/merge-patch+json")
    await cluster.client.request("POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", body={
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "train", "annotations": {controls.PAUSED: "true"}},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "restartPolicy": "OnFailure"}}}})
    book = _book(cluster)
    tripped = "breaker tripped: kcover cordoned 3 nodes within 3600s (limit 3)"
    await book.update(ledgerentries.BREAKER_KEY, _set(opened_at=now - 600, reason=tripped), now=now)
    hold = ledgerentries.HeldRestart(code="BreakerLatched", text="breaker latched open", at=now - 300, until=now + 1500,
                                     cause="{}")
    await book.update("w.u1", _set(record=(now - 900, nodes[0]), note=f"PyTorchJob {ns}/train", held=hold), now=now)
    intent = ledgerentries.Intent(id="i1", fault="f1", leader="a", epoch=1, at=now - 800,
                                  workload=("PyTorchJob", "kubeflow.org/v1", ns, "other", "uid-2"))
    await book.update("w.u2", _set(record=(now - 800, nodes[1]), note=f"PyTorchJob {ns}/other", intent=intent),
                      now=now)
    await book.update(f"n.{nodes[0]}", _set(cordoned_at=now - 1000, reason="XID 79"), now=now)
    await book.update(f"n.{nodes[1]}", _set(cordoned_at=now - 7200, reason="XID 79"), now=now)  # before the window
    evidence = "3 different workloads restarted within 21600s for faults on this node"
    await book.update(f"n.{nodes[2]}", _set(suspect_at=now - 100, suspicion=evidence), now=now)
    await book.update(f"n.{nodes[3]}", _set(suspect_at=now - 900, suspicion=evidence, judged_at=now - 800,
                                            verdict=ledgerentries.Verdict.HEALTHY), now=now)
    base = ("status", "--kubeconfig", cluster.kubeconfig_path, "--namespace", ns)
    code, text, err = await asyncio.to_thread(_cli, *base)
    code_json, doc_text, _ = await asyncio.to_thread(_cli, *base, "-o", "json")
    doc = json.loads(doc_text)
    assert (code, code_json) == (1, 1), text + err  # latched: a person resets it
    assert f"settings:   ConfigMap {ns}/kcover-config (the controllers')" in text
    assert doc["settings"] == {"config_map": f"{ns}/kcover-config", "found": True, "problem": ""}
    assert doc["held_back"] == [
        "recovery.record_only: cordon, drain: decided and recorded, not carried out",
        "recovery.judgement.suspect_device: record (decides and says so; kcover acts as without it)"]
    assert ("acting:     NOT on everything it decides:\n"
            "            recovery.record_only: cordon, drain: decided and recorded, not carried out\n") in text
    breaker = doc["breaker"]
    assert (breaker["latched"], breaker["reason"], breaker["cooldown_seconds"]) == (True, tripped, 120)
    assert breaker["reset_does"] == ("closes the latch; then restarts and cordons stay refused for 120s "
                                     "(recovery.breaker_cooldown_seconds), the 1 held restart is planned again, and the breaker's "
                                     "window starts again at the reset (the limits on what is cordoned at once still "
                                     "count every cordon)")
    assert f"breaker:    LATCHED OPEN since {breaker['since']}: {tripped}" in text
    limits = {lim["name"]: lim for lim in doc["limits"]}
    assert doc["gpu_nodes"] == 4
    held_now = limits["nodes cordoned at once"]
    assert held_now["limit"] == 2  # half of the test's 4 GPU nodes, not the default 5 % (one node)
    assert held_now["setting"] == ("recovery.max_cordoned_fraction 0.5 of 4 GPU nodes, "
                                   "recovery.max_cordoned_nodes 50")
    assert held_now["used"] >= 2  # on kube-apiserver, other tests' nodes kcover cordoned count too
    assert held_now["reached"] is True
    assert {k: (v["used"], v["limit"], v["reached"]) for k, v in limits.items() if k != "nodes cordoned at once"} == {
        "cordons in 3600s": (1, 3, False), "workloads restarted in 3600s": (2, 7, False),
        "restarts in flight": (None, 4, False)}  # the intent of w.u2 may be one finished: only the leader knows
    assert {c["node"] for c in doc["cordoned"]} >= {nodes[0], nodes[1]}
    assert set(doc["paused"]) >= {f"every target (kcover.io/paused=true on ConfigMap {ns}/kcover-controls)",
                                  f"namespace {ns}", f"PyTorchJob {ns}/train", f"Node {nodes[3]}"}
    assert [(h["key"], h["what"], h["code"], h["text"]) for h in doc["held"]] == [
        ("w.u1", f"PyTorchJob {ns}/train", "BreakerLatched", "breaker latched open")]
    assert doc["held"][0]["expires"] > doc["held"][0]["since"]
    assert [(s["node"], s["verdict"], s["evidence"]) for s in doc["suspects"]] == [
        (nodes[2], "", evidence), (nodes[3], "healthy", evidence)]
    for line in (f"  PyTorchJob {ns}/train: BreakerLatched since ", f"  {nodes[2]}  suspect since ",
                 "validation asked, not answered yet", f"  {nodes[3]}  suspect since ", "validated healthy at ",
                 "  restarts in flight:                  at most 4  (recovery.max_concurrent_restarts 4: past it a "
                 "restart waits; the leader counts them in its memory)"):
        assert line in text, line
    assert doc["problems"] == [  # the reached cordon limit is the latch's: the latch is what a person acts on
        f"no controller leads: Lease {ns}/kcover-controller has no holder",
        f"the breaker is latched open since {breaker['since']} ({tripped}); `kcover breaker reset` "
        f"{breaker['reset_does']}"]


async def test_a_reset_of_a_breaker_that_is_not_latched_writes_nothing_and_says_so(cluster: Cluster) -> None:
    ns = cluster.namespace
    book = _book(cluster)
    now = time.time()
    await book.update(ledgerentries.BREAKER_KEY, _set(closed_at=now - 30), now=now)  # reset half a minute ago: closed
    await _config_map(cluster, "kcover-config", data={"config.yaml": "recovery: {breaker_cooldown_seconds: 120}\n"})
    before = await cluster.client.request("GET", f"/apis/kcover.io/v1alpha1/namespaces/{ns}/ledgerentries")
    code, out, err = await asyncio.to_thread(_cli, "breaker", "reset", "--kubeconfig", cluster.kubeconfig_path,
                                             "--namespace", ns)
    after = await cluster.client.request("GET", f"/apis/kcover.io/v1alpha1/namespaces/{ns}/ledgerentries")
    controls_cm = await gateway.Http(cluster.client).get_config_map(ns, "kcover-controls")
    status_code, text, _ = await asyncio.to_thread(_cli, "status", "--kubeconfig", cluster.kubeconfig_path,
                                                   "--namespace", ns)
    assert (code, out, err) == (0, "the breaker is not latched: nothing to reset, nothing was changed\n", "")
    assert controls_cm is None  # no request was written
    assert [(i["metadata"]["name"], i["metadata"]["resourceVersion"]) for i in after["items"]] == \
        [(i["metadata"]["name"], i["metadata"]["resourceVersion"]) for i in before["items"]]
    assert "breaker:    closed, cooling down: reset at " in text  # the cooldown of the cluster's 120 s
    assert "(recovery.breaker_cooldown_seconds 120)" in text
    assert "            a reset does nothing: the breaker is not latched (`kcover breaker reset` changes nothing" in text
    assert status_code == 1  # no controller leads in this test's namespace
    assert "the breaker is latched" not in text


async def test_a_reset_of_a_latched_breaker_is_requested_in_the_release_namespace(cluster: Cluster) -> None:
    ns = cluster.namespace
    now = time.time()
    await _book(cluster).update(ledgerentries.BREAKER_KEY, _set(opened_at=now - 60, reason="breaker tripped"), now=now)
    code, out, err = await asyncio.to_thread(_cli, "breaker", "reset", "--kubeconfig", cluster.kubeconfig_path,
                                             "--namespace", ns, "--wait", "1")
    cm = await gateway.Http(cluster.client).get_config_map(ns, "kcover-controls")
    assert code == 1, out  # no controller leads here to act on it
    assert f"reset requested on ConfigMap {ns}/kcover-controls" in out
    assert err.startswith(f"kcover breaker reset: the controllers' settings were not read (ConfigMap {ns}/kcover-config "
                          "not found): using this command's\n"), err  # this test installs no kcover-config
    assert cm is not None
    assert controls.BREAKER_RESET in (cm["metadata"].get("annotations") or {})


async def test_status_says_when_the_controllers_settings_cannot_be_read_and_judges_with_its_own(
        cluster: Cluster) -> None:
    ns = cluster.namespace
    await _config_map(cluster, "not-yaml", data={"config.yaml": "recovery: [unclosed\n"})
    await _config_map(cluster, "invalid", data={"config.yaml": "recovery: {max_cordoned_fraction: 7}\n"})
    await _config_map(cluster, "a-list", data={"config.yaml": "- recovery\n"})
    cases = {"absent": f"ConfigMap {ns}/absent not found",
             "not-yaml": f"ConfigMap {ns}/not-yaml config.yaml is not YAML: ",
             "invalid": f"ConfigMap {ns}/invalid config.yaml does not validate: ",
             "a-list": f"ConfigMap {ns}/a-list config.yaml: the top level is not a mapping"}
    for name, problem in cases.items():
        code, doc_text, err = await asyncio.to_thread(
            _cli, "status", "--kubeconfig", cluster.kubeconfig_path, "--namespace", ns, "--config-map", name,
            "--set", "recovery.max_concurrent_restarts=3", "--set", "recovery.dry_run=true", "-o", "json")
        doc = json.loads(doc_text)
        assert code == 1, err
        assert doc["settings"]["found"] is False
        assert doc["settings"]["problem"].startswith(problem), (name, doc["settings"])
        if name == "invalid":
            assert "recovery.max_cordoned_fraction" in doc["settings"]["problem"]
        assert doc["problems"][0].startswith(f"the controllers' settings were not read ({problem}")
        limits = {lim["name"]: lim["limit"] for lim in doc["limits"]}
        assert limits["restarts in flight"] == 3  # this command's --set, said to be its own
        assert doc["held_back"] == ["recovery.dry_run: every action is decided and recorded (Events, Recoveries), "
                                    "none carried out"]
        assert doc["lease"] == f"{ns}/kcover-controller"  # the release namespace still, as the chart sets it
