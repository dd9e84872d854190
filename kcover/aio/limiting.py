"""Rate limiting shared by the agent's reporter and the controller's answers: a token bucket.

Owns the arithmetic only; the caller passes the time (monotonic seconds), so tests need no clock.
It never blocks and never raises.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenBucket:
    """`take(now)` is True at most `burst` times at once and `rate_per_second` on average."""

    rate_per_second: float
    burst: float
    tokens: float = -1.0
    updated: float = 0.0

    def take(self, now: float) -> bool:
        if self.tokens < 0:
            self.tokens, self.updated = self.burst, now
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate_per_second)
        self.updated = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False
