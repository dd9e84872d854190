"""Rules: which action a fault calls for, from the operator's `recovery.rules` and the built-in defaults.

Owns the rule vocabulary (detector, reason glob, severity, target kind -> action, and `mode`: `act`, or
`record` to decide and record without acting), the built-in rules,
their validation (`parse_rules`, which raises `errors.ConfigError` listing every bad entry; `kcover config
check` and reloads use it), and `decide`: the first matching rule combined with the source's own
recommendation as `recovery.node_judgement` says. Pure.
"""

from __future__ import annotations

import enum
import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kcover import errors, model, settings

AK = model.Action


class Mode(enum.StrEnum):
    """What a matching rule's decision leads to."""

    ACT = "act"
    RECORD = "record"
    """Decided and recorded (Event `KcoverRecordOnly...`, Recovery), not carried out: a rule tried before trusted."""


@dataclass(frozen=True)
class Rule:
    action: model.Action
    detector: str = "*"
    reason: str = "*"
    severity: model.Severity | None = None
    target: model.TargetKind | None = None
    mode: Mode = Mode.ACT
    index: int = -1
    """Position in `recovery.rules` (-1: a built-in rule)."""

    def describe(self) -> str:
        return f"recovery.rules[{self.index}]" if self.index >= 0 else "a built-in rule"

    def matches(self, event: model.CollectorEvent) -> bool:
        return (fnmatch.fnmatchcase(event.detector, self.detector)
                and fnmatch.fnmatchcase(event.reason, self.reason)
                and (self.severity is None or self.severity is event.severity)
                and (self.target is None or self.target is event.target.kind))


_E = model.Severity.ERROR
DEFAULT_RULES: tuple[Rule, ...] = (
    Rule(AK.RESTART_WORKLOAD, detector="pod-status", severity=_E),
    Rule(AK.RESTART_WORKLOAD, detector="dra-health", severity=_E),
    Rule(AK.RESTART_WORKLOAD, detector="event-watcher", severity=_E, target=model.TargetKind.POD),
    Rule(AK.RESTART_WORKLOAD, detector="event-watcher", severity=_E, target=model.TargetKind.WORKLOAD),
    Rule(AK.CORDON_NODE_AND_RESTART, detector="event-watcher", severity=_E, target=model.TargetKind.NODE),
    Rule(AK.CORDON_NODE_AND_RESTART, detector="event-watcher", severity=_E, target=model.TargetKind.DEVICE),
    Rule(AK.CORDON_NODE_AND_RESTART, detector="node-condition", severity=_E),
    Rule(AK.REPORT, severity=_E),
)
"""Built-in rules, checked after `recovery.rules`. Anything unmatched (warnings, info) is ignored."""

_RANK: dict[model.Action, frozenset[model.Action]] = {
    AK.IGNORE: frozenset({AK.IGNORE}),
    AK.REPORT: frozenset({AK.IGNORE, AK.REPORT}),
    AK.RESTART_WORKLOAD: frozenset({AK.IGNORE, AK.REPORT, AK.RESTART_WORKLOAD}),
    AK.CORDON_NODE: frozenset({AK.IGNORE, AK.REPORT, AK.CORDON_NODE}),
    AK.CORDON_NODE_AND_RESTART: frozenset(AK),
}
"""Which actions each action covers: with `node_judgement: ceiling` a recommendation is honoured when
the rule's action covers it, e.g. a node rule allowing cordon-node-and-restart accepts a recommended
restart-workload (an application XID) or cordon-node."""


def parse_rules(raw: Sequence[Mapping[str, Any]]) -> tuple[Rule, ...]:
    """Validate `recovery.rules` entries: {detector, reason (glob), severity, target, action}."""
    out: list[Rule] = []
    problems: list[str] = []
    for i, entry in enumerate(raw):
        unknown = set(entry) - {"detector", "reason", "severity", "target", "action", "mode"}
        if unknown:
            problems.append(f"recovery.rules[{i}]: unknown keys {sorted(unknown)}")
            continue
        try:
            out.append(Rule(
                action=model.Action(entry["action"]),
                detector=str(entry.get("detector", "*")),
                reason=str(entry.get("reason", "*")),
                severity=model.Severity(entry["severity"]) if entry.get("severity") else None,
                target=model.TargetKind(entry["target"]) if entry.get("target") else None,
                mode=Mode(entry.get("mode") or Mode.ACT), index=i))
        except (KeyError, ValueError) as exc:
            problems.append(f"recovery.rules[{i}]: {type(exc).__name__}: {exc}")
    if problems:
        raise errors.ConfigError("invalid recovery rules", problems)
    return tuple(out)


def matching(event: model.CollectorEvent, rules: Sequence[Rule]) -> Rule | None:
    """The first rule (configured, then built-in) matching `event`, or None."""
    for rule in (*rules, *DEFAULT_RULES):
        if rule.matches(event):
            return rule
    return None


def decide(event: model.CollectorEvent, rules: Sequence[Rule],
           judgement: settings.NodeJudgement = settings.NodeJudgement.CEILING) -> model.Action:
    """The action for an event: the first matching rule (configured, then built-in) combined with the
    source's recommendation as `judgement` says."""
    rule = matching(event, rules)
    chosen = rule.action if rule is not None else AK.IGNORE
    wanted = event.recommended
    if wanted is None or judgement is settings.NodeJudgement.RULES:
        return chosen
    if judgement is settings.NodeJudgement.SOURCE:
        return wanted
    return wanted if wanted in _RANK[chosen] else chosen
