"""DCGM detector (agent): `dcgmi diag` on a schedule, `dcgmi health`, or a dcgm-exporter's metrics.

Owns running the DCGM tools through a command runner (`context.command_runner`, default: asyncio
subprocesses), reading a dcgm-exporter endpoint over HTTP (aiohttp) where one is configured, and the
pure parsers that turn their output into per-GPU `Finding`s: `parse_diag_table` (the plain-text table
every DCGM 3.x/4.x prints), `parse_diag_json` (`dcgmi diag -j`), `parse_health_json`
(`dcgmi health -c -j`) and `parse_exporter` (Prometheus text). Findings are published when they
appear and again with `cleared=True` when they go away, like the NVML detector's health faults; the
event's `fault.check` is `<source>/<check>` (e.g. `diag/Memory`, `health/PCIe`), `recommended` the
finding's action. Diagnostics never overlap and each run has a timeout. It never writes to the API.

Fails: `dcgmi` missing (and no exporter configured) -> `errors.DetectorUnavailableError`; a run that
times out or exits non-zero without output is logged and retried at the next schedule.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import aiohttp
import structlog
from prometheus_client import parser as prom_parser
from pydantic import BaseModel, ConfigDict, Field

from kcover import bus as bus_
from kcover import errors, model
from kcover.detectors import contract
from kcover.nvml import xid_policy

log = structlog.get_logger()


# ---------------------------------------------------------------------------------------------- runner

@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


class CommandRunner(Protocol):
    async def run(self, argv: Sequence[str], *, timeout_seconds: float) -> CommandResult:
        """Run argv; FileNotFoundError if the program is missing, TimeoutError past the timeout."""
        ...


class SubprocessRunner:
    """`CommandRunner` over asyncio subprocesses; kills the process on timeout or cancellation."""

    async def run(self, argv: Sequence[str], *, timeout_seconds: float) -> CommandResult:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        try:
            async with asyncio.timeout(timeout_seconds):
                out, err = await proc.communicate()
        except BaseException:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        return CommandResult(proc.returncode or 0, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


# ---------------------------------------------------------------------------------------------- findings

@dataclass(frozen=True)
class Finding:
    source: str
    """diag, health or exporter."""
    check: str
    """The test, health system or metric, e.g. `GPU Memory`, `Thermal`, `DCGM_FI_DEV_XID_ERRORS`."""
    gpu_index: int | None
    severity: model.Severity
    action: xid_policy.Action
    message: str
    gpu_uuid: str = ""
    xid: int | None = None
    pods: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        gpu = self.gpu_uuid or ("node" if self.gpu_index is None else f"gpu{self.gpu_index}")
        return f"{self.source}/{self.check}/{gpu}" + (f"/{self.xid}" if self.xid is not None else "")


_GPU_IN_TEXT = re.compile(r"\bGPU ?(\d+)\b")
_GPU_ROW = re.compile(r"^GPU(\d+): (\w+)")
_CELL = 45
"""Characters of text per table cell line: dcgmi cuts long text at exactly this width."""


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def parse_diag_table(text: str) -> list[Finding]:
    """The plain-text `dcgmi diag` table (DCGM 3.x `Fail - GPU: 0` and 4.x `GPU0: Fail` layouts)."""
    tests: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []  # Warning / Error notes: {"kind", "text", "test"}
    category = ""
    current: dict[str, Any] | None = None
    note: dict[str, Any] | None = None
    for line in text.splitlines():
        if line.startswith(("|-----", "+-----")):
            category = line.strip("|+- ").split()[0] if line.strip("|+- ") else category
            continue
        parts = line.split("|")
        if len(parts) < 3 or line.startswith("+"):
            continue
        name, raw = parts[1].strip(), parts[2]
        value = raw.strip()
        if name in ("Warning", "Error", "Info"):
            note = {"kind": name, "text": raw[1:1 + _CELL], "test": current}
            notes.append(note)
            continue
        if name in ("Diagnostic", ""):
            if name == "" and (row := _GPU_ROW.match(value)) and current is not None:
                current["gpus"][int(row[1])] = row[2]
                note = None
            elif name == "" and value.startswith(("Fail - GPU", "Pass - GPU", "Skip - GPU")) and current is not None:
                _dcgm3_gpus(current, value)
            elif name == "" and note is not None:
                note["text"] += raw[1:1 + _CELL]
            continue
        note = None
        if category == "Metadata":
            continue
        current = {"name": name, "category": category, "result": value, "gpus": {}}
        _dcgm3_gpus(current, value)
        tests.append(current)
    findings: list[Finding] = []
    for test in tests:
        own = [_squash(n["text"]) for n in notes if n["test"] is test and n["kind"] != "Info"]
        failed = sorted(i for i, r in test["gpus"].items() if r.lower() == "fail")
        all_failed = test["result"].lower().startswith("fail - all")
        for index in failed:
            mine = [t for t in own if _gpus_named(t) in ({index}, set())] or own
            findings.append(Finding("diag", test["name"], index, model.Severity.ERROR, xid_policy.Action.CORDON_NODE,
                                    f"dcgmi diag {test['name']} failed on GPU {index}" + _detail(mine)))
        if all_failed:
            findings.append(Finding("diag", test["name"], None, model.Severity.ERROR, xid_policy.Action.CORDON_NODE,
                                    f"dcgmi diag {test['name']} failed on all GPUs" + _detail(own)))
        elif not failed and test["result"].lower().startswith("fail"):
            findings.append(Finding("diag", test["name"], None, model.Severity.WARNING, xid_policy.Action.REPORT,
                                    f"dcgmi diag {test['name']} failed without a failing GPU" + _detail(own)))
    for n in notes:
        if n["kind"] == "Error" and n["test"] is None:
            text = _squash(n["text"])
            gpus = sorted(_gpus_named(text))
            findings.append(Finding("diag", "Deployment", gpus[0] if len(gpus) == 1 else None,
                                    model.Severity.WARNING, xid_policy.Action.REPORT, f"dcgmi diag: {text}"))
    return findings


def _dcgm3_gpus(test: dict[str, Any], value: str) -> None:
    match = re.match(r"^(Pass|Fail|Skip|Warn) - GPUs?: ([\d, ]+)$", value)
    if match:
        for index in match[2].split(","):
            test["gpus"][int(index)] = match[1]


def _gpus_named(text: str) -> set[int]:
    return {int(m) for m in _GPU_IN_TEXT.findall(text)}


def _detail(notes: list[str]) -> str:
    return model.fit(": " + " | ".join(notes), 900) if notes else ""


def parse_diag_json(text: str) -> list[Finding]:
    """`dcgmi diag -j`: FAIL results per GPU (`gpu_ids` "0,1" or `gpu_id`), with their warnings.

    Raises `ValueError` for text that is not JSON or not shaped like dcgmi's document."""
    try:
        return _diag_findings(json.loads(text))
    except (AttributeError, TypeError) as exc:
        raise ValueError(f"not a dcgmi diag document: {exc}") from exc


