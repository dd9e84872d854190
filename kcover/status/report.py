"""What `kcover status` shows: the report's parts, what needs a person, and how it reads on a terminal.

Owns the `Report` (the leader, the settings' source, what they hold back from acting, the breaker, each limit in force and its use, pauses,
held restarts, suspect nodes, kcover's cordons, recent recoveries, workloads out of budget), the judgement of
what needs a person (`Report.problems()`), `Report.to_json()` for programs and `render()` for a terminal.
Pure: `gathering` fills it.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from kcover.aio import clock as clock_
from kcover.recovery import recoveries
from kcover.status import deployed

NEEDS_A_PERSON = frozenset({recoveries.Phase.STALLED.value, recoveries.Phase.FAILED.value})


@dataclass
class Leader:
    holder: str = ""
    renewed_seconds_ago: float | None = None
    held_seconds: float | None = None
    duration_seconds: int = 0
    transitions: int = 0

    @property
    def stale(self) -> bool:
        """No holder, or the holder has not renewed within the Lease's duration (a dead leader)."""
        return not self.holder or self.renewed_seconds_ago is None or self.renewed_seconds_ago > self.duration_seconds


@dataclass
class Breaker:
    latched: bool = False
    since: str = ""
    """When it latched (RFC 3339)."""
    reason: str = ""
    """What tripped it: the refusal of the action that would have passed a limit."""
    latch: bool = True
    """`recovery.breaker_latch`: a trip latches it (else each action past a limit is refused on its own)."""
    cooldown_seconds: float = 0.0
    reset_at: str = ""
    """When a person last reset it (RFC 3339)."""
    cooling_seconds_left: float = 0.0
    """Seconds of the cooldown after that reset still to run: restarts and cordons refused meanwhile."""


@dataclass
class Limit:
    name: str
    used: int | None
    """Its use as the cluster's objects show it; None where only the leader knows it (in its memory)."""
    limit: int
    setting: str
    """Which settings make the limit, with their values."""
    trips: bool = True
    """Reaching it trips the breaker (else a restart past it waits: `max_concurrent_restarts`)."""

    @property
    def reached(self) -> bool:
        return self.used is not None and self.used >= self.limit


@dataclass
class Held:
    key: str
    what: str
    code: str
    text: str
    since: str
    expires: str


@dataclass
class Suspect:
    node: str
    since: str
    evidence: str
    verdict: str = ""
    """"" while its validation is asked and unanswered; else `healthy`, `faulty` or `unvalidated`."""
    judged: str = ""


@dataclass
class Cordon:
    node: str
    reason: str
    since: str


@dataclass
class Row:
    namespace: str
    name: str
    phase: str
    action: str
    target: str
    fault: str
    cause: str = ""
    detected: str = ""
    mttr_seconds: float | None = None
    message: str = ""


@dataclass
class OutOfBudget:
    key: str
    what: str
    restarts: int
    next_at: str
    """When the oldest restart leaves the window, in RFC 3339."""


