"""The `script` detector: node checks written as NPD custom-plugin scripts.

Owns the run loop: one named task per configured script, each running its script every
`interval_seconds` (the first run at start), all sharing one semaphore of `concurrency` slots, and
publishing only transitions (problem entered, unknown for `unknown_threshold` runs in a row,
healthy again) as Node-target events: `fault.check` is the script's name, `recommended` the action
configured for the status entered (`action` for a problem, `cordon-node` unless set;
`unknown_action` for unknown), and healthy again is
`cleared=True`. It does not interpret what scripts check and never writes to
the API. A script's failure is an unknown result, never an exception; setting `stop` cancels running
scripts (their process groups are killed) and returns.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

import structlog
from pydantic import BaseModel

from kcover import model
from kcover.detectors import contract
from kcover_script_detector import checking, running
from kcover_script_detector import config as config_

log = structlog.get_logger()


def build_event(spec: config_.ScriptSpec, transition: checking.Transition, result: checking.Result, *,
                detector: str, node: str) -> model.CollectorEvent:
    """The event reporting `transition` of check `spec` on `node`. Pure."""
    status = transition.status
    if status is checking.Status.PROBLEM:
        severity = spec.severity
    elif status is checking.Status.UNKNOWN:
        severity = model.Severity.WARNING
    else:
        severity = model.Severity.INFO
    message = result.message or f"check {spec.name} is {status.value}"
    target = model.Target(kind=model.TargetKind.NODE, name=node, node=node)
    return model.CollectorEvent(
        detector=detector, target=target, severity=severity, reason=spec.reason, message=message,
        # The status is part of the key: a recovery right after a problem is not a duplicate of it.
        dedupe_key=f"{detector}/{spec.name}/{status.value}/{node}",
        fault=model.Fault(check=spec.name), recommended=spec.recommended(status),
        cleared=status is checking.Status.HEALTHY,
        attributes={"status": status.value, "previous": transition.previous.value if transition.previous else None,
                    "exit_code": result.returncode, "timed_out": result.timed_out})


class ScriptDetector:
    """Runs configured check scripts on the agent's node and reports their state changes."""

    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.AGENT})
    config_model: ClassVar[type[BaseModel]] = config_.ScriptDetectorConfig

    def __init__(self, name: str, config: config_.ScriptDetectorConfig, context: contract.DetectorContext) -> None:
        self.name = name
        self.config = config
        self.context = context

    async def run(self, bus: contract.Bus, stop: asyncio.Event) -> None:
        if not self.config.scripts:
            log.info("script_detector_idle", detector=self.name, reason="no scripts configured")
            await stop.wait()
            return
        slots = asyncio.Semaphore(self.config.concurrency)
        async with asyncio.TaskGroup() as group:
            loops = [group.create_task(self._loop(spec, bus, slots), name=f"{self.name}:{spec.name}")
                     for spec in self.config.scripts]
            await stop.wait()
            for task in loops:
                task.cancel()

    async def _loop(self, spec: config_.ScriptSpec, bus: contract.Bus, slots: asyncio.Semaphore) -> None:
        state = checking.CheckState()
        argv = [spec.path, *spec.args]
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            async with slots:
                result = await running.run_script(self.context.command_runner, argv,
                                                  timeout_seconds=spec.timeout_seconds,
                                                  max_output_length=self.config.max_output_length)
            state, transition = checking.observe(state, result, unknown_threshold=self.config.unknown_threshold)
            log.debug("script_checked", script=spec.name, status=result.status.value, exit_code=result.returncode)
            if transition is not None:
                event = build_event(spec, transition, result, detector=self.name, node=self.context.node_name)
                log.info("script_state_changed", script=spec.name, status=transition.status.value,
                         previous=transition.previous.value if transition.previous else None,
                         message=event.message)
                await bus.publish(event)
            await asyncio.sleep(max(0.0, started + spec.interval_seconds - loop.time()))
