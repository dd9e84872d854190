"""A batch/v1 Job that always fails gets as many pods with kcover as without: kcover spends no extra retries.

The Job (`backoffLimit: 1`, restartPolicy Never, a podFailurePolicy rule ignoring `DisruptionTarget`, as
a Job that tolerates evictions declares) runs a worker that always exits 1. The real Job controller
counts the failures: without kcover it creates 2 pods (the first failure is within the limit, the
second fails the Job). The same Job opted in to kcover must create 2 as well: a restart that evicts a
pod which already failed would give it the Eviction API's DisruptionTarget condition, the rule would
ignore the genuine failure, and every kcover restart would be a free retry (../shared/REAL-NODE.md saw
3 pods with kcover).

Pods are counted from a watch (every pod the Job controller created, including those deleted at once).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import workloads as wl
from nodekit import OPT_IN, RealNode, until

pytestmark = pytest.mark.parametrize("realnode", ["node"], indirect=True)
ALWAYS_FAILS = "import time; print('step 0: loss is nan, exiting with 1', flush=True); time.sleep(1); raise SystemExit(1)"


@pytest.fixture
def ns(realnode: RealNode) -> Iterator[str]:
    name = realnode.namespace("t-" + secrets.token_hex(4))
    yield name
    realnode.request("DELETE", f"/api/v1/namespaces/{name}")


class PodWatch:
    """The uids of every pod created in a namespace, per Job, from one watch (a thread)."""

    def __init__(self, rn: RealNode, ns: str) -> None:
        cp = rn.stack.cp
        self.created: dict[str, set[str]] = {}
        self.error: BaseException | None = None
        self._closing = False
        req = urllib.request.Request(f"{cp.url}/api/v1/namespaces/{ns}/pods?watch=true&timeoutSeconds=300",
                                     headers={"Authorization": f"Bearer {cp.token}"})
        self._response = urllib.request.urlopen(req, context=cp._ssl, timeout=310)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for line in self._response:
                event = json.loads(line)
                meta = event["object"]["metadata"]
                job = (meta.get("labels") or {}).get("batch.kubernetes.io/job-name")
                if job and event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    self.created.setdefault(job, set()).add(meta["uid"])
        except Exception as exc:  # closing the response ends the read with an error of its own
            if not self._closing:
                self.error = exc

    def close(self) -> None:
        """Ends the watch at once. `close()` alone waited for the reader thread, blocked in its read and holding
        the stream's lock, until the server ended the watch at its `timeoutSeconds` (300 s, every run): the
        socket is shut down first, which ends that read."""
        self._closing = True
        sock = getattr(getattr(self._response.fp, "raw", None), "_sock", None)  # http.client's SocketIO
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's: not the TLS layer's
        self._thread.join(5)
        with contextlib.suppress(Exception):  # the reader may have released the stream half way
            self._response.close()
        assert not self._thread.is_alive(), "the pod watch's reader did not end"


def _job(rn: RealNode, ns: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
    spec = wl.pod_spec(rn, ns, name, restart="Never")
    spec["containers"][0]["command"] = ["python3", "-c", ALWAYS_FAILS]
    got: dict[str, Any] = rn.ok("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": labels},
        "spec": {"backoffLimit": 1, "podFailurePolicy": {"rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]},
            "template": {"metadata": {"labels": labels}, "spec": spec}}})
    return got


def _failed(rn: RealNode, ns: str, name: str) -> bool:
    status = rn.ok("GET", f"/apis/batch/v1/namespaces/{ns}/jobs/{name}").get("status") or {}
    return any(c["type"] == "Failed" and c["status"] == "True" for c in status.get("conditions") or [])


@pytest.mark.timeout(600)  # its own waits add up to 270 s: a real kubelet's back-off on a loaded machine
def test_an_always_failing_job_gets_as_many_pods_with_kcover_as_without(realnode: RealNode, ns: str) -> None:
    rn = realnode
    rn.wait_ready()
    watch = PodWatch(rn, ns)
    try:
        _job(rn, ns, "plain", {})
        _job(rn, ns, "kcover", dict(OPT_IN))
        until(lambda: _failed(rn, ns, "plain"), "the Job without kcover Failed", within=120)
        plain = len(watch.created.get("plain", ()))
        # decided when the opted-in Job failed too, or as soon as it has more pods than the other ever had
        until(lambda: _failed(rn, ns, "kcover") or len(watch.created.get("kcover", ())) > plain,
              "the opted-in Job Failed, or past the other's count", within=150)
    finally:
        watch.close()
    assert watch.error is None, f"the pod watch ended early: {watch.error!r}"  # the counts would be short
    counts = {name: len(watch.created.get(name, ())) for name in ("plain", "kcover")}
    done = "" if _failed(rn, ns, "kcover") else " (and counting: the Job had not failed yet)"
    print(f"always-failing Job, backoffLimit 1: pods created without kcover {counts['plain']}, "
          f"with kcover {counts['kcover']}{done}")
    assert counts["plain"] == 2
    assert counts["kcover"] == counts["plain"]
