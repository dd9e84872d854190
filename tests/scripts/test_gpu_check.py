"""scripts/gpu-check in CI: its no-GPU form here (one line, exit 0), its full report where a GPU exists.

The no-GPU answer is what every machine without a driver gives (pynvml is installed with kcover, so
`libnvidia-ml.so` is what is missing); with a GPU the same test checks the report's documented shape.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-check"


def test_gpu_check_reports_in_one_json_document() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--wait-ms", "200", "--max-seconds", "120"],
                          capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["schema"] == "kcover.gpu-check/v1"
    if not report["gpu"]:
        assert proc.stdout.count("\n") == 1, "the no-GPU report is one line"
        assert report["reason"] in ("library_missing", "no_gpu"), report
        return
    assert report["device_count"] == len(report["devices"]) > 0
    for device in report["devices"]:
        assert device["uuid"].startswith("GPU-")
        assert {"supported", "enabled"} <= set(device["mig"])
        assert {"ecc_double_bit_volatile", "ecc_counters", "retired_pages_pending", "remapped_rows",
                "throttle_reasons"} <= set(device["health"])
        assert isinstance(device["would_report"], list)
    assert report["event_wait"]["timeout_ms"] == 200