def _diag_findings(data: Any) -> list[Finding]:
    root = data.get("DCGM GPU Diagnostic") or data.get("DCGM Diagnostic") or {}
    findings: list[Finding] = []
    for category in root.get("test_categories", []):
        for test in category.get("tests", []):
            for result in test.get("results", []):
                if str(result.get("status", "")).upper() != "FAIL":
                    continue
                ids = str(result.get("gpu_ids", result.get("gpu_id", ""))).split(",")
                warnings = [_squash(str(w.get("warning", ""))) for w in result.get("warnings", [])]
                for gpu in (int(i) for i in ids if i.strip().isdigit()):
                    findings.append(Finding("diag", str(test.get("name")), gpu, model.Severity.ERROR,
                                            xid_policy.Action.CORDON_NODE,
                                            f"dcgmi diag {test.get('name')} failed on GPU {gpu}" + _detail(warnings)))
    return findings


def parse_health_json(text: str) -> list[Finding]:
    """`dcgmi health -c -j`: every non-healthy system under a GPU, with its error text.

    Walks the document rather than fixing one layout: dcgmi nests `GPU` > id > system > `Health`/`Error`.
    `Failure` recommends cordon-node, `Warning` a report.
    """
    findings: list[Finding] = []

    def walk(node: Any, path: list[str]) -> None:
        if not isinstance(node, dict):
            return
        children = node.get("children")
        if not isinstance(children, dict):
            children = None
        health = node.get("Health", {})
        health_value = health.get("value") if isinstance(health, dict) else None
        if isinstance(health_value, str) and len(path) >= 2 and path[-1] not in ("Overall Health",):
            status = health_value.lower()
            if status not in ("healthy", "pass"):
                gpu = next((int(p) for p in reversed(path) if p.isdigit()), None)
                errors_text = _collect_errors(node)
                failure = status.startswith("fail")
                findings.append(Finding("health", path[-1], gpu,
                                        model.Severity.ERROR if failure else model.Severity.WARNING,
                                        xid_policy.Action.CORDON_NODE if failure else xid_policy.Action.REPORT,
                                        f"dcgmi health {path[-1]}: {health_value}" + _detail(errors_text)))
        for key, value in (children or node).items():
            if isinstance(value, dict) and key != "Health":
                walk(value, [*path, str(key)])

    walk(json.loads(text), [])
    return [f for f in findings if f.gpu_index is not None or f.check != "GPU"]


