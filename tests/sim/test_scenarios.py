"""Every `kcover sim` scenario, end to end: the real controller replicas and agents on the simulated
cluster, small sizes. What a user sees: the scenario passes, and `--report json` has the documented shape."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from typing import Any, ClassVar

import pytest
import structlog.testing

from kcover import wiring
from kcover.cli import parsing
from kcover.detectors import registry
from kcover.sim import cluster, playing, running, scenarios

SMALL = cluster.Size(nodes=2, gpus_per_node=4, jobs=2, seed=7)
"""Room for one node's pods on the other: the scheduler counts GPUs, and a cordon must not strand a job."""
LATENCY_KEYS = {"detect_p50", "detect_p99", "act_p50", "act_p99"}
FAULT_KEYS = {"kind", "target", "injected_at", "detected_at", "acted_at", "recovered_at", "action"}
STEPS = {"node-repaired": ["KcoverValidation RequestValidation, then ValidationPassed, then the un-cordon",
                           "ran the diagnostic once, at level 3, and it passed"]}
"""Checks a scenario must have made (and passed), beyond passing: the steps it exists to show."""


def _shape(doc: dict[str, Any], name: str) -> None:
    assert doc["scenario"] == name
    assert isinstance(doc["passed"], bool)
    assert set(doc["latency_ms"]) == LATENCY_KEYS
    assert all(isinstance(k, str) and " " in k and isinstance(v, int) for k, v in doc["api_requests"].items())
    for fault in doc["faults"]:
        assert set(fault) == FAULT_KEYS
        assert isinstance(fault["injected_at"], float)
    json.dumps(doc)  # serialisable as it is


@pytest.mark.parametrize("name", list(scenarios.SCENARIOS))
async def test_scenario_passes(name: str) -> None:
    plugin = scenarios.SCENARIOS[name].plugin
    if plugin and plugin not in registry.discover().names():
        pytest.skip(f"the {plugin} plugin is not installed (pip install -e plugins/kcover-{plugin})")
    with structlog.testing.capture_logs() as logged:
        report = await running.run_scenario(scenarios.SCENARIOS[name], SMALL)
    failed = [c.text for c in report.checks if not c.ok]
    assert report.passed, f"{name}: {failed}\n{running.render(report)}"
    errors = [entry for entry in logged if entry.get("log_level") in ("error", "critical")]
    assert not errors, f"{name} passed but logged errors: {errors}"
    for step in STEPS.get(name, []):
        assert any(step in c.text and c.ok for c in report.checks), f"{name}: no passed check {step!r}"
    doc = report.to_json()
    _shape(doc, name)
    assert doc["faults"], "every scenario injects at least one fault"
    first = doc["faults"][0]
    assert first["detected_at"] is not None
    assert first["detected_at"] >= first["injected_at"]
    if first["acted_at"] is not None:
        assert doc["latency_ms"]["act_p50"] is not None
    if first["recovered_at"] is not None:
        assert first["recovered_at"] >= first["acted_at"]


async def test_pod_error_restarts_through_the_api() -> None:
    report = await running.run_scenario(scenarios.SCENARIOS["pod-error"], SMALL)
    doc = report.to_json()
    # A PyTorchJob's pods carry no uid-bearing label: each is deleted on its own with a uid precondition.
    assert doc["api_requests"]["DELETE pods"] == 2
    assert "DELETECOLLECTION pods" not in doc["api_requests"]
    assert doc["faults"][0]["action"] == "restart-workload"
    assert any(tag == "act" and "KcoverRestartedWorkload" in text for _, tag, text in report.timeline)


