"""Hot reload of the configuration file.

Owns noticing that the file changed and deciding whether the new settings may be applied. A
ConfigMap volume update swaps the `..data` symlink atomically, so inotify on the path is unreliable:
this polls the *resolved* target's identity (realpath, inode, size, mtime) and content hash.

An invalid new file keeps the old configuration, logs every field-level error, and counts
`kcover_config_reload_failures_total`. Settings marked `restart_required` that changed are logged as
`config_change_needs_restart` (the new value is not applied; the old one stays in force).
It does not read the file itself: the caller's `load` callable does (only `cli.py` reads files).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from kcover import errors, metrics, settings

log = structlog.get_logger()

Loader = Callable[[], settings.Layered]
Apply = Callable[[settings.Settings, set[str]], Awaitable[None]]


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
    changed = settings.changed_paths(current, new)
    frozen = settings.restart_required_paths()
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
    """Polls `path`; on a valid change calls `apply(effective_settings, changed_paths)`."""

    def __init__(self, path: str, load: Loader, apply: Apply, current: settings.Settings,
                 metrics_: metrics.Metrics, *, interval_seconds: float = 2.0) -> None:
        self.path = path
        self._load = load
        self._apply = apply
        self.current = current
        self._metrics = metrics_
        self.interval_seconds = interval_seconds
        self._identity = identify(path)

    async def check_once(self) -> bool:
        """Reload if the file changed. Returns True when new settings were applied."""
        identity = await asyncio.to_thread(identify, self.path)
        if identity is None or identity == self._identity:
            return False
        if self._identity is not None and identity.digest == self._identity.digest:
            self._identity = identity  # same content behind a new symlink target
            return False
        self._identity = identity
        try:
            layered = await asyncio.to_thread(self._load)
        except errors.ConfigError as exc:
            self._metrics.config_reload_failures.inc()
            log.error("config_reload_refused", path=self.path, target=identity.target, error=str(exc).splitlines()[0],
                      field_errors=exc.errors, kept="previous configuration")
            return False
        effective, applied, blocked = merge_live(self.current, layered.settings)
        for path in sorted(blocked):
            log.warning("config_change_needs_restart", setting=path, path=self.path,
                        detail="this setting cannot change while running; the old value stays until restart")
        if not applied:
            return False
        try:
            await self._apply(effective, applied)
        except errors.ConfigError as exc:
            self._metrics.config_reload_failures.inc()
            log.error("config_reload_refused", path=self.path, error=str(exc).splitlines()[0],
                      field_errors=exc.errors, kept="previous configuration")
            return False
        self.current = effective
        self._metrics.config_reloads.inc()
        log.info("config_reloaded", path=self.path, changed=sorted(applied))
        return True

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.interval_seconds)
                return
            except TimeoutError:
                pass
            try:
                await self.check_once()
            except OSError as exc:
                log.error("config_reload_failed", path=self.path, error=str(exc))
