"""The waiting helpers on virtual time: each returns as soon as its answer is known, says which answer it
was, and leaves nothing running (the suite's leak fixture checks the last)."""

from __future__ import annotations

import asyncio

import pytest

from kcover.aio import waiting


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


@pytest.mark.looptime
async def test_sleep_or_stop_sleeps_the_whole_time_when_nobody_stops() -> None:
    start = _loop_time()
    assert await waiting.sleep_or_stop(asyncio.Event(), 30.0) is False
    assert _loop_time() - start == pytest.approx(30.0)


@pytest.mark.looptime
async def test_sleep_or_stop_wakes_when_stopped() -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(5.0, stop.set)
    start = _loop_time()
    assert await waiting.sleep_or_stop(stop, 3600.0) is True
    assert _loop_time() - start == pytest.approx(5.0)


@pytest.mark.looptime
async def test_sleep_or_stop_returns_at_once_when_already_stopped() -> None:
    stop = asyncio.Event()
    stop.set()
    start = _loop_time()
    assert await waiting.sleep_or_stop(stop, 3600.0) is True
    assert _loop_time() == start


@pytest.mark.looptime
async def test_first_of_names_the_event_that_was_set() -> None:
    stop, wake = asyncio.Event(), asyncio.Event()
    asyncio.get_running_loop().call_later(2.0, wake.set)
    start = _loop_time()
    assert await waiting.first_of(stop, wake, timeout=10.0) is wake
    assert _loop_time() - start == pytest.approx(2.0)


@pytest.mark.looptime
async def test_first_of_gives_none_on_timeout_and_the_first_in_order_when_several_are_set() -> None:
    stop, wake = asyncio.Event(), asyncio.Event()
    assert await waiting.first_of(stop, wake, timeout=10.0) is None
    wake.set()
    stop.set()
    assert await waiting.first_of(stop, wake, timeout=10.0) is stop
    assert await waiting.first_of(wake, stop) is wake
    with pytest.raises(ValueError, match="at least one"):
        await waiting.first_of()


@pytest.mark.looptime
async def test_or_stop_returns_the_result_when_it_comes_first() -> None:
    queue: asyncio.Queue[str] = asyncio.Queue()
    asyncio.get_running_loop().call_later(1.0, queue.put_nowait, "item")
    assert await waiting.or_stop(queue.get(), asyncio.Event()) == "item"


@pytest.mark.looptime
async def test_or_stop_cancels_the_work_when_stopped_and_loses_nothing() -> None:
    queue: asyncio.Queue[str] = asyncio.Queue()
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(1.0, stop.set)
    start = _loop_time()
    assert await waiting.or_stop(queue.get(), stop) is None
    assert _loop_time() - start == pytest.approx(1.0)
    queue.put_nowait("later")  # the cancelled get took nothing: the next one gets it
    assert await waiting.or_stop(queue.get(), asyncio.Event()) == "later"
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    ready.set_result("done")
    assert await waiting.or_stop(ready, stop) == "done"  # a result there together with the stop is not lost


@pytest.mark.looptime
async def test_or_stop_times_out_and_already_stopped_cancels_at_once() -> None:
    started: list[str] = []

    async def forever() -> str:
        started.append("x")
        await asyncio.sleep(3600)
        return "never"

    start = _loop_time()
    assert await waiting.or_stop(forever(), asyncio.Event(), timeout=4.0) is None
    assert _loop_time() - start == pytest.approx(4.0)
    stop = asyncio.Event()
    stop.set()
    assert await waiting.or_stop(forever(), stop) is None  # the coroutine is closed, never left unawaited
    assert started == ["x"]


@pytest.mark.looptime
async def test_or_stop_propagates_what_the_work_raises() -> None:
    async def broken() -> int:
        await asyncio.sleep(1.0)
        raise LookupError("gone")

    with pytest.raises(LookupError, match="gone"):
        await waiting.or_stop(broken(), asyncio.Event())


@pytest.mark.looptime
async def test_the_callers_cancellation_cancels_the_work_and_propagates() -> None:
    cancelled: list[bool] = []

    async def work() -> int:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return 1

    waiter = asyncio.create_task(waiting.or_stop(work(), asyncio.Event()))
    await asyncio.sleep(1.0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert cancelled == [True]