@dataclass
class Report:
    lease: str
    leader: Leader
    settings: deployed.Source = field(default_factory=lambda: deployed.Source(""))
    breaker: Breaker = field(default_factory=Breaker)
    gpu_nodes: int = 0
    held_back: list[str] = field(default_factory=list)
    """What the settings keep from being carried out (dry run, record-only classes, judgement rules not acting),
    one line each; empty when kcover acts on everything it decides."""
    limits: list[Limit] = field(default_factory=list)
    paused: list[str] = field(default_factory=list)
    held: list[Held] = field(default_factory=list)
    suspects: list[Suspect] = field(default_factory=list)
    cordoned: list[Cordon] = field(default_factory=list)
    recoveries: list[Row] = field(default_factory=list)
    recoveries_available: bool = True
    ledger_available: bool = True
    out_of_budget: list[OutOfBudget] = field(default_factory=list)

    @property
    def reached(self) -> list[Limit]:
        """The breaker's limits reached: the next action each counts is refused (and latches it, by default)."""
        return [lim for lim in self.limits if lim.trips and lim.reached]

    @property
    def breaker_open(self) -> bool:
        """kcover refuses now (latched, or cooling down after a reset), or refuses the next action a reached
        limit counts."""
        return self.breaker.latched or self.breaker.cooling_seconds_left > 0 or bool(self.reached)

    def reset_does(self) -> str:
        """What `kcover breaker reset` would do now."""
        b = self.breaker
        if not b.latched:
            return "nothing: the breaker is not latched (`kcover breaker reset` changes nothing and says so)"
        held = {0: "no restart is held", 1: "the 1 held restart is planned again"}.get(
            len(self.held), f"the {len(self.held)} held restarts are planned again")
        return (f"closes the latch; then restarts and cordons stay refused for {b.cooldown_seconds:g}s "
                f"(recovery.breaker_cooldown_seconds), {held}, and the breaker's window starts again at the reset "
                "(the limits on what is cordoned at once still count every cordon)")

    def problems(self) -> list[str]:
        """What needs a person, one line each; empty when nothing does."""
        out = []
        if not self.settings.found:
            out.append(f"the controllers' settings were not read ({self.settings.problem}): the limits shown are "
                       "this command's (--config, --set, defaults); --namespace and --config-map name the chart's")
        if self.leader.stale:
            out.append(f"no controller leads: Lease {self.lease} " + (
                f"last renewed by {self.leader.holder} {ago(self.leader.renewed_seconds_ago)} ago"
                if self.leader.holder else "has no holder"))
        if self.breaker.latched:
            out.append(f"the breaker is latched open since {self.breaker.since} ({self.breaker.reason}); "
                       f"`kcover breaker reset` {self.reset_does()}")
        if not self.breaker.latch:  # latching, a reached limit calls for a person once it latched
            for lim in self.reached:
                out.append(f"the breaker's limit on {lim.name} is reached ({lim.used} of {lim.limit}, {lim.setting}): "
                           "each action it counts is refused until it frees")
        for row in self.recoveries:
            if row.phase in NEEDS_A_PERSON:
                out.append(f"recovery {row.namespace}/{row.name} is {row.phase}: {row.target} "
                           f"({row.cause or 'see its message'})")
        for w in self.out_of_budget:
            out.append(f"{w.what} is out of its restart budget ({w.restarts} restarts) until {w.next_at}")
        if not self.recoveries_available:
            out.append("the Recovery CRD (recoveries.kcover.io) is not installed: no record of what kcover did")
        if not self.ledger_available:
            out.append("the LedgerEntry CRD (ledgerentries.kcover.io) is not served: kcover does not act without it")
        return out

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["breaker_open"] = self.breaker_open
        doc["breaker"]["reset_does"] = self.reset_does()
        doc["leader"]["stale"] = self.leader.stale
        for lim, out in zip(self.limits, doc["limits"], strict=True):
            out["reached"] = lim.reached
        doc["recoveries_by_phase"] = dict(Counter(r.phase for r in self.recoveries))
        doc["problems"] = self.problems()
        doc["needs_a_person"] = bool(doc["problems"])
        return doc


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60}m"


def age(text: str | None, now: dt.datetime) -> float | None:
    if not text:
        return None
    try:
        return (now - clock_.parse_time(text)).total_seconds()
    except ValueError:
        return None


def when(epoch: float | None) -> str:
    return "" if epoch is None else clock_.rfc3339(dt.datetime.fromtimestamp(epoch, dt.UTC))


# ---------------------------------------------------------------------------------------------- rendering

def _breaker_line(report: Report) -> str:
    b = report.breaker
    if b.latched:
        return f"LATCHED OPEN since {b.since or '?'}: {b.reason}"
    if b.cooling_seconds_left > 0:
        return (f"closed, cooling down: reset at {b.reset_at}; restarts and cordons refused for "
                f"{b.cooling_seconds_left:.0f}s more (recovery.breaker_cooldown_seconds {b.cooldown_seconds:g})")
    if report.reached:
        names = ", ".join(lim.name for lim in report.reached)
        return (f"closed, at its limit on {names}: the next action counted there is refused"
                + (" and latches it" if b.latch else ""))
    return "closed"


