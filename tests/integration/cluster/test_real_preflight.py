"""The `preflight-slow-node` scenario on real components (the `cluster` backend, realkit.py).

The chart is installed with `preflight.enabled` (the PreflightReport CRD, the agent's hostPath, the RBAC
verbs, the recovery rule). An eight-rank PyTorchJob (one Master, seven Workers, each pod taking a whole
8-GPU node) opts in to preflight; the real training operator creates its pods, the real scheduler
spreads them over eight of the nine kwok nodes and kwok runs them, their `preflight` init containers
ending at once. Each rank's report file (the pairwise results of real nccl-tests runs, every pair with
one node at NVLink-disabled speed) lands where its init container writes it: the agent's report
directory on that rank's node (a hostPath; realkit gives each node its own directory). One
`kcover agent` per node and a `kcover controller` run with the chart's ServiceAccount tokens, so the
chart's RBAC is all they have.

What a user sees, checked: `kubectl get pfr -w` shows every report's verdict Degraded and the slow
node's own report Slow at 19.98 GB/s (the CRD's printer columns over the status the controller wrote);
kcover cordons and taints that node and restarts the job; the operator recreates the pods, the
scheduler puts them on the other eight nodes (the spare included), the job is Running again. The old
reports go with their pods (the real garbage collector: they are owned by them; the cordon Event on
the node still says why), and the recreated pods' own preflight, all pairs healthy, gives eight new reports that `kubectl get pfr` shows Healthy.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import test_real_components as real
import test_real_nodes
from realkit import NODES, RealCluster
from test_real_components import ns  # noqa: F401  (the fixture)

preflight = pytest.importorskip("kcover_preflight.scenario")

pytestmark = pytest.mark.parametrize("realcluster", ["cluster"], indirect=True)

JOB = preflight.JOB
RANKS = preflight.NODES
SLOW_RANK = preflight.SLOW_RANK
WAIT = 90.0
HOST_PATH = "/var/lib/kcover/preflight"
"""The chart's `preflight.hostPath` (its default), where the init containers write on each node."""
PFRS = "/apis/kcover.io/v1alpha1/namespaces/{ns}/preflightreports"
COLUMNS = ["NAME", "WORKLOAD", "RANK", "NODE", "VERDICT", "NODE-VERDICT", "MIN-BUSBW", "SLOW-NODES", "AGE"]
NO_NODE_COOLDOWN = ("--set", "recovery.node_cooldown_seconds=0")
"""The nodes are shared by the session's tests and kcover keeps cordon cooldowns in its ledger: the slow
node may be one another test cordoned minutes ago."""


def _pfrs(rc: RealCluster, namespace: str) -> list[dict[str, Any]]:
    return sorted(rc.ok("GET", PFRS.format(ns=namespace))["items"], key=lambda o: int(o["spec"]["rank"]))


def _owners(pfrs: list[dict[str, Any]]) -> set[str]:
    return {str(o["metadata"]["ownerReferences"][0]["uid"]) for o in pfrs}


def _kubectl(rc: RealCluster) -> list[str]:
    return [str(rc.stack.bin_dir / "kubectl"), "--kubeconfig", rc.kubeconfig_path]


def _rows(text: str) -> list[list[str]]:
    """`kubectl get pfr` table rows (header lines left out), split into cells."""
    return [line.split() for line in text.splitlines() if line.strip() and not line.startswith("NAME ")]


def _cordoned(rc: RealCluster, node: str) -> bool:
    spec = rc.ok("GET", f"/api/v1/nodes/{node}").get("spec") or {}
    return bool(spec.get("unschedulable")) and any(t["key"] == "kcover.io/unhealthy" for t in spec.get("taints") or [])


