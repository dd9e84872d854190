"""The script detector against real shell scripts in tmp_path."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import stat
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import pydantic
import pytest
from kcover_script_detector import checking
from kcover_script_detector import config as config_
from kcover_script_detector import detector as detector_

from kcover import bus as bus_
from kcover import codec, model
from kcover import metrics as metrics_
from kcover.agent import reporting
from kcover.detectors import contract

NOW = dt.datetime(2026, 4, 23, 3, 0, tzinfo=dt.UTC)

NPD_STYLE = """\
#!/bin/bash
# Custom NPD plugin: is the fabric manager of this node running?
# Exit codes follow node-problem-detector: 0 OK, 1 NonOK, 2 Unknown.
readonly OK=0
readonly NONOK=1
readonly UNKNOWN=2

readonly STATUS_FILE="$1"

if [ ! -r "$STATUS_FILE" ]; then
  echo "cannot read fabric manager status from $STATUS_FILE"
  exit $UNKNOWN
fi

state="$(cat "$STATUS_FILE")"
case "$state" in
  active)
    echo "fabric manager is active"
    exit $OK
    ;;
  failed|inactive)
    echo "fabric manager is $state: NVLink fabric unavailable"
    exit $NONOK
    ;;
  *)
    echo "unexpected fabric manager state '$state'"
    exit $UNKNOWN
    ;;
