"""The layering of kcover's settings: CLI flags > environment > YAML file > defaults, with provenance.

Owns merging the sources kcover's settings come from (`layer()`: defaults < file < env < cli, each value's
source kept in `Layered.provenance`), reading the environment's nested names (`KCOVER_<GROUP>__<FIELD>`,
`env_layer`) and dotted CLI flags (`dotted_layer`), one line per validation error naming its source
(`format_validation`), and the comparisons a reload makes (`changed_paths`, `restart_required_paths`). It
does not own the schema (`kcover.settings`), and reads no file and no environment itself: `kcover.cli`
reads them and passes plain mappings to `layer()`.

Fails with `errors.ConfigError` carrying one line per bad field (`file:PATH: recovery.cooldown_seconds: ...`):
every layer's own field errors (a bad value a later layer overrode is still refused), then what only the
merged values show (relations between fields), each line once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from kcover import errors, settinggroups, settings


def env_layer(environ: Mapping[str, str]) -> dict[str, Any]:
    """`KCOVER_RECOVERY__DRY_RUN=true` -> {"recovery": {"dry_run": "true"}}; JSON lists/objects parsed.

    Only nested names (`KCOVER_<GROUP>__<FIELD>`) are settings: single names such as `KCOVER_CACHE`
    belong to other tools and are left alone. A nested name with an unknown group or field is an error.
    """
    out: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.upper().startswith(settings.ENV_PREFIX) or settings.ENV_NESTING not in key[len(settings.ENV_PREFIX):]:
            continue
        path = [p.lower() for p in key[len(settings.ENV_PREFIX):].split(settings.ENV_NESTING) if p]
        if not path:
            continue
        value: Any = raw
        if raw[:1] in ("[", "{"):
            try:
                value = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise errors.ConfigError("invalid environment", [f"{key}: not valid JSON: {exc}"]) from exc
        _set(out, path, value)
    return out


def dotted_layer(pairs: Mapping[str, Any]) -> dict[str, Any]:
    """{"recovery.dry_run": True} -> {"recovery": {"dry_run": True}} (for CLI flags)."""
    out: dict[str, Any] = {}
    for dotted, value in pairs.items():
        _set(out, dotted.split("."), value)
    return out


def _set(target: dict[str, Any], path: list[str], value: Any) -> None:
    node = target
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise errors.ConfigError("conflicting settings", [f"{'.'.join(path)}: parent is not a group"])
    node[path[-1]] = value


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict) and key != "config":
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _leaves(data: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and not path.endswith(".config") and path != "recovery.rules":
            yield from _leaves(value, path + ".")
        else:
            yield path


def format_validation(exc: ValidationError, source: str, *, skip: frozenset[str] = frozenset(),
                      sources: Mapping[str, str] | None = None) -> list[str]:
    """One line per error, `SOURCE: dotted.path: message (got value)`; error types in `skip` are left out.

    `sources` (dotted path -> source) names where a merged value came from instead of `source`."""
    lines = []
    for err in exc.errors():
        if err["type"] in skip:
            continue
        loc = ".".join(str(p) for p in err["loc"])
        got = err.get("input")
        shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
        origin = source if sources is None else _origin(sources, [str(p) for p in err["loc"]])
        lines.append(f"{origin}: {loc}: {err['msg']}{shown}")
    return lines


def _origin(sources: Mapping[str, str], loc: list[str]) -> str:
    for end in range(len(loc), 0, -1):
        if (found := sources.get(".".join(loc[:end]))) is not None:
            return found
    return "default"


class Layered:
    """Validated settings plus where each leaf value came from (`default`, `file:PATH`, `env`, `cli`)."""

    def __init__(self, settings: settings.Settings, provenance: dict[str, str]) -> None:
        self.settings = settings
        self.provenance = provenance


def layer(*, file_data: Mapping[str, Any] | None = None, file_name: str = "",
          environ: Mapping[str, str] | None = None, cli: Mapping[str, Any] | None = None) -> Layered:
    """Merge defaults < file < env < cli and validate. Raises ConfigError with field-level lines."""
    layers: list[tuple[str, dict[str, Any]]] = []
    if file_data:
        if not isinstance(file_data, Mapping):
            raise errors.ConfigError(f"{file_name}: the top level must be a mapping")
        layers.append((f"file:{file_name}", dict(file_data)))
    if environ:
        layers.append(("env", env_layer(environ)))
    if cli:
        layers.append(("cli", dotted_layer(cli)))
    merged: dict[str, Any] = {}
    provenance: dict[str, str] = {}
    problems: list[str] = []
    for source, data in layers:
        try:
            settings.Settings.model_validate(data)
        except ValidationError as exc:
            # relations are judged on the merged values: a later layer may set the other field
            problems += format_validation(exc, source, skip=frozenset({settinggroups.RELATION}))
        merged = _merge(merged, data)
        for leaf in _leaves(data):
            provenance[leaf] = source
    try:
        validated = settings.Settings.model_validate(merged)
    except ValidationError as exc:
        # every layer's field errors, then what only the merged values show (relations), each line once
        lines = format_validation(exc, "merged", sources=provenance)
        fields = {line.split(": ")[1] for line in problems}
        problems += [line for line in lines if line not in problems and line.split(": ")[1] not in fields]
        raise errors.ConfigError("invalid configuration", problems) from exc
    if problems:  # a layer's bad value that a later layer overrode is still refused
        raise errors.ConfigError("invalid configuration", problems)
    return Layered(validated, provenance)


def restart_required_paths(model_cls: type[BaseModel] = settings.Settings, prefix: str = "") -> set[str]:
    """Dotted paths of every field marked restart_required."""
    out: set[str] = set()
    for name, info in model_cls.model_fields.items():
        path = f"{prefix}{name}"
        extra = info.json_schema_extra
        if isinstance(extra, dict) and extra.get("restart_required"):
            out.add(path)
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out |= restart_required_paths(annotation, path + ".")
    return out


def changed_paths(old: BaseModel, new: BaseModel, prefix: str = "") -> set[str]:
    """Dotted paths whose values differ (recursing into groups; detector entries compared per name)."""
    out: set[str] = set()
    for name in type(old).model_fields:
        a, b = getattr(old, name), getattr(new, name)
        path = f"{prefix}{name}"
        if isinstance(a, BaseModel) and isinstance(b, BaseModel):
            out |= changed_paths(a, b, path + ".")
        elif isinstance(a, dict) and isinstance(b, dict) and path == "detectors.entries":
            for key in a.keys() | b.keys():
                if a.get(key) != b.get(key):
                    out.add(f"{path}.{key}")
        elif a != b:
            out.add(path)
    return out
