"""Exponential backoff with equal jitter, as an object (no module state).

Each delay is drawn uniformly from the upper half of the exponential ceiling ([ceiling/2, ceiling]):
never less than half the ceiling, so retries stay spread out but never collapse to zero (AWS calls this
"equal jitter"; "full jitter" would draw from [0, ceiling]). Pure: the caller passes the RNG for tests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Delays grow `initial * factor**n` up to `maximum`, each drawn uniformly in [delay/2, delay]."""

    initial: float = 0.5
    maximum: float = 30.0
    factor: float = 2.0
    rng: random.Random = field(default_factory=random.Random)
    attempts: int = 0

    def next_delay(self) -> float:
        ceiling = min(self.maximum, self.initial * self.factor**self.attempts)
        self.attempts += 1
        return self.rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempts = 0
