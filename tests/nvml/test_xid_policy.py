"""The shipped XID policy, its decisions, overrides, and the kernel-log parser on real log lines."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from kcover import errors, model
from kcover.nvml import xid_policy

FIXTURES = Path(__file__).parents[1] / "fixtures"
A = xid_policy.Action


@pytest.fixture(scope="module")
def policy() -> xid_policy.XidPolicy:
    return xid_policy.load()


# (xid, earlier occurrences on the GPU (seconds), now, action, class)
DECISIONS = [
    # application XIDs never cordon on one occurrence
    (13, [], 1000.0, A.RESTART_WORKLOAD, "application"),
    (31, [], 1000.0, A.RESTART_WORKLOAD, "application"),
    (43, [], 1000.0, A.REPORT, "application"),
    (45, [], 1000.0, A.REPORT, "application"),
    (68, [], 1000.0, A.RESTART_WORKLOAD, "application"),
    (109, [], 1000.0, A.RESTART_WORKLOAD, "application"),
    # ...nor repeated on one GPU: whose job failed there is the controller's judgement (WORKFLOW_XID_13/31)
    (13, [900.0, 950.0], 1000.0, A.RESTART_WORKLOAD, "application"),
    (13, [900.0], 1000.0, A.RESTART_WORKLOAD, "application"),
    (109, [10.0] * 20, 1000.0, A.RESTART_WORKLOAD, "application"),
    (43, [1.0] * 50, 1000.0, A.REPORT, "application"),
    # hardware / driver / nvlink per the catalog
    (48, [], 0.0, A.CORDON_NODE_AND_RESTART, "hardware"),  # the work on the GPU is lost
    (63, [], 0.0, A.REPORT, "hardware"),
    (64, [], 0.0, A.CORDON_NODE, "hardware"),
    (74, [], 0.0, A.CORDON_NODE, "nvlink"),
    (79, [], 0.0, A.CORDON_NODE_AND_RESTART, "hardware"),  # the work on the GPU is lost
    (92, [], 0.0, A.REPORT, "hardware"),
    (94, [], 0.0, A.RESTART_WORKLOAD, "hardware"),
    (95, [], 0.0, A.CORDON_NODE_AND_RESTART, "hardware"),  # the work on the GPU is lost
    (119, [], 0.0, A.CORDON_NODE, "driver"),
    (120, [], 0.0, A.CORDON_NODE, "driver"),
    (149, [], 0.0, A.REPORT, "nvlink"),
    (149, [1.0, 2.0], 3.0, A.CORDON_NODE, "nvlink"),
    (154, [], 0.0, A.REPORT, "driver"),
    # unknown codes are reported, never dropped
    (4242, [], 0.0, A.REPORT, "unknown"),
]


@pytest.mark.parametrize(("xid", "history", "now", "action", "xid_class"), DECISIONS)
def test_decide(policy: xid_policy.XidPolicy, xid: int, history: list[float], now: float,
                action: xid_policy.Action, xid_class: str) -> None:
    decision = policy.decide(xid, history, now)
    assert decision.action is action
    assert decision.xid_class.value == xid_class
    assert decision.reason == f"XID{xid}"


def test_unknown_is_flagged(policy: xid_policy.XidPolicy) -> None:
    decision = policy.decide(4242, [], 0.0)
    assert not decision.known
    assert decision.severity is model.Severity.WARNING


def _catalog() -> list[dict[str, str]]:
    with (FIXTURES / "xid-catalog" / "xid-catalog-xids.csv").open(newline="") as f:
        rows = list(csv.reader(f))
    return [{"code": r[1], "immediate": r[8].strip()} for r in rows[1:]]


def test_every_catalog_row_has_a_policy_entry(policy: xid_policy.XidPolicy) -> None:
    codes = {int(r["code"]) for r in _catalog()}
    assert len(codes) == 172
    assert codes <= set(policy.entries)


def test_policy_follows_the_catalog_buckets(policy: xid_policy.XidPolicy) -> None:
    for row in _catalog():
        code, bucket = int(row["code"]), row["immediate"]
        first = policy.decide(code, [], 0.0)
        if bucket == "RESTART_APP":
            assert first.action is A.RESTART_WORKLOAD, code
        elif bucket in ("RESET_GPU", "RESTART_BM", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR") and code != 109:
            lost = code in (48, 79, 95)  # the work on the GPU is already lost: restart it too
            assert first.action is (A.CORDON_NODE_AND_RESTART if lost else A.CORDON_NODE), code
        elif code in (14, 106, 107):  # IGNORE rows that are test/fake errors: not even reported
            assert first.action is A.IGNORE, code
        elif code != 109:
            assert first.action is A.REPORT, (code, bucket)


def test_override_file_replaces_entries_per_code(tmp_path: Path) -> None:
    override = tmp_path / "policy.yaml"
    override.write_text("xids:\n  13: {class: application, severity: Error, action: cordon-node}\n"
                        "unknown: {class: unknown, severity: Error, action: report}\n")
    policy = xid_policy.load(str(override))
    assert policy.decide(13, [], 0.0).action is A.CORDON_NODE
    assert policy.decide(79, [], 0.0).action is A.CORDON_NODE_AND_RESTART  # untouched entries stay
    assert policy.decide(4242, [], 0.0).severity is model.Severity.ERROR


def test_threshold_gates_the_action(tmp_path: Path) -> None:
    policy = xid_policy.XidPolicy.from_mapping({"xids": {92: {
        "class": "hardware", "action": "cordon-node", "threshold": {"count": 3, "window_seconds": 60}}}})
    assert policy.decide(92, [], 100.0).action is A.REPORT
    assert policy.decide(92, [50.0, 90.0], 100.0).action is A.CORDON_NODE
    assert policy.decide(92, [10.0, 90.0], 100.0).action is A.REPORT
    counted = policy.decide(92, [50.0, 90.0], 100.0)
    assert (counted.occurrences, counted.window_seconds) == (3, 60.0)


def test_escalation_reports_the_window_it_counted_in() -> None:
    policy = xid_policy.load()  # XID 94 (contained ECC error): hardware, escalates on its third in an hour
    first, third = policy.decide(94, [], 0.0), policy.decide(94, [900.0, 950.0], 1000.0)
    assert (first.occurrences, first.window_seconds, first.escalated) == (1, 0.0, False)
    assert (third.occurrences, third.window_seconds, third.escalated) == (3, 3600.0, True)


@pytest.mark.parametrize(("text", "problem"), [
    ("xids:\n  13: {action: reboot}\n", "xids.13.action"),
    ("xids:\n  thirteen: {action: report}\n", "xids.thirteen"),
    ("xids:\n  13: {class: app}\n", "xids.13.class"),
    ("xids: [1, 2]\n", "xids must be a mapping"),
])
def test_invalid_override_names_the_field(tmp_path: Path, text: str, problem: str) -> None:
    override = tmp_path / "policy.yaml"
    override.write_text(text)
    with pytest.raises(errors.ConfigError) as info:
        xid_policy.load(str(override))
    assert problem in str(info.value)


def test_missing_override_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError):
        xid_policy.load(str(tmp_path / "absent.yaml"))


def test_config_copy_is_the_packaged_file() -> None:
    shipped = Path(__file__).parents[2] / "config" / "xid-policy.yaml"
    assert shipped.read_text() == xid_policy.default_policy_text()


# ---------------------------------------------------------------------------------------------- parse_xid

# (fixture file, expected (code, bus, pid, process) of every XID line, in order)
KERNEL_LOGS = [
    ("ml-engineering-xid63-row-remapper-new-row.log", [(63, "0000:10:1c", 1896, "")]),
    ("nvsentinel-doc-xid48-gpu-at-header-ctx-switch-timeout.log", [(48, "0000:03:00", 91237, "nv-hostengine")]),
    ("nvsentinel-syslog-kernel-prefix-xid119-xid13.log",
     [(119, "0002:00:00", 1582259, "nvc:[driver]"), (13, "0002:00:00", 2519562, "python3")]),
    ("dxvk-1799-journalctl-k-xid31-hubclient-450.80.02.log",
     [(31, "0000:c1:00", 12890, ""), (31, "0000:c1:00", 12890, "")]),
    ("bumblebee-677-dmesg-xid32-31-2015-format.log",
     [(32, "0000:01:00", None, ""), (32, "0000:01:00", None, ""), (31, "0000:01:00", None, "")]),
    ("ogkm-1030-dmesg-xid31-mmu-fault-595.71.05-rtx5070ti.log", [(31, "0000:01:00", 13705, "UnrealEditor")]),
]


def _xids(name: str) -> list[xid_policy.KernelXid]:
    lines = (FIXTURES / "kernel-xid" / name).read_text().splitlines()
    return [x for x in map(xid_policy.parse_xid, lines) if x is not None]


@pytest.mark.parametrize(("name", "expected"), KERNEL_LOGS)
def test_parse_xid_on_real_logs(name: str, expected: list[tuple[int, str, int | None, str]]) -> None:
    assert [(x.code, x.pci_bus_id, x.pid, x.process) for x in _xids(name)] == expected


def test_xid79_line_and_gpu_header() -> None:
    lines = (FIXTURES / "kernel-xid" / "gpud-dmesg-xid79-fallen-off-bus-with-sxid20034.log").read_text().splitlines()
    assert xid_policy.parse_gpu_at(lines[0]) == ("0000:91:00", "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b")
    first = xid_policy.parse_xid(lines[2])
    assert first is not None
    assert (first.code, first.message) == (79, "GPU has fallen off the bus.")


def test_xid154_recovery_action() -> None:
    got = _xids("gpud-dmesg-gb200-xid149-netir-link-evt-xid154-recovery-action.log")
    actions = [x.recovery_action for x in got if x.code == 154]
    assert actions[:2] == ["Drain and Reset", "GPU Reset Required"]
    assert {x.code for x in got} == {149, 154}


@pytest.mark.parametrize("name", sorted(p.name for p in (FIXTURES / "kernel-xid").glob("*.log")))
def test_every_nvrm_xid_line_parses(name: str) -> None:
    for line in (FIXTURES / "kernel-xid" / name).read_text().splitlines():
        parsed = xid_policy.parse_xid(line)
        assert (parsed is not None) == ("NVRM: Xid (" in line), line
        if parsed is not None:
            assert parsed.code > 0


@pytest.mark.parametrize("line", [
    "[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
    "NVRM: The NVIDIA GPU 0000:18:00.0",
    "NVRM: GPU6 _kgspIsHeartbeatTimedOut: Heartbeat timed out",
    "",
])
def test_non_xid_lines(line: str) -> None:
    assert xid_policy.parse_xid(line) is None
