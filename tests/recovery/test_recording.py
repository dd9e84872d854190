"""The Recovery writer: names, retention, and a Recorder that never blocks and never drops silently.

The Recorder writes through the product's gateway to the simulated API server in-process, on virtual
time; the metrics are the ones /metrics exports. Retention and naming are pure functions, tested with tables.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.resources
import re
from typing import Any

import pytest
import yaml

from kcover import kinds, metrics, model, settings
from kcover.aio import clock as clock_
from kcover.kube import gateway
from kcover.recovery import dryrun, recording, recoveries
from kcover.recovery import steps as st
from kcover.sim import server as simserver

NOW = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
DNS = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _cause(**kw: Any) -> model.CollectorEvent:
    return model.CollectorEvent(detector="nvml", severity=model.Severity.ERROR, reason="XID79",
                                target=model.Target(kind=model.TargetKind.NODE, name="gpu-1", node="gpu-1"),
                                observed_at=NOW - dt.timedelta(seconds=2), id="c1",
                                fault=model.Fault(xid=79, gpu_index=3), recommended=model.Action.CORDON_NODE, **kw)


def _restart(cause_id: str = "c1") -> st.Restart:
    workload = st.WorkloadRef("PyTorchJob", "kubeflow.org/v1", "train", "ml", "uid-1")
    return st.Restart(workload=workload, unit_key="w.uid-1", unit="", selector=st.Selector((("job", "train"),)),
                      members=(), removal=kinds.Removal.DELETE, pod=None,
                      cause=_cause().model_copy(update={"id": cause_id}))


def _recorder(srv: simserver.SimServer, *, leading: Any = None, **settings_: Any
              ) -> tuple[recording.Recorder, metrics.Metrics]:
    mets = metrics.Metrics()
    rs = settings.RecoverySettings.model_validate({"ledger_namespace": "kcover-system", **settings_})
    gw = dryrun.DryRun(gateway.Http(srv.client()), active=lambda: rs.dry_run)  # as the controller builds it
    rec = recording.Recorder(gw, recording.RecordMetrics(mets.registry),
                             recovery=lambda: rs, clock=clock_.FakeClock(NOW, follow_loop=True), identity="ctl-a",
                             is_leader=leading or (lambda: True))
    return rec, mets


def _server() -> simserver.SimServer:
    srv = simserver.SimServer(listen=False)
    srv.store.create("namespaces", {"metadata": {"name": "ml"}})
    return srv


@pytest.mark.parametrize(("target", "identity"), [
    ("PyTorchJob-train", ("restart", "w.uid-1", "c1")),
    ("Node-GPU_Node.17", ("CordonNode", "gpu-node.17", "c2")),
    ("x" * 300, ("skip",)),
    ("---", ("skip",)),
])
def test_names_are_dns_labels_and_stable(target: str, identity: tuple[str, ...]) -> None:
    name = recoveries.name_for(target, *identity)
    assert DNS.match(name), name
    assert len(name) <= 63
    assert name == recoveries.name_for(target, *identity)
    assert name != recoveries.name_for(target, *identity, "other")


def _item(ns: str, name: str, age_s: float, target: str) -> dict[str, Any]:
    created = clock_.rfc3339(NOW - dt.timedelta(seconds=age_s))
    return {"metadata": {"namespace": ns, "name": name, "creationTimestamp": created,
                         "labels": {recoveries.TARGET_LABEL: target}}}


@pytest.mark.parametrize(("items", "max_age", "per_target", "doomed"), [
    ([_item("a", "old", 100, "t"), _item("a", "new", 1, "t")], 50, 10, [("a", "old")]),
    ([_item("a", f"r{i}", i, "t") for i in range(5)], 1000, 2, [("a", "r2"), ("a", "r3"), ("a", "r4")]),
    ([_item("a", "x", 5, "t1"), _item("b", "y", 6, "t2")], 1000, 1, []),
    ([], 10, 1, []),
])
def test_retention_by_age_and_per_target(items: list[dict[str, Any]], max_age: float, per_target: int,
                                         doomed: list[tuple[str, str]]) -> None:
    assert sorted(recording.retained(items, now=NOW, max_age_seconds=max_age, per_target=per_target)) == doomed


@pytest.mark.looptime
async def test_a_restart_is_created_then_its_status_follows_the_verifier() -> None:
    async with _server() as srv:
        rec, mets = _recorder(srv)
        ref = rec.note(_restart(), recoveries.Phase.VERIFYING, message="deleted 2 pods")
        assert ref is not None
        assert ref[0] == "ml"
        assert "CREATE recoveries.kcover.io" not in srv.request_counts  # noting never waits on the API
        assert rec.phase("w.uid-1", recoveries.Phase.RECOVERED, at=NOW.timestamp(), mttr_seconds=2.0)
        await rec.flush()
        # one write: the chart's CRD has no status subresource, so the status goes in the create
        writes = {k: v for k, v in srv.request_counts.items() if not k.startswith(("GET", "LIST", "WATCH"))}
        assert writes == {"CREATE recoveries.kcover.io": 1}
        obj = srv.store.get("recoveries.kcover.io", "ml", ref[1])
        assert obj["spec"]["fault"]["identity"] == {"xid": 79, "gpu_index": 3}
        assert obj["spec"]["fault"]["recommendedAction"] == "cordon-node"
        assert obj["spec"]["decision"] == {"action": "RestartWorkload", "leader": "ctl-a", "selector": "job=train",
                                           "ledgerKey": "w.uid-1", "removal": "delete", "blame": "unknown"}
        assert obj["status"]["phase"] == "Recovered"
        assert obj["status"]["mttrSeconds"] == 2.0
        assert obj["status"]["detectedAt"] == "2026-05-01T11:59:58Z"
        assert mets.registry.get_sample_value("kcover_recovery_records_written_total") == 1.0
        # a later phase is one merge patch of the object
        assert rec.phase("w.uid-1", recoveries.Phase.STALLED, at=NOW.timestamp(), cause="NotRunning")
        await rec.flush()
        assert srv.request_counts["PATCH recoveries.kcover.io"] == 1
        assert "PATCH recoveries.kcover.io/status" not in srv.request_counts
        obj = srv.store.get("recoveries.kcover.io", "ml", ref[1])
        assert (obj["status"]["phase"], obj["status"]["cause"], obj["status"]["detectedAt"]) == \
            ("Stalled", "NotRunning", "2026-05-01T11:59:58Z")


def _crd_with_status_subresource() -> dict[str, Any]:
    crd = yaml.safe_load(importlib.resources.files("kcover.sim").joinpath("crds/recovery-crd.yaml").read_text())
    crd["spec"]["versions"][0]["subresources"] = {"status": {}}
    return crd


@pytest.mark.looptime
async def test_a_crd_installed_with_a_status_subresource_gets_a_create_then_a_status_patch() -> None:
    """A Recovery CRD installed another way, with a status subresource: the server drops a status on create
    and ignores one written to the object, so the status goes through `/status` (asked of discovery)."""
    srv = simserver.SimServer(listen=False, crds=[_crd_with_status_subresource()])
    srv.store.create("namespaces", {"metadata": {"name": "ml"}})
    async with srv:
        rec, _ = _recorder(srv)
        ref = rec.note(_restart(), recoveries.Phase.VERIFYING, message="deleted 2 pods")
        assert ref is not None
        await rec.flush()
        assert srv.request_counts["CREATE recoveries.kcover.io"] == 1
        assert srv.request_counts["PATCH recoveries.kcover.io/status"] == 1
        assert srv.store.get("recoveries.kcover.io", "ml", ref[1])["status"]["phase"] == "Verifying"
        assert rec.phase("w.uid-1", recoveries.Phase.RECOVERED, at=NOW.timestamp(), mttr_seconds=2.0)
        await rec.flush()
        assert srv.request_counts["PATCH recoveries.kcover.io/status"] == 2
        assert "PATCH recoveries.kcover.io" not in srv.request_counts
        assert srv.store.get("recoveries.kcover.io", "ml", ref[1])["status"]["phase"] == "Recovered"


@pytest.mark.looptime
async def test_a_leaders_first_retention_pass_asks_discovery_so_its_first_action_costs_one_write() -> None:
    """Whether the Recovery kind has a status subresource is asked in each retention pass, and a leader's
    first pass runs as it starts: its first Recovery is then one create, with no discovery request before it
    (seen at fleet size: a cold controller's first fault cost 10 requests, not 9)."""
    async with _server() as srv:
        client = srv.client()
        rs = settings.RecoverySettings.model_validate({"ledger_namespace": "kcover-system"})
        rec = recording.Recorder(dryrun.DryRun(gateway.Http(client), active=lambda: False),
                                 recording.RecordMetrics(metrics.Metrics().registry), recovery=lambda: rs,
                                 clock=clock_.FakeClock(NOW, follow_loop=True), identity="ctl-a",
                                 is_leader=lambda: True)
        stop = asyncio.Event()
        task = asyncio.create_task(rec.run(stop), name="records")
        await asyncio.sleep(1.0)
        assert client.request_counts["GET discovery"] == 1
        before = sum(client.request_counts.values())
        assert rec.note(_restart(), recoveries.Phase.VERIFYING, message="took 2 pods away") is not None
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.wait_for(task, 2.0)
        assert client.request_counts["GET discovery"] == 1
        assert sum(client.request_counts.values()) - before == 1  # the create, with its status
        assert srv.request_counts["CREATE recoveries.kcover.io"] == 1


@pytest.mark.looptime
async def test_a_node_action_lives_in_the_release_namespace_and_a_dry_runs_says_so() -> None:
    async with _server() as srv:
        rec, _ = _recorder(srv)
        ref = rec.note(st.Cordon("gpu-1", "XID79", _cause()), recoveries.Phase.RECOVERED)
        assert ref is not None
        assert ref[0] == "kcover-system"
        dry, _ = _recorder(srv, dry_run=True)
        ref = dry.note(_restart("c9"), recoveries.Phase.VERIFYING, message="took 2 pods away")
        assert ref is not None
        await dry.flush()
        obj = srv.store.get("recoveries.kcover.io", ref[0], ref[1])
        assert obj["spec"]["decision"]["dryRun"] is True
        # nothing was taken away: the status says so, not Verifying (seen on a real kubelet: "took 1 pods away")
        assert obj["status"]["phase"] == "RecordOnly"
        assert obj["status"]["cause"] == "DryRun"
        assert obj["status"]["message"] == "dry run, nothing was changed: took 2 pods away"
        assert "actedAt" not in obj["status"]
        # the verifier's later word does not make it read as done
        assert dry.phase("w.uid-1", recoveries.Phase.RECOVERED, at=NOW.timestamp(), mttr_seconds=2.0)
        await dry.flush()
        obj = srv.store.get("recoveries.kcover.io", ref[0], ref[1])
        assert obj["status"]["phase"] == "RecordOnly"
        assert "mttrSeconds" not in obj["status"]
        assert "recoveredAt" not in obj["status"]


@pytest.mark.looptime
async def test_a_full_queue_and_a_failing_api_are_counted_not_silent() -> None:
    async with _server() as srv:
        srv.faults.resources = frozenset({"recoveries.kcover.io"})
        srv.faults.error_rate = 1.0
        rec, mets = _recorder(srv, records={"queue_size": 2})
        for i in range(3):
            rec.note(_restart(f"c{i}"), recoveries.Phase.VERIFYING)
        assert mets.registry.get_sample_value("kcover_recovery_records_failed_total", {"reason": "queue_full"}) == 1.0
        for _ in range(recording.WRITE_ATTEMPTS):
            await rec.flush()
        assert mets.registry.get_sample_value("kcover_recovery_records_failed_total", {"reason": "api_error"}) == 2.0
        assert mets.registry.get_sample_value("kcover_recovery_records_queued") == 0.0


@pytest.mark.looptime
async def test_run_writes_in_its_own_task_and_ends_on_stop() -> None:
    async with _server() as srv:
        rec, _ = _recorder(srv)
        stop = asyncio.Event()
        task = asyncio.create_task(rec.run(stop), name="records")
        rec.note(_restart(), recoveries.Phase.VERIFYING)
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.wait_for(task, 2.0)
        assert srv.request_counts["CREATE recoveries.kcover.io"] == 1
        assert "PATCH recoveries.kcover.io/status" not in srv.request_counts
        (entry,) = srv.store.list("recoveries.kcover.io").entries
        assert entry.obj()["status"]["phase"] == "Verifying"


@pytest.mark.looptime
async def test_leadership_lost_during_a_retention_pass_stops_the_pass_not_the_writer() -> None:
    """A term that ends mid-pass (the Lease lost to a slow or restarting API server) stops the pass; the
    writer's task goes on (a NotLeaderError out of it ended the controller's task group and the replica)."""
    async with _server() as srv:
        for i in range(3):  # one target, three rows: retention_per_target=1 dooms two
            srv.store.create("recoveries.kcover.io", {
                "apiVersion": "kcover.io/v1alpha1", "kind": "Recovery",
                "metadata": {"name": f"r{i}", "namespace": "ml",
                             "labels": {"app.kubernetes.io/managed-by": "kcover", recoveries.TARGET_LABEL: "job"}},
                "spec": {}})
        answers = iter([True, True])  # the pass's check and the first delete; then the term is over

        class Term:
            def __init__(self) -> None:
                self.left = 1

            def write_seconds_left(self) -> float:
                self.left -= 1
                return 10.0 if self.left >= 0 else 0.0

        mets = metrics.Metrics()
        rs = settings.RecoverySettings.model_validate(
            {"ledger_namespace": "kcover-system", "records": {"retention_per_target": 1, "prune_interval_seconds": 1}})
        rec = recording.Recorder(gateway.Http(srv.client(), fence=Term()), recording.RecordMetrics(mets.registry),
                                 recovery=lambda: rs, clock=clock_.FakeClock(NOW, follow_loop=True), identity="ctl-a",
                                 is_leader=lambda: next(answers, False))
        stop = asyncio.Event()
        task = asyncio.create_task(rec.run(stop), name="records")
        await asyncio.sleep(3.0)
        assert not task.done(), task.exception() if task.done() else ""
        stop.set()
        await asyncio.wait_for(task, 2.0)
        left = [o["metadata"]["name"] for o in srv.store.iter_objects("recoveries.kcover.io")]
        assert len(left) == 2, "one deleted while leading, none after"


def test_every_phase_action_and_blame_written_is_one_the_crd_schema_accepts() -> None:
    """The real API server refuses a status whose phase is not in the CRD's enum (422), and prunes decision
    fields the schema does not list: every value the Recorder writes must be in the shipped schema."""
    import pathlib

    import yaml

    crd = yaml.safe_load((pathlib.Path(__file__).parents[2] / "helm/kcover/files/recovery-crd.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    phases = schema["status"]["properties"]["phase"]["enum"]
    decision = schema["spec"]["properties"]["decision"]["properties"]
    assert sorted(p.value for p in recoveries.Phase) == sorted(phases)
    cause = _cause()
    node_steps: list[st.Step] = [
        st.Cordon("gpu-1", "r", cause), st.Uncordon("gpu-1", cause),
        st.TaintDevice(model.DraDevice(driver="d", pool="p", device="g"), "gpu-1", "r", cause),
        st.UntaintDevice(model.DraDevice(driver="d", pool="p", device="g"), "gpu-1", cause),
        st.RequestValidation("gpu-1", cause, purpose=st.Purpose.SUSPECT), _restart(),
        st.Refuse(st.Code.PAUSED, "t", cause), st.Report("t", cause)]
    assert {recoveries.decision(s) for s in node_steps} <= set(decision["action"]["enum"])
    assert sorted(b.value for b in model.Blame) == sorted(decision["blame"]["enum"])
    assert sorted(r.value for r in kinds.Removal) == sorted(decision["removal"]["enum"])
    assert {"dryRun", "recordOnly", "ledgerKey", "selector", "code", "text"} <= set(decision)
