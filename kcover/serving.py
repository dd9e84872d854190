"""The health and metrics HTTP server (aiohttp): /healthz, /readyz, /metrics.

Owns liveness (the process is alive and its event loop ticks: a heartbeat task records the loop's
time, and /healthz fails when it is older than `server.loop_stall_seconds`) and readiness (every
registered check passes: detectors running, caches synced, ...). It does not decide what is ready;
components register checks. /metrics renders the process's own registry in Prometheus text format.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kcover import metrics as metrics_

log = structlog.get_logger()

Check = Callable[[], tuple[bool, str]]


class Health:
    """Readiness checks by name, and the loop heartbeat."""

    def __init__(self, *, stall_seconds: float = 5.0) -> None:
        self._checks: dict[str, Check] = {}
        self.stall_seconds = stall_seconds
        self._beat: float | None = None

    def add_readiness(self, name: str, check: Check) -> None:
        self._checks[name] = check

    def remove_readiness(self, name: str) -> None:
        self._checks.pop(name, None)

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

    def liveness(self, now: float) -> tuple[bool, str]:
        if self._beat is None:
            return True, "starting"
        age = now - self._beat
        if age > self.stall_seconds:
            return False, f"event loop stalled for {age:.1f}s"
        return True, f"loop tick {age:.2f}s ago"

    async def heartbeat(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        interval = min(1.0, self.stall_seconds / 4)
        while not stop.is_set():
            self._beat = loop.time()
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except TimeoutError:
                pass


def make_app(health: Health, metrics: metrics_.Metrics) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        ok, detail = health.liveness(asyncio.get_running_loop().time())
        return web.Response(status=200 if ok else 503, text=("ok" if ok else "unhealthy") + f": {detail}\n")

    async def readyz(_: web.Request) -> web.Response:
        ok, results = health.readiness()
        body = "".join(f"[{'+' if v.startswith('ok') else '-'}] {k} {v}\n" for k, v in results.items())
        return web.Response(status=200 if ok else 503, text=body + ("ready\n" if ok else "not ready\n"))

    async def metrics_view(_: web.Request) -> web.Response:
        payload = generate_latest(metrics.registry)
        return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_view)
    return app


class Server:
    """Runs the app until stopped; `port` is the bound port (useful with port 0)."""

    def __init__(self, health: Health, metrics: metrics_.Metrics, *, host: str, port: int) -> None:
        self._runner = web.AppRunner(make_app(health, metrics), access_log=None)
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
