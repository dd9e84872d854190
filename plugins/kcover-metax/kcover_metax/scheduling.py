"""When the daily check runs next: a pure function of now, the configured HH:MM and a time zone.

Wall-clock times that a DST change skips or repeats resolve as `zoneinfo` does (fold=0).
"""

from __future__ import annotations

import datetime as dt
import zoneinfo


def parse_hhmm(text: str) -> dt.time:
    hours, sep, minutes = text.partition(":")
    if not sep or len(hours) != 2 or len(minutes) != 2 or not (hours + minutes).isdigit():
        raise ValueError(f"expected HH:MM, got {text!r}")
    return dt.time(int(hours), int(minutes))


def next_run(now: dt.datetime, at: dt.time, zone: zoneinfo.ZoneInfo | dt.tzinfo) -> dt.datetime:
    """The first moment strictly after `now` whose local time in `zone` is `at`, in UTC."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    local = now.astimezone(zone)
    candidate = dt.datetime.combine(local.date(), at, tzinfo=zone)
    if candidate <= local:
        candidate = dt.datetime.combine(local.date() + dt.timedelta(days=1), at, tzinfo=zone)
    return candidate.astimezone(dt.UTC)
