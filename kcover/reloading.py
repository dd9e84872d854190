"""Hot reload of the configuration file, and of the files it names whose content is configuration.

Owns noticing that the file changed and deciding whether the new settings may be applied. A
ConfigMap volume update swaps the `..data` symlink atomically, so inotify on the path is unreliable:
this polls the *resolved* target's identity (realpath, inode, size, mtime) and content hash. The
files the settings name (`watch`, e.g. the agent's XID policy file) are polled the same way: an edit
of one, at the same path, reloads as if its setting had changed (`apply` gets that setting's path).

The caller's `load` callable reads and checks everything (only `kcover.cli` reads files; it checks the
rules, detector configs and the XID policy with `kcover.checking`), so nothing is applied unless all
of it is valid. An invalid change keeps the old configuration, logs every problem
(`config_reload_refused` with `field_errors`), and counts `kcover_config_reload_failures_total`; so
does an `apply` that raises `errors.ConfigError`. Settings marked `restart_required` that changed are
logged as `config_change_needs_restart` (the new value is not applied; the old one stays in force).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import structlog

from kcover import errors, layering, metrics, settings
from kcover.aio import waiting

log = structlog.get_logger()

Loader = Callable[[], layering.Layered]
Apply = Callable[[settings.Settings, set[str]], Awaitable[None]]
Watch = Callable[[settings.Settings], Mapping[str, str]]
"""Settings -> {setting path: file} for the files besides the settings file whose content is configuration."""


@dataclass(frozen=True)
class FileIdentity:
    target: str
    inode: int
    size: int
    mtime_ns: int
    digest: str


def identify(path: str) -> FileIdentity | None:
    """The resolved file's identity, or None when it does not exist (yet)."""
    target = os.path.realpath(path)
    try:
        st = os.stat(target)
        with open(target, "rb") as fh:
            digest = hashlib.sha256(fh.read()).hexdigest()
    except FileNotFoundError:
        return None
    return FileIdentity(target, st.st_ino, st.st_size, st.st_mtime_ns, digest)


def merge_live(current: settings.Settings, new: settings.Settings) -> tuple[settings.Settings, set[str], set[str]]:
    """The settings to run with: `new` except restart-required fields, which keep `current`'s values.

    Returns (effective, applied paths, paths needing a restart).
    """
    changed = layering.changed_paths(current, new)
    frozen = layering.restart_required_paths()
    blocked = {p for p in changed if p in frozen}
    if not blocked:
        return new, changed, set()
    data = new.model_dump()
    old = current.model_dump()
    for path in blocked:
        parts = path.split(".")
        src, dst = old, data
        for part in parts[:-1]:
            src, dst = src[part], dst[part]
        dst[parts[-1]] = src[parts[-1]]
    return settings.Settings.model_validate(data), changed - blocked, blocked


class Reloader:
    """Polls `path` (and the files `watch` names); on a valid change calls `apply(effective_settings, changed_paths)`."""

    def __init__(self, path: str, load: Loader, apply: Apply, current: settings.Settings,
                 metrics_: metrics.Metrics, *, interval_seconds: float = 2.0, watch: Watch | None = None) -> None:
        self.path = path
        self._load = load
        self._apply = apply
        self.current = current
        self._metrics = metrics_
        self.interval_seconds = interval_seconds
        self._watch = watch or (lambda _: {})
        self._identity = identify(path)
        self._watched = self._identify_watched(current)

    def _identify_watched(self, cfg: settings.Settings) -> dict[str, tuple[str, FileIdentity | None]]:
        return {setting: (file, identify(file)) for setting, file in self._watch(cfg).items()}

    def _edited(self) -> set[str]:
        """Settings whose file (same path as now configured) has new content since the last check."""
        out = set()
        for setting, (file, known) in self._watched.items():
            now = identify(file)
            if now != known and (now is None or known is None or now.digest != known.digest):
                out.add(setting)
            self._watched[setting] = (file, now)
        return out

    async def check_once(self) -> bool:
        """Reload if the file or a watched file changed. Returns True when new settings were applied."""
        identity = await asyncio.to_thread(identify, self.path)
        edited = await asyncio.to_thread(self._edited)
        changed_file = identity is not None and identity != self._identity
        if changed_file and self._identity is not None and identity is not None \
                and identity.digest == self._identity.digest:
            self._identity = identity  # same content behind a new symlink target
            changed_file = False
        if not changed_file and not edited:
            return False
        if changed_file:
            self._identity = identity
        target = identity.target if identity is not None else self.path
        try:
            layered = await asyncio.to_thread(self._load)
        except errors.ConfigError as exc:
            self._refused(exc, target=target, edited=edited)
            return False
        effective, applied, blocked = merge_live(self.current, layered.settings)
        for path in sorted(blocked):
            log.warning("config_change_needs_restart", setting=path, path=self.path,
                        detail="this setting cannot change while running; the old value stays until restart")
        applied |= {setting for setting in edited if setting not in blocked}
        if not applied:
            return False
        try:
            await self._apply(effective, applied)
        except errors.ConfigError as exc:
            self._refused(exc, target=target, edited=edited)
            return False
        self.current = effective
        self._watched = await asyncio.to_thread(self._identify_watched, effective)
        self._metrics.config_reloads.inc()
        log.info("config_reloaded", path=self.path, changed=sorted(applied))
        return True

    def _refused(self, exc: errors.ConfigError, *, target: str, edited: set[str]) -> None:
        self._metrics.config_reload_failures.inc()
        log.error("config_reload_refused", path=self.path, target=target, error=str(exc).splitlines()[0],
                  field_errors=exc.errors, edited_files=sorted(edited), kept="previous configuration")

    async def run(self, stop: asyncio.Event) -> None:
        while not await waiting.sleep_or_stop(stop, self.interval_seconds):
            try:
                await self.check_once()
            except OSError as exc:
                log.error("config_reload_failed", path=self.path, error=str(exc))
