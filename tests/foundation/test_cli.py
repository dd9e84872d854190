from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def kcover(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kcover.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=60)


def test_version() -> None:
    out = kcover("version")
    assert out.returncode == 0
    assert out.stdout.startswith("kcover ")


def test_help_lists_only_working_commands() -> None:
    out = kcover("--help")
    assert out.returncode == 0
    for command in ("detectors", "config", "version"):
        assert command in out.stdout


def test_config_check_accepts_the_shipped_defaults() -> None:
    shipped = Path(__file__).parents[2] / "config" / "kcover.yaml"
    out = kcover("config", "check", str(shipped))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith(": valid")


def test_config_check_reports_field_level_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("recovery:\n  workload_cooldown_seconds: -3\n  max_restarts_per_window: lots\n"
                   "detectors:\n  entries:\n    nope: {}\n")
    out = kcover("config", "check", str(bad))
    assert out.returncode == 1
    assert "recovery.workload_cooldown_seconds: Input should be greater than or equal to 0 (got -3)" in out.stderr
    assert "recovery.max_restarts_per_window: Input should be a valid integer" in out.stderr
    assert "detectors.entries.nope: unknown detector; installed:" in out.stderr


BAD_XID_POLICY = "xids:\n  79: {action: explode}\n"


@pytest.mark.parametrize("schema_error", [False, True])
def test_config_check_lists_rule_detector_and_xid_policy_problems_in_one_run(tmp_path: Path,
                                                                            schema_error: bool) -> None:
    """What the roles would refuse (a rule's unknown action, a detector config, the XID policy file), all at
    once, exit 1; also when the settings schema refuses the file too."""
    xid = tmp_path / "xid-policy.yaml"
    xid.write_text(BAD_XID_POLICY)
    bad = tmp_path / "bad.yaml"
    bad.write_text("recovery:\n"
                   + ("  event_cooldown_seconds: 30\n" if schema_error else "")
                   + "  rules:\n  - {detector: pod-status, action: reboot-the-cluster}\n"
                   "detectors:\n  entries:\n    pod-status: {config: {reasons: 5, bogus: 1}}\n"
                   f"agent:\n  xid_policy_file: {xid}\n")
    out = kcover("config", "check", str(bad))
    assert out.returncode == 1
    assert "recovery.rules[0]:" in out.stderr
    assert "reboot-the-cluster" in out.stderr
    assert "detectors.entries.pod-status.config.reasons: Input should be a valid list" in out.stderr
    assert "detectors.entries.pod-status.config.bogus: Extra inputs are not permitted" in out.stderr
    assert f"agent.xid_policy_file: {xid}: xids.79.action:" in out.stderr
    assert ("recovery.event_cooldown_seconds: removed setting" in out.stderr) is schema_error


def test_config_check_accepts_valid_rules_and_xid_policy(tmp_path: Path) -> None:
    xid = tmp_path / "xid-policy.yaml"
    xid.write_text("xids:\n  79: {action: cordon-node, severity: Error}\n")
    good = tmp_path / "good.yaml"
    good.write_text("recovery:\n  rules:\n  - {detector: pod-status, reason: OOM*, action: ignore}\n"
                    f"agent:\n  xid_policy_file: {xid}\n")
    out = kcover("config", "check", str(good))
    assert out.returncode == 0, out.stderr


def test_config_check_refuses_a_rule_for_a_detector_that_does_not_exist(tmp_path: Path) -> None:
    """A rule whose detector matches no installed detector can never apply: a typo that silently
    disables what the rule was for. Patterns that match one are fine."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("recovery:\n  rules:\n  - {detector: pod-stats, action: ignore}\n"
                   "  - {detector: event-*, reason: Hang*, action: restart-workload}\n"
                   "  - {detector: kcover-validation, action: report}\n")
    out = kcover("config", "check", str(bad))
    assert out.returncode == 1
    assert "recovery.rules[0].detector: 'pod-stats' matches no installed detector" in out.stderr
    assert "recovery.rules[1]" not in out.stderr
    assert "recovery.rules[2]" not in out.stderr


@pytest.mark.parametrize("rule", ["{action: cordon-node}", "{detector: '*', reason: '*', action: cordon-node-and-restart}",
                                  "{target: Node, severity: Error, action: cordon-node-and-restart}"])
def test_config_check_warns_of_a_catch_all_cordon_rule(tmp_path: Path, rule: str) -> None:
    broad = tmp_path / "broad.yaml"
    broad.write_text(f"recovery:\n  rules:\n  - {{detector: pod-status, action: restart-workload}}\n  - {rule}\n")
    out = kcover("config", "check", str(broad))
    assert out.returncode == 0, out.stderr
    assert "warning: recovery.rules[1]:" in out.stderr
    assert "of every detector and reason" in out.stderr
    assert "recovery.rules[0]" not in out.stderr
    assert out.stdout.strip().endswith(": valid (1 warning)")
    narrow = tmp_path / "narrow.yaml"
    narrow.write_text("recovery:\n  rules:\n  - {detector: node-condition, action: cordon-node}\n"
                      "  - {reason: XID79, action: cordon-node}\n")
    out = kcover("config", "check", str(narrow))
    assert out.returncode == 0, out.stderr
    assert "warning" not in out.stderr


@pytest.mark.parametrize(("content", "message"), [
    ("recovery: [unclosed", "not valid YAML"),
    ("- a list\n", "the top level must be a mapping"),
])
def test_config_check_reports_unreadable_files(tmp_path: Path, content: str, message: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    out = kcover("config", "check", str(bad))
    assert out.returncode == 1
    assert message in out.stderr


def test_config_check_missing_file(tmp_path: Path) -> None:
    out = kcover("config", "check", str(tmp_path / "absent.yaml"))
    assert out.returncode == 1
    assert "no such file" in out.stderr


def test_config_show_gives_values_and_their_sources(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("recovery:\n  node_cooldown_seconds: 42\n")
    out = kcover("config", "show", "--config", str(f), "--set", "lease.retry_period_seconds=3", "-o", "json",
                 env={"KCOVER_RECOVERY__DRY_RUN": "true"})
    assert out.returncode == 0, out.stderr
    rows = {r["setting"]: r for r in json.loads(out.stdout)}
    assert rows["recovery.node_cooldown_seconds"] == {"setting": "recovery.node_cooldown_seconds", "value": 42.0,
                                                      "source": f"file:{f}"}
    assert rows["recovery.dry_run"]["value"] is True
    assert rows["recovery.dry_run"]["source"] == "env"
    assert rows["lease.retry_period_seconds"]["source"] == "cli"
    assert rows["lease.lease_duration_seconds"]["source"] == "default"


def test_config_show_with_an_explicit_missing_file_fails(tmp_path: Path) -> None:
    out = kcover("config", "show", "--config", str(tmp_path / "nope.yaml"))
    assert out.returncode == 1
