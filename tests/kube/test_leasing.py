"""Table tests of the pure election rules in kcover.kube.leasing."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from kcover import errors, settings
from kcover.aio import clock as clock_
from kcover.kube import leasing

ME = "replica-a"
OTHER = "replica-b"
NOW = "2026-01-02T03:04:05.123456Z"


@pytest.mark.parametrize(("holder", "duration", "observed_at", "now", "expected"), [
    ("", 15, 0.0, 1.0, False),            # released: anyone may take it
    (ME, 15, 0.0, 1.0, False),            # ours
    (OTHER, 15, 0.0, 14.9, True),         # still valid
    (OTHER, 15, 0.0, 15.0, False),        # expired exactly at duration
    (OTHER, 15, 100.0, 114.0, True),      # judged from when *we* observed the change
    (OTHER, 1, 0.0, 1.5, False),          # short duration after a release-like write
])
def test_is_held_by_other(holder: str, duration: int, observed_at: float, now: float, expected: bool) -> None:
    record = leasing.Record(holder=holder, duration_seconds=duration)
    assert leasing.is_held_by_other(record, ME, observed_at=observed_at, now=now) is expected


@pytest.mark.parametrize(("observed", "expected"), [
    (None, leasing.Record(ME, 15, NOW, NOW, 0)),
    (leasing.Record(OTHER, 15, "t0", "t1", 3), leasing.Record(ME, 15, NOW, NOW, 4)),
    (leasing.Record("", 1, "t0", "t1", 4), leasing.Record(ME, 15, NOW, NOW, 5)),
    (leasing.Record(ME, 15, "t0", "t1", 4), leasing.Record(ME, 15, "t0", NOW, 4)),  # renewal
])
def test_claim(observed: leasing.Record | None, expected: leasing.Record) -> None:
    assert leasing.claim(observed, ME, duration_seconds=15, now=NOW) == expected


def test_released_clears_holder_and_keeps_transitions() -> None:
    out = leasing.released(leasing.Record(ME, 15, "t0", "t1", 7), now=NOW)
    assert out == leasing.Record("", 1, NOW, NOW, 7)


def test_record_round_trips_through_a_lease() -> None:
    record = leasing.Record(ME, 15, NOW, NOW, 2)
    assert leasing.Record.from_lease({"spec": record.spec()}) == record
    assert leasing.Record.from_lease({}) == leasing.Record()


def test_micro_time_has_six_digits_and_z() -> None:
    text = clock_.micro_time(dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
    assert text == "2026-01-02T03:04:05.000000Z"


def test_lease_path() -> None:
    assert leasing.lease_path("ns", "l") == "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l"


async def test_empty_identity_is_refused() -> None:
    with pytest.raises(errors.ConfigError):
        leasing.LeaderElector(None, settings.LeaseSettings(), identity="")  # type: ignore[arg-type]


async def test_not_leader_before_running() -> None:
    elector = leasing.LeaderElector(None, settings.LeaseSettings(), identity=ME)  # type: ignore[arg-type]
    assert not elector.is_leader()
    assert elector.following.is_set()
    with pytest.raises(errors.NotLeaderError):
        elector.ensure_leader()
    stop = asyncio.Event()
    stop.set()
    await elector.run_while_leading(_never, stop)  # returns at once when stopped


async def _never() -> None:
    raise AssertionError("work must not run without leadership")
