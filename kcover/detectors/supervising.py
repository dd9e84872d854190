"""Running detectors: start, restart with backoff, reconfigure live, report health.

Owns the lifecycle of every enabled detector of one role: a detector that raises is restarted with
exponential backoff (`detectors.restart_initial_seconds` .. `restart_max_seconds`), marked unhealthy
in /readyz and `kcover_detector_up`, and never takes the process down. One that raises
`DetectorUnavailableError` is reported once as unavailable (no GPU, no DCGM) and retried at the
slowest rate without counting as unhealthy. `reconfigure()` restarts in place exactly the detectors
whose settings changed.

Third-party detectors run isolated (`isolating`: their own thread and loop, a rate-limited bridge to
the bus) unless their entry says `isolated: false`; built-ins run inline on the process's loop. A
failed detector makes the process not ready only when it is required (built-ins by default): a
failed optional plugin shows in `health()`, `kcover_detector_up` and the readiness text, and the
process stays ready; so does an enabled optional plugin that cannot even be imported (it runs as failed,
its import error the detail, retried with backoff). Stopping waits for inline detectors; isolated ones get `stop_grace_seconds`.
`describe()` is each detector's runtime state (served at /detectors, shown by `kcover detectors --url`),
and `on_failure` lets the role leave a `KcoverDetectorFailed` Event when one fails.

An attempt is *settled* once it has run `detectors.settle_seconds` without ending (`statuses()`): what the
agent's GPU sight (`kcover.agent.sight`) counts as a detector that watches, since a detector that cannot
run says so within moments of its start. A detector that was unavailable stays `kcover_detector_available 0`
and `unavailable` (with why) through its retries until one settles, so neither the gauge nor /detectors
blinks on every retry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import prometheus_client
import structlog
from pydantic import BaseModel

from kcover import bus as bus_
from kcover import errors, metrics, settings
from kcover.aio import backoff, waiting
from kcover.detectors import contract, isolating, registry

log = structlog.get_logger()

FAILURE_REPORT_SECONDS = 5.0
"""How long reporting one failure (the role's Event) may take before the detector restarts without it."""


@dataclass
class _Running:
    name: str
    entry: settings.DetectorEntry
    config: BaseModel
    stop: asyncio.Event
    task: asyncio.Task[None] | None = None
    state: str = "starting"
    detail: str = ""
    isolated: bool = False
    required: bool = True
    restarts: int = 0
    told: str = ""
    """The failure last handed to `Supervisor.on_failure`."""
    backoff: backoff.Backoff = field(default_factory=backoff.Backoff)
    settled: bool = False
    """The current attempt has run `detectors.settle_seconds` without ending."""


@dataclass(frozen=True)
class Status:
    """One detector's runtime state as the agent's GPU sight reads it."""

    state: str
    """starting, running, failed, unavailable or stopped."""
    detail: str
    settled: bool
    """Running, and its attempt has lasted `detectors.settle_seconds`."""


def _begin(running: _Running) -> None:
    """An attempt starts: `running`, except that a detector that was unavailable stays `unavailable` (with why)
    through its retries until one settles, as its gauge does, so /detectors does not blink on every retry."""
    if running.state != "unavailable":
        running.state, running.detail = "running", ""


class Supervisor:
    """Runs the enabled detectors whose roles include `context.role`."""

    def __init__(self, reg: registry.Registry, context: contract.DetectorContext, bus: bus_.Bus,
                 detector_settings: settings.DetectorsSettings, metrics_: metrics.Metrics) -> None:
        self._registry = reg
        self._context = context
        self._bus = bus
        self._settings = detector_settings
        self._metrics = metrics_
        self._running: dict[str, _Running] = {}
        self._group: asyncio.TaskGroup | None = None
        self._changed = asyncio.Event()
        self.on_failure: Callable[[str, str, bool], Awaitable[None]] | None = None
        """Told (name, detail, required) when a detector fails, once per distinct failure: the role
        writes a Kubernetes Event with it. Its own errors are logged, never raised into the supervisor."""

    # ------------------------------------------------------------------ planning (pure)

    def wanted(self, detector_settings: settings.DetectorsSettings) -> dict[str, tuple[settings.DetectorEntry, BaseModel]]:
        """Enabled detectors of this role with validated configs. Raises ConfigError naming every problem."""
        problems = self._registry.check_entries(detector_settings.entries)
        if problems:
            raise errors.ConfigError("invalid detector configuration", problems)
        out: dict[str, tuple[settings.DetectorEntry, BaseModel]] = {}
        for name, entry in detector_settings.entries.items():
            if not entry.enabled:
                continue
            if self._registry.unloadable(name):  # optional (else `check_entries` refused it): shown as failed
                out[name] = (entry, contract.EmptyConfig())
                continue
            info = self._registry.get(name)
            if self._context.role not in info.roles:
                continue
            out[name] = (entry, self._registry.validate_config(name, entry.config))
        return out

    # ------------------------------------------------------------------ running

    async def run(self, stop: asyncio.Event) -> None:
        wanted = self.wanted(self._settings)
        log.info("detectors_starting", role=self._context.role.value, detectors=sorted(wanted))
        async with asyncio.TaskGroup() as group:
            self._group = group
            for name, (entry, config) in wanted.items():
                self._start(name, entry, config)
            await stop.wait()
            for running in self._running.values():
                running.stop.set()
        self._group = None
        log.info("detectors_stopped", role=self._context.role.value)

    def _start(self, name: str, entry: settings.DetectorEntry, config: BaseModel) -> None:
        assert self._group is not None
        stop = asyncio.Event()
        info = self._registry.get(name)
        running = _Running(name, entry, config, stop=stop, backoff=backoff.Backoff(initial=self._settings.restart_initial_seconds,
                                           maximum=self._settings.restart_max_seconds),
                           isolated=entry.isolated if entry.isolated is not None else not info.builtin,
                           required=entry.required if entry.required is not None else info.builtin)
        running.task = self._group.create_task(self._keep_running(running), name=f"detector:{name}")
        self._running[name] = running

    async def _keep_running(self, running: _Running) -> None:
        name = running.name
        # this task's own context: every line the detector logs carries its name and role
        structlog.contextvars.bind_contextvars(detector=name, component=self._context.role.value)
        if self._context.node_name:
            structlog.contextvars.bind_contextvars(node=self._context.node_name)
        up = self._metrics.detector_up.labels(detector=name)
        available = self._metrics.detector_available.labels(detector=name)
        self._metrics.detector_started(name, isolated=running.isolated)
        available.set(1)
        unavailable_logged = False
        while not running.stop.is_set():
            settle = asyncio.get_running_loop().call_later(self._settings.settle_seconds, self._settle, running,
                                                           available)
            try:
                cls = self._registry.load(name)
                if running.isolated:
                    _begin(running)
                    up.set(1)
                    await self._isolated(running, cls).run(running.stop)
                else:
                    detector = cls(name, running.config, self._context)
                    _begin(running)
                    up.set(1)
                    await detector.run(self._bus, running.stop)
                if not running.stop.is_set():
                    raise errors.PluginError("run() returned before it was asked to stop")
            except asyncio.CancelledError:
                up.set(0)
                raise
            except errors.DetectorUnavailableError as exc:
                up.set(0)
                available.set(0)
                running.state, running.detail = "unavailable", str(exc)
                if not unavailable_logged:
                    log.warning("detector_unavailable", error=str(exc))
                    unavailable_logged = True
                delay = self._settings.restart_max_seconds
            except bus_.BusClosedError:
                up.set(0)
                return
            except Exception as exc:  # task boundary: log, count, restart with backoff
                up.set(0)
                running.restarts += 1
                running.state, running.detail = "failed", f"{type(exc).__name__}: {exc}"
                if running.detail != running.told:  # once per cause, not on every restart
                    running.told = running.detail
                    await self._tell_failure(running)
                self._metrics.detector_restarts.labels(detector=name).inc()
                delay = running.backoff.next_delay()
                log.error("detector_failed", error=running.detail, restarts=running.restarts,
                            retry_in_seconds=round(delay, 2), exc_info=exc)
            else:
                up.set(0)
                running.state = "stopped"
                return
            finally:
                settle.cancel()
                running.settled = False
            await waiting.sleep_or_stop(running.stop, delay)
        running.state = "stopped"
        up.set(0)

    @staticmethod
    def _settle(running: _Running, available: prometheus_client.Gauge) -> None:
        """The attempt has run `detectors.settle_seconds`: it watches (and is available again, if it was not).
        Called only while the attempt runs (its end cancels it before any await), so `unavailable` here is a
        retry's, not the attempt's end."""
        if running.state in ("running", "unavailable"):
            running.state, running.detail = "running", ""
            running.settled = True
            available.set(1)

    async def _tell_failure(self, running: _Running) -> None:
        if self.on_failure is None:
            return
        try:
            async with asyncio.timeout(FAILURE_REPORT_SECONDS):
                await self.on_failure(running.name, running.detail, running.required)
        except (Exception, TimeoutError) as exc:  # reporting must not keep a detector from restarting
            log.warning("detector_failure_report_failed", error=repr(exc))

    def _isolated(self, running: _Running, cls: contract.DetectorClass) -> isolating.Isolated:
        s = self._settings
        limits = isolating.Limits(rate_per_second=s.plugin_rate_per_second, burst=s.plugin_burst,
                                  queue_capacity=s.plugin_queue_capacity, stop_grace_seconds=s.stop_grace_seconds)
        context = isolating.context_for(self._context, asyncio.get_running_loop())
        return isolating.Isolated(running.name, lambda: cls(running.name, running.config, context), self._bus,
                                  limits, self._metrics.detector_dropped)

    def reconfigure(self, detector_settings: settings.DetectorsSettings, *,
                    restart: Iterable[str] = ()) -> list[str]:
        """Apply new detector settings live. Returns the names restarted, started or stopped.

        `restart` names detectors to restart even if their own entry did not change (something they
        read from the context did, such as the XID policy). Raises ConfigError (and changes nothing)
        if the new settings are invalid.
        """
        wanted = self.wanted(detector_settings)
        self._settings = detector_settings
        forced = set(restart)
        touched: list[str] = []
        for name in list(self._running):
            running = self._running[name]
            new = wanted.get(name)
            if new is None or new[0] != running.entry or name in forced:
                running.stop.set()
                del self._running[name]
                touched.append(name)
                log.info("detector_stopping", detector=name, reason="disabled" if new is None else "config_changed")
        if self._group is not None:
            for name, (entry, config) in wanted.items():
                if name not in self._running:
                    self._start(name, entry, config)
                    if name not in touched:
                        touched.append(name)
                    log.info("detector_started", detector=name)
        return touched

    def health(self) -> dict[str, str]:
        """Detector name to state: starting, running, failed, unavailable, stopped."""
        return {name: r.state for name, r in self._running.items()}

    def statuses(self) -> dict[str, Status]:
        """Detector name to its state, detail and whether its attempt settled (for the agent's GPU sight)."""
        return {name: Status(r.state, r.detail, r.settled) for name, r in self._running.items()}

    def describe(self) -> dict[str, dict[str, str | bool | int]]:
        """Per detector: state, detail, isolated, required, restarts (for `/detectors` and `kcover detectors`)."""
        return {name: {"state": r.state, "detail": r.detail, "isolated": r.isolated, "required": r.required,
                       "restarts": r.restarts} for name, r in sorted(self._running.items())}

    def readiness(self) -> tuple[bool, str]:
        """Ready unless a required detector failed; failed optional ones are named, not counted against it."""
        failed = {n: r for n, r in self._running.items() if r.state == "failed"}
        required = {n: r.detail for n, r in failed.items() if r.required}
        optional = {n: r.detail for n, r in failed.items() if not r.required}
        if required:
            return False, "; ".join(f"{n}: {d}" for n, d in sorted(required.items()))
        text = f"{len(self._running)} detectors"
        if optional:
            text += "; optional failed: " + "; ".join(f"{n}: {d}" for n, d in sorted(optional.items()))
        return True, text
