"""A real container exits 1 on the real kubelet; kcover, in its pod, restarts the job; the real controller
recreates it; the logs kcover saved are that container's own output (and only the faulting worker's:
`recovery.save_logs.scope` faulted).

One scenario per workload kind: a batch/v1 Job (the Job controller), a JobSet (the JobSet controller and
its Jobs) and a PyTorchJob (the Kubeflow training operator), two workers each, restartPolicy OnFailure.
`workloads.trigger` makes one worker print "loss is nan" and exit 1; the kubelet restarts it in place and
reports `lastState.terminated.exitCode: 1`, which kcover's pod-status detector acts on. Each scenario
prints its timeline and the time from the fault to the job Running again (every pod Running with a new
uid), and kcover's own MTTR from its KcoverRecoveryVerified Event.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
import workloads as wl
from nodekit import RELEASE_NS, RealNode, until

from kcover.aio import clock as clock_
from kcover.recovery import logsaving

pytestmark = pytest.mark.parametrize("realnode", ["node"], indirect=True)
RESTARTED = "KcoverRestartedWorkload"
VERIFIED = "KcoverRecoveryVerified"
LOGS = "/var/lib/kcover/logs"  # recovery.save_logs.directory, the chart's logs volume
READ_SAVED = """
import json, pathlib, sys
root = pathlib.Path(sys.argv[1])
out = []
for index in sorted(root.glob("*/index.json")):
    doc = json.loads(index.read_text())
    files = {f["path"]: (index.parent / f["path"]).read_text(errors="replace") for f in doc.get("files", [])}
    out.append({"folder": index.parent.name, "index": doc, "files": files})
print(json.dumps(out))
"""


@pytest.fixture
def ns(realnode: RealNode) -> Iterator[str]:
    name = realnode.namespace("t-" + secrets.token_hex(4))
    yield name
    realnode.request("DELETE", f"/api/v1/namespaces/{name}")


def _saved(rn: RealNode, controller: str, ns: str, job: str) -> list[dict[str, Any]]:
    """The folders the controller saved logs into for `ns`'s `job`, read inside its pod (kubectl exec)."""
    got = json.loads(rn.exec(RELEASE_NS, controller, "python3", "-c", READ_SAVED, LOGS))
    return [f for f in got if f"-{ns}-" in f["folder"] and job in f["folder"]]


