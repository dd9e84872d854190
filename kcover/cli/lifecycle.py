"""A long-running role's process: signals, one TaskGroup, the health server, hot reload, bounded shutdown.

Owns running `kcover controller` or `kcover agent` once its settings are checked: the health and
metrics server, the config reloader, the role's task (handed the process environment and the detectors
the check used), SIGTERM/SIGINT handling and an exit that stays bounded (`EXIT_MARGIN_SECONDS` past the
grace; at once on a second signal). Does not own the roles themselves (`kcover.wiring`) nor reading the
settings (`configuring`).

How it fails: invalid configuration at start: exit 1 before anything runs, the problem on stderr; what
the role's task raises propagates out of the TaskGroup; a shutdown that outlives its bound ends the
process with `os._exit(0)` after the role's forced-exit hook (the controller releases its Lease).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

import kcover
from kcover import checking, errors, layering, logs, metrics, reloading, serving, settings, wiring
from kcover.cli import configuring
from kcover.detectors import contract, registry

log = structlog.get_logger()

EXIT_MARGIN_SECONDS = 5.0
"""Seconds past `server.shutdown_grace_seconds` after which the process exits whatever is left running."""
FORCED_RELEASE_SECONDS = 2.0
"""Seconds a forced exit gives the controller to release its Lease (inside `EXIT_MARGIN_SECONDS`), so a
successor takes over at once instead of after the Lease's duration."""


def _force_exit(hooks: wiring.RoleHooks, why: str, **fields: Any) -> None:
    """End the process now, whatever is still running: first, bounded, what the role asked a forced exit to
    do (the controller's Lease released over connections of its own, its loop may be blocked). Call it from a
    thread other than the loop's."""
    log.error("shutdown_forced", why=why, **fields)
    if hooks.abandon is not None:
        hooks.abandon(FORCED_RELEASE_SECONDS)
    logging.shutdown()
    os._exit(0)


def _exit_guard(seconds: float, hooks: wiring.RoleHooks) -> None:
    """A daemon thread that ends the process after `seconds` (and `FORCED_RELEASE_SECONDS` to release the
    Lease): shutdown stays bounded even when something never returns (a detector that ignores its
    cancellation, a thread stuck in a blocking call that asyncio.run would wait for at exit)."""
    def guard() -> None:
        time.sleep(seconds)
        _force_exit(hooks, "shutdown_deadline", after_seconds=seconds)

    threading.Thread(target=guard, name="kcover-exit-guard", daemon=True).start()


async def _bound_shutdown(stop: asyncio.Event, role_task: asyncio.Task[None], grace: Callable[[], float],
                          hooks: wiring.RoleHooks) -> None:
    """After `stop`, give the role `grace()` seconds to finish (releasing the Lease), then cancel it."""
    await stop.wait()
    seconds = grace()
    _exit_guard(seconds + EXIT_MARGIN_SECONDS - FORCED_RELEASE_SECONDS, hooks)
    done, _ = await asyncio.wait({role_task}, timeout=seconds)
    if not done:
        log.warning("shutdown_grace_exceeded", grace_seconds=seconds)
        role_task.cancel()


async def serve(layered: layering.Layered, args: argparse.Namespace, role: wiring.RoleMain, *,
                detectors: registry.Registry | None = None) -> int:
    """Run a role with the health server, hot reload and signal handling until SIGTERM/SIGINT.

    Shutdown is bounded: the role gets `server.shutdown_grace_seconds` to stop (detectors, bus, Lease
    release), is cancelled after that, and the process exits `EXIT_MARGIN_SECONDS` later at the latest.
    `detectors` is the registry the settings were checked against (discovered here when None): the role and
    every reload use that one."""
    config = layered.settings
    detectors = registry.discover() if detectors is None else detectors
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    hooks = wiring.RoleHooks(environ=dict(os.environ), detectors=detectors,
                             fake_nvml_file=getattr(args, "fake_nvml", None) or "")

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set():  # a second signal: a person (or a supervisor) will not wait
            threading.Thread(target=_force_exit, args=(hooks, "second_signal"), kwargs={"signal": sig.name},
                             name="kcover-forced-exit", daemon=True).start()
            return
        log.info("shutdown_requested", signal=sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    metrics_ = metrics.Metrics(role=args.command)  # each role exports only its own series
    health = serving.Health(stall_seconds=config.server.loop_stall_seconds)
    health.starting(f"the {args.command} has not registered its own checks yet")  # the role says `started()`
    server = serving.Server(health, metrics_, host=config.server.host, port=config.server.port)
    await server.start()
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(health.heartbeat(stop), name="heartbeat")

            async def apply(new: settings.Settings, changed: set[str]) -> None:
                if any(p.startswith("logging.") for p in changed):
                    logs.configure(new.logging)
                health.stall_seconds = new.server.loop_stall_seconds
                if hooks.reconfigure is not None:
                    await hooks.reconfigure(new, changed)

            role_ = contract.Role(args.command)
            reloader = reloading.Reloader(
                args.config, configuring.checked_loader(args.config, configuring.cli_overrides(args), role=role_, detectors=detectors),
                apply, config, metrics_, interval_seconds=config.server.config_poll_seconds,
                watch=lambda cfg: checking.watched_files(cfg, role=role_))
            group.create_task(reloader.run(stop), name="config-reloader")

            role_task = group.create_task(role(config, metrics_, health, stop, hooks), name=f"{args.command}-main")
            group.create_task(_bound_shutdown(stop, role_task, lambda: reloader.current.server.shutdown_grace_seconds,
                                              hooks), name="shutdown-bound")
    finally:
        await server.stop()
    return 0


def run_role(args: argparse.Namespace, role: wiring.RoleMain) -> int:
    detectors = registry.discover()  # once: the check, the role and every reload use this one
    try:
        layered = configuring.load_settings(args.config, configuring.cli_overrides(args),
                                            required=args.config_given)
        checking.validate(layered.settings, detectors, role=contract.Role(args.command))
    except errors.ConfigError as exc:
        print(f"kcover: {exc}", file=sys.stderr)
        return 1
    logs.configure(layered.settings.logging)
    log.info("kcover_starting", command=args.command, version=kcover.__version__, config=args.config)
    for line in checking.warnings(layered.settings):
        log.warning("config_warning", warning=line)
    return asyncio.run(serve(layered, args, role, detectors=detectors))
