"""Parsing NVIDIA nccl-tests output: the text table, launcher logs and the `-J` JSON report.

Owns turning what `all_reduce_perf`, `sendrecv_perf` and the other nccl-tests binaries print into a
`Run`: one `Row` per message size (out-of-place and in-place time, algbw, busbw, wrong count) plus the
footer (out-of-bounds count, the printed `Avg bus bandwidth`). It reads

* the plain table of every nccl-tests version: the current one (`redop`, `root`, `#wrong` columns),
  the 2021 one (`redop`, `error` holding a max delta such as `5e-07`) and older ones (no `redop`);
* launcher logs (`mpirun`, Kubeflow MPIJob `kubectl logs`): every line may start with
  `[1,N]<stdout>:` or `[1,N]<stderr>:`, and NCCL INFO/WARN lines are mixed in; both are ignored;
* the JSON document `-J FILE` writes (nccl-tests' `JSON_FILE_VERSION` 2: `results[]` with
  `out_of_place`/`in_place` objects, `out_of_bounds`, `average_bus_bandwidth`).

It refuses, with a reason a person can read, output that carries no measurement: a `Test NCCL
failure` / `Test failure` line, an out-of-bounds count above zero (wrong results), a row whose
`#wrong` is not zero, or no data row at all. Pure: no I/O; the caller reads the file or the log.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

PREFIX = re.compile(r"^\[\d+,\d+\]<(?:stdout|stderr)>:")
"""Open MPI's `--tag-output` prefix (`[jobid,rank]<stream>:`), as MPIJob launcher logs show it."""
_NCCL_LOG = re.compile(r"\bNCCL (?:INFO|WARN|TRACE)\b")
_FAILURE = re.compile(r"Test (?:NCCL )?failure\b.*")
_OOB = re.compile(r"Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?")
_AVG = re.compile(r"Avg bus bandwidth\s*:\s*([0-9.eE+-]+|nan|inf)\s*(OK|FAILED)?")
_RANKS = re.compile(r"^#\s+Rank\s+(\d+)\b")
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?$")


class ParseRefused(ValueError):
    """The output holds no usable measurement; `str()` says why."""


@dataclass(frozen=True)
class Side:
    """One placement (out-of-place or in-place) of one message size."""

    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: float | None
    """`#wrong` (elements found wrong); None where the output has no such count (`N/A`, or the `error`
    column of old versions, a max delta that the out-of-bounds footer judges instead)."""


@dataclass(frozen=True)
class Row:
    size_bytes: int
    count: int
    dtype: str
    redop: str
    out_of_place: Side
    in_place: Side | None


@dataclass(frozen=True)
class Run:
    rows: tuple[Row, ...]
    ranks: int | None
    """Ranks listed under `# Using devices`; None when the output does not list them."""
    out_of_bounds: int | None
    avg_busbw_gbps: float | None
    """The printed `Avg bus bandwidth`; None when the footer is missing."""

    @property
    def largest(self) -> Row:
        """The row of the largest message size: the bandwidth-bound one preflight judges."""
        return max(self.rows, key=lambda r: r.size_bytes)

    def computed_avg_busbw(self) -> float:
        """nccl-tests' own average: the mean busbw over every size, in-place and out-of-place."""
        values = [r.out_of_place.busbw_gbps for r in self.rows]
        values += [r.in_place.busbw_gbps for r in self.rows if r.in_place is not None]
        return sum(values) / len(values)


def strip_launcher(line: str) -> str:
    """A line without Open MPI's `[1,N]<stdout>:` prefix."""
    return PREFIX.sub("", line, count=1)


def _float(token: str) -> float | None:
    if token == "N/A":
        return None
    return float(token)


def _columns(line: str) -> list[str] | None:
    """The column names of a table header line (`# size count type ... busbw #wrong ...`), else None."""
    tokens = line.lstrip("#").split()
    if "size" in tokens and "count" in tokens and "busbw" in tokens:
        return tokens
    return None


def _row(tokens: list[str], columns: list[str]) -> Row | None:
    if len(tokens) != len(columns) or not tokens[0].isdigit():
        return None
    if not all(_NUMBER.match(t) or t == "N/A" for i, t in enumerate(tokens) if columns[i] not in ("type", "redop")):
        return None
    times = [i for i, c in enumerate(columns) if c in ("time", "cputime")]
    sides: list[Side] = []
    for start in times:
        wrong_col = start + 3
        wrong = _float(tokens[wrong_col]) if wrong_col < len(columns) and columns[wrong_col] == "#wrong" else None
        sides.append(Side(time_us=float(tokens[start]), algbw_gbps=float(tokens[start + 1]),
                          busbw_gbps=float(tokens[start + 2]), wrong=wrong))
    if not sides:
        return None
    named = dict(zip(columns, tokens, strict=True))
    return Row(size_bytes=int(named["size"]), count=int(named["count"]), dtype=named.get("type", ""),
               redop=named.get("redop", ""), out_of_place=sides[0], in_place=sides[1] if len(sides) > 1 else None)