def test_cli_report_json_exits_zero() -> None:
    done = subprocess.run([sys.executable, "-m", "kcover.cli", "sim", "--report", "json", "--nodes", "2",
                           "--gpus-per-node", "2"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    _shape(doc, "pod-error")
    assert doc["passed"] is True


def test_cli_lists_scenarios_and_refuses_unknown_ones() -> None:
    listed = subprocess.run([sys.executable, "-m", "kcover.cli", "sim", "--list"], capture_output=True, text=True,
                            timeout=60, check=False)
    assert listed.returncode == 0
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [*scenarios.catalogue(), running.CHAOS, running.FLEET]
    unknown = subprocess.run([sys.executable, "-m", "kcover.cli", "sim", "no-such-scenario"], capture_output=True,
                             text=True, timeout=60, check=False)
    assert unknown.returncode == 2
    assert "unknown scenario" in unknown.stderr


async def test_a_scenario_whose_plugin_is_missing_does_not_pass_and_says_why() -> None:
    needs = playing.Scenario("needs-plugin", "needs a plugin that is not installed", scenarios.pod_error,
                               plugin="no-such-plugin")
    report = await running.run_scenario(needs, SMALL)
    assert not report.passed
    assert "'no-such-plugin' is not installed" in report.to_json()["skipped"]
    assert report.to_json()["passed"] is False
    assert report.faults == []
    assert running.render(report).splitlines()[-1] == "result: NOT RUN"


def test_cli_exits_non_zero_for_a_scenario_that_cannot_run(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`kcover sim log-classified` without the logscan plugin once printed SKIPPED and exited 0."""
    needs = playing.Scenario("needs-plugin", "needs a plugin that is not installed", scenarios.pod_error,
                               plugin="no-such-plugin")
    monkeypatch.setitem(scenarios.SCENARIOS, needs.name, needs)
    args = parsing.build_parser(wiring.ROLES, command="sim").parse_args(["sim", needs.name, "--nodes", "2"])
    args.config_given = False
    buf = io.StringIO()
    assert running.main(args, buf) == running.NOT_RUN == 3
    _, err = capsys.readouterr()
    out = buf.getvalue()
    assert "NOT RUN: detector plugin 'no-such-plugin' is not installed" in out
    assert "did not run" in err
    assert "pip install -e plugins/kcover-no-such-plugin" in err


@pytest.mark.parametrize("name", ["breaker-latch", "pause", "restart-stalled", "node-repaired"])
async def test_the_closed_loop_scenarios_pass_at_the_clis_default_size(name: str) -> None:
    """`kcover sim NAME` as a user runs it (the default 4 nodes): breaker-latch once relied on the small
    size, where the simulated cluster's cordon fraction happened to refuse the second node."""
    report = await running.run_scenario(scenarios.SCENARIOS[name], cluster.Size())
    assert report.passed, f"{name}: {[c.text for c in report.checks if not c.ok]}\n{running.render(report)}"


@pytest.mark.parametrize(("text", "limit", "want"), [
    ("restarted PyTorchJob ml/train-0: deleted 4 pods (training.kubeflow.org/job-name=train-0,training.kubeflow.org/"
     "operator-name=pytorchjob-controller)", 100,
     "restarted PyTorchJob ml/train-0: deleted 4 pods (training.kubeflow.org/job-name=train-0 ..."),
    ("0/4 nodes are available: 4 node(s) were unschedulable. no new claims to deallocate", 60,
     "0/4 nodes are available: 4 node(s) were unschedulable. ..."),
    ("short enough", 40, "short enough"),
    ("spaces   and\nnewlines   fold", 40, "spaces and newlines fold"),
    ("x" * 50, 20, "x" * 16 + " ..."),
])
def test_clip_cuts_on_a_word_boundary(text: str, limit: int, want: str) -> None:
    assert playing.clip(text, limit) == want
    assert len(playing.clip(text, limit)) <= limit


def test_timeline_event_messages_end_on_a_word() -> None:
    """Timelines once cut an Event's message at 140 characters, mid-word ("...operator-name=pytorchjob-contr")."""

    class Cluster:
        detections: ClassVar[list[Any]] = []
        api_events: ClassVar[list[cluster.ApiEvent]] = [cluster.ApiEvent(at=running.dt.datetime.now(running.dt.UTC), reason="KcoverRestartedWorkload",
                                       kind="PyTorchJob", namespace="ml", name="train-0", reporter="kcover",
                                       instance="kcover-controller-a", annotations={},
                                       message="restarted PyTorchJob ml/train-0: deleted 4 pods (training.kubeflow.org/"
                                               "job-name=train-0,training.kubeflow.org/operator-name=pytorchjob-"
                                               "controller) after ContainerError from pod-status: the worker exited")]

    started = running.dt.datetime.now(running.dt.UTC) - running.dt.timedelta(seconds=1)
    run = playing.Run(Cluster(), started=started)  # type: ignore[arg-type]
    [(_, tag, text)] = running.timeline(run)
    event = Cluster.api_events[0]
    full = f"Event {event.reason} on PyTorchJob ml/train-0 by kcover-controller-a: {event.message}"
    assert tag == "act"
    assert text.endswith(" ...")
    body = text.removesuffix(" ...")
    assert full.startswith(body)
    assert full[len(body)] in " ,;", text  # the cut falls between words
