"""Which instance of a container a `pods/log` read gets, and when one read is enough.

Owns the reading of a pod's container statuses for its log instances (`has_previous`, `first_stop`) and
of a `timestamps=true` read (`unstamp`, `proves_stopped_instance`): the kubelet serves the running or
last stopped instance as the current log and the one before as the previous, and restarts a container
that stopped under `OnFailure` at once. Pure; `logsaving` does the reads.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from typing import Any

from kcover.aio import clock as clock_

STAMP_BYTES = 36
"""The most a `timestamps=true` read adds to a line (`2006-01-02T15:04:05.999999999+07:00 `)."""


def has_previous(pod: Mapping[str, Any], container: str) -> bool:
    """Whether the container may have a previous (terminated) instance to read: False when its status says
    it never restarted (`restartCount` 0, no `lastState.terminated`) and it cannot be restarted before its
    log is read, where the kubelet answers 400. A container stopped now (`state.terminated`) may be
    restarted by its kubelet before its log is read (a fraction of a second under `OnFailure`): the instance
    that failed is then the previous one, so both are read (a 400 for the previous is skipped). Not under
    the pod's `restartPolicy: Never`: the kubelet starts none of its regular containers again, so the
    current log is the failed instance and one read is enough; an init container (a sidecar restarts
    whatever the pod's policy) and a container whose own spec names a `restartPolicy` keep both reads.
    A regular container's own policy (alpha container restart rules) is not in the cache's projection:
    a pod given as the cache's projection is read by its pod's policy alone."""
    status = pod.get("status") or {}
    for init, statuses in ((True, status.get("initContainerStatuses")), (False, status.get("containerStatuses"))):
        for cs in statuses or []:
            if cs.get("name") != container:
                continue
            if bool(cs.get("restartCount")) or (cs.get("lastState") or {}).get("terminated") is not None:
                return True
            return (cs.get("state") or {}).get("terminated") is not None and (
                init or _restarts_in_place(pod, container))
    return True


def first_stop(pod: Mapping[str, Any], container: str) -> dt.datetime | None:
    """When the container's status says its first instance stopped (`state.terminated`, no restart, no
    `lastState`) and its kubelet may start it again before its log is read: that instance's `finishedAt`.
    Its current log is then either that instance or, when the kubelet restarted it meanwhile, a new one
    whose lines all come after it stopped. None otherwise (or without a readable `finishedAt`)."""
    status = pod.get("status") or {}
    for statuses in (status.get("initContainerStatuses"), status.get("containerStatuses")):
        for cs in statuses or []:
            if cs.get("name") != container:
                continue
            if bool(cs.get("restartCount")) or (cs.get("lastState") or {}).get("terminated") is not None:
                return None
            finished = ((cs.get("state") or {}).get("terminated") or {}).get("finishedAt")
            if not finished or not has_previous(pod, container):
                return None
            try:
                return clock_.parse_time(str(finished))
            except ValueError:
                return None
    return None


_STAMPED = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.\d{1,9})?(Z|[+-]\d{2}:\d{2}) ")
"""A line of `pods/log?timestamps=true`: the kubelet's RFC 3339 time (nanoseconds, trailing zeros cut), a
space, then the line as written."""


def unstamp(text: str, *, cut: bool = False) -> tuple[str, list[dt.datetime]]:
    """The text of a `timestamps=true` read without its times (each line as the container wrote it), and the
    times, whole seconds in UTC, of the lines that had one. `cut`: the text lost its head to the byte bound,
    so its first line is a fragment whose start is the container's text, never read as a time."""
    lines: list[str] = []
    times: list[dt.datetime] = []
    parts = text.split("\n")  # the kubelet ends lines with "\n" alone; a "\r" is the container's own
    for i, part in enumerate(parts):
        line = part + "\n" if i < len(parts) - 1 else part
        if not line:
            continue
        match = None if cut and i == 0 else _STAMPED.match(line)
        if match is None:
            lines.append(line)
            continue
        try:
            seconds = dt.datetime.fromisoformat(match.group(1) + match.group(3).replace("Z", "+00:00"))
        except ValueError:
            lines.append(line)
            continue
        times.append(seconds.astimezone(dt.UTC))
        lines.append(line[match.end():])
    return "".join(lines), times


def proves_stopped_instance(times: Sequence[dt.datetime], finished: dt.datetime) -> bool:
    """Whether a current log with lines at `times` is the instance that stopped at `finished` (its status's
    `finishedAt`, cut to the second, so at or before the real end). An instance started after that one
    ended writes every line after `finished`; a line written before it can only be the stopped instance's.
    An empty log, or one whose lines all fall in its last second, proves nothing. `times` are whole seconds,
    so `finished` is compared cut to its second too (a line at 10.7 s is not before a stop at 10.5 s)."""
    whole = finished.replace(microsecond=0)
    return any(t < whole for t in times)


def _restarts_in_place(pod: Mapping[str, Any], container: str) -> bool:
    """Whether the kubelet may start regular container `container` again after it stops."""
    spec = pod.get("spec") or {}
    if (spec.get("restartPolicy") or "Always") != "Never":
        return True
    return any(c.get("name") == container and c.get("restartPolicy") for c in (spec.get("containers") or []))
