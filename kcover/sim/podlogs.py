"""Container log buffers behind the simulated `pods/log` subresource.

Owns the text each simulated container instance has written, keyed by (namespace, pod, container);
each container keeps its current instance and the previous (terminated) one, as a kubelet does. It
also owns the reading options (`tailLines`, `limitBytes`, `timestamps`, `sinceSeconds`) and their
validation. It does not know whether the pod exists; the API server checks that first.
"""

from __future__ import annotations

import datetime as dt
from collections import deque
from dataclasses import dataclass, field

from kcover.aio import clock as clocks
from kcover.sim import status

LINES_PER_INSTANCE = 10_000


@dataclass
class _Instance:
    lines: deque[tuple[dt.datetime, str]] = field(default_factory=lambda: deque(maxlen=LINES_PER_INSTANCE))


@dataclass
class _Container:
    current: _Instance = field(default_factory=_Instance)
    previous: _Instance | None = None


@dataclass(frozen=True)
class LogOptions:
    previous: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None
    timestamps: bool = False
    since_seconds: int | None = None


def validate(options: LogOptions, pod: str) -> None:
    """422 Invalid (kind PodLogOptions) for option values the API server refuses."""
    causes: list[tuple[str, str, str]] = []
    if options.tail_lines is not None and options.tail_lines < 0:
        causes.append(("FieldValueInvalid", "tailLines", f"Invalid value: {options.tail_lines}: must be greater "
                       "than or equal to 0"))
    if options.limit_bytes is not None and options.limit_bytes < 1:
        causes.append(("FieldValueInvalid", "limitBytes", f"Invalid value: {options.limit_bytes}: must be "
                       "greater than 0"))
    if options.since_seconds is not None and options.since_seconds < 1:
        causes.append(("FieldValueInvalid", "sinceSeconds", f"Invalid value: {options.since_seconds}: must be "
                       "greater than 0"))
    if causes:
        raise status.invalid("PodLogOptions", "", pod, causes)


class LogBuffers:
    """Per-container log text of every simulated pod."""

    def __init__(self, clock: clocks.Clock | None = None) -> None:
        self._clock: clocks.Clock = clock or clocks.SystemClock()
        self._containers: dict[tuple[str, str, str], _Container] = {}

    def append(self, namespace: str, pod: str, container: str, text: str) -> None:
        """Append `text` (one or more lines) to the container's current instance."""
        now = self._clock.now()
        buf = self._containers.setdefault((namespace, pod, container), _Container())
        for line in text.splitlines():
            buf.current.lines.append((now, line))

    def restart(self, namespace: str, pod: str, container: str) -> None:
        """The current instance terminated: it becomes `previous`, a new empty one starts."""
        buf = self._containers.setdefault((namespace, pod, container), _Container())
        buf.previous, buf.current = buf.current, _Instance()

    def forget_pod(self, namespace: str, pod: str) -> None:
        for key in [k for k in self._containers if k[:2] == (namespace, pod)]:
            del self._containers[key]

    def read(self, namespace: str, pod: str, container: str, options: LogOptions) -> str:
        buf = self._containers.get((namespace, pod, container))
        if options.previous:
            if buf is None or buf.previous is None:
                raise status.bad_request(f'previous terminated container "{container}" in pod "{pod}" not found')
            instance = buf.previous
        else:
            instance = buf.current if buf else _Instance()
        lines = list(instance.lines)
        if options.since_seconds is not None:
            cutoff = self._clock.now() - dt.timedelta(seconds=options.since_seconds)
            lines = [(t, s) for t, s in lines if t >= cutoff]
        if options.tail_lines is not None:
            lines = lines[-options.tail_lines:] if options.tail_lines else []
        if options.timestamps:
            text = "".join(f"{t.strftime('%Y-%m-%dT%H:%M:%S.%fZ')} {s}\n" for t, s in lines)
        else:
            text = "".join(f"{s}\n" for _, s in lines)
        if options.limit_bytes is not None:
            text = text.encode()[: options.limit_bytes].decode(errors="ignore")
        return text
