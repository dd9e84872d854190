"""DCGM detector (agent): `dcgmi diag` on a schedule, `dcgmi health`, or a dcgm-exporter's metrics.

Owns the schedules and the events: running the DCGM tools through the context's command runner
(`context.command_runner`: asyncio subprocesses in a running kcover, `kcover.aio.commands`), reading a
dcgm-exporter endpoint over HTTP (aiohttp) where one is configured, and turning the `Finding`s the
parsers read from their output (`kcover.nvml.dcgmi`) into events. Findings are published when they
appear and again with `cleared=True` when they go away, like the NVML detector's health faults; the
event's `fault.check` is `<source>/<check>` (e.g. `diag/Memory`, `health/PCIe`), `recommended` the
finding's action. Diagnostics never overlap and each run has a timeout. It never writes to the API.

Fails: `dcgmi` missing (and no exporter configured) -> `errors.DetectorUnavailableError`; a run that
times out or exits non-zero without output is logged and retried at the next schedule; one that cannot
be started at all (`commands.CommandError`: not executable) raises, and the supervisor restarts the
detector with backoff.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import ClassVar

import aiohttp
import structlog
from pydantic import BaseModel, ConfigDict, Field

from kcover import bus as bus_
from kcover import errors, model
from kcover.aio import commands, waiting
from kcover.detectors import contract
from kcover.nvml import dcgmi, xid_policy

log = structlog.get_logger()


class DcgmConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dcgmi_path: str = Field("dcgmi", description="The dcgmi program (looked up on PATH).")
    diag_level: int = Field(1, ge=1, le=4, description="`dcgmi diag -r` level: 1 (seconds, safe beside jobs); 2-4 run minutes of stress and should only be scheduled on drained nodes.")
    diag_interval_seconds: float = Field(3600.0, gt=0, description="Seconds between diagnostics (never overlapping): hourly catches slow hardware decay at no cost to jobs at level 1.")
    diag_timeout_seconds: float = Field(300.0, gt=0, description="Seconds one diagnostic may run before it is killed.")
    health_interval_seconds: float = Field(60.0, gt=0, description="Seconds between `dcgmi health -c` checks (DCGM's background watches do the sampling).")
    health_timeout_seconds: float = Field(30.0, gt=0, description="Seconds one health check may run.")
    exporter_url: str = Field("", description="A dcgm-exporter metrics URL (e.g. http://localhost:9400/metrics); when set it is read instead of running dcgmi.")
    exporter_interval_seconds: float = Field(15.0, gt=0, description="Seconds between exporter reads: dcgm-exporter's default collection interval is 30 s.")


class DcgmDetector:
    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.AGENT})
    config_model: ClassVar[type[BaseModel]] = DcgmConfig

    def __init__(self, name: str, config: DcgmConfig, context: contract.DetectorContext) -> None:
        self.name = name
        self.config = config
        self.context = context
        self.runner = context.command_runner
        self.policy: contract.XidPolicy = context.xid_policy or xid_policy.load()
        self._active: dict[str, dict[str, dcgmi.Finding]] = {}

    def _polled(self, mode: str, ok: bool) -> None:
        """Count a check (`kcover_dcgm_polls_total`); a good one is the detector's last successful health check."""
        metrics = self.context.metrics
        metrics.dcgm_polls.labels(mode=mode, result="ok" if ok else "failed").inc()
        if ok:
            metrics.health_checks.succeeded(self.name)

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        if self.config.exporter_url:
            self.context.metrics.health_checks.started(self.name)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
                await self._every(stop, self.config.exporter_interval_seconds,
                                  lambda: self._exporter(bus, session))
            return
        try:
            await self.runner.run([self.config.dcgmi_path, "--version"], timeout_seconds=10)
        except commands.CommandNotFoundError as exc:
            raise errors.DetectorUnavailableError(str(exc)) from exc
        self.context.metrics.health_checks.started(self.name)
        async with asyncio.TaskGroup() as group:
            group.create_task(self._every(stop, self.config.diag_interval_seconds, lambda: self._diag(bus)),
                              name=f"{self.name}:diag")
            group.create_task(self._every(stop, self.config.health_interval_seconds, lambda: self._health(bus)),
                              name=f"{self.name}:health")

    async def _every(self, stop: asyncio.Event, interval: float, once: Callable[[], Awaitable[None]]) -> None:
        """Run `once` now and then `interval` after each run ends (so runs never overlap)."""
        while not stop.is_set():
            await once()
            if await waiting.sleep_or_stop(stop, interval):
                return

    async def _command(self, argv: list[str], limit_seconds: float) -> str | None:
        try:
            result = await self.runner.run(argv, timeout_seconds=limit_seconds)
        except commands.CommandTimeoutError:
            log.warning("dcgm_command_timed_out", detector=self.name, argv=argv, timeout_seconds=limit_seconds)
            return None
        except commands.CommandNotFoundError as exc:
            raise errors.DetectorUnavailableError(f"{argv[0]} disappeared: {exc}") from exc
        if not result.stdout.strip():
            log.warning("dcgm_command_failed", detector=self.name, argv=argv, returncode=result.returncode,
                        stderr=result.stderr[-500:])
            return None
        return result.stdout

    async def _diag(self, bus: bus_.Bus) -> None:
        out = await self._command([self.config.dcgmi_path, "diag", "-r", str(self.config.diag_level), "-j"],
                                  self.config.diag_timeout_seconds)
        self._polled("diag", out is not None)
        if out is not None:
            await self._reconcile(bus, "diag", dcgmi.parse_diag(out))

    async def _health(self, bus: bus_.Bus) -> None:
        out = await self._command([self.config.dcgmi_path, "health", "-c", "-j"], self.config.health_timeout_seconds)
        if out is None:
            self._polled("health", False)
            return
        try:
            findings = dcgmi.parse_health_json(out)
        except ValueError as exc:
            log.warning("dcgm_health_unparsed", detector=self.name, error=str(exc))
            self._polled("health", False)
            return
        self._polled("health", True)
        await self._reconcile(bus, "health", findings)

    async def _exporter(self, bus: bus_.Bus, session: aiohttp.ClientSession) -> None:
        try:
            async with session.get(self.config.exporter_url) as response:
                response.raise_for_status()
                text = await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("dcgm_exporter_read_failed", detector=self.name, url=self.config.exporter_url, error=str(exc))
            self._polled("exporter", False)
            return
        self._polled("exporter", True)
        await self._reconcile(bus, "exporter", dcgmi.parse_exporter(text, self.policy))

    async def _reconcile(self, bus: bus_.Bus, source: str, findings: list[dcgmi.Finding]) -> None:
        before = self._active.get(source, {})
        now = {f.key: f for f in findings}
        self._active[source] = now
        for key, finding in now.items():
            if key not in before:
                await self._publish(bus, finding, "active")
        for key, finding in before.items():
            if key not in now:
                await self._publish(bus, finding, "cleared")

    async def _publish(self, bus: bus_.Bus, finding: dcgmi.Finding, state: str) -> None:
        node = self.context.node_name
        cleared = state == "cleared"
        target = model.Target(kind=model.TargetKind.DEVICE, node=node, name=node, device_id=finding.gpu_uuid) \
            if finding.gpu_uuid else model.Target(kind=model.TargetKind.NODE, node=node, name=node)
        reason = "DCGM" + re.sub(r"[^A-Za-z0-9]", "", finding.check.title() if " " in finding.check
                                 else finding.check.replace("DCGM_FI_DEV_", "").title().replace("_", ""))
        if finding.xid is not None:
            reason = f"XID{finding.xid}"
        fault = model.Fault(xid=finding.xid, gpu_index=finding.gpu_index, gpu_uuid=finding.gpu_uuid,
                            check=f"{finding.source}/{finding.check}"[:128], pods=finding.pods)
        await bus.publish(model.CollectorEvent(
            detector=self.name, target=target, severity=model.Severity.INFO if cleared else finding.severity,
            reason=model.fit(reason + "Cleared" if cleared else reason, model.NAME_MAX, suffix=""),
            message=("cleared: " if cleared else "") + finding.message, observed_at=self.context.clock.now(),
            dedupe_key=f"{self.name}/{finding.key}/{state}", fault=fault,
            recommended=None if cleared else finding.action, cleared=cleared))