def _collect_errors(node: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in node.items():
        if key.startswith("Error") and isinstance(value, dict) and isinstance(value.get("value"), str):
            out.append(_squash(value["value"]))
        elif isinstance(value, dict) and key == "children":
            out += [e for k, v in value.items() if k.startswith("Error") and isinstance(v, dict)
                    for e in ([_squash(str(v.get("value", "")))] if v.get("value") else [])]
    return out


_EXPORTER_RULES: dict[str, tuple[str, model.Severity, xid_policy.Action]] = {
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("row remapping failed", model.Severity.ERROR, xid_policy.Action.CORDON_NODE),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("volatile double-bit ECC errors", model.Severity.ERROR,
                                      xid_policy.Action.CORDON_NODE),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("rows remapped for uncorrectable errors", model.Severity.WARNING,
                                                xid_policy.Action.REPORT),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("NVLink CRC flit errors", model.Severity.WARNING,
                                                      xid_policy.Action.REPORT),
    "DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS": ("NVLink effective errors", model.Severity.WARNING,
                                                  xid_policy.Action.REPORT),
}


def parse_exporter(text: str, policy: xid_policy.XidPolicy) -> list[Finding]:
    """dcgm-exporter metrics: the last XID per GPU (judged by `policy`), DBE, row-remap and NVLink errors."""
    findings: list[Finding] = []
    for family in prom_parser.text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if value <= 0 or (name != "DCGM_FI_DEV_XID_ERRORS" and name not in _EXPORTER_RULES):
                continue
            gpu = int(labels["gpu"]) if labels.get("gpu", "").isdigit() else None
            uuid = labels.get("UUID", "")
            pods = (f"{labels['namespace']}/{labels['pod']}",) if labels.get("pod") and labels.get("namespace") else ()
            if name == "DCGM_FI_DEV_XID_ERRORS":
                code = int(value)
                decision = policy.decide(code, [], 0.0)
                if decision.action is xid_policy.Action.IGNORE:
                    continue
                findings.append(Finding("exporter", name, gpu, decision.severity, decision.action,
                                        f"dcgm-exporter reports XID {code} ({decision.name or 'unknown'}) on GPU "
                                        f"{gpu} {uuid}".rstrip(), gpu_uuid=uuid, xid=code, pods=pods))
                continue
            what, severity, action = _EXPORTER_RULES[name]
            findings.append(Finding("exporter", name, gpu, severity, action,
                                    f"dcgm-exporter: {what} on GPU {gpu} {uuid}: {value:g}", gpu_uuid=uuid, pods=pods))
    return findings


# ---------------------------------------------------------------------------------------------- detector

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

    def __init__(self, name: str, config: BaseModel, context: contract.DetectorContext) -> None:
        assert isinstance(config, DcgmConfig)
        self.name = name
        self.config = config
        self.context = context
        self.runner: CommandRunner = context.command_runner or SubprocessRunner()
        policy = context.extras.get("xid_policy")
        self.policy = policy if isinstance(policy, xid_policy.XidPolicy) else xid_policy.load()
        self._active: dict[str, dict[str, Finding]] = {}

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
        except FileNotFoundError as exc:
            raise errors.DetectorUnavailableError(f"{self.config.dcgmi_path} not found: {exc}") from exc
        self.context.metrics.health_checks.started(self.name)
        async with asyncio.TaskGroup() as group:
            group.create_task(self._every(stop, self.config.diag_interval_seconds, lambda: self._diag(bus)),
                              name=f"{self.name}:diag")
            group.create_task(self._every(stop, self.config.health_interval_seconds, lambda: self._health(bus)),
                              name=f"{self.name}:health")

    async def _every(self, stop: asyncio.Event, interval: float, once: Any) -> None:
        """Run `once` now and then `interval` after each run ends (so runs never overlap)."""
        while not stop.is_set():
            await once()
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except TimeoutError:
                pass

    async def _command(self, argv: list[str], limit_seconds: float) -> str | None:
        try:
            result = await self.runner.run(argv, timeout_seconds=limit_seconds)
        except TimeoutError:
            log.warning("dcgm_command_timed_out", detector=self.name, argv=argv, timeout_seconds=limit_seconds)
            return None
        except FileNotFoundError as exc:
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
            await self._reconcile(bus, "diag", _parse_any_diag(out))

    async def _health(self, bus: bus_.Bus) -> None:
        out = await self._command([self.config.dcgmi_path, "health", "-c", "-j"], self.config.health_timeout_seconds)
        if out is None:
            self._polled("health", False)
            return
        try:
            findings = parse_health_json(out)
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
        await self._reconcile(bus, "exporter", parse_exporter(text, self.policy))

    async def _reconcile(self, bus: bus_.Bus, source: str, findings: list[Finding]) -> None:
        before = self._active.get(source, {})
        now = {f.key: f for f in findings}
        self._active[source] = now
        for key, finding in now.items():
            if key not in before:
                await self._publish(bus, finding, "active")
        for key, finding in before.items():
            if key not in now:
                await self._publish(bus, finding, "cleared")

    async def _publish(self, bus: bus_.Bus, finding: Finding, state: str) -> None:
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


def parse_diag(out: str) -> list[Finding]:
    """What `dcgmi diag` printed, JSON or table: the findings of the scheduled diagnostic and of the agent's
    return-to-service validation (`kcover.agent.validating`). JSON it cannot read is read as a table."""
    return _parse_any_diag(out)


def _parse_any_diag(out: str) -> list[Finding]:
    """`-j` output where supported, else the table (older dcgmi print the table whatever the flag)."""
    start = out.find("{")
    if start >= 0:
        try:
            return parse_diag_json(out[start:])
        except ValueError:
            pass
    return parse_diag_table(out)
