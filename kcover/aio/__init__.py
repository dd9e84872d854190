"""Small asyncio helpers shared by every layer, each in its own module:

* `clock`: the `Clock` protocol, the system clock and `FakeClock`, the one clock tests use;
* `waiting`: wait for a stop signal, for the first of several, or for a condition, with a timeout;
* `commands`: run a node command as an asyncio subprocess, bounded in time and output, its process group
  killed on timeout or cancellation;
* `backoff`: exponential retry delays with equal jitter;
* `limiting`: a token bucket.

Nothing here starts or supervises tasks beyond the waits it is asked for; each role owns its one TaskGroup.
This package imports nothing of kcover's.
"""
