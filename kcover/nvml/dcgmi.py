"""What `dcgmi` and dcgm-exporter print, read into per-GPU `Finding`s (pure parsers, no I/O).

Owns reading the output of NVIDIA DCGM's tools: `parse_diag_table` (the plain-text `dcgmi diag` table
every DCGM 3.x/4.x prints), `parse_diag_json` (`dcgmi diag -j`), `parse_diag` (either, whichever the
tool printed), `parse_health_json` (`dcgmi health -c -j`) and `parse_exporter` (dcgm-exporter's
Prometheus text, XIDs judged by the XID policy). A finding names the source, the test or health system,
the GPU, a severity and the action it recommends (a failed diagnostic or health `Failure`: cordon the
node; warnings: report). Both the DCGM detector and the agent's return-to-service validation read
their runs through these. It does not run the tools (`kcover.aio.commands` does) and decides nothing
beyond the finding. How it fails: JSON that is not dcgmi's raises `ValueError` (`parse_diag` then reads
the text as a table); a table or exporter text it does not recognise gives no findings.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from prometheus_client import parser as prom_parser

from kcover import model
from kcover.nvml import xid_policy


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


def parse_exporter(text: str, policy: xid_policy.Judge) -> list[Finding]:
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



def parse_diag(out: str) -> list[Finding]:
    """What `dcgmi diag` printed, JSON or table: the findings of the scheduled diagnostic and of the agent's
    return-to-service validation (`kcover.agent.validating`). `-j` output where the tool supports it, else
    the table (older dcgmi print the table whatever the flag): JSON it cannot read is read as a table."""
    start = out.find("{")
    if start >= 0:
        try:
            return parse_diag_json(out[start:])
        except ValueError:
            pass
    return parse_diag_table(out)
