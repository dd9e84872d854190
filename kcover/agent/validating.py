"""The agent's side of return-to-service validation: run the `dcgmi diag` the controller asks for, answer.

Owns one loop per agent (`agent.validation.enabled`): a reflector watches the agent's own Node (field
selector `metadata.name`, so one object), and each new request the codec reads from its annotations
(`validationcodec.decode_validation_request`: an id and a `dcgmi diag -r` level) is run once through a command
runner (`kcover.aio.commands`) and read with the dcgmi parsers (`kcover.nvml.dcgmi.parse_diag`), the ones
the DCGM detector reads its scheduled diagnostics with. The verdict is written
as the Node condition `KcoverGPUValidated` (`validationcodec.encode_validation_answer`, a strategic-merge patch
of nodes/status, the one write the agent already makes):

* `Passed`: dcgmi printed a diagnostic in which every test passed;
* `Failed`: some test failed or warned (the message names them);
* `DiagError`: dcgmi is missing, ran past `agent.validation.timeout_seconds`, or printed no result.

A request already answered (the condition names its id) is not run again, so an agent restart does not
repeat a diagnostic. Runs never overlap; a request that arrives during a run is taken after it. It
decides nothing: the controller reads the answer and un-cordons, escalates or waits. How it fails: API
errors writing the answer are logged and the answer is written again on the next change of the Node;
the reflector retries its watch on its own.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

import structlog

from kcover import errors, settings, validationcodec
from kcover.aio import clock as clock_
from kcover.aio import commands, waiting
from kcover.kube import client as client_
from kcover.kube import projecting, watching
from kcover.kube import projections as proj
from kcover.nvml import dcgmi

log = structlog.get_logger()
_PASS = re.compile(r"\bpass\b", re.IGNORECASE)


def verdict(returncode: int, out: str, level: int) -> tuple[validationcodec.ValidationOutcome, str]:
    """Judge one `dcgmi diag -r level` run from its exit code and output."""
    if not out.strip():
        return validationcodec.ValidationOutcome.ERROR, f"dcgmi diag -r {level} printed nothing (exit code {returncode})"
    try:
        findings = dcgmi.parse_diag(out)
    except ValueError as exc:
        return validationcodec.ValidationOutcome.ERROR, f"dcgmi diag -r {level}: unreadable output ({exc})"
    if findings:
        named = "; ".join(f.message for f in findings[:3]) + (f" (and {len(findings) - 3} more)"
                                                              if len(findings) > 3 else "")
        return validationcodec.ValidationOutcome.FAILED, f"dcgmi diag -r {level} failed: {named}"
    if returncode == 0 and _PASS.search(out):
        return validationcodec.ValidationOutcome.PASSED, f"dcgmi diag -r {level}: every test passed"
    tail = " ".join(out.split())[-200:]
    return validationcodec.ValidationOutcome.ERROR, f"dcgmi diag -r {level} gave no result (exit code {returncode}): {tail}"


class Validator:
    """Runs the validations the controller asks of this node. `await run(stop)`."""

    def __init__(self, kube: client_.KubeClient, node: str, config: settings.AgentValidationSettings, *,
                 runner: commands.CommandRunner | None = None, clock: clock_.Clock | None = None) -> None:
        self._kube = kube
        self.node = node
        self.config = config
        self._runner = runner or commands.SubprocessRunner()
        self._clock = clock or clock_.SystemClock()
        self._wake = asyncio.Event()
        self._latest: proj.Node | None = None
        self.answered: dict[str, validationcodec.ValidationOutcome] = {}
        """Request id -> the outcome this agent reported (this process's memory; the condition is the record)."""
        self.reflector: watching.Reflector[proj.Node] = watching.Reflector(
            kube, "/api/v1/nodes", projecting.node, sink=self._changed, name=f"validation:{node}",
            query={"fieldSelector": f"metadata.name={node}"})

    def _changed(self, _old: proj.Node | None, new: proj.Node | None) -> None:
        self._latest = new
        self._wake.set()

    def pending(self) -> validationcodec.ValidationRequest | None:
        """The request on the Node not answered yet (by this process or, per its condition, an earlier one)."""
        node = self._latest
        if node is None:
            return None
        request = validationcodec.decode_validation_request(dict(node.annotations))
        if request is None or request.id in self.answered:
            return None
        for cond in node.conditions:
            answer = validationcodec.decode_validation_answer(cond.type, cond.status, cond.reason, cond.message)
            if answer is not None and answer.request == request.id:
                return None
        return request

    async def run(self, stop: asyncio.Event) -> None:
        log.info("validation_agent_starting", node=self.node, dcgmi=self.config.dcgmi_path)
        async with asyncio.TaskGroup() as group:
            group.create_task(self.reflector.run(stop), name=f"validation:{self.node}:watch")
            while not stop.is_set():
                request = self.pending()
                if request is not None:
                    await self.validate(request)
                    continue
                self._wake.clear()
                await waiting.first_of(stop, self._wake)

    async def validate(self, request: validationcodec.ValidationRequest) -> validationcodec.ValidationOutcome:
        """Run the diagnostic `request` asks for and write the answer; returns the outcome."""
        argv: Sequence[str] = [self.config.dcgmi_path, "diag", "-r", str(request.level), "-j"]
        log.info("validation_started", node=self.node, request=request.id, level=request.level)
        try:
            result = await self._runner.run(argv, timeout_seconds=self.config.timeout_seconds)
        except commands.CommandNotFoundError as exc:
            outcome, text = validationcodec.ValidationOutcome.ERROR, f"{self.config.dcgmi_path} not found: {exc}"
        except commands.CommandTimeoutError:
            outcome, text = (validationcodec.ValidationOutcome.ERROR,
                             f"dcgmi diag -r {request.level} ran past {self.config.timeout_seconds:g}s and was killed")
        except commands.CommandError as exc:
            outcome, text = validationcodec.ValidationOutcome.ERROR, f"dcgmi diag -r {request.level} could not run: {exc}"
        else:
            outcome, text = verdict(result.returncode, result.stdout, request.level)
        self.answered[request.id] = outcome
        log.info("validation_finished", node=self.node, request=request.id, outcome=outcome.value, text=text)
        answer = validationcodec.ValidationAnswer(request.id, outcome, text)
        condition = validationcodec.encode_validation_answer(answer, clock_.rfc3339(self._clock.now()))
        try:
            await self._kube.request("PATCH", f"/api/v1/nodes/{self.node}/status",
                                     body={"status": {"conditions": [condition]}},
                                     content_type="application/strategic-merge-patch+json")
        except errors.KubeError as exc:
            log.warning("validation_answer_failed", node=self.node, request=request.id, error=str(exc))
            del self.answered[request.id]  # answered again on the Node's next change
        return outcome
