"""Small asyncio helpers shared by every layer: clocks (`clock`: wall and monotonic time, a fake for tests) and
retry backoff (`backoff`). Nothing here starts or supervises tasks; each role owns its one TaskGroup."""
