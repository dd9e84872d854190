"""The long-running roles `kcover` can run, composed with their real implementations.

Owns the table of role commands (`controller`, `agent`, ...) the CLI offers: a role appears here
only once it works. Each role main builds its clients, starts its work, and returns a reconfigure
callable for hot reload.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable

from kcover import metrics, serving, settings

Reconfigure = Callable[[settings.Settings, set[str]], Awaitable[None]]
RoleMain = Callable[[settings.Settings, metrics.Metrics, serving.Health, asyncio.Event],
                    Awaitable[Reconfigure | None]]
AddArgs = Callable[[argparse.ArgumentParser], None]

ROLES: dict[str, tuple[str, RoleMain, AddArgs]] = {}
