"""The `metax` detector: MetaX GPU node day-2 checks, daily and at start.

Owns the schedule (daily at `run_at` in `timezone`, optionally also at start), running `mx-smi -L`,
`mx-smi --show-temperature`, `mx-smi --count-ecc` and `ibv_devinfo` through the context's command runner
(`context.command_runner`: kcover's subprocess runner, each command in its own process group, killed
past `command_timeout_seconds`), and
publishing one Node-target event per failed check (`fault.check` the check, `recommended` its
configured action, cordon-node by default) and a `cleared=True` Info when a failed check passes
again. Parsing and the rules are pure (`parsing`, `checking`). It never writes to the API.

Runs only on nodes whose capacity (`context.node_capacity`) lists `metax-tech.com/gpu`,
unless `force`; elsewhere, or without `mx-smi`, it raises `DetectorUnavailableError`. A check whose
command fails, times out or prints something unparsable yields a `MetaxCheckFailed` Warning.
"""

from __future__ import annotations

import asyncio
import zoneinfo
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import structlog
from pydantic import BaseModel

from kcover import model
from kcover.detectors import contract
from kcover_metax import checking, parsing, scheduling
from kcover_metax import config as config_

log = structlog.get_logger()

MAX_SLEEP_SECONDS = 300.0
"""Sleeps toward the next run are cut into pieces this long, so a wall-clock jump is noticed."""

REASONS: dict[checking.Check, tuple[str, model.Severity]] = {
    checking.Check.GPU_COUNT: ("MetaxGpuUnavailable", model.Severity.ERROR),
    checking.Check.TEMPERATURE: ("MetaxGpuOverheating", model.Severity.WARNING),
    checking.Check.ECC: ("MetaxDoubleBitEccExceeded", model.Severity.ERROR),
    checking.Check.HCA: ("MetaxInfinibandPortDown", model.Severity.ERROR),
}
CHECK_FAILED = "MetaxCheckFailed"


def has_capacity(capacity: object, resource: str) -> bool:
    """Whether a Node capacity mapping lists a non-zero quantity of `resource`. Pure."""
    if not isinstance(capacity, Mapping):
        return False
    quantity = str(capacity.get(resource, "")).strip()
    return quantity not in ("", "0")


def build_event(result: checking.CheckResult, *, detector: str, node: str, error: bool = False,
                action: model.Action | None = None,
                attributes: Mapping[str, Any] | None = None) -> model.CollectorEvent:
    """The event reporting `result` on `node` (a failure, recommending `action`; a recovery, cleared; or a
    check that could not run, recommending nothing). Pure."""
    reason, severity = REASONS[result.check]
    if error:
        reason, severity = CHECK_FAILED, model.Severity.WARNING
    elif result.ok:
        severity = model.Severity.INFO
    state = "error" if error else ("ok" if result.ok else "failed")
    return model.CollectorEvent(
        detector=detector, severity=severity, reason=reason, message=result.message,
        target=model.Target(kind=model.TargetKind.NODE, name=node, node=node),
        dedupe_key=f"{detector}/{result.check.value}/{state}/{node}",
        fault=model.Fault(check=result.check.value),
        recommended=None if error or result.ok else action, cleared=result.ok and not error,
        attributes={"offenders": list(result.offenders), **(attributes or {})})


