"""The whole configuration checked at once: everything a role would refuse, found before anything runs or applies.

Owns one list of problems for validated settings: the recovery rules (`recovery.rules.parse_rules`,
and the detector each names: a pattern that matches no installed detector is a rule that can never
apply), every enabled detector's config against its own model (`detectors.registry.Registry.check_entries`,
as the supervisor's `wanted()` does), the limits between a setting and a detector's config
(`agent.event_retry_seconds` below the event watcher's staleness) and the XID policy file
`agent.xid_policy_file` (`nvml.xid_policy.load`). `kcover config check`, the start of a role and every hot reload use it, so
a file that passes the check is one the roles accept, and a reload applies nothing unless all of it is
valid. `warnings()` names what is valid but likely wrong (a rule that cordons for any fault of any
detector); `kcover config check` prints them and a role logs them, neither refuses them. It also names the files besides the settings file whose content is configuration
(`watched_files`), for the reloader to poll. The settings schema itself is `layering.layer()`'s.

It reads the XID policy file (through `xid_policy.load`) and nothing else; it never raises on a bad
configuration: problems come back as lines `<dotted setting>: <what is wrong>`, and `validate()`
raises them together as one `errors.ConfigError`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

from kcover import errors, settings
from kcover.detectors import contract, registry
from kcover.nvml import xid_policy
from kcover.recovery import rules as rules_

XID_POLICY_SETTING = "agent.xid_policy_file"
EVENT_WATCHER = "event-watcher"
CORDONING = frozenset({"cordon-node", "cordon-node-and-restart"})


def rule_problems(rules: Sequence[Any], detectors: registry.Registry | None = None) -> list[str]:
    """What is wrong with `recovery.rules` (unknown actions, keys, severities, targets; with `detectors`, a
    `detector` pattern that matches no installed detector)."""
    if not all(isinstance(rule, Mapping) for rule in rules):
        return [f"recovery.rules[{i}]: must be a mapping, not {type(rule).__name__}"
                for i, rule in enumerate(rules) if not isinstance(rule, Mapping)]
    try:
        rules_.parse_rules(rules)
    except errors.ConfigError as exc:
        return list(exc.errors) or [f"recovery.rules: {exc}"]
    if detectors is None:
        return []
    known = sorted(detectors.names())
    found = []
    for i, rule in enumerate(rules):
        pattern = str(rule.get("detector", "*"))
        if not any(fnmatch.fnmatchcase(name, pattern) for name in known):
            found.append(f"recovery.rules[{i}].detector: {pattern!r} matches no installed detector, so the rule "
                         f"never applies; installed: {', '.join(known)}")
    return found


def rule_warnings(rules: Sequence[Any]) -> list[str]:
    """What in `recovery.rules` is valid but likely wrong: a rule that cordons (`cordon-node`,
    `cordon-node-and-restart`) for every fault of every detector. Whoever can raise any fault (a tenant's
    Event about its own pod, any plugin) could then move nodes; the built-in rules cordon only for the
    node signals kcover checks the writer of."""
    found = []
    for i, rule in enumerate(rules):
        if not isinstance(rule, Mapping) or rule.get("action") not in CORDONING:
            continue
        if str(rule.get("detector", "*")) == "*" and str(rule.get("reason", "*")) == "*":
            scope = f"every {rule['target']} fault" if rule.get("target") else "every fault"
            found.append(f"recovery.rules[{i}]: {rule['action']} for {scope} of every detector and reason: any "
                         f"fault anyone can raise then cordons a node; name the detector (and reason) it is for")
    return found


def warnings(cfg: settings.Settings) -> list[str]:
    """What `kcover config check` prints and a role logs about valid settings that are likely wrong."""
    return rule_warnings(cfg.recovery.rules)


def xid_policy_problems(path: str) -> list[str]:
    """What is wrong with the XID policy override at `path` (empty: the shipped policy, always valid)."""
    if not path:
        return []
    try:
        xid_policy.load(path)
    except errors.ConfigError as exc:
        return [f"{XID_POLICY_SETTING}: {line}" for line in exc.errors] or [f"{XID_POLICY_SETTING}: {exc}"]
    return []


def event_retry_problems(event_retry_seconds: float, entries: Mapping[str, settings.DetectorEntry],
                         detectors: registry.Registry) -> list[str]:
    """`agent.event_retry_seconds` must stay below the event watcher's `staleness_seconds`: an Event the agent
    writes later than that after the fault is one the controller ignores as stale. Not judged while the event
    watcher is off or its config is invalid (`check_entries` reports that)."""
    entry = entries.get(EVENT_WATCHER)
    if entry is None or not entry.enabled:
        return []
    try:
        config = detectors.validate_config(EVENT_WATCHER, entry.config)
    except (errors.ConfigError, errors.PluginError):
        return []
    staleness = getattr(config, "staleness_seconds", None)
    if not isinstance(staleness, int | float) or event_retry_seconds < staleness:
        return []
    return [f"agent.event_retry_seconds: must be below detectors.entries.{EVENT_WATCHER}.config.staleness_seconds "
            f"({staleness:g}): the controller ignores an Event the agent writes later than that "
            f"(got {event_retry_seconds:g})"]


def problems(cfg: settings.Settings, detectors: registry.Registry, *, role: contract.Role | None = None) -> list[str]:
    """Every problem of validated settings. `role` None checks all; the controller skips the agent's XID file,
    which only agent pods mount."""
    found = rule_problems(cfg.recovery.rules, detectors if role in (None, contract.Role.CONTROLLER) else None)
    found += detectors.check_entries(cfg.detectors.entries)
    found += event_retry_problems(cfg.agent.event_retry_seconds, cfg.detectors.entries, detectors)
    if role in (None, contract.Role.AGENT):
        found += xid_policy_problems(cfg.agent.xid_policy_file)
    return found


def validate(cfg: settings.Settings, detectors: registry.Registry, *, role: contract.Role | None = None) -> None:
    """Raise `errors.ConfigError` listing every problem `problems()` finds."""
    found = problems(cfg, detectors, role=role)
    if found:
        raise errors.ConfigError("invalid configuration", found)


def watched_files(cfg: settings.Settings, *, role: contract.Role | None = None) -> dict[str, str]:
    """Setting path -> file, for files besides the settings file whose content is configuration."""
    if role in (None, contract.Role.AGENT) and cfg.agent.xid_policy_file:
        return {XID_POLICY_SETTING: cfg.agent.xid_policy_file}
    return {}
