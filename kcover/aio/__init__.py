"""Small asyncio helpers shared by every layer: clocks, backoff, stop signals, task supervision."""
