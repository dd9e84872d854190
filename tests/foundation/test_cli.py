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
                   "  - {detector: event-*, reason: Hang*, action: restart-workload}\n")
    out = kcover("config", "check", str(bad))
    assert out.returncode == 1
    assert "recovery.rules[0].detector: 'pod-stats' matches no installed detector" in out.stderr
    assert "recovery.rules[1]" not in out.stderr


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
                                                      "source": f"file:{f}", "restart_required": False}
    assert rows["recovery.dry_run"]["value"] is True
    assert rows["recovery.dry_run"]["source"] == "env"
    assert rows["lease.retry_period_seconds"]["source"] == "cli"
    assert rows["lease.lease_duration_seconds"]["source"] == "default"


def test_config_show_with_an_explicit_missing_file_fails(tmp_path: Path) -> None:
    out = kcover("config", "show", "--config", str(tmp_path / "nope.yaml"))
    assert out.returncode == 1


# ---------------------------------------------------------------------------------------------- one run, every problem

def test_config_check_lists_field_and_relation_errors_in_one_run(tmp_path: Path) -> None:
    """A relation between two fields is reported beside a field error elsewhere in the file, and beside one in
    its own group; a relation that reads an invalid field is not judged on a default in its place."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("lease:\n  renew_deadline_seconds: 20\n  name: 5\nrecovery:\n  workload_cooldown_seconds: -1\n")
    out = kcover("config", "check", str(bad))
    assert out.returncode == 1
    assert "recovery.workload_cooldown_seconds: Input should be greater than or equal to 0" in out.stderr
    assert "lease.name: Input should be a valid string" in out.stderr
    assert "lease.renew_deadline_seconds: must be below lease.lease_duration_seconds (15)" in out.stderr
    bad.write_text("lease:\n  renew_deadline_seconds: 20\n  lease_duration_seconds: soon\n")
    out = kcover("config", "check", str(bad))
    assert out.returncode == 1
    assert "lease.lease_duration_seconds: Input should be a valid number" in out.stderr
    assert "lease.renew_deadline_seconds" not in out.stderr  # judged against "soon" next run, not against 15


@pytest.mark.parametrize("schema_error", [False, True])
def test_the_agents_event_retry_must_stay_below_the_event_watchers_staleness(tmp_path: Path,
                                                                             schema_error: bool) -> None:
    """An Event the agent writes past the event watcher's staleness is ignored: the limit is checked (with the
    event watcher's own config, default or set), also when the file has other errors."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent:\n  event_retry_seconds: 400\n"
                   + ("recovery:\n  workload_cooldown_seconds: -1\n" if schema_error else ""))
    out = kcover("config", "check", str(bad))
    assert out.returncode == 1
    assert ("agent.event_retry_seconds: must be below detectors.entries.event-watcher.config.staleness_seconds "
            "(180)") in out.stderr
    assert ("recovery.workload_cooldown_seconds" in out.stderr) is schema_error
    good = tmp_path / "good.yaml"
    good.write_text("agent:\n  event_retry_seconds: 400\n"
                    "detectors:\n  entries:\n    event-watcher: {config: {staleness_seconds: 600}}\n")
    assert kcover("config", "check", str(good)).returncode == 0


def test_a_role_refuses_an_event_retry_past_the_staleness(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("agent:\n  event_retry_seconds: 180\n")
    out = kcover("agent", "--config", str(f), "--node-name", "n1", "--port", "0")
    assert out.returncode == 1
    assert "agent.event_retry_seconds: must be below" in out.stderr


# ---------------------------------------------------------------------------------------------- config show, help

def test_config_show_marks_the_settings_that_need_a_restart() -> None:
    from kcover import layering

    out = kcover("config", "show", "--config", "/dev/null", "-o", "json")
    assert out.returncode == 0, out.stderr
    rows = {r["setting"]: r for r in json.loads(out.stdout)}
    marked = {path for path, row in rows.items() if row["restart_required"]}
    assert marked == layering.restart_required_paths()
    assert rows["server.port"]["restart_required"] is True
    assert rows["recovery.workload_cooldown_seconds"]["restart_required"] is False
    table = kcover("config", "show", "--config", "/dev/null").stdout
    lines = {line.split()[0]: line for line in table.splitlines() if line.strip()}
    assert lines["server.port"].endswith("[restart required]")
    assert not lines["recovery.workload_cooldown_seconds"].endswith("[restart required]")


@pytest.mark.parametrize(("argv", "rereads"), [
    (("controller",), True), (("agent",), True),
    (("status",), False), (("breaker", "reset"), False), (("config", "show"), False),
])
def test_only_the_roles_say_they_re_read_their_config(argv: tuple[str, ...], rereads: bool) -> None:
    out = kcover(*argv, "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "--config CONFIG YAML settings file" in text
    assert ("re-read when it changes" in text) is rereads


# ---------------------------------------------------------------------------------------------- pipes, dead servers

def _into_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """Run kcover with stdout a pipe whose reader is gone (`kcover ... | head` once head exited)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "kcover.cli", *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=60, check=False)
    finally:
        os.close(write)


@pytest.mark.parametrize("argv", [("config", "show"), ("detectors",), ("version",)])
def test_commands_are_quiet_in_a_closed_pipe(argv: tuple[str, ...]) -> None:
    out = _into_closed_pipe(*argv)
    assert out.stderr == ""
    assert out.returncode == 141  # as a process that SIGPIPE ended


async def test_status_is_quiet_in_a_closed_pipe(tmp_path: Path) -> None:
    import asyncio

    from kcover.sim import server

    async with server.SimServer() as srv:
        kubeconfig = str(srv.write_kubeconfig(tmp_path / "kubeconfig"))
        out = await asyncio.to_thread(_into_closed_pipe, "status", "--kubeconfig", kubeconfig)
    assert "Traceback" not in out.stderr
    assert out.stderr == ""
    assert out.returncode == 141


def _kubeconfig(tmp_path: Path, server: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    return str(path)


@pytest.mark.parametrize("argv", [("status",), ("breaker", "reset")])
def test_one_shot_commands_give_up_on_a_refusing_server_with_a_clear_message(tmp_path: Path,
                                                                              argv: tuple[str, ...]) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = kcover(*argv, "--kubeconfig", _kubeconfig(tmp_path, f"http://127.0.0.1:{port}"), "--timeout", "1")
    assert out.returncode == (3 if argv == ("status",) else 1)
    assert out.stderr.splitlines() == [
        f"kcover {' '.join(argv)}: cannot reach the API server http://127.0.0.1:{port} within 1s (--timeout): "
        + out.stderr.split("(--timeout): ", 1)[-1].strip()]
    assert "Connect" in out.stderr


def test_status_gives_up_on_a_server_that_never_answers(tmp_path: Path) -> None:
    """A server that accepts connections and never answers (a hung API server behind a load balancer) is given
    `--timeout`, not the 30 s of each request and the retries after it."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshakes; nobody ever reads or answers
        port = silent.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "kcover.cli", "status", "--kubeconfig",
                              _kubeconfig(tmp_path, f"http://127.0.0.1:{port}"), "--timeout", "1"],
                             capture_output=True, text=True, timeout=25)
    assert out.returncode == 3
    assert out.stderr.strip() == f"kcover status: the API server http://127.0.0.1:{port} did not answer within 1s (--timeout)"
