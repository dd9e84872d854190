"""Fault injection for the simulated API server, used by chaos tests and `kcover sim`.

Owns the knobs: added latency per request, a rate of 5xx answers, a rate of 429 answers (plain
text as priority-and-fairness sends it, or a `TooManyRequests` Status), dropping every open watch,
and forcing watches of a resource to 410 (one-shot, or by compacting its history). Randomness
comes from a seeded `random.Random` so chaos runs repeat. Faults apply to resource requests only
(not discovery), optionally limited to some resource keys.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

from kcover.sim import store as stores


@dataclass
class Decision:
    """What to do to one request before it is served."""

    delay_seconds: float = 0.0
    error_code: int = 0  # 0: serve normally
    throttle: Literal["", "text", "status"] = ""
    retry_after_seconds: int = 1


@dataclass
class Faults:
    """Mutable fault settings of one `SimServer`; all off by default."""

    store: stores.Store
    latency_seconds: float = 0.0
    error_rate: float = 0.0
    error_code: int = 500
    throttle_rate: float = 0.0
    throttle_style: Literal["text", "status"] = "text"
    retry_after_seconds: int = 1
    resources: frozenset[str] | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    expire_next: set[str] = field(default_factory=set)

    def reset(self) -> None:
        """Turn every fault off."""
        self.latency_seconds = self.error_rate = self.throttle_rate = 0.0
        self.resources = None
        self.expire_next.clear()

    def decide(self, resource_key: str) -> Decision:
        if self.resources is not None and resource_key not in self.resources:
            return Decision()
        decision = Decision(delay_seconds=self.latency_seconds, retry_after_seconds=self.retry_after_seconds)
        if self.throttle_rate and self.rng.random() < self.throttle_rate:
            decision.throttle = self.throttle_style
        elif self.error_rate and self.rng.random() < self.error_rate:
            decision.error_code = self.error_code
        return decision

    def drop_watches(self, resource_key: str | None = None) -> int:
        """End every open watch stream now (of one resource, or all); returns how many."""
        return self.store.close_watchers(resource_key)

    def expire_next_watch(self, resource_key: str) -> None:
        """The next watch of `resource_key` that names a resourceVersion gets 410 Expired."""
        self.expire_next.add(resource_key)

    def compact(self, resource_key: str) -> None:
        """Forget the watch history of `resource_key`: every watch from an older RV gets 410."""
        self.store.compact(resource_key)

    def take_expiry(self, resource_key: str) -> bool:
        if resource_key in self.expire_next:
            self.expire_next.discard(resource_key)
            return True
        return False
