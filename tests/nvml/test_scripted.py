"""The fault-file fake NVML behind `kcover agent --fake-nvml FILE`."""

from __future__ import annotations

from pathlib import Path

import pytest

from kcover import errors
from kcover.nvml import backend, scripted
from kcover.wiring import ROLES


def _nvml(tmp_path: Path) -> tuple[scripted.ScriptedNvml, Path]:
    path = tmp_path / "faults"
    nvml = scripted.from_file(str(path))
    nvml.init()
    nvml.register_events(backend.EventType.XID_CRITICAL | backend.EventType.DOUBLE_BIT_ECC)
    return nvml, path


def test_an_appended_xid_line_wakes_a_waiter(tmp_path: Path) -> None:
    nvml, path = _nvml(tmp_path)
    assert nvml.wait(50) == []  # no file yet: no faults
    path.write_text("# injected by a test\nxid 79 3\n")
    got = nvml.wait(1000)
    assert [(e.gpu_uuid, e.event_type, e.data) for e in got] == [
        (nvml.device_info(3).uuid, backend.EventType.XID_CRITICAL, 79)]
    assert nvml.wait(50) == []  # each line applies once


def test_health_faults_and_a_half_written_line(tmp_path: Path) -> None:
    nvml, path = _nvml(tmp_path)
    path.write_text("gpu-lost 2\ndouble-bit-ecc 1 3\nrow-remap-")
    with pytest.raises(errors.NvmlError) as lost:
        nvml.probe(2)
    assert lost.value.code == backend.CODE_GPU_LOST
    assert nvml.ecc_double_bit_volatile(1) == 3
    assert not nvml.remapped_rows(0).failure  # the unfinished line waits for its newline
    with path.open("a") as f:
        f.write("failure 0\nclear 2\n")
    nvml.poll()
    assert nvml.remapped_rows(0).failure
    nvml.probe(2)  # cleared, as after a reset


def test_lines_it_cannot_read_are_kept_and_skipped(tmp_path: Path) -> None:
    nvml, path = _nvml(tmp_path)
    path.write_text("xid seventy-nine\nmelt 0\nxid 79 99\nxid 48\n")
    assert nvml.poll() == 1
    assert nvml.rejected == ["xid seventy-nine", "melt 0", "xid 79 99"]


def test_the_agent_command_offers_the_flag() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    ROLES["agent"][2](parser)
    assert parser.parse_args(["--fake-nvml", "/tmp/f"]).fake_nvml == "/tmp/f"
