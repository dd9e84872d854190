"""structlog configuration: JSON when stderr is not a TTY (in the cluster), console on a terminal.

Owns the processor chain only. Context (component, node, detector) is bound by callers with
`structlog.contextvars.bind_contextvars` per task, or `log.bind(...)`. Tracebacks are rendered without
the frames' local variables (structlog's default shows them): a frame of the HTTP layer holds the
request's headers, the `Authorization` bearer token among them, and a logged exception must not carry it.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from typing import TextIO

import structlog

from kcover import settings


class _Stderr:
    """sys.stderr looked up at each write, so a replaced stream (tests, daemons) is honoured."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def configure(config: settings.LoggingSettings, *, stream: TextIO | None = None) -> None:
    out: TextIO = stream or _Stderr()  # type: ignore[assignment]
    fmt = config.format
    if fmt is settings.LogFormat.AUTO:
        fmt = settings.LogFormat.CONSOLE if out.isatty() else settings.LogFormat.JSON
    renderer: structlog.typing.Processor
    if fmt is settings.LogFormat.JSON:
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty(), exception_formatter=_console_tracebacks())
    level = logging.getLevelNamesMapping()[config.level.upper()]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.ExceptionRenderer(structlog.tracebacks.ExceptionDictTransformer(show_locals=False))
            if fmt is settings.LogFormat.JSON else structlog.dev.set_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )


def _console_tracebacks() -> structlog.typing.ExceptionRenderer:
    """Rich's tracebacks where rich is installed, plain ones otherwise; without locals either way."""
    if importlib.util.find_spec("rich") is not None:
        return structlog.dev.RichTracebackFormatter(show_locals=False)
    return structlog.dev.plain_traceback
