"""`helm upgrade`, `helm uninstall` and a reinstall of the running chart, as an operator does them.

* An upgrade with a changed setting reaches the running pods through the ConfigMap volume (the real
  kubelet updates it) and kcover applies it without a restart: `dryRun=true` makes the next restart a
  dry run, and no kcover pod was restarted or replaced. A value the schema refuses is refused by helm,
  and nothing changes.
* `helm uninstall` keeps the Recovery and LedgerEntry CRDs (`helm.sh/resource-policy: keep`) and so the
  Recovery history and the ledger; the reinstalled controller honours the cooldown and the restart budget
  those entries hold.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import workloads as wl
from nodekit import RELEASE_NS, RealNode, until

pytestmark = pytest.mark.parametrize("realnode", ["node"], indirect=True)
RESTARTED = "KcoverRestartedWorkload"
DRY_RESTARTED = "KcoverDryRunRestartedWorkload"
REFUSED = ("KcoverRecoverySkipped", "KcoverRecoveryHeld")  # refused outright, or held until the blocker lifts
KCOVER = "/apis/kcover.io/v1alpha1"


@pytest.fixture
def ns(realnode: RealNode) -> Iterator[str]:
    name = realnode.namespace("t-" + secrets.token_hex(4))
    yield name
    realnode.request("DELETE", f"/api/v1/namespaces/{name}")
    # a failed test may have left kcover uninstalled
    if realnode.run_helm("status", "kcover", "--namespace", RELEASE_NS, check=False).returncode != 0:
        realnode.install()
    realnode.upgrade({})  # the session's values again
    realnode.wait_ready()


def _kcover_pods(rn: RealNode) -> dict[str, tuple[str, int]]:
    """name -> (uid, restarts) of kcover's pods on the real node."""
    return {p["metadata"]["name"]: (p["metadata"]["uid"], sum(s.get("restartCount", 0) for s in
                                                               p["status"].get("containerStatuses") or []))
            for p in rn.pods(RELEASE_NS) if p["spec"].get("nodeName") == rn.node}


def _reloaded(rn: RealNode, pod: str, setting: str, after: int) -> bool:
    """Whether `pod` logged config_reloaded with `setting` among its `after`-th or later log records."""
    records = rn.json_log(RELEASE_NS, pod)[after:]
    return any(r.get("event") == "config_reloaded" and setting in r.get("changed", []) for r in records)


def _upgrade_and_wait(rn: RealNode, values: dict[str, Any], setting: str) -> None:
    controllers, _ = rn.wait_ready()
    seen = {c: len(rn.json_log(RELEASE_NS, c)) for c in controllers}
    rn.upgrade(values)
    for c in controllers:
        until(lambda c=c: _reloaded(rn, c, setting, seen[c]), f"{c} to reload {setting}", within=120)


def _restart_events(rn: RealNode, ns: str, job: dict[str, Any]) -> list[dict[str, Any]]:
    return rn.events(ns, RESTARTED, job["metadata"]["uid"])


def test_helm_upgrade_takes_effect_without_restarting_pods_and_a_schema_invalid_value_is_refused(
        realnode: RealNode, ns: str) -> None:
    rn = realnode
    rn.wait_ready()
    pods_before = _kcover_pods(rn)
    _upgrade_and_wait(rn, {"dryRun": True}, "recovery.dry_run")
    job = wl.create(rn, "batch", ns, "dry")
    old = frozenset(wl.uids(until(lambda: wl.running(rn, "batch", ns, "dry"), "Job dry Running")))
    wl.trigger(ns, "dry")
    until(lambda: rn.events(ns, DRY_RESTARTED, job["metadata"]["uid"]), "kcover's dry-run restart Event")
    assert not _restart_events(rn, ns, job)
    assert wl.uids(wl.pods(rn, "batch", ns, "dry")) == old  # planned, not done
    assert _kcover_pods(rn) == pods_before  # no kcover pod restarted or replaced by the upgrade

    revision = rn.run_helm("history", "kcover", "--namespace", RELEASE_NS, "--max", "1", "-o", "json").stdout
    refused = rn.upgrade({"dryRun": "yes"}, check=False)
    assert refused.returncode != 0
    assert "values don't meet the specifications of the schema" in refused.stderr, refused.stderr
    assert rn.run_helm("history", "kcover", "--namespace", RELEASE_NS, "--max", "1", "-o", "json").stdout == revision
    assert _kcover_pods(rn) == pods_before


