from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest
from kcover_metax import scheduling

UTC = dt.UTC
SHANGHAI = zoneinfo.ZoneInfo("Asia/Shanghai")
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")


@pytest.mark.parametrize(("now", "at", "zone", "due"), [
    (dt.datetime(2026, 4, 23, 1, 0, tzinfo=UTC), "03:00", UTC, dt.datetime(2026, 4, 23, 3, 0, tzinfo=UTC)),
    (dt.datetime(2026, 4, 23, 3, 0, tzinfo=UTC), "03:00", UTC, dt.datetime(2026, 4, 24, 3, 0, tzinfo=UTC)),
    (dt.datetime(2026, 4, 23, 23, 59, tzinfo=UTC), "00:00", UTC, dt.datetime(2026, 4, 24, 0, 0, tzinfo=UTC)),
    # 03:00 in Shanghai (UTC+8) is 19:00 UTC the day before.
    (dt.datetime(2026, 4, 23, 12, 0, tzinfo=UTC), "03:00", SHANGHAI, dt.datetime(2026, 4, 23, 19, 0, tzinfo=UTC)),
    (dt.datetime(2026, 4, 23, 20, 0, tzinfo=UTC), "03:00", SHANGHAI, dt.datetime(2026, 4, 24, 19, 0, tzinfo=UTC)),
    # Across the spring DST change in Berlin (29 March 2026): 04:00 CEST is 02:00 UTC.
    (dt.datetime(2026, 3, 28, 12, 0, tzinfo=UTC), "04:00", BERLIN, dt.datetime(2026, 3, 29, 2, 0, tzinfo=UTC)),
])
def test_next_run(now: dt.datetime, at: str, zone: dt.tzinfo, due: dt.datetime) -> None:
    assert scheduling.next_run(now, scheduling.parse_hhmm(at), zone) == due


@pytest.mark.parametrize("text", ["3:00", "24:00", "03:60", "0300", "ab:cd", "03:00:00"])
def test_bad_hhmm_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        scheduling.parse_hhmm(text)


def test_naive_now_is_refused() -> None:
    with pytest.raises(ValueError):
        scheduling.next_run(dt.datetime(2026, 1, 1), dt.time(3), UTC)
