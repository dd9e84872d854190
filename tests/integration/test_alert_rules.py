"""Every alert of the chart's PrometheusRule evaluated by Prometheus's own rule engine (`promtool test
rules`) on the series a running controller and agent export, scraped over HTTP from the simulated cluster
(the fixture of test_documented_metrics): silent while both idle, and firing on the first failure.

The first failure is the case that needs care: a labelled counter that has no series until its first
increment is born at 1, and `increase()` over a series that starts at 1 is 0, so an alert such as
KcoverRecoveryFailed would never fire for the first given-up restart. Here each failure is the scraped
series changing the way the product changes it (a counter +1, a gauge set): a series the scrape does not
hold cannot change and fails the test, since in production it would be born at its first value.

The rules are evaluated as the chart renders them (helm/kcover/files/prometheus-rules.yaml), with their
annotations left out (templates for people; the expressions, `for` and labels are what is tested). Series
get the target labels a ServiceMonitor scrape adds (job from the Service name, namespace, pod), and `up`
for each target, which Prometheus records itself. promtool comes from tests/controlplane/build-promtool.sh
(Debian's package, or built from its Go module) or KCOVER_PROMTOOL_BIN; without it the test is skipped, except with CI=true,
where it is built and a failure fails the run.
"""

from __future__ import annotations

import asyncio
import glob
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from test_documented_metrics import BLIND_NODE, blind_scrape, scrapes  # noqa: F401 -- fixtures
from test_documented_metrics import NODE as AGENT_NODE

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "helm" / "kcover" / "files" / "prometheus-rules.yaml"
NAMESPACE = "kcover-system"
TARGETS = {
    "controller": {"job": "kcover-controller-metrics", "namespace": NAMESPACE, "pod": "kcover-controller-7d9f-a",
                   "instance": "10.0.0.1:8080"},
    "agent": {"job": "kcover-agent-metrics", "namespace": NAMESPACE, "pod": "kcover-agent-x2x9k",
              "instance": "10.0.0.2:8080"},
}
IDLE_MINUTES = 30
AFTER_MINUTES = 30

Labels = dict[str, str]