def test_preflight_slow_node_is_cordoned_and_the_job_runs_elsewhere(realcluster: RealCluster, ns: str,  # noqa: F811
                                                                    tmp_path: Path) -> None:
    rc = realcluster
    agents = [rc.start("agent", f"kcover-agent-{node}", node=node) for node in NODES]
    real._controller(rc, extra=NO_NODE_COOLDOWN)
    rc.wait_ready(*agents, timeout=120)

    manifest = preflight.job_manifest()
    manifest["metadata"]["namespace"] = ns
    job = rc.ok("POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", manifest)
    pods = real._until(lambda: real._running(rc, ns, JOB, RANKS), f"PyTorchJob {JOB} Running on kwok", within=WAIT)
    assert len({p["spec"]["nodeName"] for p in pods}) == RANKS, "one rank per node"
    assert all(s["state"]["terminated"]["exitCode"] == 0
               for p in pods for s in p["status"]["initContainerStatuses"] if s["name"] == "preflight")
    old = real._uids(pods)

    watch_log, watch_err = tmp_path / "kubectl-get-pfr-w.txt", tmp_path / "kubectl-get-pfr-w.stderr"
    with watch_log.open("wb") as out, watch_err.open("wb") as err:
        # -v=6 logs kubectl's requests on stderr: the reports are written once its watch is open, so a
        # kubectl slow to start (a loaded machine) cannot list them after some already went with their pods
        watcher = subprocess.Popen([*_kubectl(rc), "get", "pfr", "-n", ns, "-w", "-v=6"], stdout=out, stderr=err)
    try:
        real._until(lambda: "watch=true" in watch_err.read_text(errors="replace"), "kubectl get pfr -w watching",
                    within=WAIT)
        tl = real.Timeline("preflight-slow-node")
        slow = preflight.write_reports(lambda node: rc.host_path(node, HOST_PATH), ns, JOB, pods,
                                       slow_rank=SLOW_RANK)
        tl.mark("reports written")
        first = real._until(lambda: (found := _pfrs(rc, ns)) and len(found) == RANKS and found,
                            f"{RANKS} PreflightReports from the agents", within=WAIT)
        tl.mark("PreflightReports created (agents)")
        assert [o["spec"]["nodeName"] for o in first] == [p["spec"]["nodeName"] for p in
                                                          sorted(pods, key=preflight.rank_of)]
        assert _owners(first) == old
        assert {o["spec"]["workloadUID"] for o in first} == {job["metadata"]["uid"]}

        real._until(lambda: _cordoned(rc, slow), f"kcover to cordon and taint {slow}", within=WAIT)
        tl.mark("cordoned")
        real._until(lambda: real._restart_events(rc, ns, job["metadata"]["uid"]), f"kcover's restart Event for {JOB}")
        tl.mark("acted (restart Event)")

        def recreated() -> bool:
            live = [p for p in real._pods(rc, ns, JOB) if not p["metadata"].get("deletionTimestamp")]
            return len(live) == RANKS and not (real._uids(live) & old)

        real._until(recreated, f"the training operator to recreate {JOB}'s pods", within=WAIT)
        tl.mark("recreated by the operator")
        moved = real._until(lambda: real._running(rc, ns, JOB, RANKS, old=old, avoid=slow),
                            f"{JOB} Running again away from {slow}", within=WAIT)
        tl.mark("job Running again")
        assert {p["spec"]["nodeName"] for p in moved} == set(NODES) - {slow}
        assert [n for n in NODES if rc.ok("GET", f"/api/v1/nodes/{n}")["spec"].get("unschedulable")] == [slow]
        real._until(lambda: not (_owners(_pfrs(rc, ns)) & old), "the old reports to go with their pods (GC)",
                    within=WAIT)
        tl.mark("old reports garbage-collected")
        # what still says why, with the reports gone: kcover's Event on the node
        said = [e["message"] for e in test_real_nodes._node_events(rc, slow, "KcoverCordonedNode")]
        assert any("PreflightSlowNode" in m and "19.98 GB/s" in m for m in said), said
    finally:
        watcher.terminate()
        watcher.wait(10)
    watched = watch_log.read_text(errors="replace")
    print(f"kubectl get pfr -w:\n{watched}")
    assert watched.splitlines()[0].split() == COLUMNS, watched
    judged = [r for r in _rows(watched) if r[4:5] == ["Degraded"]]
    assert {r[0] for r in judged} == {o["metadata"]["name"] for o in first}, "every report showed Degraded"
    assert any(r[3] == slow and r[4:7] == ["Degraded", "Slow", "19.98"] for r in judged), watched
    assert all(slow in r[7] for r in judged), watched
    assert all(r[5] == "Healthy" for r in judged if r[3] != slow), watched

    # the recreated pods ran their preflight too: every pair healthy this time
    assert preflight.write_reports(lambda node: rc.host_path(node, HOST_PATH), ns, JOB, moved, slow_rank=None) == ""
    new = real._until(lambda: (found := _pfrs(rc, ns)) and len(found) == RANKS and all(
        (o.get("status") or {}).get("verdict") == "Healthy" for o in found) and found,
        "the re-run's eight PreflightReports judged Healthy", within=WAIT)
    tl.mark("re-run's preflight Healthy")
    tl.report()
    assert _owners(new) == real._uids(moved)
    shown = subprocess.run([*_kubectl(rc), "get", "pfr", "-n", ns], capture_output=True, text=True, timeout=30,
                           check=False)
    print(f"kubectl get pfr:\n{shown.stdout}")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0].split() == COLUMNS
    rows = _rows(shown.stdout)
    assert sorted(r[3] for r in rows) == sorted(set(NODES) - {slow})
    assert all(r[4:6] == ["Healthy", "Healthy"] and float(r[6]) > 300 for r in rows), shown.stdout
    assert len(real._restart_events(rc, ns, job["metadata"]["uid"])) == 1
    assert _cordoned(rc, slow)
