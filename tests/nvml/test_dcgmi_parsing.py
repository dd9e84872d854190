"""The dcgmi parsers on real dcgmi / dcgm-exporter output (tests/fixtures, provenance in SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kcover.nvml import dcgmi, xid_policy

FIXTURES = Path(__file__).parents[1] / "fixtures"
A = xid_policy.Action


def _read(*parts: str) -> str:
    return FIXTURES.joinpath(*parts).read_text()


def _with_value(text: str, metric: str, value: str) -> str:
    """A real sample with one metric's value changed (the captured nodes were healthy)."""
    return "\n".join(f"{line.rsplit(' ', 1)[0]} {value}" if line.startswith(metric + "{") else line
                     for line in text.splitlines()) + "\n"


# (fixture, [(gpu_index, check, action)])
DIAG_TABLES = [
    ("dcgm-124-r2-pass-dcgm4.4.2-a10g-table.txt", []),
    ("ramble-r3-pass-dcgm3.3.9-h200x8-table.txt", []),
    ("dcgm-253-r2-pcie-fail-internal-error-dcgm4.2.3-l40sx4-table.txt", [(None, "pcie", A.REPORT)]),
    ("dcgm-253-r2-pcie-fail-parse-error-dcgm4.4.1-b200x8-table.txt", [(None, "pcie", A.REPORT)]),
    ("ml-engineering-r2-gpu-memory-fail-gpu0-thermal-violation-excerpt.txt", [(0, "GPU Memory", A.CORDON_NODE)]),
    ("ml-engineering-r3-deployment-error-row-remap-pending-excerpt.txt", [(3, "Deployment", A.REPORT)]),
    ("nccl-tests-264-r3-fail-cuda-init-dcgm3.3.8-h100x8-table.txt", [(None, "GPU Memory", A.CORDON_NODE)]),
]


@pytest.mark.parametrize(("name", "expected"), DIAG_TABLES)
def test_parse_diag_table(name: str, expected: list[tuple[int | None, str, xid_policy.Action]]) -> None:
    got = dcgmi.parse_diag_table(_read("dcgmi-diag", name))
    assert [(f.gpu_index, f.check, f.action) for f in got] == expected


def test_wrapped_cell_text_is_rejoined_exactly() -> None:
    [finding] = dcgmi.parse_diag_table(_read("dcgmi-diag", "ml-engineering-r2-gpu-memory-fail-gpu0-thermal-violation-excerpt.txt"))
    assert "Thermal violations totaling 13.3 seconds started at 9.7 seconds into the test for GPU 0 Verify" \
        in finding.message
    [pcie] = dcgmi.parse_diag_table(_read("dcgmi-diag", "dcgm-253-r2-pcie-fail-internal-error-dcgm4.2.3-l40sx4-table.txt"))
    assert "'A child process (152) exited with non-zero status 1'" in pcie.message


def test_parse_diag_json_authored_reference() -> None:
    got = dcgmi.parse_diag_json(_read("dcgmi-diag", "dcgm-repo-testdiagmanagerstrings-per-gpu-json-AUTHORED.json"))
    assert [(f.gpu_index, f.check) for f in got] == [(0, "sm_stress"), (2, "sm_stress"), (3, "sm_stress")]
    assert "2128.7 did not exceed" in got[0].message


def test_parse_exporter_all_zero_samples_find_nothing() -> None:
    policy = xid_policy.load()
    for name in ("lke-rtx4000ada-580.95.05-xid-errcode-labels-k8s-pod.prom", "cncf-kops-l4-580.105.08-remap-fields.prom",
                 "dcgm-exporter-581-gb200-nvlink-effective-ber-errors-fragment.prom"):
        assert dcgmi.parse_exporter(_read("dcgm-exporter", name), policy) == []


def test_parse_exporter_xid_with_pod_labels() -> None:
    text = _with_value(_read("dcgm-exporter", "lke-rtx4000ada-580.95.05-xid-errcode-labels-k8s-pod.prom"),
                       "DCGM_FI_DEV_XID_ERRORS", "79")
    [finding] = dcgmi.parse_exporter(text, xid_policy.load())
    assert (finding.xid, finding.gpu_index, finding.action) == (79, 0, A.CORDON_NODE_AND_RESTART)
    assert finding.gpu_uuid == "GPU-a8394b51-c086-568a-9f1a-c1e1c934c44c"
    assert finding.pods == ("default/cuda-75454ffb9f-8ljq7",)


def test_parse_exporter_row_remap_failure() -> None:
    text = _with_value(_read("dcgm-exporter", "cncf-kops-l4-580.105.08-remap-fields.prom"),
                       "DCGM_FI_DEV_ROW_REMAP_FAILURE", "1")
    [finding] = dcgmi.parse_exporter(text, xid_policy.load())
    assert (finding.check, finding.action) == ("DCGM_FI_DEV_ROW_REMAP_FAILURE", A.CORDON_NODE)


# Constructed (no real `dcgmi health -c -j` capture is available): the nesting dcgmi uses.
HEALTH = {"body": {"Overall Health": {"value": "Failure"}, "GPU": {"children": {
    "0": {"children": {"Overall Health": {"value": "Healthy"}}},
    "2": {"children": {
        "Memory": {"Health": {"value": "Failure"},
                   "children": {"Error": {"value": "GPU 2 has uncorrectable memory errors"}}},
        "Thermal": {"Health": {"value": "Warning"},
                    "children": {"Error": {"value": "Detected clocks event due to thermal violation in GPU 2."}}}}}}}}}


def test_parse_health_json() -> None:
    got = {(f.gpu_index, f.check, f.action) for f in dcgmi.parse_health_json(json.dumps(HEALTH))}
    assert got == {(2, "Memory", A.CORDON_NODE), (2, "Thermal", A.REPORT)}


def test_either_format_is_read_and_unreadable_json_falls_back_to_the_table() -> None:
    table = _read("dcgmi-diag", "ml-engineering-r2-gpu-memory-fail-gpu0-thermal-violation-excerpt.txt")
    assert dcgmi.parse_diag(table) == dcgmi.parse_diag_table(table)
    doc = _read("dcgmi-diag", "dcgm-repo-testdiagmanagerstrings-per-gpu-json-AUTHORED.json")
    assert dcgmi.parse_diag("dcgmi prints a banner first\n" + doc) == dcgmi.parse_diag_json(doc)
    assert dcgmi.parse_diag("{not json") == []
    with pytest.raises(ValueError, match="not a dcgmi diag document"):
        dcgmi.parse_diag_json("[1, 2]")
