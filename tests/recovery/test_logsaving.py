"""Table tests of the pure parts of kcover.recovery.logsaving, and its file-system behaviour."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from kcover import settings
from kcover.kube import projecting
from kcover.kube import projections as proj
from kcover.recovery import logsaving

NOW = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Ref:
    kind: str
    namespace: str
    name: str
    uid: str


def test_folder_name() -> None:
    ref = Ref("PyTorchJob", "team-a", "llama", "0f3c2a9e-1111-2222-3333-444455556666")
    assert logsaving.folder_name(ref, NOW) == "20260304T050607Z-team-a-pytorchjob-llama-0f3c2a9e"


def test_folder_name_is_safe_against_odd_names() -> None:
    assert logsaving.folder_name(Ref("Job", "../x", "a/b", ""), NOW) == "20260304T050607Z-_x-job-a_b-nouid"


def test_containers_of_lists_init_containers_first() -> None:
    pod = {"spec": {"initContainers": [{"name": "init"}], "containers": [{"name": "main"}, {"name": "side"}]}}
    assert logsaving.containers_of(pod) == ["init", "main", "side"]
    assert logsaving.containers_of({}) == []


@pytest.mark.parametrize(("text", "lines", "size", "expected", "cut"), [
    ("a\nb\nc\n", 5, 100, "a\nb\nc\n", False),
    ("a\nb\nc\n", 2, 100, "b\nc\n", True),
    ("aaaa\nbbbb\n", 5, 6, "\nbbbb\n", True),
    ("", 5, 5, "", False),
    ("é" * 4, 5, 3, "é", True),  # never a broken UTF-8 sequence
])
def test_tail(text: str, lines: int, size: int, expected: str, cut: bool) -> None:
    assert logsaving.tail(text, max_lines=lines, max_bytes=size) == (expected, cut)


def _entry(name: str, hours_ago: float, size: int) -> logsaving.SinkEntry:
    return logsaving.SinkEntry(name, NOW - dt.timedelta(hours=hours_ago), size)


@pytest.mark.parametrize(("entries", "policy", "keep", "expected"), [
    # nothing to do
    ([_entry("a", 2, 10), _entry("b", 1, 10)], {}, "b", []),
    # by count: oldest first
    ([_entry("a", 3, 1), _entry("b", 2, 1), _entry("c", 1, 1)], {"retention_count": 2}, "c", ["a"]),
    # by age
    ([_entry("a", 200, 1), _entry("b", 1, 1)], {"retention_age_seconds": 3600.0}, "b", ["a"]),
    # by size: drop oldest until under budget
    ([_entry("a", 3, 50), _entry("b", 2, 50), _entry("c", 1, 50)], {"retention_bytes": 100}, "c", ["a"]),
    # the folder just written is kept even when it alone exceeds the budget
    ([_entry("a", 3, 50), _entry("c", 1, 500)], {"retention_bytes": 100}, "c", ["a"]),
    # the kept folder is kept even when it is old (clock skew) or past the count
    ([_entry("c", 500, 1)], {"retention_age_seconds": 60.0, "retention_count": 1}, "c", []),
])
def test_plan_prune(entries: list[logsaving.SinkEntry], policy: dict[str, object], keep: str,
                    expected: list[str]) -> None:
    rules = settings.SaveLogsSettings.model_validate(policy)
    assert logsaving.plan_prune(entries, now=NOW, keep=keep, policy=rules) == expected


async def test_save_without_pods_writes_an_index_and_prunes(tmp_path: Path) -> None:
    old = tmp_path / "20200101T000000Z-ns-job-old-abc"
    old.mkdir()
    (old / "index.json").write_text("{}")
    (tmp_path / "unrelated").mkdir()
    policy = settings.SaveLogsSettings(directory=str(tmp_path), retention_age_seconds=86400)
    result = await logsaving.save(None, Ref("Job", "ns", "j", "u1"), [], settings=policy, now=NOW)  # type: ignore[arg-type]
    assert result.error is None
    assert result.path is not None
    index = json.loads((Path(result.path) / "index.json").read_text())
    assert index["workload"] == {"kind": "Job", "namespace": "ns", "name": "j", "uid": "u1"}
    assert index["complete"] is True
    assert not old.exists()
    assert (tmp_path / "unrelated").exists()


async def test_unwritable_sink_is_a_reported_failure(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    policy = settings.SaveLogsSettings(directory=str(blocker / "sink"))
    result = await logsaving.save(None, Ref("Job", "ns", "j", "u1"), [], settings=policy, now=NOW)  # type: ignore[arg-type]
    assert result.path is None
    assert result.error is not None
    assert "cannot write" in result.error


@pytest.mark.parametrize(("status", "expected"), [
    ({"containerStatuses": [{"name": "c", "restartCount": 0, "lastState": {}}]}, False),
    ({"containerStatuses": [{"name": "c", "restartCount": 2, "lastState": {}}]}, True),
    ({"containerStatuses": [{"name": "c", "restartCount": 0, "lastState": {"terminated": {"exitCode": 1}}}]}, True),
    # stopped now, never restarted yet: its kubelet may restart it before the log is read, and the failed
    # instance is then the previous one (seen on a real kubelet under OnFailure)
    ({"containerStatuses": [{"name": "c", "restartCount": 0, "state": {"terminated": {"exitCode": 1}}}]}, True),
    ({"initContainerStatuses": [{"name": "c", "restartCount": 0}]}, False),
    ({"containerStatuses": [{"name": "other", "restartCount": 0}]}, True),  # no status for it: ask
    ({}, True),
])
def test_a_previous_log_is_asked_for_only_of_a_container_that_may_have_one(status: dict[str, object],
                                                                          expected: bool) -> None:
    assert logsaving.has_previous({"status": status}, "c") is expected


STOPPED = {"restartCount": 0, "state": {"terminated": {"exitCode": 1}}}


@pytest.mark.parametrize(("spec", "init", "expected"), [
    ({"restartPolicy": "Never", "containers": [{"name": "c"}]}, False, False),
    ({"restartPolicy": "OnFailure", "containers": [{"name": "c"}]}, False, True),
    ({"containers": [{"name": "c"}]}, False, True),  # Always when unsaid
    # its own restartPolicy (container restart rules): the kubelet may start it again under the pod's Never
    ({"restartPolicy": "Never", "containers": [{"name": "c", "restartPolicy": "OnFailure"}]}, False, True),
    # an init container: a sidecar restarts whatever the pod's policy
    ({"restartPolicy": "Never", "initContainers": [{"name": "c", "restartPolicy": "Always"}]}, True, True),
])
def test_a_stopped_container_is_read_once_where_its_kubelet_never_starts_it_again(
        spec: dict[str, object], init: bool, expected: bool) -> None:
    """Under `restartPolicy: Never` the stopped container's current log is the instance that failed, and
    no previous one can appear before the read: one request, not two."""
    status = {"initContainerStatuses" if init else "containerStatuses": [{"name": "c", **STOPPED}]}
    assert logsaving.has_previous({"spec": spec, "status": status}, "c") is expected


FINISHED = "2026-03-04T05:06:07Z"


@pytest.mark.parametrize(("status", "restart_policy", "expected"), [
    # the first instance stopped, under OnFailure: its kubelet may restart it before the read
    ({"restartCount": 0, "state": {"terminated": {"exitCode": 1, "finishedAt": FINISHED}}}, "OnFailure", NOW),
    ({"restartCount": 0, "state": {"terminated": {"exitCode": 1, "finishedAt": "2026-03-04T06:06:07+01:00"}}},
     "OnFailure", NOW),
    # under Never it is never started again: one read already, no proof needed
    ({"restartCount": 0, "state": {"terminated": {"exitCode": 1, "finishedAt": FINISHED}}}, "Never", None),
    # an earlier instance exists: its previous log holds more than the current one
    ({"restartCount": 1, "state": {"terminated": {"exitCode": 1, "finishedAt": FINISHED}}}, "OnFailure", None),
    ({"restartCount": 0, "state": {"terminated": {"finishedAt": FINISHED}},
      "lastState": {"terminated": {"exitCode": 1}}}, "OnFailure", None),
    ({"restartCount": 0, "state": {"running": {}}}, "OnFailure", None),
    # no time to compare with
    ({"restartCount": 0, "state": {"terminated": {"exitCode": 1}}}, "OnFailure", None),
    ({"restartCount": 0, "state": {"terminated": {"exitCode": 1, "finishedAt": "yesterday"}}}, "OnFailure", None),
])
def test_a_first_stop_is_known_with_its_time(status: dict[str, object], restart_policy: str,
                                             expected: dt.datetime | None) -> None:
    pod = {"spec": {"restartPolicy": restart_policy, "containers": [{"name": "c"}]},
           "status": {"containerStatuses": [{"name": "c", **status}]}}
    assert logsaving.first_stop(pod, "c") == expected
    assert logsaving.first_stop(pod, "other") is None


def test_a_timestamped_read_gives_back_the_lines_as_written_and_their_seconds() -> None:
    text = ("2026-03-04T05:06:05.123456789Z step 1\n"
            "2026-03-04T06:06:06+01:00 step 2 \r 2026-03-04T05:06:06Z not a time\n"
            "  a continuation line the kubelet did not stamp\n"
            "2026-03-04T05:06:07.5Z NCCL error")
    plain, times = logsaving.unstamp(text)
    assert plain == ("step 1\nstep 2 \r 2026-03-04T05:06:06Z not a time\n"
                     "  a continuation line the kubelet did not stamp\nNCCL error")
    assert times == [NOW - dt.timedelta(seconds=2), NOW - dt.timedelta(seconds=1), NOW]
    assert logsaving.unstamp("") == ("", [])
    # a head cut by the byte bound: its first line is the container's text, whatever it looks like
    fragment = "2026-03-04T05:00:00Z looks like a time\n2026-03-04T05:06:07Z NCCL error\n"
    assert logsaving.unstamp(fragment, cut=True) == ("2026-03-04T05:00:00Z looks like a time\nNCCL error\n", [NOW])
    assert logsaving.unstamp("2026-13-04T05:06:05Z month 13\n") == ("2026-13-04T05:06:05Z month 13\n", [])


@pytest.mark.parametrize(("seconds_before_stop", "expected"), [
    ([5, 0], True),   # a line written before the stop's second: only the stopped instance has one
    ([0, 0], False),  # every line in the stop's own second: a fast restart's lines could be there too
    ([-1], False),    # written after the stop: a new instance
    ([], False),      # empty: either instance
])
def test_a_current_log_proves_it_is_the_stopped_instance_only_by_a_line_before_the_stop(
        seconds_before_stop: list[int], expected: bool) -> None:
    times = [NOW - dt.timedelta(seconds=s) for s in seconds_before_stop]
    assert logsaving.proves_stopped_instance(times, NOW) is expected
    # a finishedAt with a fraction (never a kubelet's, second precision) is cut to its second like the lines
    assert logsaving.proves_stopped_instance(times, NOW + dt.timedelta(microseconds=500_000)) is expected


def test_the_cached_pod_gives_save_its_containers_and_their_restarts() -> None:
    def container(name: str, *, init: bool, restarts: int, last: bool, now: bool = False) -> proj.ContainerState:
        return proj.ContainerState(name=name, init=init, restart_count=restarts,
                                   terminated=proj.Terminated("Error", 1, "") if now else None,
                                   last_terminated=proj.Terminated("Error", 1, "") if last else None, resources=())

    pod = proj.Pod(uid="u1", rv="1", namespace="ml", name="w-0", node="n1", phase="Running", labels=(),
                   annotations=(), owner=None, deletion_timestamp="", restart_policy="OnFailure",
                   containers=(container("setup", init=True, restarts=0, last=False),
                               container("trainer", init=False, restarts=1, last=True),
                               container("sidecar", init=False, restarts=0, last=False),
                               container("worker", init=False, restarts=0, last=False, now=True)))
    body = logsaving.from_cache(pod)
    assert logsaving.containers_of(body) == ["setup", "trainer", "sidecar", "worker"]
    assert [logsaving.has_previous(body, c) for c in ("setup", "trainer", "sidecar", "worker")] == \
        [False, True, False, True]
    assert (body["metadata"], body["spec"]["nodeName"]) == ({"namespace": "ml", "name": "w-0", "uid": "u1"}, "n1")
    assert logsaving.first_stop(body, "worker") is None  # the cache had no finishedAt for it
    stamped = pod._replace(containers=(*pod.containers[:3], pod.containers[3]._replace(
        terminated=proj.Terminated("Error", 1, "2026-03-04T05:06:07Z"))))
    assert logsaving.first_stop(logsaving.from_cache(stamped), "worker") == NOW
    never = logsaving.from_cache(pod._replace(restart_policy="Never"))
    assert [logsaving.has_previous(never, c) for c in ("setup", "trainer", "sidecar", "worker")] == \
        [False, True, False, False]


def test_the_scope_chooses_the_pods_the_fault_is_about_or_all() -> None:
    from harness import objects as o

    def pod(name: str, node: str, *, exit_code: int | None = None, last: int | None = None) -> proj.Pod:
        raw = o.pod(name, node=node)
        status: dict[str, object] = {"name": "trainer", "restartCount": 1 if last is not None else 0,
                                     "state": {"running": {}}}
        if exit_code is not None:
            status["state"] = {"terminated": {"exitCode": exit_code, "reason": "Error",
                                              "finishedAt": "2026-01-01T00:00:00Z"}}
        if last is not None:
            status["lastState"] = {"terminated": {"exitCode": last, "reason": "Error",
                                                  "finishedAt": "2026-01-01T00:00:00Z"}}
        raw["status"]["containerStatuses"] = [status]
        return projecting.pod(raw)

    pods = [pod("a", "n1"), pod("b", "n1"), pod("c", "n2", last=1), pod("d", "n2", last=0), pod("e", "n3", exit_code=0)]
    uid = {p.name: p.uid for p in pods}
    faulted = settings.SaveLogsScope.FAULTED
    names = lambda chosen: [p.name for p in chosen]  # noqa: E731
    assert names(logsaving.chosen(pods, faulted, faulting_pod=uid["a"])) == ["a", "c"]
    assert names(logsaving.chosen(pods, faulted, faulting_node="n1")) == ["a", "b", "c"]
    assert names(logsaving.chosen(pods, faulted, faulting_pod=uid["a"], faulting_node="n1")) == ["a", "c"]
    assert names(logsaving.chosen(pods, faulted)) == ["c"]
    assert names(logsaving.chosen(pods, settings.SaveLogsScope.ALL, faulting_pod=uid["a"])) == list("abcde")
