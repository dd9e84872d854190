"""Discovery of detectors through the entry point group `kcover.detectors`.

Owns finding, importing and checking detector classes, built-in and third-party alike (the built-ins
are registered in kcover's own pyproject exactly as a plugin would be). Discovery reads the entry points
only; a detector's module is imported the first time it is asked for (`get`, `load`, a config check), so a
role imports the detectors its configuration enables and no others (`infos` imports them all, for
`kcover detectors`). A plugin that fails to import is recorded with its name and the error, logged once,
and does not stop the others; enabled, it is a configuration problem only when it is required
(`optional()`: a plugin is optional unless its entry says `required: true`). It does not run detectors
(`supervising` does).
"""

from __future__ import annotations

import importlib.metadata as md
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import BaseModel, ValidationError

from kcover import errors
from kcover.detectors import contract

log = structlog.get_logger()

GROUP = "kcover.detectors"
BUILTIN_DISTRIBUTION = "kcover"
"""The distribution of kcover's own detectors: they run inline and are required for readiness by default."""


@dataclass(frozen=True)
class DetectorInfo:
    name: str
    value: str
    distribution: str
    version: str
    cls: contract.DetectorClass | None
    error: str = ""

    @property
    def builtin(self) -> bool:
        """Shipped in kcover's own distribution (as opposed to a third-party plugin)."""
        return self.distribution == BUILTIN_DISTRIBUTION

    @property
    def roles(self) -> frozenset[contract.Role]:
        return self.cls.roles if self.cls is not None else frozenset()


def _check(cls: object) -> str:
    """Why `cls` is not a usable detector class, or '' if it is."""
    if not isinstance(cls, type):
        return "the entry point does not name a class"
    roles = getattr(cls, "roles", None)
    if not isinstance(roles, frozenset) or not roles or not all(isinstance(r, contract.Role) for r in roles):
        return "class attribute `roles` must be a non-empty frozenset of kcover.detectors.contract.Role"
    model = getattr(cls, "config_model", None)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return "class attribute `config_model` must be a pydantic BaseModel subclass"
    if not callable(getattr(cls, "run", None)):
        return "the class has no `run(bus, stop)` coroutine"
    return ""


class Registry:
    """The detectors installed in this environment, by entry point name: `infos` already loaded, and
    `entry_points` imported when first asked for."""

    def __init__(self, infos: Iterable[DetectorInfo] = (), *, entry_points: Iterable[md.EntryPoint] = ()) -> None:
        self._infos = {info.name: info for info in infos}
        self._pending: dict[str, md.EntryPoint] = {}
        for ep in entry_points:
            if ep.name not in self._infos and ep.name not in self._pending:  # the first found wins (editable + site)
                self._pending[ep.name] = ep

    @property
    def infos(self) -> list[DetectorInfo]:
        """Every installed detector, each imported (now, if it was not yet)."""
        return sorted((self.get(name) for name in self.names()), key=lambda i: i.name)

    def names(self) -> list[str]:
        return sorted({*self._infos, *self._pending})

    def get(self, name: str) -> DetectorInfo:
        info = self._infos.get(name)
        if info is not None:
            return info
        ep = self._pending.pop(name, None)
        if ep is None:
            known = ", ".join(self.names()) or "none"
            raise errors.UnknownDetectorError(f"unknown detector {name!r}; installed detectors: {known}")
        info = self._infos[name] = _load(ep)
        return info

    def load(self, name: str) -> contract.DetectorClass:
        info = self.get(name)
        if info.cls is None:
            raise errors.PluginError(f"detector {name!r} from {info.distribution} {info.version} cannot be loaded: "
                                     f"{info.error}")
        return info.cls

    def validate_config(self, name: str, config: Mapping[str, Any]) -> BaseModel:
        cls = self.load(name)
        try:
            return cls.config_model.model_validate(dict(config))
        except ValidationError as exc:
            lines = [f"detectors.entries.{name}.config.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                     for e in exc.errors()]
            raise errors.ConfigError(f"invalid config for detector {name!r}", lines) from exc

    def optional(self, name: str, entry: Any) -> bool:
        """Whether the entry's failure leaves the process ready: `required` as set, else only plugins."""
        required = getattr(entry, "required", None)
        return not required if required is not None else not self.get(name).builtin

    def unloadable(self, name: str) -> bool:
        """The detector is installed but cannot be imported or is not a usable class."""
        return self.get(name).cls is None

    def check_entries(self, entries: Mapping[str, Any]) -> list[str]:
        """Field-level problems with configured detector entries (unknown names, bad configs, a required
        detector that cannot be loaded; an optional one that cannot is no problem: it runs as failed)."""
        problems: list[str] = []
        for name, entry in entries.items():
            if not getattr(entry, "enabled", True):
                continue  # a disabled entry may name a plugin that is not installed here
            if name not in self._infos and name not in self._pending:
                problems.append(f"detectors.entries.{name}: unknown detector; installed: {', '.join(self.names())}")
                continue
            try:
                self.validate_config(name, getattr(entry, "config", {}))
            except errors.ConfigError as exc:
                problems.extend(exc.errors)
            except errors.PluginError as exc:
                if not self.optional(name, entry):
                    problems.append(f"detectors.entries.{name}: {exc}")
        return problems


def discover(entry_points: Iterable[md.EntryPoint] | None = None) -> Registry:
    """The entry points of the group, each imported when first asked for (see `Registry`)."""
    return Registry(entry_points=md.entry_points(group=GROUP) if entry_points is None else entry_points)


def _load(ep: md.EntryPoint) -> DetectorInfo:
    """Import one entry point and check its class; a failure is logged and kept as DetectorInfo.error."""
    dist = ep.dist
    dist_name = dist.name if dist is not None else "unknown"
    version = dist.version if dist is not None else "unknown"
    try:
        cls = ep.load()
    except Exception as exc:  # a broken plugin must not stop the others
        error = f"{type(exc).__name__}: {exc}"
        log.error("detector_plugin_import_failed", detector=ep.name, entry_point=ep.value,
                  distribution=dist_name, error=error)
        return DetectorInfo(ep.name, ep.value, dist_name, version, None, error)
    problem = _check(cls)
    if problem:
        log.error("detector_plugin_invalid", detector=ep.name, entry_point=ep.value, error=problem)
        return DetectorInfo(ep.name, ep.value, dist_name, version, None, problem)
    return DetectorInfo(ep.name, ep.value, dist_name, version, cls)
