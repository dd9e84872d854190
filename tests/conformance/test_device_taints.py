"""Conformance: DeviceTaintRules (KEP-5055) as kube-apiserver 1.36 serves them, and as kcover writes them.

`resource.k8s.io/v1beta2` (the `DRADeviceTaintRules` gate plus `--runtime-config=resource.k8s.io/v1beta2=true`
on the real server, tests/controlplane/server.py): discovery lists `devicetaintrules` (cluster-scoped,
with a status subresource); a create fills `spec.taint.timeAdded`; a second create of the name is 409
AlreadyExists; a node effect (PreferNoSchedule), a key that is not a qualified name, a device name that
is not an RFC 1123 label and a missing taint are 422 with the server's causes; only metadata field
selectors work; DELETE answers with the deleted object (not a Status), and a second DELETE 404; a
DELETE with a stale uid precondition is 409. Then kcover's own writer (`recovery.devicetainting`)
against the same server: discovery finds v1beta2, the rule it writes selects exactly one device, a
rule of that name it did not write is left alone, and it removes only its own.

Each test first asks the server whether it serves what the test covers (`Api.served_versions`) and is
skipped, saying so, where it does not (Kubernetes before 1.33, or a server without the gate and the
runtime-config): kcover falls back to the node there (tests/integration/recovery).
"""

# ruff: noqa: PT018  (compound asserts read as one expectation about one answer)
from __future__ import annotations

import secrets
from typing import Any

import pytest
from conformance_client import Api

from kcover import errors, metrics, model, settings
from kcover.aio import clock as clock_
from kcover.kube import client as kubeclient
from kcover.kube import gateway
from kcover.recovery import devicetainting

BASE = "/apis/resource.k8s.io/v1beta2/devicetaintrules"


@pytest.fixture
async def v1beta2(conformance_api: Api) -> None:
    """Skip unless the server serves DeviceTaintRules in resource.k8s.io/v1beta2 (what these tests observed)."""
    served = await conformance_api.served_versions("resource.k8s.io", "devicetaintrules")
    if "v1beta2" not in served:
        pytest.skip(f"kube-apiserver {await conformance_api.server_version()} serves no resource.k8s.io/v1beta2 "
                    f"devicetaintrules (served in: {', '.join(served) or 'no version'})")


def _rule(name: str, *, effect: str = "NoSchedule", key: str = "kcover.io/unhealthy",
          device: str = "gpu-3") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
            "metadata": {"name": name, "labels": {"conf": "device-taints"}},
            "spec": {"deviceSelector": {"driver": "gpu.example.com", "pool": "conf-node", "device": device},
                     "taint": {"key": key, "value": "XID79", "effect": effect}}}


@pytest.mark.usefixtures("v1beta2")
async def test_discovery_lists_device_taint_rules(conformance_api: Api) -> None:
    group = await conformance_api.ok("GET", "/apis/resource.k8s.io")
    assert "v1beta2" in {v["version"] for v in group["versions"]}
    listing = await conformance_api.ok("GET", "/apis/resource.k8s.io/v1beta2")
    names = {r["name"]: r for r in listing["resources"]}
    assert names["devicetaintrules"]["kind"] == "DeviceTaintRule" and names["devicetaintrules"]["namespaced"] is False
    assert "devicetaintrules/status" in names
    assert {"create", "delete", "get", "list", "watch"} <= set(names["devicetaintrules"]["verbs"])


@pytest.mark.usefixtures("v1beta2")
async def test_create_defaults_and_conflicts(conformance_api: Api) -> None:
    name = "conf-" + secrets.token_hex(4)
    code, created = await conformance_api.request("POST", BASE, body=_rule(name))
    try:
        assert code == 201, created
        assert created["kind"] == "DeviceTaintRule" and created["metadata"]["generation"] == 1
        taint = created["spec"]["taint"]
        assert taint["effect"] == "NoSchedule" and taint["value"] == "XID79" and taint["timeAdded"]
        assert created["spec"]["deviceSelector"] == {"driver": "gpu.example.com", "pool": "conf-node", "device": "gpu-3"}
        code, dup = await conformance_api.request("POST", BASE, body=_rule(name))
        assert code == 409 and dup["reason"] == "AlreadyExists"
        listed = await conformance_api.ok("GET", BASE, query={"labelSelector": "conf=device-taints"})
        assert name in {r["metadata"]["name"] for r in listed["items"]}
        code, bad = await conformance_api.request("GET", BASE, query={"fieldSelector": "spec.taint.key=x"})
        assert code == 400 and bad["reason"] == "BadRequest"
        code, stale = await conformance_api.request("DELETE", f"{BASE}/{name}", body={
            "apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": "0" * 8}})
        assert code == 409 and stale["reason"] == "Conflict"
    finally:
        code, deleted = await conformance_api.request("DELETE", f"{BASE}/{name}")
    assert code == 200 and deleted["kind"] == "DeviceTaintRule" and deleted["metadata"]["name"] == name
    code, gone = await conformance_api.request("DELETE", f"{BASE}/{name}")
    assert code == 404 and gone["reason"] == "NotFound"


