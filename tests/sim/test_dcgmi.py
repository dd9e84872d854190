"""The simulated node's `dcgmi` (kcover/sim/dcgmi.py), judged by the agent's own verdict.

It prints the real recorded outputs: a pass while the node's GPUs answer NVML, the recorded failure
while one is lost, and a usage error for anything but `dcgmi diag -r <level>`. Its recordings are
the test fixtures themselves (byte for byte), so the sim cannot drift from what the parsers are tested on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kcover import validationcodec
from kcover.agent import validating
from kcover.nvml import fake
from kcover.sim import dcgmi

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgmi-diag"


def _nvml() -> fake.FakeNvml:
    nvml = fake.FakeNvml(8)
    nvml.init()
    return nvml


async def test_a_healthy_node_passes_its_diagnostic() -> None:
    diag = dcgmi.FakeDcgmi(_nvml())
    result = await diag.run(["dcgmi", "diag", "-r", "3", "-j"], timeout_seconds=10.0)
    outcome, text = validating.verdict(result.returncode, result.stdout, 3)
    assert (outcome, result.returncode) == (validationcodec.ValidationOutcome.PASSED, 0)
    assert "every test passed" in text
    assert [(c.argv, c.recording) for c in diag.calls] == [(("dcgmi", "diag", "-r", "3", "-j"), dcgmi.PASSED)]


async def test_a_lost_gpu_fails_it_with_the_recorded_failure() -> None:
    nvml = _nvml()
    nvml.gpu_lost(5)
    diag = dcgmi.FakeDcgmi(nvml)
    result = await diag.run(["dcgmi", "diag", "-r", "1"], timeout_seconds=10.0)
    outcome, text = validating.verdict(result.returncode, result.stdout, 1)
    assert outcome is validationcodec.ValidationOutcome.FAILED
    assert "GPU Memory" in text
    assert result.returncode != 0
    nvml.clear(5)  # repaired: the next run passes
    again = await diag.run(["dcgmi", "diag", "-r", "1"], timeout_seconds=10.0)
    assert validating.verdict(again.returncode, again.stdout, 1)[0] is validationcodec.ValidationOutcome.PASSED


async def test_nvml_down_fails_the_diagnostic() -> None:
    result = await dcgmi.FakeDcgmi(fake.FakeNvml(2)).run(["dcgmi", "diag", "-r", "1"], timeout_seconds=1.0)
    assert validating.verdict(result.returncode, result.stdout, 1)[0] is validationcodec.ValidationOutcome.FAILED


@pytest.mark.parametrize("argv", [["dcgmi"], ["dcgmi", "health", "-c"], ["dcgmi", "diag", "-r"],
                                  ["dcgmi", "diag", "-r", "long"]])
async def test_anything_but_a_diag_at_a_level_is_a_usage_error(argv: list[str]) -> None:
    result = await dcgmi.FakeDcgmi(_nvml()).run(argv, timeout_seconds=1.0)
    assert (result.returncode, result.stdout) == (2, "")
    assert "usage: dcgmi diag -r <level>" in result.stderr
    assert validating.verdict(result.returncode, result.stdout, 1)[0] is validationcodec.ValidationOutcome.ERROR


@pytest.mark.parametrize("name", [dcgmi.PASSED, dcgmi.FAILED])
def test_the_recordings_are_the_test_fixtures(name: str) -> None:
    assert dcgmi.recorded(name) == (FIXTURES / name).read_text("utf-8")
