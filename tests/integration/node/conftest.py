"""The `node` backend's fixtures (nodekit.py), and kcover's pods' logs on a failed scenario."""

from collections.abc import Generator
from typing import Any

import pytest
from nodekit import RELEASE_NS, realnode  # noqa: F401  (the session fixture)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """A failed scenario shows the last lines of every kcover pod's log (the kubelet's, through the API)."""
    outcome = yield
    report = outcome.get_result()
    rn = getattr(item, "funcargs", {}).get("realnode")
    if report.when == "call" and report.failed and rn is not None:
        try:
            for pod in rn.pods(RELEASE_NS):
                name = pod["metadata"]["name"]
                if pod["spec"].get("nodeName") == rn.node:
                    report.sections.append((f"kcover pod {name}", "\n".join(rn.log(RELEASE_NS, name).splitlines()[-60:])))
        except Exception as exc:  # a report must not fail on a cluster that went away
            report.sections.append(("kcover pod logs", f"unavailable: {exc}"))
