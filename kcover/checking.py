"""The whole configuration checked at once: everything a role would refuse, found before anything runs or applies.

Owns one list of problems for validated settings: the recovery rules (`recovery.rules.parse_rules`),
every enabled detector's config against its own model (`detectors.registry.Registry.check_entries`,
as the supervisor's `wanted()` does) and the XID policy file `agent.xid_policy_file`
(`nvml.xid_policy.load`). `kcover config check`, the start of a role and every hot reload use it, so
a file that passes the check is one the roles accept, and a reload applies nothing unless all of it is
valid. It also names the files besides the settings file whose content is configuration
(`watched_files`), for the reloader to poll. The settings schema itself is `settings.layer()`'s.

It reads the XID policy file (through `xid_policy.load`) and nothing else; it never raises on a bad
configuration: problems come back as lines `<dotted setting>: <what is wrong>`, and `validate()`
raises them together as one `errors.ConfigError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kcover import errors, settings
from kcover.detectors import contract, registry
from kcover.nvml import xid_policy
from kcover.recovery import rules as rules_

XID_POLICY_SETTING = "agent.xid_policy_file"


def rule_problems(rules: Sequence[Any]) -> list[str]:
    """What is wrong with `recovery.rules` (unknown actions, keys, severities, targets)."""
    if not all(isinstance(rule, Mapping) for rule in rules):
        return [f"recovery.rules[{i}]: must be a mapping, not {type(rule).__name__}"
                for i, rule in enumerate(rules) if not isinstance(rule, Mapping)]
    try:
        rules_.parse_rules(rules)
    except errors.ConfigError as exc:
        return list(exc.errors) or [f"recovery.rules: {exc}"]
    return []


def xid_policy_problems(path: str) -> list[str]:
    """What is wrong with the XID policy override at `path` (empty: the shipped policy, always valid)."""
    if not path:
        return []
    try:
        xid_policy.load(path)
    except errors.ConfigError as exc:
        return [f"{XID_POLICY_SETTING}: {line}" for line in exc.errors] or [f"{XID_POLICY_SETTING}: {exc}"]
    return []


def problems(cfg: settings.Settings, detectors: registry.Registry, *, role: contract.Role | None = None) -> list[str]:
    """Every problem of validated settings. `role` None checks all; the controller skips the agent's XID file,
    which only agent pods mount."""
    found = rule_problems(cfg.recovery.rules)
    found += detectors.check_entries(cfg.detectors.entries)
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
