from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves tasks running on its loop."""
    before = asyncio.all_tasks()
    yield
    await asyncio.sleep(0)
    leaked = {t for t in asyncio.all_tasks() - before if not t.done()} - {asyncio.current_task()}
    assert not leaked, f"leaked tasks: {sorted(t.get_name() for t in leaked)}"
