"""The simulated server's structural schemas: the CRDs it serves, what it refuses to carry out, ratcheting,
and the Go printing its causes need. What it prunes, defaults and refuses is held to a real kube-apiserver
by tests/conformance/test_crd_schema.py; these are the parts no conformance test can reach."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kcover.sim import registry, schemacheck, server, status, strategy, structural

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kcover" / "files"
SIM = ROOT / "kcover" / "sim" / "crds"


@pytest.mark.parametrize("name", ["recovery-crd.yaml", "ledgerentry-crd.yaml", "preflight-crd.yaml"])
def test_the_sim_serves_the_charts_crds_as_shipped(name: str) -> None:
    assert (SIM / name).read_text() == (CHART / name).read_text(), f"copy helm/kcover/files/{name} to kcover/sim/crds"
    plugin = ROOT / "plugins" / "kcover-preflight" / "kcover_preflight" / "crd.yaml"
    assert (SIM / "preflight-crd.yaml").read_text() == plugin.read_text()


def test_kcovers_kinds_are_read_from_their_crds() -> None:
    crd = yaml.safe_load((CHART / "recovery-crd.yaml").read_text())
    res = registry.Registry().by_key("recoveries.kcover.io")
    version = crd["spec"]["versions"][0]
    assert [(c.name, c.json_path, c.priority) for c in res.columns] == [
        (c["name"], c["jsonPath"], c.get("priority", 0)) for c in version["additionalPrinterColumns"]]
    assert (res.short_names, res.subresources, res.namespaced) == (("krec",), (), True)  # created with its status
    assert res.schema is not None
    assert "Held" in (res.schema.properties["status"].properties["phase"].enum or ())
    ledger = registry.Registry().by_key("ledgerentries.kcover.io")
    assert ledger.subresources == ()
    assert ledger.schema is not None


@pytest.mark.parametrize("raw", [
    {"type": "string", "pattern": "^a$"},
    {"type": "string", "minLength": 1},
    {"type": "object", "oneOf": [{"required": ["a"]}]},
    {"type": "string", "format": "email"},
    {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
    {"type": "object", "additionalProperties": False},
    {"type": "object", "x-kubernetes-validations": [{"rule": "self.a > 1"}]},
    {"type": "object", "x-kubernetes-validations": [{"rule": "self == oldSelf", "messageExpression": "'x'"}]},
    {"type": "array"},
    {"properties": {"a": {"type": "string"}}},
])
def test_a_keyword_the_sim_does_not_carry_out_is_refused_not_ignored(raw: dict[str, Any]) -> None:
    with pytest.raises(structural.SchemaError):
        structural.build({"type": "object", "properties": {"spec": raw}})


def test_defaults_are_pruned_and_copied_per_use() -> None:
    s = structural.build({"type": "object", "properties": {
        "a": {"type": "object", "default": {"keep": 1, "drop": 2}, "properties": {"keep": {"type": "integer"}}}}})
    obj: dict[str, Any] = {}
    structural.default(obj, s)
    obj["a"]["keep"] = 5
    again: dict[str, Any] = {}
    structural.default(again, s)
    assert again == {"a": {"keep": 1}}


def _recovery(**status_: Any) -> dict[str, Any]:
    return {"apiVersion": "kcover.io/v1alpha1", "kind": "Recovery",
            "metadata": {"name": "r", "namespace": "default", "resourceVersion": "1"},
            "spec": {"target": {"kind": "Node", "name": "n" * 300}, "decision": {"action": "CordonNode"}},
            "status": status_}


def test_updates_ratchet_what_was_stored_before_the_schema_said_otherwise() -> None:
    """An object stored before a stricter CRD (seeded straight into the store) can still be written: only
    the parts a write changes are held to the schema."""
    res = registry.Registry().by_key("recoveries.kcover.io")
    old = _recovery(phase="Gone")
    labelled = {**old, "metadata": {**old["metadata"], "labels": {"a": "b"}}}
    assert strategy.prepare_update(res, labelled, old)["metadata"]["labels"] == {"a": "b"}
    renamed = {**old, "spec": {**old["spec"], "target": {"kind": "Node", "name": "m" * 300}}}
    with pytest.raises(status.ApiError) as refused:
        strategy.prepare_update(res, renamed, old)
    assert [c["field"] for c in refused.value.status_obj["details"]["causes"]] == ["spec.target.name"]
    assert strategy.prepare_update(res, _recovery(phase="Gone", cause="x"), old, subresource="status")
    with pytest.raises(status.ApiError) as refused:
        strategy.prepare_update(res, _recovery(phase="Lost"), old, subresource="status")
    assert [c["field"] for c in refused.value.status_obj["details"]["causes"]] == ["status.phase"]


async def test_extra_crds_are_served_next_to_the_built_in_kinds() -> None:
    crd = yaml.safe_load((ROOT / "tests" / "controlplane" / "crds" / "conformance-widgets.yaml").read_text())
    async with server.SimServer(crds=[crd], listen=False) as srv, srv.client() as kube:
        created = await kube.request("POST", "/apis/conformance.kcover.io/v1/namespaces/default/widgets", body={
            "apiVersion": "conformance.kcover.io/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"name": "w"}})
        assert created["spec"] == {"name": "w", "size": 3, "mode": "fast", "nested": {"depth": 1}}


@pytest.mark.parametrize(("value", "text"), [
    (0.0, "0"), (-0.0, "-0"), (1.0, "1"), (-0.5, "-0.5"), (0.25, "0.25"), (123456.0, "123456"), (1e6, "1e+06"),
    (1234567.0, "1.234567e+06"), (9.223372036854776e18, "9.223372036854776e+18"), (0.0001, "0.0001"),
    (0.00001, "1e-05"), (19.98, "19.98"), (float("inf"), "+Inf"),
])
def test_numbers_print_as_go_prints_them(value: float, text: str) -> None:
    assert schemacheck.go_float(value) == text


@pytest.mark.parametrize(("text", "ok"), [
    ("2026-01-01T00:00:00Z", True), ("2026-01-01T00:00:00.123456789+02:00", True), ("2026-01-01t00:00:00z", True),
    ("2026-01-01T00:00:00", False), ("2026-13-01T00:00:00Z", False), ("2026-02-30T00:00:00Z", False),
    ("2026-01-01T24:00:00Z", False), ("2026-01-01 00:00:00Z", False), ("", False), ("now", False),
])
def test_date_times_are_what_kube_openapi_accepts(text: str, ok: bool) -> None:
    assert schemacheck.is_date_time(text) is ok