def parse_text(text: str) -> Run:
    """The measurements in nccl-tests' printed output (a plain run or a launcher log). Raises ParseRefused."""
    columns: list[str] | None = None
    rows: list[Row] = []
    ranks: set[int] = set()
    failures: list[str] = []
    oob: int | None = None
    avg: float | None = None
    avg_failed = False
    for raw in text.splitlines():
        line = strip_launcher(raw).rstrip()
        if not line.strip() or _NCCL_LOG.search(line):
            continue
        failure = _FAILURE.search(line)
        if failure:
            failures.append(line.strip())
            continue
        if m := _RANKS.match(line):
            ranks.add(int(m.group(1)))
            continue
        if m := _OOB.search(line):
            oob = int(m.group(1))
            continue
        if m := _AVG.search(line):
            avg = float(m.group(1))
            avg_failed = m.group(2) == "FAILED"
            continue
        found = _columns(line)
        if found is not None:
            columns = found
            continue
        if columns is not None and not line.lstrip().startswith("#"):
            row = _row(line.split(), columns)
            if row is not None:
                rows.append(row)
    if failures:
        raise ParseRefused(f"nccl-tests failed: {failures[0]}"
                           + (f" (and {len(failures) - 1} more failure lines)" if len(failures) > 1 else ""))
    if oob:
        raise ParseRefused(f"nccl-tests found {oob} out-of-bounds values: the collective returned wrong data")
    wrong = [r.size_bytes for r in rows if _wrong(r)]
    if wrong:
        raise ParseRefused(f"nccl-tests counted wrong elements at {len(wrong)} sizes (first {wrong[0]} B)")
    if not rows:
        raise ParseRefused("no nccl-tests result rows found" if columns is not None
                           else "no nccl-tests table header (size count ... busbw) found")
    if avg_failed:
        raise ParseRefused(f"nccl-tests' own average bus bandwidth check FAILED ({avg:g} GB/s)")
    return Run(rows=tuple(rows), ranks=len(ranks) or None, out_of_bounds=oob, avg_busbw_gbps=avg)


def _wrong(row: Row) -> bool:
    """A `#wrong` count above zero."""
    sides = [row.out_of_place, *([row.in_place] if row.in_place else [])]
    return any(s.wrong is not None and s.wrong > 0 for s in sides)


def _side(obj: Any) -> Side | None:
    if not isinstance(obj, dict):
        return None
    wrong = obj.get("nwrong")
    time = obj.get("time", obj.get("cpu_time"))
    return Side(time_us=float(time or 0.0), algbw_gbps=float(obj["alg_bw"]),
                busbw_gbps=float(obj["bus_bw"]), wrong=None if wrong is None else float(wrong))


def parse_json(text: str) -> Run:
    """The measurements in a `-J FILE` JSON report. Raises ParseRefused."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseRefused(f"not a nccl-tests JSON report: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise ParseRefused("not a nccl-tests JSON report: no `results` list")
    errors = [str(e) for e in doc.get("errors") or [] if str(e)]
    if errors:
        raise ParseRefused(f"nccl-tests failed: {errors[0]}")
    oob = int((doc.get("out_of_bounds") or {}).get("count", 0))
    if oob:
        raise ParseRefused(f"nccl-tests found {oob} out-of-bounds values: the collective returned wrong data")
    rows: list[Row] = []
    try:
        for entry in doc["results"]:
            out = _side(entry.get("out_of_place")) or _side(entry.get("in_place"))
            if out is None:
                continue
            rows.append(Row(size_bytes=int(entry["size"]), count=int(entry["count"]), dtype=str(entry.get("type", "")),
                            redop=str(entry.get("redop", "")), out_of_place=out,
                            in_place=_side(entry.get("in_place")) if entry.get("out_of_place") else None))
    except (KeyError, TypeError, ValueError) as exc:
        raise ParseRefused(f"unreadable nccl-tests JSON result: {exc!r}") from None
    wrong = [r.size_bytes for r in rows if _wrong(r)]
    if wrong:
        raise ParseRefused(f"nccl-tests counted wrong elements at {len(wrong)} sizes (first {wrong[0]} B)")
    if not rows:
        raise ParseRefused("no nccl-tests result rows found")
    avg_doc = doc.get("average_bus_bandwidth") or {}
    avg = avg_doc.get("bandwidth")
    if avg_doc.get("okay") is False or avg_doc.get("okay") == "false":
        raise ParseRefused(f"nccl-tests' own average bus bandwidth check FAILED ({avg} GB/s)")
    devices = doc.get("config", {}).get("devices") if isinstance(doc.get("config"), dict) else None
    return Run(rows=tuple(rows), ranks=len(devices) if isinstance(devices, list) and devices else None,
               out_of_bounds=oob, avg_busbw_gbps=None if avg is None else float(avg))


def parse(text: str) -> Run:
    """Either format: JSON when the text is a JSON object, else the printed table."""
    return parse_json(text) if text.lstrip().startswith("{") else parse_text(text)
