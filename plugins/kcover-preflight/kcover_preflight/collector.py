"""The `preflight-collector` detector (agent): finished preflight init containers become PreflightReports.

Owns, on one node: a watch of the pods on this node that run a preflight (`label_selector`, field
selector `spec.nodeName`), noticing when a pod's `preflight` init container has terminated, finding
the report file it wrote (`<report_dir>/<namespace>/<workload>-<index>.json` with this node's name in
it, written after the pod was created), and creating the immutable `PreflightReport` for it, owned by
the pod (`resources.body`). A pod's reports are read only from its own namespace's folder, and only
plain files there: the folder and the file may not be symbolic links, nor the file a hard link (either
could bring in a file of another namespace's folder); what else keeps one namespace from writing into
another's folder is the chart's admission policy (`preflight.restrictHostPath`). A report file may land just after the container ends: it is looked for
every `retry_seconds` for `report_wait_seconds`, then the rank is left silent (the controller's
collection timeout reports it).

Unlike kcover's own detectors it writes to the API, and only this: it creates PreflightReports, its
plugin's own kind, in the pod's namespace (RBAC: `create` on `preflightreports`). It publishes no
events (the controller-side `preflight` detector judges) and changes nothing else. A create that
answers 409 means the report exists (an agent restart); other API errors are logged and retried.
It raises `DetectorUnavailableError` without a Kubernetes client in `context.gateway`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import stat as stat_
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import structlog
from pydantic import BaseModel

from kcover.detectors import contract
from kcover_preflight import config as config_
from kcover_preflight import reports, resources
from kcover_preflight.resources import inline

log = structlog.get_logger()


@dataclass(frozen=True)
class PreflightPod:
    """The fields of a pod the collector reads."""

    uid: str
    rv: str
    namespace: str
    name: str
    node: str
    created: dt.datetime
    workload: str
    """The workload membership label's value (`training.kubeflow.org/job-name`, ...); '' without one."""
    workload_uid: str
    finished: dt.datetime | None
    """When the preflight init container terminated; None while it has not."""
    exit_code: int | None
    deleting: bool


def _time(value: Any) -> dt.datetime | None:
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).astimezone(dt.UTC)
    except ValueError:
        return None


def project(raw: Mapping[str, Any], init_container: str) -> PreflightPod | None:
    """The collector's view of a pod (pure)."""
    meta = raw.get("metadata") or {}
    if not meta.get("uid"):
        return None
    labels = meta.get("labels") or {}
    workload = next((str(labels[k]) for k in contract.MEMBERSHIP_LABELS if labels.get(k)), "")
    owner = contract.controller_of(meta)
    workload_uid = str(labels.get("jobset.sigs.k8s.io/jobset-uid") or (owner.uid if owner else ""))
    finished: dt.datetime | None = None
    exit_code: int | None = None
    for status in (raw.get("status") or {}).get("initContainerStatuses") or []:
        if status.get("name") != init_container:
            continue
        terminated = (status.get("state") or {}).get("terminated") or (status.get("lastState") or {}).get("terminated")
        if terminated:
            finished = _time(terminated.get("finishedAt")) or dt.datetime.now(dt.UTC)
            exit_code = int(terminated.get("exitCode", 0))
    return PreflightPod(uid=str(meta["uid"]), rv=str(meta.get("resourceVersion", "")),
                        namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")),
                        node=str((raw.get("spec") or {}).get("nodeName", "")),
                        created=_time(meta.get("creationTimestamp")) or dt.datetime.fromtimestamp(0, dt.UTC),
                        workload=workload, workload_uid=workload_uid, finished=finished, exit_code=exit_code,
                        deleting=bool(meta.get("deletionTimestamp")))


@dataclass(frozen=True)
class Found:
    path: Path
    mtime: float
    text: str
    report: reports.Report


