"""The configuration as the command line reads and checks it: the settings layers, `kcover config`.

Owns reading the settings file and the environment, turning the command-line options into overrides
(`--set`, `--log-level`, ...), building settings with their provenance for every command, the reloader's
checked `load`, and the `config check` / `config show` commands. Does not own what
is valid (`kcover.settings`, `kcover.checking`) nor when a role re-reads its file (`kcover.reloading`).

How it fails: `errors.ConfigError` with the file and position (a missing required file, unreadable YAML, a
top level that is not a mapping, a setting the schema refuses); `config check` and `config show` print the
problems and return 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kcover import checking, errors, layering, reloading, settings
from kcover.detectors import contract, registry

# ---------------------------------------------------------------------------------------------- settings I/O

def read_config_file(path: str, *, required: bool) -> dict[str, Any]:
    """Parse a YAML config file; a missing optional file is empty. Raises ConfigError with the position."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        if required:
            raise errors.ConfigError(f"{path}: no such file") from exc
        return {}
    except OSError as exc:
        raise errors.ConfigError(f"{path}: cannot be read: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise errors.ConfigError(f"{path}: not valid YAML", [f"{path}: {exc}".replace("\n", " ")]) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise errors.ConfigError(f"{path}: the top level must be a mapping, not {type(data).__name__}")
    return data


def load_settings(config_path: str, cli_values: Mapping[str, Any], *, environ: Mapping[str, str] | None = None,
                  required: bool = False) -> layering.Layered:
    env = os.environ if environ is None else environ
    data = read_config_file(config_path, required=required)
    return layering.layer(file_data=data, file_name=config_path, environ=env, cli=cli_values)


def checked_loader(config_path: str, cli_values: Mapping[str, Any], *, role: contract.Role,
                   detectors: registry.Registry, environ: Mapping[str, str] | None = None) -> reloading.Loader:
    """The reloader's `load`: read the layers and check all of the configuration as `role` uses it."""
    def load() -> layering.Layered:
        layered = load_settings(config_path, cli_values, environ=environ)
        checking.validate(layered.settings, detectors, role=role)
        return layered
    return load


def cli_overrides(args: argparse.Namespace) -> dict[str, Any]:
    pairs = {
        "kube.kubeconfig": getattr(args, "kubeconfig", None),
        "logging.level": getattr(args, "log_level", None),
        "logging.format": getattr(args, "log_format", None),
        "server.port": getattr(args, "port", None),
        "recovery.dry_run": True if getattr(args, "dry_run", False) else None,
        "agent.node_name": getattr(args, "node_name", None),
        "lease.identity": getattr(args, "identity", None),
    }
    pairs.update(set_values(args))
    return {k: v for k, v in pairs.items() if v is not None}


def set_values(args: argparse.Namespace) -> dict[str, Any]:
    """The `--set KEY=VALUE` options, as dotted paths to values."""
    pairs: dict[str, Any] = {}
    for item in getattr(args, "set", None) or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise errors.ConfigError("invalid --set", [f"--set {item}: expected KEY=VALUE"])
        pairs[key.strip()] = yaml.safe_load(value)
    return {k: v for k, v in pairs.items() if v is not None}


# ---------------------------------------------------------------------------------------------- kcover config

def cmd_config_check(args: argparse.Namespace) -> int:
    """Validate a file as the roles would: settings, rules, detector configs, XID policy; list every problem."""
    problems: list[str] = []
    try:
        data = read_config_file(args.file, required=True)
    except errors.ConfigError as exc:
        data = None
        problems = [str(exc).splitlines()[0], *exc.errors]
    warned: list[str] = []
    if data is not None:
        problems = check_file_data(data, args.file, registry.discover())
        rules = (data.get("recovery") or {}).get("rules") if isinstance(data.get("recovery"), Mapping) else None
        warned = checking.rule_warnings(rules) if isinstance(rules, list) else []
    for line in warned:
        print(f"{args.file}: warning: {line}", file=sys.stderr)
    if problems:
        print(f"{args.file}: invalid", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"{args.file}: valid" + (f" ({len(warned)} warning{'s' if len(warned) > 1 else ''})" if warned else ""))
    return 0


def check_file_data(data: Mapping[str, Any], file_name: str, detectors: registry.Registry) -> list[str]:
    """Every problem of a settings file's content. When the schema refuses it, the rules, detector configs
    and XID policy are still checked from what the file holds, so one run lists everything."""
    try:
        cfg = layering.layer(file_data=data, file_name=file_name).settings
    except errors.ConfigError as exc:
        found = list(exc.errors) or [str(exc)]
    else:
        return checking.problems(cfg, detectors)
    recovery = data.get("recovery") if isinstance(data.get("recovery"), Mapping) else {}
    rules = recovery.get("rules") if isinstance(recovery, Mapping) else None
    if isinstance(rules, list):
        found += checking.rule_problems(rules, detectors)
    entries: dict[str, settings.DetectorEntry] | None = None
    try:
        entries = settings.DetectorsSettings.model_validate(data.get("detectors") or {}).entries
    except ValidationError:
        pass  # already reported above, field by field
    else:
        found += detectors.check_entries(entries)
    try:
        agent_settings = settings.AgentSettings.model_validate(data.get("agent") or {})
    except ValidationError:
        agent_settings = None
    if entries is not None and agent_settings is not None:
        found += checking.event_retry_problems(agent_settings.event_retry_seconds, entries, detectors)
    agent = data.get("agent")
    if isinstance(agent, Mapping) and isinstance(agent.get("xid_policy_file"), str):
        found += checking.xid_policy_problems(agent["xid_policy_file"])
    return found


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and not path.endswith(".config") and path != "detectors.entries":
            out.update(_flatten(value, path + "."))
        elif path == "detectors.entries" and isinstance(value, Mapping):
            for name, entry in value.items():
                for k, v in entry.items():
                    out[f"{path}.{name}.{k}"] = v
        else:
            out[path] = value
    return out


def cmd_config_show(args: argparse.Namespace) -> int:
    try:
        layered = load_settings(args.config, cli_overrides(args), required=args.config_given)
    except errors.ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    flat = _flatten(layered.settings.model_dump(mode="json"))
    restart = layering.restart_required_paths()
    rows = []
    for path, value in flat.items():
        source = next((s for p, s in layered.provenance.items() if path == p or path.startswith(p + ".")),
                      "default")
        rows.append({"setting": path, "value": value, "source": source, "restart_required": path in restart})
    if args.output == "json":
        print(json.dumps(rows, indent=2))
    else:
        width = max(len(r["setting"]) for r in rows)
        for r in rows:
            mark = "  [restart required]" if r["restart_required"] else ""
            print(f"{r['setting'].ljust(width)}  {json.dumps(r['value'])}  ({r['source']}){mark}")
        print("\n[restart required]: a change applies when the process restarts; every other setting applies "
              "live when the file changes")
    return 0