@pytest.mark.usefixtures("v1beta2")
async def test_invalid_rules_are_refused_with_causes(conformance_api: Api) -> None:
    cases: list[tuple[dict[str, Any], set[tuple[str, str]]]] = [
        (_rule("conf-bad-effect", effect="PreferNoSchedule"), {("FieldValueNotSupported", "spec.taint.effect")}),
        (_rule("conf-bad-key", key="not a key!"), {("FieldValueInvalid", "spec.taint.key")}),
        (_rule("conf-bad-device", device="Bad_Name"), {("FieldValueInvalid", "spec.deviceSelector.device")}),
    ]
    no_taint = _rule("conf-no-taint")
    del no_taint["spec"]["taint"]
    cases.append((no_taint, {("FieldValueInvalid", "spec.taint.key"), ("FieldValueRequired", "spec.taint.effect")}))
    for body, wanted in cases:
        code, answer = await conformance_api.request("POST", BASE, body=body)
        assert code == 422 and answer["reason"] == "Invalid", (body["metadata"]["name"], answer)
        assert answer["details"]["kind"] == "DeviceTaintRule"
        assert {(c["reason"], c["field"]) for c in answer["details"]["causes"]} == wanted, answer
    code, answer = await conformance_api.request("POST", BASE, body=_rule("conf-none-" + secrets.token_hex(3),
                                                                         effect="None"))
    assert code == 201, answer  # None is a device effect (informational), unlike on nodes
    await conformance_api.ok("DELETE", f"{BASE}/{answer['metadata']['name']}")


@pytest.mark.usefixtures("v1beta2")
async def test_kcovers_writer_taints_one_device_and_removes_only_its_own(conformance_api: Api) -> None:
    kube = kubeclient.from_configuration(conformance_api.client.configuration)
    options = settings.DeviceTaintSettings(effect=settings.DeviceTaintEffect.NO_SCHEDULE)
    taints = devicetainting.DeviceTaints(kube, gateway.Http(kube), options=lambda: options,
                                         metrics_=metrics.Metrics(), clock=clock_.SystemClock())
    suffix = secrets.token_hex(3)
    ours = model.DraDevice(driver="gpu.example.com", pool=f"conf-{suffix}", device="gpu-3")
    foreign = model.DraDevice(driver="gpu.example.com", pool=f"conf-{suffix}", device="gpu-5")
    try:
        assert await taints.served_version() == "resource.k8s.io/v1beta2"
        got = await taints.taint(ours, node="conf-node", reason="XID79: fallen off the bus", cause="c1")
        assert got is devicetainting.Outcome.CREATED
        rule = await conformance_api.ok("GET", f"{BASE}/{devicetainting.rule_name(ours)}")
        assert rule["spec"]["deviceSelector"] == {"driver": ours.driver, "pool": ours.pool, "device": "gpu-3"}
        assert rule["spec"]["taint"]["key"] == "kcover.io/unhealthy" and rule["spec"]["taint"]["value"] == "XID79"
        assert rule["metadata"]["annotations"]["kcover.io/node"] == "conf-node"
        assert await taints.taint(ours, node="conf-node", reason="XID79", cause="c2") is devicetainting.Outcome.EXISTS
        # a person's rule under the name kcover would use for gpu-5: never kcover's to remove
        mine = _rule(devicetainting.rule_name(foreign), device="gpu-5")
        mine["spec"]["deviceSelector"]["pool"] = foreign.pool
        await conformance_api.ok("POST", BASE, body=mine)
        assert await taints.untaint(foreign) is devicetainting.Outcome.FOREIGN
        assert await taints.taint(foreign, node="conf-node", reason="XID79", cause="c3") is devicetainting.Outcome.FOREIGN
        await conformance_api.ok("GET", f"{BASE}/{devicetainting.rule_name(foreign)}")
        assert await taints.untaint(ours) is devicetainting.Outcome.REMOVED
        code, _ = await conformance_api.request("GET", f"{BASE}/{devicetainting.rule_name(ours)}")
        assert code == 404
        assert await taints.untaint(ours) is devicetainting.Outcome.ABSENT
    finally:
        for device in (ours, foreign):
            try:
                await kube.request("DELETE", f"{BASE}/{devicetainting.rule_name(device)}")
            except errors.NotFoundError:
                pass
        await kube.close()


async def test_where_none_is_served_kcovers_writer_writes_nothing_and_says_so(conformance_api: Api) -> None:
    served = await conformance_api.served_versions("resource.k8s.io", "devicetaintrules")
    if served:
        pytest.skip(f"this server serves devicetaintrules (resource.k8s.io {served}): the tests above cover it")
    kube = kubeclient.from_configuration(conformance_api.client.configuration)
    registry = metrics.Metrics()
    taints = devicetainting.DeviceTaints(kube, gateway.Http(kube), options=settings.DeviceTaintSettings,
                                         metrics_=registry, clock=clock_.SystemClock())
    device = model.DraDevice(driver="gpu.example.com", pool="conf-" + secrets.token_hex(3), device="gpu-3")
    try:
        assert await taints.served_version() is None
        assert await taints.taint(device, node="conf-node", reason="XID79", cause="c1") is devicetainting.Outcome.UNSERVED
        assert await taints.untaint(device) is devicetainting.Outcome.UNSERVED
    finally:
        await kube.close()
    assert not [k for k in kube.request_counts if not k.startswith("GET ")]  # only discovery was asked
    assert registry.registry.get_sample_value("kcover_device_taints_served") == 0
    assert registry.registry.get_sample_value("kcover_api_capability", {"capability": "device_taint_rules"}) == 0