def _plain(path: Path, max_bytes: int) -> tuple[os.stat_result, str] | str:
    """(its stat, its text) for a plain file at `path` (not a link of either kind, at most `max_bytes`),
    else why not. Opened without following a link, so a link swapped in after the check is refused too."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        return "a symbolic link" if os.path.islink(path) else f"cannot be opened: {exc}"
    with os.fdopen(fd, "rb") as f:
        stat = os.fstat(f.fileno())
        if not stat_.S_ISREG(stat.st_mode):
            return "not a regular file"
        if stat.st_nlink != 1:
            return f"a file with {stat.st_nlink} hard links"
        if stat.st_size > max_bytes:
            return f"larger than {max_bytes} bytes"
        return stat, f.read(max_bytes + 1).decode("utf-8")


def find_report(root: Path, pod: PreflightPod, node: str, *, max_bytes: int,
                taken: set[tuple[str, float]], refused: set[tuple[str, str]] | None = None) -> Found | None:
    """The report file `pod`'s init container wrote: in `<root>/<namespace>/` (a folder, not a link to one),
    a plain file named `<workload>-<index>.json`, naming this node, written no earlier than the pod was
    created, and not already taken by another pod. A refusal is logged once per path and reason in
    `refused`. Blocking (run it in a thread)."""
    folder = root / pod.namespace
    candidates: list[Found] = []
    told = refused if refused is not None else set()

    def refuse(path: Path, why: str) -> None:
        if (str(path), why) not in told:
            told.add((str(path), why))
            log.warning("preflight_report_refused", path=str(path), why=why, namespace=pod.namespace, pod=pod.name)
    try:
        if not stat_.S_ISDIR(os.lstat(folder).st_mode):
            refuse(folder, "the namespace's folder is not a folder (a symbolic link?)")
            return None
        entries = list(folder.glob(f"{pod.workload}-*.json"))
    except OSError:
        return None
    not_before = pod.created.timestamp() - 1.0  # creationTimestamp has whole seconds
    for path in entries:
        try:
            read = _plain(path, max_bytes)
            if isinstance(read, str):
                refuse(path, read)
                continue
            stat, text = read
            if stat.st_mtime < not_before or (str(path), stat.st_mtime) in taken:
                continue
            report = reports.parse(text)
        except (OSError, UnicodeDecodeError, reports.ReportError) as exc:
            log.warning("preflight_report_unreadable", path=str(path), error=str(exc))
            continue
        if report.workload == pod.workload and report.node_name in ("", node):
            candidates.append(Found(path, stat.st_mtime, text, report))
    # the newest file naming this node: a second pod of the workload on this node takes the next one
    candidates.sort(key=lambda f: (f.report.node_name != node, -f.mtime))
    return candidates[0] if candidates else None


class PreflightCollector:
    """Creates a PreflightReport for each preflight init container that finished on this node."""

    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.AGENT})
    config_model: ClassVar[type[BaseModel]] = config_.CollectorConfig

    def __init__(self, name: str, config: config_.CollectorConfig, context: contract.DetectorContext) -> None:
        self.name = name
        self.config = config
        self.context = context
        self.node = context.node_name
        self.pods: dict[str, PreflightPod] = {}
        """Pods whose init container finished and whose report is not created yet, by uid."""
        self.done: set[str] = set()
        """Pod uids whose report was created (or given up on)."""
        self.taken: set[tuple[str, float]] = set()
        self.refused: set[tuple[str, str]] = set()
        """(path, why) of report files refused and logged."""
        self.created = 0
        self._wake = asyncio.Event()

    def _client(self) -> contract.KubeClient:
        kube = self.context.gateway
        if kube is None:
            raise contract.DetectorUnavailableError("preflight-collector needs a Kubernetes client in context.gateway")
        return kube

    def _changed(self, old: PreflightPod | None, new: PreflightPod | None) -> None:
        if new is None:
            if old is not None:
                self.pods.pop(old.uid, None)
                self.done.discard(old.uid)
            return
        if new.finished is not None and new.uid not in self.done and not new.deleting and new.workload:
            self.pods[new.uid] = new
            self._wake.set()

    async def run(self, bus: contract.Bus, stop: asyncio.Event) -> None:
        inline(self.name, bus)
        kube = self._client()
        if not self.node:
            raise contract.DetectorUnavailableError("preflight-collector needs the node name")
        cfg = self.config
        reflector: contract.Reflector[PreflightPod] = contract.Reflector(
            kube, "/api/v1/pods", lambda raw: project(raw, cfg.init_container), sink=self._changed,
            name=f"{self.name}:pods", query={"fieldSelector": f"spec.nodeName={self.node}",
                                              "labelSelector": cfg.label_selector})
        async with asyncio.TaskGroup() as group:
            watch = group.create_task(reflector.run(stop), name=f"{self.name}:watch")
            collect = group.create_task(self._collect(kube, stop), name=f"{self.name}:collect")
            await stop.wait()
            for task in (watch, collect):
                task.cancel()

    async def _collect(self, kube: contract.KubeClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._wake.clear()
            for pod in list(self.pods.values()):
                await self._one(kube, pod)
            await contract.first_of(stop, self._wake, timeout=self.config.retry_seconds if self.pods else None)

    async def _one(self, kube: contract.KubeClient, pod: PreflightPod) -> None:
        cfg = self.config
        found = await asyncio.to_thread(find_report, Path(cfg.report_dir), pod, self.node,
                                        max_bytes=cfg.max_report_bytes, taken=self.taken, refused=self.refused)
        now = self.context.clock.now()
        if found is None:
            assert pod.finished is not None
            if (now - pod.finished).total_seconds() > cfg.report_wait_seconds:
                log.warning("preflight_report_missing", namespace=pod.namespace, pod=pod.name, workload=pod.workload,
                            exit_code=pod.exit_code, directory=os.path.join(cfg.report_dir, pod.namespace))
                self._finish(pod)
            return
        obj = resources.body(pod=resources.PodRef(pod.namespace, pod.name, pod.uid), workload=pod.workload,
                             workload_uid=pod.workload_uid, node=self.node, report_text=found.text,
                             report=found.report, observed_at=now)
        try:
            await kube.request("POST", resources.collection(pod.namespace), body=obj)
        except contract.ConflictError:
            pass  # created before this agent restarted
        except contract.NotFoundError as exc:
            log.warning("preflight_report_not_created", namespace=pod.namespace, pod=pod.name, error=str(exc),
                        hint="is the PreflightReport CRD installed (preflight.enabled in the chart)?")
            return
        except contract.KubeError as exc:
            log.warning("preflight_report_not_created", namespace=pod.namespace, pod=pod.name, error=str(exc))
            return
        self.taken.add((str(found.path), found.mtime))
        self.created += 1
        log.info("preflight_report_created", namespace=pod.namespace, pod=pod.name, name=obj["metadata"]["name"],
                 rank=found.report.rank, workload=pod.workload)
        self._finish(pod)

    def _finish(self, pod: PreflightPod) -> None:
        self.done.add(pod.uid)
        self.pods.pop(pod.uid, None)
