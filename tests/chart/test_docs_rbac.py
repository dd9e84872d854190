"""docs/security.md's RBAC tables are the chart's rules, row for row: the chart rendered with default
values, its controller and agent ClusterRoles and Roles, against what the tables say (resource, verbs,
the names a verb is limited to, ClusterRole or Role)."""

from __future__ import annotations

import re
from typing import Any

from chartkit import ROOT, Render, find

SECURITY = ROOT / "docs" / "security.md"

Grant = tuple[str, str, str, str, str]
"""(scope Role|ClusterRole, apiGroup, resource, verb, resourceName or "")."""


def table(heading: str) -> list[list[str]]:
    """The cells of the first table after the paragraph starting with `heading`."""
    lines = SECURITY.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    assert rows[0][:2] == ["resource", "verbs"], rows[0]
    return rows[2:]


def _resource(token: str) -> tuple[str, str]:
    """`pods/log` -> ("", "pods/log"); `recoveries.kcover.io/status` -> ("kcover.io", "recoveries/status")."""
    base, _, sub = token.partition("/")
    plural, _, group = base.partition(".")
    return group, plural + (f"/{sub}" if sub else "")


def documented(heading: str) -> set[Grant]:
    grants: set[Grant] = set()
    for resource_cell, verbs_cell, *_ in table(heading):
        scope = "Role" if "(Role)" in resource_cell else "ClusterRole"
        resources = [_resource(t) for t in re.findall(r"`([^`]+)`", resource_cell)]
        assert resources, resource_cell
        for part in verbs_cell.split(";"):
            names = re.findall(r"`([^`]+)`", part.split(" on ", 1)[1]) if " on " in part else [""]
            verbs = [v.strip() for v in part.split(" on ", 1)[0].split(",") if v.strip()]
            grants |= {(scope, g, r, v, n) for g, r in resources for v in verbs for n in names}
    return grants


def rendered(objs: list[dict[str, Any]], suffix: str) -> set[Grant]:
    grants: set[Grant] = set()
    for kind in ("ClusterRole", "Role"):
        for rule in find(objs, kind, suffix)["rules"]:
            grants |= {(kind, g, r, v, n) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
                       for n in rule.get("resourceNames") or [""]}
    return grants


def test_the_controller_table_is_the_charts_rules(render: Render) -> None:
    docs, chart = documented("**Controller**"), rendered(render({}), "-controller")
    assert docs - chart == set(), f"security.md grants what the chart does not: {sorted(docs - chart)}"
    assert chart - docs == set(), f"the chart grants what security.md does not say: {sorted(chart - docs)}"


def test_the_agent_table_is_the_charts_rules(render: Render) -> None:
    docs, chart = documented("**Agent**"), rendered(render({}), "-agent")
    assert docs - chart == set(), f"security.md grants what the chart does not: {sorted(docs - chart)}"
    assert chart - docs == set(), f"the chart grants what security.md does not say: {sorted(chart - docs)}"


def test_the_docs_namespace_is_where_the_chart_puts_kcovers_own_objects(render: Render) -> None:
    """The docs' `kubectl -n NS` for kcover's objects use the install namespace (tests/docs); the chart puts the
    agent's Node Events, the Lease and the ledger in the release namespace, so installed as the docs say, there."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "docs"))
    from test_docs_true import install_namespace  # type: ignore[import-not-found]
    from test_render import container, resolved_env

    namespace = install_namespace()
    objs = render({}, namespace=namespace)
    agent = resolved_env(container(find(objs, "DaemonSet", "-agent")), pod="a", namespace=namespace, node="n")
    controller = resolved_env(container(find(objs, "Deployment", "-controller")), pod="c", namespace=namespace,
                              node="")
    assert agent["KCOVER_AGENT__EVENT_NAMESPACE"] == namespace
    assert controller["KCOVER_LEASE__NAMESPACE"] == controller["KCOVER_RECOVERY__LEDGER_NAMESPACE"] == namespace
    role = find(objs, "Role", "-agent")
    assert role["metadata"]["namespace"] == namespace  # where the agent may create its Events
