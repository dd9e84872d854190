"""The `cluster` backend's fixtures (realkit.py), and the kcover processes' logs on a failed scenario."""

from collections.abc import Generator
from typing import Any

import pytest
from realkit import realcluster  # noqa: F401  (the session fixture)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """A failed scenario shows the last lines of every kcover process it ran (they are gone after it)."""
    outcome = yield
    report = outcome.get_result()
    rc = getattr(item, "funcargs", {}).get("realcluster")
    if report.when == "call" and report.failed and rc is not None:
        for proc in rc.processes:
            report.sections.append((f"kcover {proc.role} {proc.name}", proc.tail(80)))
