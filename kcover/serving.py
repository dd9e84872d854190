"""The health and metrics HTTP server (aiohttp): /healthz, /readyz, /metrics, /detectors.

Owns liveness (the process is alive and its event loop ticks: a heartbeat task on the loop records
the time, and a watchdog thread, outside the loop, compares it with the clock; /healthz fails while
the loop has not ticked for `server.loop_stall_seconds`, and for as long again after such a stall,
so a probe that could not be answered during the stall sees it afterwards; every stall is logged
from the watchdog thread with where the loop was stuck, and counted in `kcover_event_loop_stalls`)
and readiness (every registered check passes: required detectors running, caches synced, ...), with
degradations beside it (a check that says what works less well, such as an agent that cannot see its
GPUs: /readyz still answers 200, names it and ends `ready (degraded)`). It does not decide what is ready;
components register checks. /metrics renders the process's own registry in Prometheus text format.
/detectors answers, as JSON, each detector's runtime state (running, failed, unavailable, ...; what
`kcover detectors --url` shows) and the degradations (`degraded`, name to text), or 404 when the process
registered no detectors.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kcover import metrics as metrics_
from kcover.aio import waiting

log = structlog.get_logger()

Check = Callable[[], tuple[bool, str]]
Degradation = Callable[[], str]


STARTING = "role"
"""The readiness check failing while a role's process starts (`Health.starting`)."""