def test_uninstall_and_reinstall_keep_the_history_and_the_ledger_and_honour_cooldowns_and_budgets(
        realnode: RealNode, ns: str) -> None:
    rn = realnode
    _upgrade_and_wait(rn, {"config": {"recovery": {"workload_cooldown_seconds": 900}}},
                      "recovery.workload_cooldown_seconds")
    jobs = {name: wl.create(rn, "batch", ns, name) for name in ("cool", "budget")}
    for name in jobs:
        until(lambda n=name: wl.running(rn, "batch", ns, n), f"Job {name} Running")
    for name, job in jobs.items():
        old = frozenset(wl.uids(wl.pods(rn, "batch", ns, name)))
        wl.trigger(ns, name)
        until(lambda j=job: _restart_events(rn, ns, j), f"kcover's restart of Job {name}")
        until(lambda n=name, o=old: wl.running(rn, "batch", ns, n, old=o), f"Job {name} Running again")
    recoveries = {r["metadata"]["uid"] for r in rn.ok("GET", f"{KCOVER}/namespaces/{ns}/recoveries")["items"]}
    ledger = {e["metadata"]["name"] for e in rn.ok("GET", f"{KCOVER}/namespaces/{RELEASE_NS}/ledgerentries")["items"]}
    assert recoveries
    assert ledger

    rn.uninstall()
    assert not rn.controllers()
    for crd in ("recoveries.kcover.io", "ledgerentries.kcover.io"):
        kept = rn.ok("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
        assert kept["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert {r["metadata"]["uid"] for r in rn.ok("GET", f"{KCOVER}/namespaces/{ns}/recoveries")["items"]} == recoveries
    assert ledger <= {e["metadata"]["name"] for e in
                      rn.ok("GET", f"{KCOVER}/namespaces/{RELEASE_NS}/ledgerentries")["items"]}

    rn.install({"config": {"recovery": {"workload_cooldown_seconds": 900}}})
    controllers, _ = rn.wait_ready()
    # the cooldown of Job cool's restart, from before the uninstall, holds: its next fault is not acted on
    before = frozenset(wl.uids(wl.pods(rn, "batch", ns, "cool")))
    wl.trigger(ns, "cool")

    def cooled() -> bool:
        """The new leader refused (logged) or held (logged, and an Event) Job cool's restart for its cooldown."""
        leader = rn.leader()
        logged = leader in controllers and any(
            r.get("event") in ("recovery_refused", "restart_held") and r.get("code") == "Cooldown"
            and f"{ns}/cool" in str(r.get("text", "")) + str(r.get("workload", ""))
            for r in rn.json_log(RELEASE_NS, leader))
        return logged or any("Cooldown" in e.get("message", "") for reason in REFUSED
                             for e in rn.events(ns, reason, jobs["cool"]["metadata"]["uid"]))
    until(cooled, "the new controller to refuse Job cool's restart for its cooldown")
    assert len(_restart_events(rn, ns, jobs["cool"])) == 1
    assert wl.uids(wl.pods(rn, "batch", ns, "cool")) == before

    # the budget: one restart in the window, spent before the uninstall
    _upgrade_and_wait(rn, {"config": {"recovery": {"workload_cooldown_seconds": 1, "max_restarts_per_window": 1}}},
                      "recovery.max_restarts_per_window")
    before = frozenset(wl.uids(wl.pods(rn, "batch", ns, "budget")))
    wl.trigger(ns, "budget")
    skipped = until(lambda: [e for reason in REFUSED for e in rn.events(ns, reason) if "BudgetExhausted" in
                             e.get("message", "") and f"{ns}/budget " in e.get("message", "")],
                    "kcover's BudgetExhausted refusal (or hold) of Job budget's restart")
    assert "restarted 1 times" in skipped[0]["message"], skipped[0]["message"]
    assert len(_restart_events(rn, ns, jobs["budget"])) == 1
    assert wl.uids(wl.pods(rn, "batch", ns, "budget")) == before
