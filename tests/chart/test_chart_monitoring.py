"""The chart's observability: the Recovery CRD and who may write it, the PrometheusRule and the Grafana
dashboard (both off by default, rendered by `helm template` when enabled, carrying the files the
metrics test checks against a running controller and agent)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from chartkit import CHART, NAMESPACE, Render, find

FILES = CHART / "files"


def _writes(role: dict[str, Any], resource: str) -> bool:
    return any("kcover.io" in r.get("apiGroups", []) and resource in r.get("resources", [])
               and set(r.get("verbs", [])) & {"create", "update", "patch", "delete", "deletecollection", "*"}
               for r in role.get("rules") or [])


def test_monitoring_is_off_by_default(render: Render) -> None:
    objs = render({})
    assert not [o for o in objs if o["kind"] == "PrometheusRule"]
    assert not [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]


def test_helm_template_renders_the_rule_and_the_dashboard_when_enabled(render: Render) -> None:
    objs = render({"monitoring": {"prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
                                  "dashboard": {"enabled": True, "namespace": "monitoring"}}})
    rule = find(objs, "PrometheusRule")
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"] == yaml.safe_load((FILES / "prometheus-rules.yaml").read_text())
    dashboard = find(objs, "ConfigMap", "-dashboard")
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["kcover.json"]) == json.loads((FILES / "dashboard.json").read_text())


def test_the_recovery_crd_ships_and_only_the_controller_writes_recoveries(render: Render) -> None:
    objs = render({})
    crd = find(objs, "CustomResourceDefinition", "recoveries.kcover.io")
    version = crd["spec"]["versions"][0]
    assert crd["spec"]["scope"] == "Namespaced"
    # no status subresource: a Recovery is created with its status, one write per action
    assert "subresources" not in version
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[:2] == ["Phase", "Action"]
    assert columns[-1] == "Age"
    roles = [o for o in objs if o["kind"] in ("ClusterRole", "Role")]
    writers = [r["metadata"]["name"] for r in roles if _writes(r, "recoveries") or _writes(r, "recoveries/status")]
    assert writers == [find(objs, "ClusterRole", "-controller")["metadata"]["name"]]
    view = find(objs, "ClusterRole", "-recoveries-view")
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert view["rules"] == [{"apiGroups": ["kcover.io"], "resources": ["recoveries"], "verbs": ["get", "list", "watch"]}]
    assert not [o for o in render({"recoveries": {"installCRD": False}}) if o["kind"] == "CustomResourceDefinition"]


def test_the_test_control_plane_installs_the_charts_crd() -> None:
    link = Path(__file__).parents[1] / "controlplane" / "crds" / "kcover-recoveries.yaml"
    assert link.read_text() == (FILES / "recovery-crd.yaml").read_text()
