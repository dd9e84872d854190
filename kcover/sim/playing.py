"""Playing a `kcover sim` scenario: what a scenario is and what one run of it records.

Owns `Scenario` (its name, summary, `Play`, the settings it needs, its timeout, the plugin and nodes it
needs), `Run` (what one play records: fault records with their detected, acted and recovered times,
checks, timeline notes, results) with the waits that fill a fault record (`WAIT` each), the API Event
reasons scenarios look for (`RESTARTED`, `CORDONED`, `SKIPPED`), `SETTLE` and `clip` (messages cut at a
word for timelines and check details).

Does not own the scenarios themselves or the catalogue (`scenarios`, `loopscenarios`, plugins), nor
running one, rendering or JSON (`running`).

How it fails: a wait that times out raises `cluster.WaitTimeout`, which the runner turns into a failed
check; nothing else here raises on purpose.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kcover import model
from kcover.aio import clock as clock_
from kcover.sim import cluster as cluster_

NS: str = cluster_.NAMESPACE
RESTARTED = "KcoverRestartedWorkload"
CORDONED = "KcoverCordonedNode"
SKIPPED = "KcoverRecoverySkipped"
ACTION_NAMES = {RESTARTED: "restart-workload", CORDONED: "cordon-node", SKIPPED: "skip"}
_WORD_END = re.compile(r"\b")
WAIT = 10.0
"""Seconds any one expected step may take before the scenario fails."""
SETTLE = 1.0
"""Seconds watched after recovery for actions that should not happen (duplicates)."""


@dataclass
class FaultRecord:
    kind: str
    target: str
    injected_at: dt.datetime
    detected_at: dt.datetime | None = None
    acted_at: dt.datetime | None = None
    recovered_at: dt.datetime | None = None
    action: str = ""


@dataclass(frozen=True)
class Check:
    text: str
    ok: bool
    detail: str = ""


@dataclass
class Run:
    """What one scenario run records."""

    cluster: cluster_.SimCluster
    started: dt.datetime = field(default_factory=clock_.utcnow)
    faults: list[FaultRecord] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[tuple[dt.datetime, str, str]] = field(default_factory=list)
    skipped: str = ""
    results: dict[str, Any] = field(default_factory=dict)
    """What a scenario reports beyond its checks (the chaos tally)."""

    def note(self, tag: str, text: str, at: dt.datetime | None = None) -> None:
        self.notes.append((at or clock_.utcnow(), tag, text))

    def check(self, text: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(text, bool(ok), detail))
        return bool(ok)

    def fault(self, kind: str, target: str, how: str) -> FaultRecord:
        record = FaultRecord(kind, target, clock_.utcnow())
        self.faults.append(record)
        self.note("inject", f"{kind} on {target}: {how}", record.injected_at)
        return record

    async def detected(self, f: FaultRecord, match: Callable[[model.CollectorEvent], bool], what: str) -> None:
        c = self.cluster
        found = await c.until(lambda: c.detection(match, f.injected_at), WAIT, what)
        f.detected_at = f.detected_at or found.event.observed_at

    async def acted(self, f: FaultRecord, match: Callable[[cluster_.ApiEvent], bool],
                    what: str) -> cluster_.ApiEvent:
        c = self.cluster
        found: cluster_.ApiEvent = await c.until(lambda: c.api_event(match, f.injected_at), WAIT, what)
        f.acted_at = f.acted_at or found.at
        name = ACTION_NAMES.get(found.reason, found.reason)
        f.action = f"{f.action},{name}" if f.action and name not in f.action.split(",") else (f.action or name)
        return found

    async def recovered(self, f: FaultRecord, job: str, old_uids: set[str], within: float = WAIT) -> None:
        c = self.cluster
        await c.until(lambda: c.recovered(job, old_uids), within, f"PyTorchJob {NS}/{job} to run again")
        f.recovered_at = clock_.utcnow()
        self.note("recover", f"PyTorchJob {NS}/{job}: {c.size.pods_per_job}/{c.size.pods_per_job} pods Running "
                             "with new uids", f.recovered_at)

    def api_events(self, reason: str, name: str = "") -> list[cluster_.ApiEvent]:
        return [e for e in self.cluster.api_events
                if e.at >= self.started and e.reason == reason and (not name or e.name == name)]


Play = Callable[[Run], Awaitable[None]]


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    play: Play
    overrides: Mapping[str, Any] = field(default_factory=dict)
    timeout: float = 45.0
    plugin: str = ""
    """A detector plugin the scenario needs; without it the scenario does not run (`kcover sim` exits 3, saying why)."""
    nodes: int = 0
    """Nodes the scenario needs at least; a smaller `--nodes` is raised to it."""
    agent_overrides: Mapping[str, Any] = field(default_factory=dict)
    """Settings merged over every simulated agent's (`overrides` are the controllers')."""

def clip(text: str, limit: int) -> str:
    """`text` (whitespace runs made single spaces) cut to at most `limit` characters at a word boundary,
    with " ..." where it was cut.

    Timelines and check details show messages written by others (Events, conditions); a cut in the
    middle of a word reads as a different word. The cut falls at the last space, comma or semicolon
    in the second half of the room, else at the last word boundary (a label selector, a path), else at
    `limit` (one word longer than half of it)."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    room = max(1, limit - 4)
    head = text[:room + 1]
    cut = max(head.rfind(" "), head.rfind(",") + 1, head.rfind(";") + 1)
    if cut <= room // 2:
        bounds = [m.start() for m in _WORD_END.finditer(head) if m.start() <= room]
        cut = bounds[-1] if bounds and bounds[-1] > room // 2 else room
    return text[:cut].rstrip(" ,;:") + " ..."