def render(report: Report) -> str:
    """The report for a terminal."""
    ld = report.leader
    lines = []
    src = report.settings
    lines.append(f"settings:   ConfigMap {src.config_map} (the controllers')" if src.found
                 else f"settings:   this command's, NOT the controllers' ({src.problem})")
    if ld.holder:
        state = "STALE" if ld.stale else "leading"
        lines.append(f"leader:     {ld.holder} ({state}; Lease {report.lease} renewed {ago(ld.renewed_seconds_ago)} "
                     f"ago, held {ago(ld.held_seconds)}, {ld.transitions} transitions)")
    else:
        lines.append(f"leader:     none (Lease {report.lease} " + ("has no holder)" if report.lease else "absent)"))
    if report.held_back:
        lines.append("acting:     NOT on everything it decides:")
        lines += [f"            {line}" for line in report.held_back]
    else:
        lines.append("acting:     on everything it decides")
    lines.append(f"breaker:    {_breaker_line(report)}")
    verb = "a reset" if report.breaker.latched else "a reset does"  # reset_does() reads "nothing: ..." then
    lines.append(f"            {verb} {report.reset_does()}")
    if not report.breaker.latch:
        lines.append("            recovery.breaker_latch is off: a trip refuses that action only")
    lines.append("limits:")
    for lim in report.limits:
        flag = "  REACHED" if lim.trips and lim.reached else ""
        use = f"{lim.used} of {lim.limit}" if lim.used is not None else f"at most {lim.limit}"
        lines.append(f"  {lim.name + ':':36} {use}  ({lim.setting}){flag}")
    lines.append("paused: " + ("; ".join(report.paused) if report.paused else "nothing"))
    lines.append(f"held restarts ({len(report.held)}):" if report.held else "held restarts: none")
    for h in report.held:
        lines.append(f"  {h.what}: {h.code} since {h.since}, given up at {h.expires}: {h.text}")
    lines.append(f"suspect nodes ({len(report.suspects)}):" if report.suspects else "suspect nodes: none")
    for s in report.suspects:
        found = f"validated {s.verdict} at {s.judged}" if s.verdict else "validation asked, not answered yet"
        lines.append(f"  {s.node}  suspect since {s.since}, {found}: {s.evidence}")
    lines.append(f"cordoned by kcover ({len(report.cordoned)}):" if report.cordoned else "cordoned by kcover: none")
    for c in report.cordoned:
        lines.append(f"  {c.node}  since {c.since or '?'}  {c.reason}")
    by_phase: dict[str, list[Row]] = defaultdict(list)
    for row in report.recoveries:
        by_phase[row.phase].append(row)
    if not report.recoveries_available:
        lines.append("recoveries, last 24h: the Recovery CRD is not installed")
    else:
        counts = ", ".join(f"{phase} {len(rows)}" for phase, rows in sorted(by_phase.items()))
        lines.append(f"recoveries, last 24h ({len(report.recoveries)}): {counts or 'none'}")
    for phase, rows in sorted(by_phase.items()):
        lines.append(f"  {phase}:")
        for r in rows:
            extra = f" mttr {r.mttr_seconds:.1f}s" if r.mttr_seconds is not None else ""
            extra += f" cause {r.cause}" if r.cause else ""
            lines.append(f"    {r.detected or '?':20}  {r.action:15}  {r.target}  ({r.fault}){extra}")
    lines.append(f"out of budget ({len(report.out_of_budget)}):" if report.out_of_budget else "out of budget: none")
    for w in report.out_of_budget:
        lines.append(f"  {w.what}: {w.restarts} restarts in the window, next allowed {w.next_at}")
    problems = report.problems()
    lines.append("needs a person:" if problems else "needs a person: no")
    lines += [f"  - {p}" for p in problems]
    return "\n".join(lines)

