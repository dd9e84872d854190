"""The chart grants what the closed loop uses: the drain's evictions, the remediation request's label and
Node condition, the namespace pause (a watch), and the controls ConfigMap by name (a watch) (docs/runbook.md, "Operator controls"
and "The escalation ladder")."""

from __future__ import annotations

import yaml
from chartkit import Render, find


def _rules(objs: list[dict[str, object]], kind: str, name: str) -> list[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    role = find(objs, kind, name)
    return [(g, r, tuple(rule["verbs"]), tuple(rule.get("resourceNames") or ()))  # type: ignore[index]
            for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]]  # type: ignore[index]


def test_controller_may_evict_request_remediation_and_read_namespace_pauses(render: Render) -> None:
    objs = render({})
    granted = {(g, r): verbs for g, r, verbs, _ in _rules(objs, "ClusterRole", "-controller")}
    assert "create" in granted[("", "pods/eviction")]
    assert "patch" in granted[("", "nodes")]
    assert granted[("", "nodes/status")] == ("patch",)
    assert granted[("", "namespaces")] == ("get", "list", "watch")


def test_controller_watches_the_controls_configmap_by_name_and_writes_no_configmap(render: Render) -> None:
    objs = render({"controller": {"controlsName": "my-controls"}})
    rules = [(verbs, names) for g, r, verbs, names in _rules(objs, "Role", "-controller") if r == "configmaps"]
    assert rules == [(("get", "list", "watch"), ("my-controls",))], rules
    container = find(objs, "Deployment", "-controller")["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["KCOVER_RECOVERY__CONTROLS_NAME"] == "my-controls"


def test_return_validation_lets_the_agent_watch_nodes_and_turns_both_sides_on(render: Render) -> None:
    off = {(g, r): verbs for g, r, verbs, _ in _rules(render({"agentValidation": {"enabled": False}}),
                                                       "ClusterRole", "-agent")}
    assert off[("", "nodes")] == ("get",)
    objs = render({"returnValidation": {"enabled": True, "diagLevel": 3}})
    on: dict[tuple[str, str], set[str]] = {}
    for g, r, verbs, _ in _rules(objs, "ClusterRole", "-agent"):
        on.setdefault((g, r), set()).update(verbs)
    assert on[("", "nodes")] == {"get", "list", "watch"}
    assert on[("", "nodes/status")] == {"patch"}, "the answer goes through nodes/status: no write to nodes"
    config = yaml.safe_load(find(objs, "ConfigMap", "")["data"]["config.yaml"])  # type: ignore[index]
    assert config["recovery"]["return_validation"] == {"enabled": True, "diag_level": 3}
    assert "agent" not in config, "agents validate by default (agent.validation.enabled)"
    off_config = yaml.safe_load(find(render({"agentValidation": {"enabled": False}}), "ConfigMap", "")["data"]["config.yaml"])  # type: ignore[index]
    assert off_config["agent"]["validation"] == {"enabled": False}