def _the_kubelets_stamped_log_reads_back_as_written(rn: RealNode, ns: str, pod: dict[str, Any]) -> None:
    """The real kubelet's `timestamps=true` read, as `logsaving.unstamp` takes it apart: the lines as the
    plain read serves them, and a time for each, in order, from the container's start to now."""
    name = pod["metadata"]["name"]
    stamped = rn.log(ns, name, timestamps=True)
    after = dt.datetime.now(dt.UTC)
    plain, times = logsaving.unstamp(stamped)
    assert plain, stamped[:300]
    assert rn.log(ns, name).startswith(plain), (stamped[:300], plain[:300])
    assert len(times) == plain.count("\n"), stamped[:300]
    started = clock_.parse_time(pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"])
    assert times == sorted(times), times
    assert started <= times[0], (started, times[0])
    assert times[-1] <= after, (times[-1], after)


@pytest.mark.parametrize("kind", ["batch", "jobset", "pytorchjob"])
def test_a_real_container_exit_is_recovered_on_the_real_kubelet(realnode: RealNode, ns: str, kind: str) -> None:
    rn = realnode
    rn.wait_ready()
    job = wl.create(rn, kind, ns, "train")
    before = until(lambda: wl.running(rn, kind, ns, "train"), f"the {kind}'s two pods Running", within=120)
    old = frozenset(wl.uids(before))
    # two seconds into their run (a line every second): the instance that fails has lines from before its
    # last second, which is what lets kcover's log save prove it read that instance
    until(lambda: all(": step 10\n" in rn.log(ns, p["metadata"]["name"]) for p in before),
          "every worker two seconds into its run")
    _the_kubelets_stamped_log_reads_back_as_written(rn, ns, before[0])
    fault = wl.trigger(ns, "train")
    marks: list[tuple[str, float]] = []

    def exited() -> dict[str, Any] | None:
        """The worker that took the trigger, once the kubelet reported its container's exit 1 (as its state,
        or as its last state after restarting it); it may be terminating already, kcover acts fast."""
        who = wl.failed_by(ns, "train")
        for pod in wl.pods(rn, kind, ns, "train", live=False):
            if who and who in (pod["metadata"]["name"], pod["spec"].get("hostname")):
                for status in pod["status"].get("containerStatuses") or []:
                    for state in (status.get("state") or {}, status.get("lastState") or {}):
                        if (state.get("terminated") or {}).get("exitCode") == 1:
                            return pod
        return None
    failed = until(exited, "the kubelet to report the worker's exit 1 and restart it")
    marks.append(("the kubelet reported exit 1", time.monotonic() - fault))
    events = until(lambda: rn.events(ns, RESTARTED, job["metadata"]["uid"]), "kcover's restart Event")
    marks.append(("kcover restarted the job", time.monotonic() - fault))
    until(lambda: len(wl.pods(rn, kind, ns, "train")) == 2 and not (wl.uids(wl.pods(rn, kind, ns, "train")) & old),
          "the controller to recreate the pods")
    marks.append(("recreated", time.monotonic() - fault))
    until(lambda: wl.running(rn, kind, ns, "train", old=old), f"the {kind} Running again", within=120)
    mttr = time.monotonic() - fault
    marks.append(("Running again", mttr))
    verified = until(lambda: rn.events(ns, VERIFIED, job["metadata"]["uid"]), "kcover's verification")
    kcover_mttr = re.search(r"([0-9.]+)s after the fault", verified[0]["message"])
    print(f"timeline {kind}: fault 0.00 s, " + ", ".join(f"{w} {t:.2f} s" for w, t in marks)
          + f"; kcover's MTTR {kcover_mttr.group(1) if kcover_mttr else '?'} s")
    print(f"fault-to-Running {kind}: {mttr:.2f} s")
    assert len(rn.events(ns, RESTARTED, job["metadata"]["uid"])) == 1

    # the logs kcover saved before deleting the pods are the real container's: its previous instance's exit
    controller = str(events[0].get("reportingInstance"))
    folders = until(lambda: _saved(rn, controller, ns, "train"), f"saved logs in {controller}:{LOGS}", within=30)
    assert len(folders) == 1, [f["folder"] for f in folders]
    name = failed["metadata"]["name"]
    saved = folders[0]["files"]
    # the failed instance's log: the current one if kcover saved before the kubelet restarted the container,
    # else the previous one (kcover reads it only of a container whose status says it restarted)
    host = failed["spec"].get("hostname") or name
    exit_line = re.compile(rf"train worker {re.escape(host)}: loss is nan at step \d+, exiting with 1")
    instances = [text.splitlines() for path, text in saved.items() if path.startswith(f"{name}/")
                 and any(exit_line.fullmatch(line) for line in text.splitlines())]
    assert len(instances) == 1, {path: text[-200:] for path, text in saved.items()}
    lines = instances[0]
    # as the container wrote them: a read with timestamps (a first stop's proof) has them taken off
    assert lines[0].startswith(f"train worker {host} starting on GPUs"), lines[:2]
    assert exit_line.fullmatch(lines[-1]), lines[-2:]
    # One read when kcover saved before the kubelet restarted the container: its status was the first stop
    # and the current log, lines from two seconds before the exit, proved to be that instance. Two when
    # the restart came first: the failed instance is then the previous log. Printed: which one happened.
    where = next(path for path, text in saved.items() if path.startswith(f"{name}/") and exit_line.search(text))
    reads = folders[0]["index"]["reads"]
    print(f"log save {kind}: the failed instance in {where}, {reads} pods/log read(s)")
    assert reads == (2 if where.endswith(".previous.log") else 1), folders[0]["index"]
    # recovery.save_logs.scope faulted (the default): the faulting worker's logs, not its healthy peer's
    assert {p["metadata"]["name"] for p in before} > {name}
    assert {path.split("/", 1)[0] for path in saved if path.endswith(".log")} == {name}
