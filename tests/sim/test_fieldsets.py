"""Field sets, compare, merge and prune as structured-merge-diff does them, on the recorded schemas
(the server-side behaviour is pinned against kube-apiserver in tests/conformance/test_apply.py)."""

from __future__ import annotations

from kcover.sim import applying, collecting, fieldsets, jobs, registry

POD = fieldsets.Schema.of("", "v1", "Pod")
REG = registry.Registry()


def test_the_field_set_of_an_applied_pod() -> None:
    applied = {"metadata": {"labels": {"app": "web"}},
               "spec": {"containers": [{"name": "main", "image": "nginx", "args": ["-v"]}],
                        "tolerations": [{"operator": "Exists"}]}}
    fields = fieldsets.field_set(applied, POD)
    assert fieldsets.to_fields_v1(fields) == {
        "f:metadata": {"f:labels": {"f:app": {}}},
        "f:spec": {"f:containers": {'k:{"name":"main"}': {".": {}, "f:args": {}, "f:image": {}, "f:name": {}}},
                   "f:tolerations": {}}}
    assert fieldsets.from_fields_v1(fieldsets.to_fields_v1(fields)) == fields


def test_merge_keeps_live_items_and_takes_applied_values() -> None:
    live = {"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}],
                     "tolerations": [{"key": "x", "operator": "Exists"}]}}
    applied = {"spec": {"containers": [{"name": "b", "image": "2"}, {"name": "c", "image": "1"}],
                        "tolerations": [{"key": "y", "operator": "Exists"}]}}
    merged = fieldsets.merge(live, applied, POD)
    assert [(c["name"], c["image"]) for c in merged["spec"]["containers"]] == [("a", "1"), ("b", "2"), ("c", "1")]
    assert merged["spec"]["tolerations"] == [{"key": "y", "operator": "Exists"}]  # atomic: replaced
    assert live["spec"]["containers"][1]["image"] == "1"  # inputs untouched


def test_compare_and_remove() -> None:
    old = {"metadata": {"labels": {"a": "1", "b": "2"}}}
    new = {"metadata": {"labels": {"a": "9", "c": "3"}}}
    diff = fieldsets.compare(old, new, POD)
    label = (("f", "metadata"), ("f", "labels"))
    assert diff.modified == {(*label, ("f", "a"))}
    assert diff.added == {(*label, ("f", "c"))}
    assert diff.removed == {(*label, ("f", "b"))}
    assert fieldsets.remove(new, [(*label, ("f", "a")), (*label, ("f", "c"))], POD) == {}
    assert fieldsets.path_text((("f", "spec"), ("k", (("name", "main"),)), ("f", "image"))) == '.spec[name="main"].image'


def test_apply_prunes_what_the_manager_stops_applying_unless_another_owns_it() -> None:
    res = REG.by_key("configmaps")
    first = applying.apply(res, None, {"data": {"a": "1", "b": "2"}}, "one", False, "", "2026-01-01T00:00:00Z")
    shared = applying.apply(res, first, {"data": {"b": "2"}}, "two", False, "", "2026-01-01T00:00:01Z")
    dropped = applying.apply(res, shared, {"data": {}}, "one", False, "", "2026-01-01T00:00:02Z")
    assert dropped["data"] == {"b": "2"}  # a went with its only owner; b stays with "two"
    entries = dropped["metadata"]["managedFields"]
    # "two" changed nothing (no time: sorted first); "one" now owns the empty map it applies
    assert [(e["manager"], e["fieldsV1"], e.get("time")) for e in entries] == [
        ("two", {"f:data": {"f:b": {}}}, None), ("one", {"f:data": {}}, "2026-01-01T00:00:02Z")]


def test_the_deletion_finalizers_of_each_policy() -> None:
    cms, job_res, events = REG.by_key("configmaps"), REG.by_key("jobs.batch"), REG.by_key("events")
    assert collecting.deletion_finalizers(cms, ["x"], "Orphan") == ["x", "orphan"]
    assert collecting.deletion_finalizers(cms, ["orphan"], "Foreground") == ["foregroundDeletion"]
    assert collecting.deletion_finalizers(cms, ["orphan"], None) == ["orphan"]
    assert collecting.deletion_finalizers(cms, [], None) == []
    assert collecting.deletion_finalizers(job_res, [], None) == ["orphan"]
    assert collecting.deletion_finalizers(job_res, [], "Background") == []
    assert collecting.deletion_finalizers(events, [], "Orphan") == []


def test_a_pod_failure_policy_matches_exit_codes_and_conditions() -> None:
    job = jobs.defaults({"metadata": {"name": "j"}, "spec": {"podFailurePolicy": {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}}})
    failed = {"metadata": {"name": "p", "namespace": "ns"}, "status": {"phase": "Failed", "containerStatuses": [
        {"name": "main", "state": {"terminated": {"exitCode": 42}}}]}}
    assert jobs.match_failure_policy(job, failed) == (
        "FailJob", "Container main for pod ns/p failed with exit code 42 matching FailJob rule at index 0")
    evicted = {"metadata": {"name": "p", "namespace": "ns"}, "status": {"phase": "Failed", "conditions": [
        {"type": "DisruptionTarget", "status": "True"}], "containerStatuses": [
        {"name": "main", "state": {"terminated": {"exitCode": 137}}}]}}
    assert jobs.match_failure_policy(job, evicted)[0] == "Ignore"
    other = {"metadata": {"name": "p", "namespace": "ns"}, "status": {"phase": "Failed"}}
    assert jobs.match_failure_policy(job, other) == ("", "")
    assert job["spec"]["podReplacementPolicy"] == "Failed"
    terminating = {"metadata": {"name": "p", "deletionTimestamp": "x"}, "status": {"phase": "Running"}}
    assert not jobs.pod_failed(terminating, job)  # Failed replacement: only a terminal pod counts
    assert jobs.pod_failed(terminating, jobs.defaults({"metadata": {"name": "k"}, "spec": {}}))
