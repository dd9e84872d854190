from __future__ import annotations

import asyncio
import time

import aiohttp

from kcover import metrics, serving


async def test_health_ready_and_metrics_over_http() -> None:
    m = metrics.Metrics()
    m.config_reload_failures.inc()
    health = serving.Health(stall_seconds=0.5)
    state = {"synced": False}
    health.add_readiness("caches", lambda: (state["synced"], "pods 0/1 synced"))
    server = serving.Server(health, m, host="127.0.0.1", port=0)
    await server.start()
    stop = asyncio.Event()
    beat = asyncio.create_task(health.heartbeat(stop))
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{server.port}") as http:
            async with http.get("/healthz") as r:
                assert r.status == 200
            async with http.get("/readyz") as r:
                assert r.status == 503
                assert "[-] caches failing: pods 0/1 synced" in await r.text()
            state["synced"] = True
            async with http.get("/readyz") as r:
                assert r.status == 200
            async with http.get("/metrics") as r:
                assert r.status == 200
                assert "kcover_config_reload_failures_total 1.0" in await r.text()
            # a blocked event loop makes liveness fail, seen by the watchdog thread outside the loop
            time.sleep(0.8)  # noqa: ASYNC251 -- blocking the loop on purpose
            ok, detail = health.liveness()
            assert not ok
            assert "stalled" in detail
            assert health.stalls == 1, "the watchdog thread saw the stall while the loop was blocked"
            async with http.get("/healthz") as r:  # the first probe answered after the stall still fails
                assert r.status == 503
                assert "stalled" in await r.text()
            async with http.get("/metrics") as r:
                assert "kcover_event_loop_stalls_total 1.0" in await r.text()
            await asyncio.sleep(0.6)  # the loop ticks again for a whole stall period: live again
            async with http.get("/healthz") as r:
                assert r.status == 200
    finally:
        stop.set()
        await beat
        await server.stop()


def test_a_check_that_raises_reports_not_ready() -> None:
    health = serving.Health()

    def broken() -> tuple[bool, str]:
        raise RuntimeError("boom")

    health.add_readiness("x", broken)
    ok, results = health.readiness()
    assert not ok
    assert results["x"] == "failing: check raised RuntimeError: boom"