@pytest.fixture(scope="session")
def promtool() -> str:
    env = os.environ.get("KCOVER_PROMTOOL_BIN")
    if env and os.access(env, os.X_OK):
        return env
    cache = Path(os.environ.get("KCOVER_CACHE", str(Path.home() / ".cache" / "kcover")))
    built = sorted(glob.glob(str(cache / "promtool-*" / "promtool")))
    if built:
        return built[-1]
    if os.environ.get("CI") != "true":
        pytest.skip("promtool is not built (run tests/controlplane/build-promtool.sh or set KCOVER_PROMTOOL_BIN); "
                    "CI=true builds it and makes a failure fatal")
    proc = subprocess.run(["bash", str(ROOT / "tests" / "controlplane" / "build-promtool.sh")], capture_output=True,
                          text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        pytest.fail(f"build-promtool.sh failed:\n{proc.stderr[-4000:]}")
    return lines[-1].strip()


def scraped(text: str, target: Labels) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """(name, labels with the target's) -> value, as Prometheus stores one scrape of `text`."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset({**sample.labels, **target}.items()))] = float(sample.value)
    return out


@dataclass
class Change:
    """What a failure does to one series: a counter's increase (`add`) or a gauge's new value (`set`)."""

    role: str
    name: str
    labels: Labels = field(default_factory=dict)
    add: float | None = None
    set: float | None = None
    new_pod: str = ""
    """Another replica's copy of the series (set to `set`), instead of changing this one."""


@dataclass
class Case:
    alert: str
    changes: list[Change]
    labels: Labels
    """The alert's labels besides alertname and severity."""
    after_minutes: int = 1
    """Minutes after the failure the alert is expected (its `for`, and a scrape or two)."""


NS = {"namespace": NAMESPACE}
CASES = [
    Case("KcoverControllerWithoutLeader", [Change("controller", "kcover_leader", set=0)], NS, 3),
    Case("KcoverSeveralLeaders", [Change("controller", "kcover_leader", set=1, new_pod="kcover-controller-7d9f-b")],
         NS, 3),
    Case("KcoverBreakerOpen", [Change("controller", "kcover_breaker_open", set=1)], NS, 6),
    Case("KcoverRecoveryStalled", [Change("controller", "kcover_recovery_stalled_total", {"cause": "Unschedulable"},
                                          add=1)], {**NS, "cause": "Unschedulable"}),
    Case("KcoverRecoveryFailed", [Change("controller", "kcover_actions_total",
                                         {"action": "restart_workload", "result": "failed"}, add=1)], NS),
    Case("KcoverRecoveryRecordsFailing", [Change("controller", "kcover_recovery_records_failed_total",
                                                 {"reason": "api_error"}, add=1)], {**NS, "reason": "api_error"}),
    Case("KcoverAgentSilent", [Change("agent", "up", set=0)],
         {k: v for k, v in TARGETS["agent"].items()}, 6),
    Case("KcoverAgentConditionMissing", [Change("controller", "kcover_agent_condition_missing_nodes", set=1)], NS, 16),
    Case("KcoverAgentBlind", [Change("agent", "kcover_agent_blind", {"node": AGENT_NODE}, set=1)],
         {**NS, "pod": TARGETS["agent"]["pod"], "node": AGENT_NODE}, 11),
    Case("KcoverEventLoopStalled", [Change("agent", "kcover_event_loop_lag_seconds", set=6)],
         {**NS, "pod": TARGETS["agent"]["pod"]}, 3),
    Case("KcoverDetectorFailing", [Change("agent", "kcover_detector_up", {"detector": "nvml"}, set=0)],
         {**TARGETS["agent"], "detector": "nvml"}, 6),
    Case("KcoverDetectorRestarting", [Change("agent", "kcover_detector_restarts_total", {"detector": "nvml"}, add=4)],
         {**NS, "pod": TARGETS["agent"]["pod"], "detector": "nvml"}),
    Case("KcoverConfigReloadRefused", [Change("agent", "kcover_config_reload_failures_total", add=1)],
         {**NS, "pod": TARGETS["agent"]["pod"]}),
    Case("KcoverBusDropping", [Change("controller", "kcover_bus_dropped_total", {"subscriber": "recovery"}, add=1)],
         {**NS, "pod": TARGETS["controller"]["pod"]}),
]


def series_text(name: str, labels: frozenset[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{v}"'.replace("\\", "\\\\") for k, v in sorted(labels))
    return f"{name}{{{inner}}}"


def values(before: float, after: float) -> str:
    """promtool's notation: `before` for IDLE_MINUTES scrapes, then `after` for AFTER_MINUTES."""
    return f"{before!r}+0x{IDLE_MINUTES - 1} {after!r}+0x{AFTER_MINUTES}"


def idle_series(texts: dict[str, str]) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    series: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for role, text in texts.items():
        series.update(scraped(text, TARGETS[role]))
        series[("up", frozenset(TARGETS[role].items()))] = 1.0
    return series


def input_series(series: dict[tuple[str, frozenset[tuple[str, str]]], float],
                 changes: list[Change], *, then: dict[tuple[str, frozenset[tuple[str, str]]], float] | None = None,
                 ) -> list[dict[str, str]]:
    """`series` for IDLE_MINUTES, then with `changes` (or, `then`, another scrape's series over them)."""
    after = dict(series) if then is None else {**series, **then}
    for change in changes:
        target = TARGETS[change.role]
        key = (change.name, frozenset({**change.labels, **target}.items()))
        if change.new_pod:
            assert key in series, f"{change.name}{change.labels} is not on the {change.role}'s /metrics"
            twin = (change.name, frozenset({**change.labels, **target, "pod": change.new_pod}.items()))
            after[twin] = float(change.set or 0)
            continue
        assert key in series, (
            f"{change.name}{change.labels} is not on the {change.role}'s /metrics before the failure: its first "
            "increment would create it at that value, and an alert on its increase would not fire")
        after[key] = series[key] + change.add if change.add is not None else float(change.set or 0)
    out = []
    for key in sorted(after):
        before = series.get(key)
        text = values(before if before is not None else after[key], after[key])
        if before is None:  # a replica that appears with the failure: absent before it
            text = f"_x{IDLE_MINUTES - 1} {after[key]!r}+0x{AFTER_MINUTES}"
        out.append({"series": series_text(*key), "values": text})
    return out


def rules_without_annotations(tmp: Path) -> Path:
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    path = tmp / "rules.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def alerts() -> list[tuple[str, str]]:
    doc = yaml.safe_load(RULES.read_text())
    return [(rule["alert"], rule["labels"]["severity"]) for group in doc["groups"] for rule in group["rules"]]


def test_every_alert_has_a_case() -> None:
    assert sorted(name for name, _ in alerts()) == sorted(case.alert for case in CASES)


def run_promtool(promtool: str, tmp: Path, tests: list[dict[str, object]]) -> subprocess.CompletedProcess[str]:
    rules = rules_without_annotations(tmp)
    spec = tmp / "tests.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests},
                                   width=10_000))
    return subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=300,
                          check=False)


