"""The chart's alerts and dashboard query only what kcover exports: scraped from a running controller and
agent on the simulated cluster (the fixture of test_documented_metrics), not listed by hand.

The metric names are read out of every PromQL expression in helm/kcover/files/prometheus-rules.yaml and
every target and variable query of helm/kcover/files/dashboard.json. The one series allowed beside
kcover's own is `up`, which Prometheus itself records for each target it scrapes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from test_documented_metrics import exported, present, scrapes  # noqa: F401 -- `scrapes` is a fixture

FILES = Path(__file__).parents[2] / "helm" / "kcover" / "files"
PROMETHEUS_OWN = {"up"}
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
            "inf", "nan"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def series(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (functions, keywords, labels and durations left out)."""
    text = _RANGE.sub(" ", _MATCHERS.sub(" ", _STRING.sub(" ", expr)))
    text = _GROUPING.sub(" ", text)
    out = set()
    for m in _NAME.finditer(text):
        rest = text[m.end():].lstrip()
        if rest.startswith("(") or m.group().lower() in KEYWORDS or text[max(m.start() - 1, 0)] in "0123456789.":
            continue
        out.add(m.group())
    return out


def rule_exprs() -> list[str]:
    doc = yaml.safe_load((FILES / "prometheus-rules.yaml").read_text())
    return [str(rule["expr"]) for group in doc["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    doc = json.loads((FILES / "dashboard.json").read_text())
    exprs = [str(t["expr"]) for p in doc["panels"] for t in p.get("targets", [])]
    for var in doc["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            inner = re.fullmatch(r"label_values\((\w+),\s*\w+\)", str(query.get("query", "")))
            assert inner, query
            exprs.append(inner.group(1))
    return exprs


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (namespace) (increase(kcover_a_total{x="y"}[5m])) > 0', {"kcover_a_total"}),
    ("(kcover_b == 0) unless on (pod, d) (kcover_c == 0)", {"kcover_b", "kcover_c"}),
    ('histogram_quantile(0.5, sum by (le) (rate(kcover_d_bucket{n=~"$namespace"}[$__rate_interval])))', {"kcover_d_bucket"}),
    ('up{job=~".*kcover-agent.*"} == 0', {"up"}),
    ("(sum(kcover_leader) < 1) or absent(kcover_leader)", {"kcover_leader"}),
])
def test_series_are_read_out_of_promql(expr: str, names: set[str]) -> None:
    assert series(expr) == names


def test_the_rules_cover_every_alert_the_chart_promises() -> None:
    doc = yaml.safe_load((FILES / "prometheus-rules.yaml").read_text())
    alerts = {rule["alert"] for group in doc["groups"] for rule in group["rules"]}
    assert {"KcoverBreakerOpen", "KcoverRecoveryStalled", "KcoverRecoveryFailed", "KcoverAgentSilent",
            "KcoverAgentConditionMissing", "KcoverDetectorFailing", "KcoverConfigReloadRefused",
            "KcoverControllerWithoutLeader"} <= alerts
    for group in doc["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
            assert rule["annotations"]["summary"], rule["alert"]
            assert rule["annotations"]["description"], rule["alert"]


async def test_every_series_the_alerts_and_dashboard_query_is_exported(scrapes: dict[str, str]) -> None:  # noqa: F811
    on_metrics = exported(scrapes["controller"]) | exported(scrapes["agent"])
    queried = {name: source for source, exprs in (("rules", rule_exprs()), ("dashboard", dashboard_exprs()))
               for expr in exprs for name in series(expr)}
    assert {"kcover_faults_total", "kcover_recovery_mttr_seconds_bucket", "kcover_breaker_open",
            "kcover_bus_dropped_total"} <= set(queried), "the extraction found too little: is the parser right?"
    missing = {name: source for name, source in queried.items()
               if name not in PROMETHEUS_OWN and not present(name, on_metrics)}
    assert not missing, f"queried but on neither role's /metrics: {missing}"
