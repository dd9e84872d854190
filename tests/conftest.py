"""Suite-wide fixtures: a leak check that fails a test which leaves asyncio tasks running, and the
cluster backends plugin (tests/backends.py: `cluster`, `controlplane`, per-backend summary)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
import structlog

pytest_plugins = ["backends"]


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    """A test that configures structlog (the CLI does, at level warning) must not filter the next
    test's log capture: every test starts from structlog's defaults."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    before = set(asyncio.all_tasks())
    yield
    await asyncio.sleep(0)
    leaked = [t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()]
    if leaked:
        # give cancelled tasks one more turn to finish
        await asyncio.sleep(0.05)
        leaked = [t for t in leaked if not t.done()]
    for task in leaked:
        task.cancel()
    assert not leaked, f"test leaked tasks: {[t.get_name() for t in leaked]}"