class Health:
    """Readiness checks by name, and the loop heartbeat."""

    def __init__(self, *, stall_seconds: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._checks: dict[str, Check] = {}
        self._degradations: dict[str, Degradation] = {}
        self.stall_seconds = stall_seconds
        self._clock = clock
        self._beat: float | None = None
        self._stalled_until = float("-inf")
        """Monotonic time until which /healthz reports the last stall the watchdog saw."""
        self._longest = 0.0
        self.stalls = 0
        self.lag_seconds = 0.0
        """How late the event loop is, when the watchdog last looked (exported as `kcover_event_loop_lag_seconds`):
        how far past its due time the next heartbeat is, or how late the last one came, whichever is more. Near
        zero on an idle loop: the heartbeat's own interval is not lag."""
        self._due = float("inf")
        """Monotonic time by which the next heartbeat is due (the last one plus `interval`)."""
        self._late = 0.0
        """How late the last heartbeat woke after its due time."""
        self.watched = 0
        """The watchdog's looks so far (each one refreshes `lag_seconds`)."""
        self._loop_thread: int | None = None
        self.detectors: Callable[[], Mapping[str, Mapping[str, str | bool | int]]] | None = None
        """The process's detectors and their runtime state (`Supervisor.describe`), served at /detectors."""

    def add_readiness(self, name: str, check: Check) -> None:
        self._checks[name] = check

    def starting(self, what: str) -> None:
        """Fail readiness on `role` ("starting: `what`") until `started()`: the process's health server answers
        before its role has registered checks of its own, and must not say ready meanwhile (a rolling update
        would count a controller with no cache, or an agent with no detectors, as available)."""
        self._checks[STARTING] = lambda: (False, f"starting: {what}")

    def started(self) -> None:
        """The role registered its own readiness checks: `role` goes (see `starting`)."""
        self._checks.pop(STARTING, None)

    def remove_readiness(self, name: str) -> None:
        self._checks.pop(name, None)

    def add_degradation(self, name: str, check: Degradation) -> None:
        """A check that says the process works less well than it should ("" when it does not), without making
        it not ready: /readyz answers 200 and names it, /detectors carries it."""
        self._degradations[name] = check

    def remove_degradation(self, name: str) -> None:
        self._degradations.pop(name, None)

    def degraded(self) -> dict[str, str]:
        """Name to what is degraded, for the degradations that say so now."""
        out: dict[str, str] = {}
        for name, check in sorted(self._degradations.items()):
            try:
                text = check()
            except Exception as exc:  # a broken check reports, it does not crash the server
                text = f"check raised {type(exc).__name__}: {exc}"
            if text:
                out[name] = text
        return out

    def readiness(self) -> tuple[bool, dict[str, str]]:
        results: dict[str, str] = {}
        ok = True
        for name, check in sorted(self._checks.items()):
            try:
                passed, detail = check()
            except Exception as exc:  # a broken check reports, it does not crash the server
                passed, detail = False, f"check raised {type(exc).__name__}: {exc}"
            ok = ok and passed
            results[name] = ("ok" if passed else "failing") + (f": {detail}" if detail else "")
        return ok, results

    def liveness(self, now: float | None = None) -> tuple[bool, str]:
        now = self._clock() if now is None else now
        if self._beat is None:
            return True, "starting"
        age = now - self._beat
        if age > self.stall_seconds:
            return False, f"event loop stalled for {age:.1f}s"
        if now < self._stalled_until:
            return False, f"event loop stalled for {self._longest:.1f}s (ended {now - self._stalled_until + self.stall_seconds:.1f}s ago)"
        return True, f"loop tick {age:.2f}s ago"

    @property
    def interval(self) -> float:
        """Seconds between heartbeats (and between the watchdog's looks)."""
        return min(1.0, self.stall_seconds / 4)

    def beat(self, now: float | None = None) -> None:
        """A heartbeat, on the loop: the next one is due `interval` later."""
        now = self._clock() if now is None else now
        self._beat = now
        self._due = now + self.interval

    def woke(self, now: float | None = None) -> None:
        """The heartbeat's wait ended (on the loop): note how late after its due time."""
        now = self._clock() if now is None else now
        self._late = max(0.0, now - self._due)

    def watch(self, now: float | None = None) -> None:
        """One look by the watchdog (outside the loop): note and log a stall longer than `stall_seconds`."""
        now = self._clock() if now is None else now
        if self._beat is None:
            return
        age = now - self._beat
        self.lag_seconds = max(self._late, now - self._due, 0.0)
        self.watched += 1
        if age <= self.stall_seconds:
            return
        if now >= self._stalled_until:  # a new stall
            self.stalls += 1
            self._longest = 0.0
            log.error("event_loop_stalled", seconds=round(age, 2), threshold_seconds=self.stall_seconds,
                      where=self._where())
        self._longest = max(self._longest, age)
        self._stalled_until = now + self.stall_seconds

    def _where(self) -> str:
        """The innermost frames of the loop's thread: what is blocking it."""
        frame = sys._current_frames().get(self._loop_thread) if self._loop_thread is not None else None
        if frame is None:
            return ""
        return "".join(traceback.format_stack(frame, limit=4)).strip()[-1500:]

    async def heartbeat(self, stop: asyncio.Event) -> None:
        """Tick on the loop and run the watchdog thread until `stop`."""
        self._loop_thread = threading.get_ident()
        done = threading.Event()
        watchdog = threading.Thread(target=self._watchdog, args=(done,), name="kcover-watchdog", daemon=True)
        self.beat()
        watchdog.start()
        try:
            while not stop.is_set():
                self.beat()
                if not await waiting.sleep_or_stop(stop, self.interval):
                    self.woke()
        finally:
            done.set()

    def _watchdog(self, done: threading.Event) -> None:
        while not done.wait(self.interval):
            self.watch()


class HealthCollector(Collector):
    """`kcover_event_loop_lag_seconds` and `kcover_event_loop_stalls` from the watchdog, at scrape time."""

    def __init__(self, health: Health) -> None:
        self._health = health

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily("kcover_event_loop_lag_seconds", "Seconds the event loop is late: how far past its "
                                "due time its heartbeat was when the watchdog thread last looked (near zero when "
                                "idle).", value=self._health.lag_seconds)
        yield CounterMetricFamily("kcover_event_loop_stalls", "Times the event loop did not tick for longer than "
                                  "server.loop_stall_seconds.", value=self._health.stalls)


def make_app(health: Health, metrics: metrics_.Metrics) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        ok, detail = health.liveness()
        return web.Response(status=200 if ok else 503, text=("ok" if ok else "unhealthy") + f": {detail}\n")

    async def readyz(_: web.Request) -> web.Response:
        ok, results = health.readiness()
        degraded = health.degraded()
        body = "".join(f"[{'+' if v.startswith('ok') else '-'}] {k} {v}\n" for k, v in results.items())
        body += "".join(f"[!] {k} degraded: {v}\n" for k, v in degraded.items())
        last = ("ready" + (" (degraded)" if degraded else "")) if ok else "not ready"
        return web.Response(status=200 if ok else 503, text=f"{body}{last}\n")

    async def detectors_view(_: web.Request) -> web.Response:
        if health.detectors is None:
            return web.Response(status=404, text="no detectors in this process\n")
        states = {name: dict(state) for name, state in health.detectors().items()}
        return web.json_response({"detectors": states, "degraded": health.degraded()})

    async def metrics_view(_: web.Request) -> web.Response:
        payload = generate_latest(metrics.exposition())
        return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_view)
    app.router.add_get("/detectors", detectors_view)
    return app


class Server:
    """Runs the app until stopped; `port` is the bound port (useful with port 0)."""

    def __init__(self, health: Health, metrics: metrics_.Metrics, *, host: str, port: int) -> None:
        self._runner = web.AppRunner(make_app(health, metrics), access_log=None)
        metrics.registry.register(HealthCollector(health))
        self._host = host
        self._port = port
        self.port = port

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]
        log.info("http_server_started", host=self._host, port=self.port)

    async def stop(self) -> None:
        await self._runner.cleanup()
