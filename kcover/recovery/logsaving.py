"""Saving a workload's container logs before a restart deletes its pods.

Owns the log sink and whose logs go in it (`chosen`, as `save_logs.scope` says): for each pod, the
current and the previous log of each container (init containers included), each bounded in lines and bytes, written under `settings.directory` in one
folder per recovery (`<UTC timestamp>-<namespace>-<kind>-<name>-<short uid>`) with an `index.json`
that lists the workload, pods, containers, files, sizes and errors. After each save it prunes the
sink by count, age and total size, oldest first (the folder just written is always kept).

It does not decide whether to restart: it returns a `SaveResult` and the caller proceeds or not
(`proceed_on_failure`). It reads pods as the API server's JSON (`metadata`, `spec.containers`,
`spec.initContainers`).

How it fails: never by raising a Kubernetes or file-system error. The whole save is time-boxed by
`timeout_seconds` (80% for the logs, 10% for the index, 10% for pruning), so a slow API server or a stuck volume never holds a recovery hostage; what was
saved before the deadline stays on disk. A previous log is asked for only of a container whose status
says it restarted or that its kubelet may restart before the read (`has_previous`), and a 400 for one (no terminated instance) is normal and skipped; other per-container errors are listed in the index.
A container whose status says its first instance stopped (`first_stop`: the usual fault under `OnFailure`)
costs one read, not two, when the current log proves it is that instance (`proves_stopped_instance`); the
previous log is read only when it does not. A save that timed out or could not
write its folder is a failure: logged (`log_save_failed`), counted in `kcover_log_save_failures_total`
and returned in `SaveResult.error`.

Which instance of a container a read gets, and when a second read is needed, is `loginstances`'.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import structlog
from prometheus_client import CollectorRegistry, Counter

from kcover import errors, settings
from kcover.kube import client as client_
from kcover.kube import projections as proj
from kcover.recovery.loginstances import (
    STAMP_BYTES,
    first_stop,
    has_previous,
    proves_stopped_instance,
    unstamp,
)

log = structlog.get_logger()

INDEX = "index.json"
FETCH_SHARE = 0.8
"""Part of `timeout_seconds` given to fetching and writing logs; the index and pruning get 10% each,
so the whole save ends within `timeout_seconds` and a caller's own time box never cuts the index."""
INDEX_SHARE = 0.1
STAMP = "%Y%m%dT%H%M%SZ"
_FOLDER = re.compile(r"^(\d{8}T\d{6}Z)-")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class WorkloadRef(Protocol):
    """What is being recovered: any object with these attributes (the engine's own ref type fits)."""

    @property
    def kind(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def uid(self) -> str: ...


class PodRef(Protocol):
    """A pod known by name only (the cache's `projections.Pod`); its containers are read from the API."""

    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...


Pod = Mapping[str, Any] | PodRef
"""A pod as the API server's JSON, or a reference whose containers are looked up."""


@dataclass(frozen=True)
class SaveResult:
    path: str | None
    """The recovery's folder; None when nothing could be written."""
    error: str | None
    """Why the save failed (timeout, unwritable sink); None when it completed."""
    files: int = 0
    bytes: int = 0
    container_errors: int = 0
    """Logs that could not be fetched (listed in index.json); not a failure of the save."""
    reads: int = 0
    """`pods/log` requests made (a first stop's proven current log saves its previous read)."""


FAILURE_REASONS = ("timeout", "write")
"""`kcover_log_save_failures_total{reason}`: the logs could not be fetched in time, or the sink not written."""


class LogSaveMetrics:
    """The sink's counters, registered once per process on its registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.failures = Counter("kcover_log_save_failures", "Log saves that failed or timed out, by reason "
                                "(timeout, write).", ["reason"], registry=registry)
        for reason in FAILURE_REASONS:
            self.failures.labels(reason)
        self.bytes = Counter("kcover_log_saved_bytes", "Bytes of container logs written to the sink.",
                             registry=registry)
        self.pruned = Counter("kcover_log_folders_pruned", "Recovery folders removed by retention.",
                              registry=registry)


@dataclass
class _Progress:
    files: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0
    reads: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(int(f["bytes"]) for f in self.files)


# -------------------------------------------------------------------------------------- pure helpers

def safe(part: str) -> str:
    """A path component from an API name (names are DNS-like already; be strict anyway)."""
    return _UNSAFE.sub("_", part).strip(".") or "_"


def _errored(pod: proj.Pod) -> bool:
    return pod.phase == "Failed" or any(
        t is not None and t.exit_code != 0 for c in pod.containers for t in (c.terminated, c.last_terminated))


def chosen(pods: Sequence[proj.Pod], scope: settings.SaveLogsScope, *, faulting_pod: str = "",
           faulting_node: str = "") -> list[proj.Pod]:
    """The pods whose logs a restart saves (`save_logs.scope`): all of them, or those the fault is about
    (the pod of uid `faulting_pod`; with no faulting pod, those on `faulting_node`; and any with a container
    that ended with an error)."""
    if scope is settings.SaveLogsScope.ALL:
        return list(pods)
    return [p for p in pods if p.uid == faulting_pod or (not faulting_pod and faulting_node and p.node == faulting_node)
            or _errored(p)]


def folder_name(workload: WorkloadRef, now: dt.datetime) -> str:
    stamp = now.astimezone(dt.UTC).strftime(STAMP)
    short_uid = (workload.uid or "nouid").replace("-", "")[:8]
    return "-".join((stamp, safe(workload.namespace), safe(str(workload.kind)).lower(), safe(workload.name),
                     safe(short_uid)))


def from_cache(pod: proj.Pod) -> dict[str, Any]:
    """The pod JSON `save` reads (identity, node, containers and their restarts) built from the cache's
    projection, so a save costs no GET per pod. Only containers with a status can have a log."""
    def statuses(init: bool) -> list[dict[str, Any]]:
        return [{"name": c.name, "restartCount": c.restart_count,
                 "state": {"terminated": {"finishedAt": c.terminated.finished_at}} if c.terminated is not None
                 else {},
                 "lastState": {"terminated": {}} if c.last_terminated is not None else {}}
                for c in pod.containers if c.init is init]
    return {"metadata": {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid},
            "spec": {"nodeName": pod.node, "restartPolicy": pod.restart_policy,
                     "initContainers": [{"name": c.name} for c in pod.containers if c.init],
                     "containers": [{"name": c.name} for c in pod.containers if not c.init]},
            "status": {"initContainerStatuses": statuses(True), "containerStatuses": statuses(False)}}


def containers_of(pod: Mapping[str, Any]) -> list[str]:
    """Init containers first, then the main ones, as the pod's JSON lists them."""
    spec = pod.get("spec") or {}
    names = [c.get("name", "") for c in (spec.get("initContainers") or [])]
    names += [c.get("name", "") for c in (spec.get("containers") or [])]
    return [n for n in names if n]


def tail(text: str, *, max_lines: int, max_bytes: int) -> tuple[str, bool]:
    """The last `max_lines` lines within `max_bytes` bytes; and whether anything was cut."""
    cut = False
    lines = text.splitlines(keepends=True)
    if len(lines) > max_lines:
        lines = lines[-max_lines:]
        cut = True
    out = "".join(lines)
    data = out.encode()
    if len(data) > max_bytes:
        out = data[-max_bytes:].decode("utf-8", "ignore")
        cut = True
    return out, cut


@dataclass(frozen=True)
class SinkEntry:
    name: str
    saved_at: dt.datetime
    bytes: int


def plan_prune(entries: Sequence[SinkEntry], *, now: dt.datetime, keep: str,
               policy: settings.SaveLogsSettings) -> list[str]:
    """Names to delete, oldest first: past the age limit, beyond the count, then over the byte budget."""
    ordered = sorted(entries, key=lambda e: (e.saved_at, e.name))
    doomed: list[str] = []
    alive: list[SinkEntry] = []
    max_age = dt.timedelta(seconds=policy.retention_age_seconds)
    for entry in ordered:
        if entry.name != keep and now - entry.saved_at > max_age:
            doomed.append(entry.name)
        else:
            alive.append(entry)
    total = sum(e.bytes for e in alive)
    count = len(alive)
    for entry in list(alive):
        if count <= policy.retention_count and total <= policy.retention_bytes:
            break
        if entry.name == keep:
            continue
        doomed.append(entry.name)
        count -= 1
        total -= entry.bytes
    return doomed


# ----------------------------------------------------------------------------------------- file I/O

def _write(path: Path, text: str) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode()
    path.write_bytes(data)
    return len(data)


def _scan(root: Path) -> list[SinkEntry]:
    entries: list[SinkEntry] = []
    if not root.is_dir():
        return entries
    for child in root.iterdir():
        match = _FOLDER.match(child.name)
        if not match or not child.is_dir():
            continue
        saved_at = dt.datetime.strptime(match.group(1), STAMP).replace(tzinfo=dt.UTC)
        size = sum(f.stat().st_size for f in child.rglob("*") if f.is_file())
        entries.append(SinkEntry(child.name, saved_at, size))
    return entries


def _prune(root: Path, keep: str, now: dt.datetime, policy: settings.SaveLogsSettings) -> list[str]:
    doomed = plan_prune(_scan(root), now=now, keep=keep, policy=policy)
    for name in doomed:
        shutil.rmtree(root / name, ignore_errors=True)
    return doomed


# -------------------------------------------------------------------------------------------- saving

async def _pod_json(client: client_.KubeClient, pod: Pod, progress: _Progress,
                    limit: asyncio.Semaphore) -> Mapping[str, Any] | None:
    if isinstance(pod, Mapping):
        return pod
    async with limit:
        try:
            found: Mapping[str, Any] = await client.request(
                "GET", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}")
        except errors.KubeError as exc:
            progress.errors.append({"pod": pod.name, "container": "", "previous": False,
                                    "status": exc.status, "error": str(exc)[:512]})
            return None
    return found


async def save(client: client_.KubeClient, workload: WorkloadRef, pods: Sequence[Pod], *,
               settings: settings.SaveLogsSettings, now: dt.datetime,
               metrics: LogSaveMetrics | None = None) -> SaveResult:
    """Save every container's current and previous log of `pods`; never raises for I/O errors."""
    root = Path(settings.directory)
    folder = root / folder_name(workload, now)
    progress = _Progress()
    error: str | None = None
    reason = ""
    created = False
    resolved: list[Mapping[str, Any]] = []
    fetch_budget = settings.timeout_seconds * FETCH_SHARE
    try:
        async with asyncio.timeout(fetch_budget):
            await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
            created = True
            limit = asyncio.Semaphore(settings.concurrency)
            found = await asyncio.gather(*(_pod_json(client, pod, progress, limit) for pod in pods))
            resolved.extend(p for p in found if p is not None)
            await asyncio.gather(*(_save_container(client, pod, container, folder=folder, policy=settings,
                                                   progress=progress, limit=limit)
                                   for pod in resolved for container in containers_of(pod)))
    except TimeoutError:
        error, reason = f"timed out after {fetch_budget:g} s", "timeout"
    except OSError as exc:
        error, reason = f"cannot write the log sink: {exc}", "write"

    index = {
        "workload": {"kind": str(workload.kind), "namespace": workload.namespace, "name": workload.name,
                     "uid": workload.uid},
        "savedAt": now.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
        "complete": error is None,
        "error": error,
        "pods": [{"namespace": (p.get("metadata") or {}).get("namespace", ""),
                  "name": (p.get("metadata") or {}).get("name", ""),
                  "uid": (p.get("metadata") or {}).get("uid", ""),
                  "node": (p.get("spec") or {}).get("nodeName", ""),
                  "containers": containers_of(p)} for p in resolved],
        "files": sorted(progress.files, key=lambda f: str(f["path"])),
        "errors": progress.errors,
        "bytes": progress.total_bytes,
        "reads": progress.reads,
    }
    written = False
    if created:
        try:  # a short extra allowance, so even a timed-out save says what it holds
            async with asyncio.timeout(settings.timeout_seconds * INDEX_SHARE):
                await asyncio.to_thread(_write, folder / INDEX, json.dumps(index, indent=2, sort_keys=True))
            written = True
        except (TimeoutError, OSError) as exc:
            if error is None:
                error, reason = f"cannot write {INDEX}: {exc or type(exc).__name__}", "write"

    if written:
        try:
            async with asyncio.timeout(settings.timeout_seconds * INDEX_SHARE):
                pruned = await asyncio.to_thread(_prune, root, folder.name, now, settings)
            if pruned:
                log.info("log_sink_pruned", removed=len(pruned), oldest=pruned[0])
                if metrics is not None:
                    metrics.pruned.inc(len(pruned))
        except (TimeoutError, OSError) as exc:
            log.warning("log_sink_prune_failed", error=str(exc) or type(exc).__name__)

    if metrics is not None:
        metrics.bytes.inc(progress.total_bytes)
    result = SaveResult(path=str(folder) if created else None, error=error, files=len(progress.files),
                        bytes=progress.total_bytes, container_errors=len(progress.errors), reads=progress.reads)
    if error is not None:
        if metrics is not None:
            metrics.failures.labels(reason).inc()
        log.warning("log_save_failed", workload=f"{workload.namespace}/{workload.name}", kind=str(workload.kind),
                    error=error, files=result.files, bytes=result.bytes, path=result.path)
    else:
        log.info("logs_saved", workload=f"{workload.namespace}/{workload.name}", kind=str(workload.kind),
                 path=result.path, files=result.files, bytes=result.bytes,
                 container_errors=result.container_errors, skipped_previous=progress.skipped, reads=result.reads)
    return result


async def _read_tail(client: client_.KubeClient, path: str, query: dict[str, str | int | bool], *,
                     max_bytes: int, read_timeout: float) -> tuple[str, bool]:
    """Stream a text response keeping only its last `max_bytes` (memory stays bounded); and whether it cut."""
    buffer = bytearray()
    total = 0
    try:
        async with client.stream(path, query=query, read_timeout=read_timeout) as response:
            async for chunk in response.content.iter_any():
                buffer += chunk
                total += len(chunk)
                if len(buffer) > 2 * max_bytes:
                    del buffer[:-max_bytes]
    except aiohttp.ClientError as exc:
        raise errors.KubeError(f"GET {path}: reading the log failed: {exc}") from exc
    return bytes(buffer[-max_bytes:]).decode("utf-8", "ignore"), total > max_bytes


async def _save_container(client: client_.KubeClient, pod: Mapping[str, Any], container: str, *, folder: Path,
                          policy: settings.SaveLogsSettings, progress: _Progress, limit: asyncio.Semaphore) -> None:
    """One container's logs: its current one, and its previous one where there may be one.

    A container whose first instance stopped (`first_stop`) is read once, with timestamps, when that read
    proves it got the stopped instance: the previous log then holds nothing else (a 400 before the kubelet
    restarts it, the same instance after). When the read proves nothing, the previous log is read too, as for
    any restarted container. When the read failed it is not: both go through the same kubelet, and a previous
    log exists only once the kubelet has restarted the container, so the second read cannot find more."""
    stopped = first_stop(pod, container)
    if stopped is None:
        previous = has_previous(pod, container)
        await asyncio.gather(*(_save_one(client, pod, container, p, folder=folder, policy=policy, progress=progress,
                                         limit=limit) for p in ((False, True) if previous else (False,))))
        progress.skipped += not previous
        return
    outcome = await _save_one(client, pod, container, False, folder=folder, policy=policy, progress=progress,
                              limit=limit, stopped=stopped)
    if outcome == "proven" or outcome == "failed":
        progress.skipped += 1
        return
    await _save_one(client, pod, container, True, folder=folder, policy=policy, progress=progress, limit=limit)


async def _save_one(client: client_.KubeClient, pod: Mapping[str, Any], container: str, previous: bool, *,
                    folder: Path, policy: settings.SaveLogsSettings, progress: _Progress,
                    limit: asyncio.Semaphore, stopped: dt.datetime | None = None) -> str:
    """Read and write one log; "saved", "proven" (with `stopped`: the log is the instance that stopped then),
    "failed" (listed in the index) or "absent" (a previous log that does not exist)."""
    meta = pod.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    # No limitBytes: the server would keep the *head* of the tail; the reader keeps the last bytes instead.
    query: dict[str, str | int | bool] = {"container": container, "tailLines": policy.max_lines_per_container}
    if previous:
        query["previous"] = True
    bound = policy.max_bytes_per_container
    if stopped is not None:
        query["timestamps"] = True
        bound += STAMP_BYTES * policy.max_lines_per_container
    proven = False
    async with limit:
        progress.reads += 1
        try:
            text, cut = await _read_tail(client, f"/api/v1/namespaces/{namespace}/pods/{name}/log", query,
                                    max_bytes=bound, read_timeout=policy.timeout_seconds)
        except errors.KubeError as exc:
            if previous and exc.status == 400:
                progress.skipped += 1  # no terminated instance: nothing to save
                return "absent"
            progress.errors.append({"pod": name, "container": container, "previous": previous,
                                    "status": exc.status, "error": str(exc)[:512]})
            return "failed"
        if stopped is not None:
            text, times = unstamp(text, cut=cut)
            proven = proves_stopped_instance(times, stopped)
        text, trimmed = tail(text, max_lines=policy.max_lines_per_container,
                             max_bytes=policy.max_bytes_per_container)
        # the server applied tailLines itself: reaching the line limit means older lines were left out
        truncated = cut or trimmed or text.count("\n") >= policy.max_lines_per_container
        relative = Path(safe(name)) / (safe(container) + (".previous.log" if previous else ".log"))
        size = await asyncio.to_thread(_write, folder / relative, text)
    progress.files.append({"pod": name, "container": container, "previous": previous,
                           "path": str(relative), "bytes": size, "truncated": truncated})
    return "proven" if proven else "saved"
