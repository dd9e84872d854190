"""Conformance: Events (core/v1 and events.k8s.io/v1) and Leases (K8S-SEMANTICS.md "Events", "Leader election Lease")."""

# ruff: noqa: PT018  (compound asserts read as one expectation about one answer)
from __future__ import annotations

import datetime as dt
from typing import Any

from conformance_client import Api

from kcover.aio import clock


def core_event(name: str, ns: str, *, involved_ns: str | None = None, **extra: Any) -> dict[str, Any]:
    involved = {"kind": "Pod", "name": "p", "namespace": ns if involved_ns is None else involved_ns,
                "uid": "11111111-1111-1111-1111-111111111111"}
    if involved_ns == "":
        involved = {"kind": "Node", "name": "n1", "uid": "22222222-2222-2222-2222-222222222222"}
    return {"metadata": {"name": name}, "involvedObject": involved, "reason": "Test", "message": "hello",
            "type": "Warning", "source": {"component": "kcover"}, **extra}


def now_micro() -> str:
    return clock.micro_time(dt.datetime.now(dt.UTC))


async def test_core_event_without_event_time_must_match_namespace(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/events"
    await conformance_api.ok("POST", path, body=core_event("ok", ns))
    code, body = await conformance_api.request("POST", path, body=core_event("bad", ns, involved_ns="default"))
    assert code == 422 and body["reason"] == "Invalid"
    assert body["details"]["causes"][0]["field"] == "involvedObject.namespace"
    code, _ = await conformance_api.request("POST", path, body=core_event("node", ns, involved_ns=""))
    assert code == 422  # cluster-scoped objects' legacy Events live in "default"


async def test_core_event_with_event_time_needs_reporting_fields(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/events"
    code, body = await conformance_api.request("POST", path, body=core_event("e1", ns, eventTime=now_micro()))
    assert code == 422
    fields = {c["field"] for c in body["details"]["causes"]}
    assert {"reportingComponent", "reportingInstance"} <= fields
    ok = core_event("e2", ns, eventTime=now_micro(), reportingComponent="kcover.io/controller",
                    reportingInstance="kcover-0", action="Restart")
    created = await conformance_api.ok("POST", path, body=ok)
    assert created["reportingComponent"] == "kcover.io/controller"
    long_message = dict(ok, metadata={"name": "e3"}, message="x" * 1025)
    code, body = await conformance_api.request("POST", path, body=long_message)
    assert code == 422


async def test_event_lengths_are_counted_in_utf8_bytes(conformance_api: Api, ns: str) -> None:
    """The limits (message 1024, reason/action/reportingInstance 128) are bytes: 600 CJK characters are
    1,800 bytes and refused; 341 of them (1,023 bytes) fit."""
    path = f"/api/v1/namespaces/{ns}/events"
    base = core_event("b0", ns, eventTime=now_micro(), reportingComponent="kcover.io/controller",
                      reportingInstance="kcover-0", action="Restart")
    code, body = await conformance_api.request("POST", path, body=dict(base, metadata={"name": "b1"},
                                                                      message="\u8a13" * 600))
    assert code == 422 and {c["field"] for c in body["details"]["causes"]} == {"message"}
    created = await conformance_api.ok("POST", path, body=dict(base, metadata={"name": "b2"}, message="\u8a13" * 341))
    assert len(created["message"].encode()) == 1023
    for field in ("reason", "action", "reportingInstance"):
        code, body = await conformance_api.request("POST", path, body=dict(base, metadata={"name": f"b-{field.lower()}"},
                                                                          **{field: "\u00e9" * 65}))
        assert code == 422 and field in {c["field"] for c in body["details"]["causes"]}, field  # 130 bytes
    await conformance_api.ok("POST", path, body=dict(base, metadata={"name": "b3"}, reason="\u00e9" * 64))


async def test_micro_time_needs_six_digits(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/events"
    event = core_event("e", ns, eventTime="2026-01-01T00:00:00.123Z", reportingComponent="kcover",
                       reportingInstance="i", action="A")
    code, body = await conformance_api.request("POST", path, body=event)
    assert code == 400 and body["reason"] == "BadRequest"
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
    code, body = await conformance_api.request("POST", lease_path, body={
        "metadata": {"name": "l"}, "spec": {"holderIdentity": "a", "renewTime": "2026-01-01T00:00:00Z"}})
    assert code == 400


async def test_events_api_shares_the_core_store(conformance_api: Api, ns: str) -> None:
    new_path = f"/apis/events.k8s.io/v1/namespaces/{ns}/events"
    created = await conformance_api.ok("POST", new_path, body={
        "metadata": {"name": "n1"}, "eventTime": now_micro(), "reportingController": "kcover.io/controller",
        "reportingInstance": "kcover-0", "action": "Restart", "reason": "JobRestarted", "type": "Normal",
        "note": "restarted", "regarding": {"kind": "Pod", "name": "p", "namespace": ns}})
    assert created["apiVersion"] == "events.k8s.io/v1" and created["note"] == "restarted"
    core = await conformance_api.ok("GET", f"/api/v1/namespaces/{ns}/events/n1")
    assert core["message"] == "restarted" and core["involvedObject"]["name"] == "p"
    assert core["reportingComponent"] == "kcover.io/controller"
    got = await conformance_api.ok("GET", f"/api/v1/namespaces/{ns}/events",
                                   query={"fieldSelector": "involvedObject.name=p,reason=JobRestarted"})
    assert [e["metadata"]["name"] for e in got["items"]] == ["n1"]
    got = await conformance_api.ok("GET", new_path, query={"fieldSelector": "regarding.name=p"})
    assert [e["metadata"]["name"] for e in got["items"]] == ["n1"] and got["items"][0]["note"] == "restarted"
    code, body = await conformance_api.request("POST", new_path, body={"metadata": {"name": "n2"}, "reason": "R"})
    assert code == 422 and "eventTime" in {c["field"] for c in body["details"]["causes"]}


async def test_lease_update_with_rv(conformance_api: Api, ns: str) -> None:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
    lease = await conformance_api.ok("POST", path, body={"metadata": {"name": "l"}, "spec": {
        "holderIdentity": "a", "leaseDurationSeconds": 15, "acquireTime": now_micro(), "renewTime": now_micro(),
        "leaseTransitions": 0}})
    stale = dict(lease)
    lease["spec"] = dict(lease["spec"], holderIdentity="b", leaseTransitions=1, renewTime=now_micro())
    won = await conformance_api.ok("PUT", f"{path}/l", body=lease)
    assert won["spec"]["holderIdentity"] == "b"
    stale["spec"] = dict(stale["spec"], holderIdentity="c")
    code, body = await conformance_api.request("PUT", f"{path}/l", body=stale)
    assert code == 409 and body["reason"] == "Conflict"
    assert body["details"] == {"name": "l", "group": "coordination.k8s.io", "kind": "leases"}