def test_the_rules_are_valid_promql(promtool: str, tmp_path: Path) -> None:
    proc = subprocess.run([promtool, "check", "rules", str(rules_without_annotations(tmp_path))],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


async def test_no_alert_fires_while_both_roles_idle(promtool: str, tmp_path: Path,
                                                    scrapes: dict[str, str]) -> None:  # noqa: F811
    series = idle_series(scrapes)
    test = {"interval": "1m", "input_series": input_series(series, []),
            "alert_rule_test": [{"eval_time": f"{minute}m", "alertname": name, "exp_alerts": []}
                                for name, _ in alerts() for minute in (5, IDLE_MINUTES + AFTER_MINUTES - 1)]}
    proc = await asyncio.to_thread(run_promtool, promtool, tmp_path, [test])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


async def test_each_alert_fires_on_the_first_failure(promtool: str, tmp_path: Path,
                                                     scrapes: dict[str, str]) -> None:  # noqa: F811
    """One promtool test per alert: silent just before the failure, firing with its labels after it (and its
    `for`). promtool names the alert of each group that fails."""
    series = idle_series(scrapes)
    severities = dict(alerts())
    tests: list[dict[str, object]] = []
    for case in CASES:
        expected = {"exp_labels": {**case.labels, "severity": severities[case.alert]}}
        tests.append({"name": case.alert, "interval": "1m", "input_series": input_series(series, case.changes),
                      "alert_rule_test": [
                          {"eval_time": f"{IDLE_MINUTES - 2}m", "alertname": case.alert, "exp_alerts": []},
                          {"eval_time": f"{IDLE_MINUTES - 1 + case.after_minutes}m", "alertname": case.alert,
                           "exp_alerts": [expected]}]})
    proc = await asyncio.to_thread(run_promtool, promtool, tmp_path, tests)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-3000:]


async def test_the_blind_alert_fires_on_a_real_blind_agents_metrics(promtool: str, tmp_path: Path,
                                                                     scrapes: dict[str, str],  # noqa: F811
                                                                     blind_scrape: str) -> None:  # noqa: F811
    """A GPU node's agent restarts without NVML or dcgmi (a broken driver rollout): its target's series become those
    the blind agent exported, and KcoverAgentBlind fires for that node past its `for`, and only it."""
    series = idle_series(scrapes)
    blind = scraped(blind_scrape, TARGETS["agent"])
    assert blind[("kcover_agent_blind", frozenset({"node": BLIND_NODE, **TARGETS["agent"]}.items()))] == 1
    severities = dict(alerts())
    expected = {"alertname": "KcoverAgentBlind", "severity": severities["KcoverAgentBlind"], "namespace": NAMESPACE,
                "pod": TARGETS["agent"]["pod"], "node": BLIND_NODE}
    test = {"interval": "1m", "input_series": input_series(series, [], then=blind),
            "alert_rule_test": [
                {"eval_time": f"{IDLE_MINUTES - 2}m", "alertname": "KcoverAgentBlind", "exp_alerts": []},
                {"eval_time": f"{IDLE_MINUTES + 5}m", "alertname": "KcoverAgentBlind", "exp_alerts": []},  # its `for`
                {"eval_time": f"{IDLE_MINUTES + 11}m", "alertname": "KcoverAgentBlind",
                 "exp_alerts": [{"exp_labels": {k: v for k, v in expected.items() if k != "alertname"}}]},
                # a blind agent is not a failing detector: the unavailable ones stay out of KcoverDetectorFailing
                {"eval_time": f"{IDLE_MINUTES + 11}m", "alertname": "KcoverDetectorFailing", "exp_alerts": []}]}
    proc = await asyncio.to_thread(run_promtool, promtool, tmp_path, [test])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
