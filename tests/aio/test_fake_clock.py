"""`FakeClock`, the one test clock: it moves only when told, or with the loop's (virtual) time."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from kcover.aio import clock as clock_

T0 = dt.datetime(2026, 3, 1, 8, 0, tzinfo=dt.UTC)


def test_a_fake_clock_moves_only_when_told() -> None:
    clock = clock_.FakeClock(T0, monotonic_start=100.0)
    assert clock.now() == T0
    assert clock.monotonic() == 100.0
    clock.advance(90)
    assert clock.now() == T0 + dt.timedelta(seconds=90)
    assert clock.monotonic() == 190.0
    with pytest.raises(ValueError, match="does not go back"):
        clock.advance(-1)


def test_a_wall_clock_step_leaves_monotonic_time_alone() -> None:
    clock = clock_.FakeClock(T0)
    clock.advance(10)
    clock.set_now(T0 - dt.timedelta(hours=1))  # NTP stepped the wall clock back
    assert clock.now() == T0 - dt.timedelta(hours=1)
    assert clock.monotonic() == 10.0
    clock.advance(5)
    assert clock.now() == T0 - dt.timedelta(hours=1) + dt.timedelta(seconds=5)


def test_a_fake_clock_refuses_naive_times() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        clock_.FakeClock(dt.datetime(2026, 1, 1))  # naive: the point of the test
    with pytest.raises(ValueError, match="timezone-aware"):
        clock_.FakeClock().set_now(dt.datetime(2026, 1, 1))


@pytest.mark.looptime
async def test_a_loop_following_clock_moves_with_virtual_time() -> None:
    loop = asyncio.get_running_loop()
    clock = clock_.FakeClock(T0, follow_loop=True)
    assert clock.now() == T0
    assert clock.monotonic() == pytest.approx(loop.time())  # the loop's own time, as SystemClock's
    await asyncio.sleep(3600)
    assert clock.now() == T0 + dt.timedelta(hours=1)
    assert clock.monotonic() == pytest.approx(loop.time())
    clock.advance(60)
    assert clock.now() == T0 + dt.timedelta(hours=1, minutes=1)
    assert clock.monotonic() == pytest.approx(loop.time() + 60)
