"""Faults kept to be handled again: those whose first write failed before anything was recorded.

Owns when each is due (after 1, 2, 4, ... seconds, at most `RETRY_MAX_SECONDS` apart), which have been
kept longer than `recovery.retry_seconds` (given up: the engine says so with an Event and
`kcover_faults_given_up_total`), and forgetting one once a handling of it left nothing unrecorded. In the
leader's memory; a new leader replays the faults it saw while following (`recovery.retry_seconds` back).
"""

from __future__ import annotations

from dataclasses import dataclass

from kcover import model

RETRY_INITIAL_SECONDS = 1.0
RETRY_MAX_SECONDS = 30.0
"""A fault whose first write failed is handled again after 1, 2, 4, ... seconds, at most 30 apart."""


@dataclass
class Kept:
    event: model.CollectorEvent
    first_failed: float
    next_at: float
    attempts: int
    error: str


class KeptFaults:
    def __init__(self) -> None:
        self._kept: dict[str, Kept] = {}

    def __bool__(self) -> bool:
        return bool(self._kept)

    def __contains__(self, event_key: object) -> bool:
        return event_key in self._kept

    def keep(self, event: model.CollectorEvent, error: str, now: float) -> Kept:
        """Keep `event` (epoch `now`), or keep it again with the next backoff."""
        held = self._kept.get(event.key)
        attempts = held.attempts + 1 if held is not None else 1
        delay = min(RETRY_MAX_SECONDS, RETRY_INITIAL_SECONDS * 2 ** (attempts - 1))
        kept = Kept(event, held.first_failed if held else now, now + delay, attempts, error[:300])
        self._kept[event.key] = kept
        return kept

    def settled(self, event_key: str) -> None:
        """A handling of the fault recorded everything it did: it is no longer kept."""
        self._kept.pop(event_key, None)

    def given_up(self, now: float, retry_seconds: float) -> list[Kept]:
        """The due faults kept longer than `retry_seconds`, taken out."""
        out = [k for k in self._kept.values() if k.next_at <= now and now - k.first_failed > retry_seconds]
        for k in out:
            del self._kept[k.event.key]
        return out

    def due(self, now: float) -> list[model.CollectorEvent]:
        return [k.event for k in self._kept.values() if k.next_at <= now]