esac
"""


def write_script(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.write_text(body if body.startswith("#!") else "#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def make(tmp_path: Path, scripts: list[dict[str, Any]], **settings: Any) -> detector_.ScriptDetector:
    config = config_.ScriptDetectorConfig.model_validate({"scripts": scripts, **settings})
    context = contract.DetectorContext(role=contract.Role.AGENT, metrics=metrics_.Metrics(), node_name="gpu-node-7")
    return detector_.ScriptDetector("script", config, context)


class Running:
    """A detector running in the background, with every event it published."""

    def __init__(self, detector: detector_.ScriptDetector) -> None:
        self.bus = bus_.Bus(dedupe_window_seconds=0)
        self.sub = self.bus.subscribe("test")
        self.stop = asyncio.Event()
        self.events: list[model.CollectorEvent] = []
        self.task = asyncio.create_task(detector.run(self.bus, self.stop), name="detector-under-test")

    async def wait_for(self, predicate: Callable[[list[model.CollectorEvent]], bool], within: float = 15.0) -> None:
        async with asyncio.timeout(within):
            while not predicate(self.events):
                assert not self.task.done(), self.task
                self.events += await self.sub.get_batch()

    async def finish(self) -> None:
        self.stop.set()
        async with asyncio.timeout(5):
            await self.task
        self.events += self.sub.get_nowait()


async def eventually(condition: Callable[[], bool], within: float = 10.0) -> None:
    """Poll `condition` (file system or /proc state, which nothing can await) until it holds."""
    async with asyncio.timeout(within):
        while True:
            if condition():
                return
            await asyncio.sleep(0.02)


def process_alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"


def test_entry_point_registers_the_detector() -> None:
    (entry,) = [e for e in metadata.entry_points(group="kcover.detectors") if e.name == "script"]
    cls = entry.load()
    assert cls is detector_.ScriptDetector
    assert cls.roles == frozenset({contract.Role.AGENT})
    assert cls.config_model is config_.ScriptDetectorConfig
    assert isinstance(make(Path("/"), []), contract.Detector)


async def test_npd_style_script_reports_problem_once_and_recovery(tmp_path: Path) -> None:
    status_file = tmp_path / "fabricmanager.state"
    status_file.write_text("active\n")
    script = write_script(tmp_path, "check_fabricmanager.sh", NPD_STYLE)
    running = Running(make(tmp_path, [{"name": "fabricmanager", "path": str(script), "args": [str(status_file)],
                                       "interval_seconds": 0.1, "reason": "FabricManagerDown"}]))
    await asyncio.sleep(0.5)
    assert running.sub.get_nowait() == []  # healthy from the start: nothing to say

    status_file.write_text("failed\n")
    await running.wait_for(lambda events: len(events) >= 1)
    await asyncio.sleep(0.5)  # several more failing runs: still one event
    status_file.write_text("active\n")
    await running.wait_for(lambda events: len(events) >= 2)
    await asyncio.sleep(0.3)
    await running.finish()

    problem, recovered = running.events
    assert problem.severity is model.Severity.ERROR
    assert problem.reason == "FabricManagerDown"
    assert problem.message == "fabric manager is failed: NVLink fabric unavailable"
    assert problem.target == model.Target(kind=model.TargetKind.NODE, name="gpu-node-7", node="gpu-node-7")
    assert (problem.fault.check, problem.recommended, problem.cleared) == \
        ("fabricmanager", model.Action.CORDON_NODE, False)
    assert problem.attributes["exit_code"] == 1
    assert recovered.severity is model.Severity.INFO
    assert recovered.message == "fabric manager is active"
    assert (recovered.fault.check, recovered.recommended, recovered.cleared) == ("fabricmanager", None, True)
    assert recovered.attributes["previous"] == "problem"


async def test_configured_severity_is_used_for_problems(tmp_path: Path) -> None:
    script = write_script(tmp_path, "warn.sh", "echo disk 91% full\nexit 1\n")
    running = Running(make(tmp_path, [{"name": "disk", "path": str(script), "interval_seconds": 3600,
                                       "reason": "DiskPressure", "severity": "Warning"}]))
    await running.wait_for(lambda events: len(events) == 1)
    await running.finish()
    assert running.events[0].severity is model.Severity.WARNING
    assert running.events[0].message == "disk 91% full"


async def test_unknown_is_reported_after_consecutive_unknowns_only(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    script = write_script(tmp_path, "unknown.sh", f"echo run >> {runs}\necho cannot tell\nexit 2\n")
    running = Running(make(tmp_path, [{"name": "flaky", "path": str(script), "interval_seconds": 0.1,
                                       "reason": "FlakyCheck"}], unknown_threshold=3))
    await running.wait_for(lambda events: len(events) == 1)
    assert len(runs.read_text().splitlines()) >= 3
    await asyncio.sleep(0.5)  # unknown holds: no repeat
    await running.finish()
    (event,) = running.events
    assert event.severity is model.Severity.WARNING
    assert (event.fault.check, event.recommended, event.cleared) == ("flaky", None, False)
    assert event.message == "cannot tell"


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = write_script(tmp_path, "hang.sh", f"sleep 300 &\necho $! > {pid_file}\nwait\n")
    running = Running(make(tmp_path, [{"name": "hang", "path": str(script), "interval_seconds": 3600,
                                       "timeout_seconds": 0.5, "reason": "HangCheck"}], unknown_threshold=1))
    await running.wait_for(lambda events: len(events) == 1)
    await running.finish()
    (event,) = running.events
    assert event.severity is model.Severity.WARNING
    assert event.message == "timed out after 0.5s"
    assert event.attributes["timed_out"] is True
    child = int(pid_file.read_text())
    await eventually(lambda: not process_alive(child))


async def test_stop_kills_running_scripts_promptly(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = write_script(tmp_path, "slow.sh", f"sleep 300 &\necho $! > {pid_file}\nwait\n")
    running = Running(make(tmp_path, [{"name": "slow", "path": str(script), "interval_seconds": 3600,
                                       "timeout_seconds": 600, "reason": "SlowCheck"}]))
    await eventually(lambda: pid_file.exists() and bool(pid_file.read_text().strip()))
    await running.finish()
    assert running.events == []
    child = int(pid_file.read_text())
    await eventually(lambda: not process_alive(child))


async def test_concurrency_limit_bounds_scripts_running_at_once(tmp_path: Path) -> None:
    log = tmp_path / "timeline"
    body = f"echo \"start $(date +%s.%N)\" >> {log}\nsleep 0.4\necho \"end $(date +%s.%N)\" >> {log}\nexit 0\n"
    scripts = [{"name": f"check-{i}", "path": str(write_script(tmp_path, f"c{i}.sh", body)),
                "interval_seconds": 3600, "reason": "Busy"} for i in range(5)]
    running = Running(make(tmp_path, scripts, concurrency=2))
    await eventually(lambda: log.exists() and len(log.read_text().splitlines()) == 10, within=20)
    await running.finish()

    marks = sorted((float(stamp), kind) for kind, stamp in (line.split() for line in log.read_text().splitlines()))
    current = peak = 0
    for _, kind in sorted(marks, key=lambda m: (m[0], m[1] == "start")):  # an end at the same instant goes first
        current += 1 if kind == "start" else -1
        peak = max(peak, current)
    assert peak == 2


async def test_stdout_is_truncated_to_max_output_length(tmp_path: Path) -> None:
    long_line = "GPU 3 row remap pending; " * 10
    script = write_script(tmp_path, "long.sh", f"printf '%s\\n' '{long_line}'\nexit 1\n")
    running = Running(make(tmp_path, [{"name": "long", "path": str(script), "interval_seconds": 3600,
                                       "reason": "RowRemapPending"}], max_output_length=40))
    await running.wait_for(lambda events: len(events) == 1)
    await running.finish()
    assert running.events[0].message == long_line[:40]


async def test_missing_executable_is_unknown(tmp_path: Path) -> None:
    running = Running(make(tmp_path, [{"name": "gone", "path": str(tmp_path / "nope.sh"), "interval_seconds": 3600,
                                       "reason": "GoneCheck"}], unknown_threshold=1))
    await running.wait_for(lambda events: len(events) == 1)
    await running.finish()
    assert running.events[0].severity is model.Severity.WARNING
    assert running.events[0].message.startswith("cannot start")


async def test_without_scripts_it_waits_for_stop(tmp_path: Path) -> None:
    running = Running(make(tmp_path, []))
    await asyncio.sleep(0.05)
    assert not running.task.done()
    await running.finish()


@pytest.mark.parametrize("scripts", [
    [{"name": "a", "path": "/bin/true", "reason": "A"}, {"name": "a", "path": "/bin/true", "reason": "B"}],
    [{"name": "a", "path": "/bin/true", "reason": "not camel"}],
    [{"name": "a", "path": "/bin/true", "reason": "A", "timeout_seconds": 0}],
    [{"name": "a", "path": "/bin/true", "reason": "A", "target": "pod"}],
])
def test_invalid_config_is_refused(scripts: list[dict[str, Any]]) -> None:
    with pytest.raises(pydantic.ValidationError):
        config_.ScriptDetectorConfig.model_validate({"scripts": scripts})


def test_process_alive_sees_this_process() -> None:
    assert process_alive(os.getpid())


P, U, H = checking.Status.PROBLEM, checking.Status.UNKNOWN, checking.Status.HEALTHY


@pytest.mark.parametrize(("actions", "status", "previous", "recommended", "need_recovery"), [
    ({}, P, None, model.Action.CORDON_NODE, True),
    ({"action": "restart-workload"}, P, H, model.Action.RESTART_WORKLOAD, True),
    ({"action": "report"}, P, None, model.Action.REPORT, False),
    ({}, U, None, None, False),
    ({"unknown_action": "cordon-node"}, U, H, model.Action.CORDON_NODE, True),
    ({"unknown_action": "cordon-node"}, H, P, None, False),
])
def test_each_status_recommends_its_configured_action(
        actions: dict[str, str], status: checking.Status, previous: checking.Status | None,
        recommended: model.Action | None, need_recovery: bool) -> None:
    spec = config_.ScriptSpec.model_validate({"name": "ntp", "path": "/bin/true", "reason": "NTPProblem", **actions})
    event = detector_.build_event(spec, checking.Transition(status, previous), checking.Result(status, "text", 1),
                                  detector="script", node="gpu-node-7")
    assert (event.recommended, event.cleared, event.fault.check) == (recommended, status is H, "ntp")
    body = reporting.event_body(event, node="gpu-node-7", reporter="kcover.io/agent", when=NOW)
    annotations = body["metadata"]["annotations"]
    assert (annotations.get(codec.NEED_RECOVERY) == "true") is need_recovery
    decoded = codec.decode_annotations(annotations)
    assert isinstance(decoded, codec.Decoded)
    assert (decoded.recommended, decoded.cleared, decoded.fault.check) == (recommended, status is H, "ntp")


def test_a_failing_node_check_sets_the_agent_condition_false() -> None:
    spec = config_.ScriptSpec.model_validate({"name": "ntp", "path": "/bin/true", "reason": "NTPProblem"})
    problem = detector_.build_event(spec, checking.Transition(P, None), checking.Result(P, "drift", 1),
                                    detector="script", node="gpu-node-7")
    faults: dict[str, reporting.Fault] = {}
    reporting.apply(faults, problem, now=0.0)
    assert reporting.condition(faults, 1.0, hold_seconds=60).status == "False"
    healthy = detector_.build_event(spec, checking.Transition(H, P), checking.Result(H, "ok", 0),
                                    detector="script", node="gpu-node-7")
    reporting.apply(faults, healthy, now=2.0)
    assert reporting.condition(faults, 63.0, hold_seconds=60).status == "True"


def test_an_unknown_action_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="action"):
        config_.ScriptSpec.model_validate({"name": "ntp", "path": "/bin/true", "reason": "NTPProblem",
                                           "action": "reboot"})