class MetaxDetector:
    """Checks a MetaX GPU node's GPUs, temperatures, ECC pages and InfiniBand ports once a day."""

    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.AGENT})
    config_model: ClassVar[type[BaseModel]] = config_.MetaxConfig

    def __init__(self, name: str, config: config_.MetaxConfig, context: contract.DetectorContext) -> None:
        self.name = name
        self.config = config
        self.context = context
        self.runner = context.command_runner
        self._at = scheduling.parse_hhmm(config.run_at)
        self._zone = zoneinfo.ZoneInfo(config.timezone)
        self._failing: set[checking.Check] = set()

    async def run(self, bus: contract.Bus, stop: asyncio.Event) -> None:
        cfg = self.config
        if not cfg.force and not has_capacity(self.context.node_capacity, cfg.capacity_resource):
            raise contract.DetectorUnavailableError(f"node has no {cfg.capacity_resource} capacity (set force to run anyway)")
        await contract.or_stop(self._loop(bus), stop)  # the checks run until stopped; what they raise propagates

    async def _loop(self, bus: contract.Bus) -> None:
        clock = self.context.clock
        if self.config.run_at_start:
            await self.check_once(bus)
        while True:
            due = scheduling.next_run(clock.now(), self._at, self._zone)
            while True:
                left = (due - clock.now()).total_seconds()
                if left <= 0:
                    break
                await asyncio.sleep(min(left, MAX_SLEEP_SECONDS))
            await self.check_once(bus)

    async def check_once(self, bus: contract.Bus) -> list[model.CollectorEvent]:
        """Run every check now; publish failures, recoveries and checks that could not run."""
        cfg = self.config
        mx = cfg.mx_smi
        plan: list[tuple[checking.Check, list[str], Callable[[str], checking.CheckResult]]] = [
            (checking.Check.GPU_COUNT, [mx, "-L"],
             lambda out: checking.gpu_count(parsing.parse_gpu_list(out), expected=cfg.expected_gpus)),
            (checking.Check.TEMPERATURE, [mx, "--show-temperature"],
             lambda out: checking.temperature(parsing.parse_hotspot_temperatures(out),
                                              limit_celsius=cfg.hotspot_limit_celsius)),
            (checking.Check.ECC, [mx, "--count-ecc"],
             lambda out: checking.double_bit_ecc(parsing.parse_double_bit_ecc(out), limit=cfg.double_bit_ecc_limit)),
        ]
        if cfg.hca_ids:
            plan.append((checking.Check.HCA, [cfg.ibv_devinfo],
                         lambda out: checking.hca_ports(parsing.parse_port_states(out), hca_ids=cfg.hca_ids)))
        node = self.context.node_name
        events: list[model.CollectorEvent] = []
        for check, argv, evaluate in plan:
            event = await self._run_check(check, argv, evaluate, node)
            if event is not None:
                events.append(event)
                await bus.publish(event)
        log.info("metax_checks_done", node=node, failing=sorted(c.value for c in self._failing))
        return events

    async def _run_check(self, check: checking.Check, argv: list[str],
                         evaluate: Callable[[str], checking.CheckResult], node: str) -> model.CollectorEvent | None:
        try:
            result = await self.runner.run(argv, timeout_seconds=self.config.command_timeout_seconds)
        except contract.CommandNotFoundError as exc:
            if argv[0] == self.config.mx_smi:
                raise contract.DetectorUnavailableError(str(exc)) from exc
            return self._error(check, str(exc), node)
        except contract.CommandError as exc:
            return self._error(check, str(exc), node)
        if result.returncode != 0:
            detail = model.fit(result.stderr.strip() or result.stdout.strip(), 200)
            return self._error(check, f"{' '.join(argv)} exited {result.returncode}: {detail}", node)
        try:
            outcome = evaluate(result.stdout)
        except parsing.ParseError as exc:
            return self._error(check, f"cannot parse {' '.join(argv)}: {exc}", node)
        log.info("metax_check", check=check.value, ok=outcome.ok, message=outcome.message)
        if outcome.ok:
            if check not in self._failing:
                return None
            self._failing.discard(check)
        else:
            self._failing.add(check)
        return build_event(outcome, detector=self.name, node=node, action=self.config.actions[check])

    def _error(self, check: checking.Check, message: str, node: str) -> model.CollectorEvent:
        log.warning("metax_check_error", check=check.value, error=message)
        return build_event(checking.CheckResult(check, False, message), detector=self.name, node=node, error=True)
