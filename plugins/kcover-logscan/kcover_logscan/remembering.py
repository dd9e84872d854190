"""A bounded memory of containers already classified, so one failure is classified once.

Owns insertion-ordered keys with a size bound; the oldest are forgotten first. No I/O, no locking
(one event loop uses it).
"""

from __future__ import annotations

import collections
from collections.abc import Hashable


class Seen:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._keys: collections.OrderedDict[Hashable, None] = collections.OrderedDict()

    def add(self, key: Hashable) -> bool:
        """Remember `key`; False if it was already remembered."""
        if key in self._keys:
            return False
        self._keys[key] = None
        if len(self._keys) > self.capacity:
            self._keys.popitem(last=False)
        return True

    def discard(self, key: Hashable) -> None:
        """Forget `key`, so a later event for it is scanned again (after a failed read)."""
        self._keys.pop(key, None)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys
