from __future__ import annotations

import pytest
from kcover_script_detector import checking

S = checking.Status


@pytest.mark.parametrize(("code", "status"), [
    (0, S.HEALTHY), (1, S.PROBLEM), (2, S.UNKNOWN), (3, S.UNKNOWN), (127, S.UNKNOWN), (-9, S.UNKNOWN), (None, S.UNKNOWN),
])
def test_status_from_exit_follows_npd(code: int | None, status: checking.Status) -> None:
    assert checking.status_from_exit(code) is status


@pytest.mark.parametrize(("raw", "limit", "message"), [
    (b"NTP service is not running\n", 80, "NTP service is not running"),
    (b"  padded  \n\n", 80, "padded"),
    (b"x" * 200, 80, "x" * 80),
    ("température élevée".encode(), 5, "tempé"),
    (b"\xff\xfebad", 80, "\ufffd\ufffdbad"),
    (b"", 80, ""),
])
def test_message_is_trimmed_and_truncated(raw: bytes, limit: int, message: str) -> None:
    assert checking.message_from_output(raw, limit) == message


def _fold(statuses: list[checking.Status], threshold: int = 2) -> list[tuple[S, S | None] | None]:
    state = checking.CheckState()
    out: list[tuple[S, S | None] | None] = []
    for status in statuses:
        state, transition = checking.observe(state, checking.Result(status, ""), unknown_threshold=threshold)
        out.append((transition.status, transition.previous) if transition else None)
    return out


@pytest.mark.parametrize(("statuses", "expected"), [
    # First healthy result is not news; staying healthy neither.
    ([S.HEALTHY, S.HEALTHY], [None, None]),
    # Problem reported once while it holds, recovery reported once.
    ([S.HEALTHY, S.PROBLEM, S.PROBLEM, S.HEALTHY, S.HEALTHY],
     [None, (S.PROBLEM, S.HEALTHY), None, (S.HEALTHY, S.PROBLEM), None]),
    # A problem on the very first run is reported.
    ([S.PROBLEM], [(S.PROBLEM, None)]),
    # Unknown needs `threshold` in a row; a healthy run resets the streak.
    ([S.UNKNOWN, S.HEALTHY, S.UNKNOWN, S.UNKNOWN, S.UNKNOWN],
     [None, None, None, (S.UNKNOWN, S.HEALTHY), None]),
    # Leaving unknown for healthy is a recovery.
    ([S.UNKNOWN, S.UNKNOWN, S.HEALTHY], [None, (S.UNKNOWN, None), (S.HEALTHY, S.UNKNOWN)]),
    # A single unknown inside a problem does not clear it, nor repeat it.
    ([S.PROBLEM, S.UNKNOWN, S.PROBLEM], [(S.PROBLEM, None), None, None]),
    # A problem that turns unknown for long enough is reported as unknown, then problem again.
    ([S.PROBLEM, S.UNKNOWN, S.UNKNOWN, S.PROBLEM], [(S.PROBLEM, None), None, (S.UNKNOWN, S.PROBLEM), (S.PROBLEM, S.UNKNOWN)]),
])
def test_only_transitions_are_reported(statuses: list[checking.Status], expected: list[object]) -> None:
    assert _fold(statuses) == expected


def test_threshold_one_reports_first_unknown() -> None:
    assert _fold([S.UNKNOWN], threshold=1) == [(S.UNKNOWN, None)]
