"""Conformance: custom resources held to their CRD's structural schema (pruning, defaults, validation).

The kinds are kcover's own (helm/kcover/files: Recovery, PreflightReport, LedgerEntry), a training
operator's test CRD (schema-less: an object that preserves unknown fields) and the test CRD Widget
(tests/controlplane/crds/conformance-widgets.yaml), which adds the features kcover's CRDs do not use yet
(default, nullable, exclusive bounds). A real server walks properties in Go map order, so the order of
its causes varies between requests: causes are compared as sets.
"""

# ruff: noqa: PT018  (compound asserts read as one expectation about one answer)
from __future__ import annotations

import re
from typing import Any

import orjson
from conformance_client import Api, skip_unless_recorded_minor

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
PHASES = ("Acting", "Verifying", "Recovered", "Stalled", "Failed", "Refused", "Held", "Validating", "RecordOnly")
ACTIONS = ("RestartWorkload", "CordonNode", "UncordonNode", "TaintDevice", "UntaintDevice", "ValidateNode", "Skip",
           "Report")
RULES_NOT_CHECKED = ("<nil>", "FieldValueInvalid", "Invalid value: null: some validation rules were not checked "
                     "because the object was invalid; correct the existing errors to complete validation")



def supported(*values: str) -> str:
    return "supported values: " + ", ".join(f'"{v}"' for v in values)


def recovery(name: str, **spec: Any) -> dict[str, Any]:
    body = {"target": {"kind": "PyTorchJob", "name": "j"}, "decision": {"action": "RestartWorkload"}}
    return {"apiVersion": "kcover.io/v1alpha1", "kind": "Recovery", "metadata": {"name": name}, "spec": {**body, **spec}}


def report(name: str, **spec: Any) -> dict[str, Any]:
    body = {"workloadName": "w", "workloadUID": "u", "nodeName": "n", "rank": 0, "report": "{}",
            "observedAt": "2026-01-01T00:00:00Z"}
    return {"apiVersion": "kcover.io/v1alpha1", "kind": "PreflightReport", "metadata": {"name": name},
            "spec": {**body, **spec}}


def widget(name: str, spec: Any) -> dict[str, Any]:
    return {"apiVersion": "conformance.kcover.io/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}


def causes(body: Any) -> set[tuple[str, str, str]]:
    """The (field, reason, message) of each cause of a 422 Invalid Status."""
    assert body["kind"] == "Status" and body["reason"] == "Invalid" and body["code"] == 422, body
    return {(c["field"], c["reason"], c["message"]) for c in body["details"]["causes"]}


def paths(ns: str) -> tuple[str, str, str, str]:
    group = f"/apis/kcover.io/v1alpha1/namespaces/{ns}"
    return (f"{group}/recoveries", f"{group}/preflightreports", f"{group}/ledgerentries",
            f"/apis/conformance.kcover.io/v1/namespaces/{ns}/widgets")


async def test_unknown_fields_are_pruned_where_the_schema_does_not_preserve_them(conformance_api: Api, ns: str) -> None:
    rec, _, ledger, _ = paths(ns)
    body = recovery("r", extra=1, target={"kind": "PyTorchJob", "name": "j", "bogus": 2},
                    fault={"reason": "XID", "junk": 1, "identity": {"xid": 79, "deep": {"a": [1, None]}}})
    body |= {"top": 1, "status": {"phase": "Acting"}}
    body["metadata"]["junk"] = "x"
    created = await conformance_api.ok("POST", rec, body=body)
    assert created["spec"] == {"target": {"kind": "PyTorchJob", "name": "j"}, "decision": {"action": "RestartWorkload"},
                               "fault": {"reason": "XID", "identity": {"xid": 79, "deep": {"a": [1, None]}}}}
    # the Recovery kind has no status subresource: a create keeps its status (pruned like the rest)
    assert "top" not in created and created["status"] == {"phase": "Acting"} and "junk" not in created["metadata"]
    assert (await conformance_api.ok("GET", f"{rec}/r"))["spec"] == created["spec"]
    patched = await conformance_api.ok("PATCH", f"{rec}/r", content_type=MERGE,
                                       body={"status": {"phase": "Acting", "later": True}, "spec": {"x": 1}})
    assert patched["status"] == {"phase": "Acting"} and patched["spec"] == created["spec"]
    patched = await conformance_api.ok("PATCH", f"{rec}/r", content_type=JSON_PATCH,
                                       body=[{"op": "add", "path": "/spec/decision/unknown", "value": 1}])
    assert patched["spec"]["decision"] == {"action": "RestartWorkload"} and patched["metadata"]["generation"] == 1
    entry = await conformance_api.ok("POST", ledger, body={"apiVersion": "kcover.io/v1alpha1", "kind": "LedgerEntry",
                                                           "metadata": {"name": "l"}, "data": {"a": "1"},
                                                           "spec": {"x": 1}, "status": {"y": 2}})
    assert entry["data"] == {"a": "1"} and "spec" not in entry and "status" not in entry


async def test_a_schema_that_preserves_unknown_fields_keeps_everything(conformance_api: Api, ns: str) -> None:
    path = f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs"
    body = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "j", "junk": 1},
            "spec": {"anything": [1, {"a": None}]}, "top": None}
    created = await conformance_api.ok("POST", path, body=body)
    assert created["spec"] == {"anything": [1, {"a": None}]} and created["top"] is None
    assert "junk" not in created["metadata"]  # metadata is ObjectMeta whatever the schema says


async def test_an_enum_is_refused_on_create_update_patch_and_status(conformance_api: Api, ns: str) -> None:
    await skip_unless_recorded_minor(conformance_api, "the structural schema's error wording")
    rec, *_ = paths(ns)
    action = ("spec.decision.action", "FieldValueNotSupported", f'Unsupported value: "Bogus": {supported(*ACTIONS)}')
    code, body = await conformance_api.request("POST", rec, body=recovery("r", decision={"action": "Bogus"}))
    assert code == 422 and causes(body) == {action}
    assert body["details"]["kind"] == "Recovery" and body["details"]["group"] == "kcover.io"
    assert body["message"] == f'Recovery.kcover.io "r" is invalid: {action[0]}: {action[2]}'
    created = await conformance_api.ok("POST", rec, body=recovery("r"))
    code, body = await conformance_api.request("PATCH", f"{rec}/r", body={"spec": {"decision": {"action": "Bogus"}}},
                                               content_type=MERGE)
    assert code == 422 and causes(body) == {action}
    created["spec"]["decision"]["action"] = "Bogus"
    code, body = await conformance_api.request("PUT", f"{rec}/r", body=created)
    assert code == 422 and causes(body) == {action}
    phase = ("status.phase", "FieldValueNotSupported", f'Unsupported value: "Holding": {supported(*PHASES)}')
    code, body = await conformance_api.request("PATCH", f"{rec}/r", body={"status": {"phase": "Holding"}},
                                               content_type=MERGE)
    assert code == 422 and causes(body) == {phase}
    current = await conformance_api.ok("GET", f"{rec}/r")
    code, body = await conformance_api.request("PUT", f"{rec}/r", body={**current, "status": {"phase": "Holding"}})
    assert code == 422 and causes(body) == {phase}
    code, body = await conformance_api.request("PATCH", f"{rec}/r", content_type=JSON_PATCH,
                                               body=[{"op": "add", "path": "/status", "value": {"phase": "Holding"}}])
    assert code == 422 and causes(body) == {phase}
    after = await conformance_api.ok("GET", f"{rec}/r")
    assert after["spec"]["decision"]["action"] == "RestartWorkload" and "status" not in after
    assert after["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"]
    for value in PHASES:  # every phase the CRD lists is taken
        done = await conformance_api.ok("PATCH", f"{rec}/r", body={"status": {"phase": value}},
                                        content_type=MERGE)
        assert done["status"]["phase"] == value


async def test_every_cause_of_a_create_is_reported(conformance_api: Api, ns: str) -> None:
    await skip_unless_recorded_minor(conformance_api, "the structural schema's error wording")
    rec, *_ = paths(ns)
    body = recovery("r", target={"kind": 5, "namespace": "n" * 254},
                    decision={"action": "Nope", "blame": "me", "dryRun": 1, "removal": "evict"})
    code, answer = await conformance_api.request("POST", rec, body=body)
    assert code == 422 and causes(answer) == {
        ("spec.decision.dryRun", "FieldValueTypeInvalid",
         'Invalid value: "integer": spec.decision.dryRun in body must be of type boolean: "integer"'),
        ("spec.decision.action", "FieldValueNotSupported", f'Unsupported value: "Nope": {supported(*ACTIONS)}'),
        ("spec.decision.blame", "FieldValueNotSupported",
         f'Unsupported value: "me": {supported("device", "node", "workload", "unknown")}'),
        ("spec.target.kind", "FieldValueTypeInvalid",
         'Invalid value: "integer": spec.target.kind in body must be of type string: "integer"'),
        ("spec.target.namespace", "FieldValueTooLong", "Too long: may not be more than 253 bytes"),
        ("spec.target.name", "FieldValueRequired", "Required value")}
    code, answer = await conformance_api.request("POST", rec, body={"apiVersion": "kcover.io/v1alpha1",
                                                                    "kind": "Recovery", "metadata": {"name": "r"}})
    assert code == 422 and causes(answer) == {("spec", "FieldValueRequired", "Required value")}
    assert answer["message"] == 'Recovery.kcover.io "r" is invalid: spec: Required value'


async def test_status_causes_name_the_field_under_status_and_the_path_within_it(conformance_api: Api, ns: str) -> None:
    """Written to the object (the Recovery kind has no status subresource), a message names the path from the
    root (`status.mttrSeconds in body`); through a `/status` subresource it names it from `status`
    (PreflightReport's, below)."""
    await skip_unless_recorded_minor(conformance_api, "the structural schema's error wording")
    rec, *_ = paths(ns)
    await conformance_api.ok("POST", rec, body=recovery("r"))
    status = {"phase": "Stalled", "mttrSeconds": "3", "detectedAt": "yesterday", "actedAt": "2026-01-01T00:00:00",
              "recoveredAt": "2026-01-01t00:00:00.5+02:00", "message": "m" * 2049, "cause": None}
    code, body = await conformance_api.request("PATCH", f"{rec}/r", body={"status": status}, content_type=MERGE)
    assert code == 422 and causes(body) == {
        ("status.mttrSeconds", "FieldValueTypeInvalid",
         'Invalid value: "string": status.mttrSeconds in body must be of type number: "string"'),
        ("status.detectedAt", "FieldValueTypeInvalid",
         'Invalid value: "yesterday": status.detectedAt in body must be of type date-time: "yesterday"'),
        ("status.actedAt", "FieldValueTypeInvalid",  # a date-time needs a zone
         'Invalid value: "2026-01-01T00:00:00": status.actedAt in body must be of type date-time: "2026-01-01T00:00:00"'),
        ("status.message", "FieldValueTooLong", "Too long: may not be more than 2048 bytes")}
    ok = await conformance_api.ok("PATCH", f"{rec}/r", content_type=MERGE, body={"status": {
        "phase": "Recovered", "mttrSeconds": 3.0, "detectedAt": "2026-01-01T00:00:00.123456Z",
        "recoveredAt": "2026-01-01t00:00:00.5+02:00", "cause": None, "message": "é" * 2048}})
    assert ok["status"] == {"phase": "Recovered", "mttrSeconds": 3, "detectedAt": "2026-01-01T00:00:00.123456Z",
                            "recoveredAt": "2026-01-01t00:00:00.5+02:00", "message": "é" * 2048}
    assert type(ok["status"]["mttrSeconds"]) is int  # a whole float comes back as an integer (Go's encoding)


async def test_preflight_report_bounds_types_and_immutable_spec(conformance_api: Api, ns: str) -> None:
    await skip_unless_recorded_minor(conformance_api, "the structural schema's error wording")
    _, pfr, *_ = paths(ns)
    code, body = await conformance_api.request("POST", pfr, body=report("a", rank=-1))
    assert code == 422 and causes(body) == {  # not a blocking error: the CEL rules still ran
        ("spec.rank", "FieldValueInvalid", "Invalid value: -1: spec.rank in body should be greater than or equal to 0")}
    code, body = await conformance_api.request("POST", pfr, body=report("a", rank="3"))
    assert code == 422 and causes(body) == {RULES_NOT_CHECKED, (
        "spec.rank", "FieldValueTypeInvalid", 'Invalid value: "string": spec.rank in body must be of type integer: "string"')}
    code, body = await conformance_api.request("POST", pfr, body=report("a", rank=3.5))
    assert code == 422 and causes(body) == {RULES_NOT_CHECKED, (
        "spec.rank", "FieldValueTypeInvalid", 'Invalid value: "number": spec.rank in body must be of type integer: "number"'),
        ("<nil>", "FieldValueInvalid", 'Invalid value: "": Checked value must be of type integer (default format) in spec.rank')}
    created = await conformance_api.ok("POST", pfr, body=report("a", rank=3.0))
    assert created["spec"]["rank"] == 3 and type(created["spec"]["rank"]) is int
    code, body = await conformance_api.request("PATCH", f"{pfr}/a", body={"spec": {"rank": 2}}, content_type=MERGE)
    assert code == 422 and causes(body) == {("spec", "FieldValueInvalid",
                                             "Invalid value: the spec of a PreflightReport is immutable")}
    labelled = await conformance_api.ok("PATCH", f"{pfr}/a", body={"metadata": {"labels": {"a": "b"}}}, content_type=MERGE)
    assert labelled["metadata"]["labels"] == {"a": "b"}
    bad = {"verdict": "Bogus", "slowNodes": ["a" * 254, None, 3], "missingRanks": ["x"],
           "pairs": [{"nodes": ["a", "b", "c"], "slow": "no", "batch": 1.5}]}
    code, body = await conformance_api.request("PATCH", f"{pfr}/a/status", body={"status": bad}, content_type=MERGE)
    assert code == 422 and causes(body) == {
        RULES_NOT_CHECKED,
        ("status.verdict", "FieldValueNotSupported",
         f'Unsupported value: "Bogus": {supported("Pending", "Healthy", "Degraded", "Incomplete")}'),
        ("status.slowNodes[0]", "FieldValueTooLong", "Too long: may not be more than 253 bytes"),
        ("status.slowNodes[1]", "FieldValueTypeInvalid",
         'Invalid value: "null": slowNodes[1] in body must be of type string: "null"'),
        ("status.slowNodes[2]", "FieldValueTypeInvalid",
         'Invalid value: "integer": slowNodes[2] in body must be of type string: "integer"'),
        ("status.missingRanks[0]", "FieldValueTypeInvalid",
         'Invalid value: "string": missingRanks[0] in body must be of type integer: "string"'),
        ("status.pairs[0].nodes", "FieldValueTooMany", "Too many: 3: must have at most 2 items"),
        ("status.pairs[0].slow", "FieldValueTypeInvalid",
         'Invalid value: "string": pairs[0].slow in body must be of type boolean: "string"'),
        ("status.pairs[0].batch", "FieldValueTypeInvalid",
         'Invalid value: "number": pairs[0].batch in body must be of type integer: "number"'),
        ("status", "FieldValueInvalid",
         'Invalid value: "": Checked value must be of type integer (default format) in pairs[0].batch')}
    code, body = await conformance_api.request("PATCH", f"{pfr}/a/status", body={"status": {"slowNodes": ["n"] * 5001}},
                                               content_type=MERGE)
    assert code == 422 and causes(body) == {RULES_NOT_CHECKED, (
        "status.slowNodes", "FieldValueTooMany", "Too many: 5001: must have at most 5000 items")}
    judged = await conformance_api.ok("PATCH", f"{pfr}/a/status", content_type=MERGE, body={"status": {
        "verdict": "Degraded", "nodeVerdict": "Slow", "minBusbwGbps": 19.98, "pairs": [{"nodes": ["a"], "extra": 1}]}})
    assert judged["status"] == {"verdict": "Degraded", "nodeVerdict": "Slow", "minBusbwGbps": 19.98,
                                "pairs": [{"nodes": ["a"]}]}


async def test_ledger_entry_values_are_bounded_strings(conformance_api: Api, ns: str) -> None:
    await skip_unless_recorded_minor(conformance_api, "the structural schema's error wording")
    *_, ledger, _ = paths(ns)

    def entry(name: str, data: Any) -> dict[str, Any]:
        return {"apiVersion": "kcover.io/v1alpha1", "kind": "LedgerEntry", "metadata": {"name": name}, "data": data}
    code, body = await conformance_api.request("POST", ledger, body=entry("a", {str(i): "v" for i in range(9)}))
    assert code == 422 and causes(body) == {("data", "FieldValueTooMany", "Too many: 9: must have at most 8 items")}
    code, body = await conformance_api.request("POST", ledger, body=entry("a", {"a": 1, "b": None, "c": "x" * 65537}))
    assert code == 422 and causes(body) == {
        ("data.a", "FieldValueTypeInvalid", 'Invalid value: "integer": data.a in body must be of type string: "integer"'),
        ("data.c", "FieldValueTooLong", "Too long: may not be more than 65536 bytes")}
    code, body = await conformance_api.request("POST", ledger, body=entry("a", "text"))
    assert code == 422 and causes(body) == {
        ("data", "FieldValueTypeInvalid", 'Invalid value: "string": data in body must be of type object: "string"')}
    created = await conformance_api.ok("POST", ledger, body=entry("a", None))
    assert "data" not in created  # a null the schema does not allow is dropped, not refused
    created = await conformance_api.ok("POST", ledger, body=entry("b", {"a": "x", "b": None}))
    assert created["data"] == {"a": "x"}


async def test_defaults_fill_absent_fields_and_non_nullable_nulls(conformance_api: Api, ns: str) -> None:
    *_, widgets = paths(ns)
    spec = {"name": "w", "note": None, "label": None, "items": [{"id": "a"}, {"id": "b", "weight": None}],
            "free": {"known": 1, "other": {"x": 1}}, "junk": 1}
    created = await conformance_api.ok("POST", widgets, body={**widget("a", spec), "status": {"count": 5}})
    want = {"name": "w", "note": None, "size": 3, "mode": "fast", "nested": {"depth": 1},
            "items": [{"id": "a", "weight": 1}, {"id": "b", "weight": 1}], "free": {"known": 1, "other": {"x": 1}}}
    assert created["spec"] == want and "status" not in created
    assert (await conformance_api.ok("GET", f"{widgets}/a"))["spec"] == want
    status = await conformance_api.ok("PATCH", f"{widgets}/a/status", body={"status": {"phase": "Ready"}},
                                      content_type=MERGE)
    assert status["status"] == {"phase": "Ready", "count": 0}
    status = await conformance_api.ok("PATCH", f"{widgets}/a/status", content_type=MERGE,
                                      body={"status": {"count": None, "message": None}})
    assert status["status"] == {"phase": "Ready", "count": 0}
    created = await conformance_api.ok("POST", widgets, body=widget("b", {"name": "w", "nested": None, "size": None,
                                                                         "mode": None}))
    assert created["spec"] == {"name": "w", "size": 3, "mode": "fast", "nested": {"depth": 1}}
    code, body = await conformance_api.request("POST", widgets, body=widget("c", None))
    assert code == 422 and causes(body) == {("spec", "FieldValueRequired", "Required value")}
    current = await conformance_api.ok("GET", f"{widgets}/a")
    del current["spec"]
    code, body = await conformance_api.request("PUT", f"{widgets}/a", body=current)
    assert code == 422 and causes(body) == {("spec", "FieldValueRequired", "Required value")}


async def test_bounds_types_and_formats_of_every_kind(conformance_api: Api, ns: str) -> None:
    await skip_unless_recorded_minor(conformance_api, "the structural schema's error wording")
    *_, widgets = paths(ns)
    spec = {"name": "toolongname", "size": 11, "ratio": 1, "mode": "medium", "enabled": "true", "when": "x",
            "tags": ["aaaaa", "b", "c"], "limits": {"a": -1, "b": 1, "c": 2}, "free": {"known": "s"},
            "items": [{"weight": 2}, "str", None]}
    code, body = await conformance_api.request("POST", widgets, body=widget("a", spec))
    assert code == 422 and causes(body) == {
        ("spec.name", "FieldValueTooLong", "Too long: may not be more than 8 bytes"),
        ("spec.size", "FieldValueInvalid", "Invalid value: 11: spec.size in body should be less than or equal to 10"),
        ("spec.ratio", "FieldValueInvalid", "Invalid value: 1: spec.ratio in body should be less than 1"),
        ("spec.mode", "FieldValueNotSupported", f'Unsupported value: "medium": {supported("fast", "slow")}'),
        ("spec.enabled", "FieldValueTypeInvalid",
         'Invalid value: "string": spec.enabled in body must be of type boolean: "string"'),
        ("spec.when", "FieldValueTypeInvalid", 'Invalid value: "x": spec.when in body must be of type date-time: "x"'),
        ("spec.tags[0]", "FieldValueTooLong", "Too long: may not be more than 4 bytes"),
        ("spec.tags", "FieldValueTooMany", "Too many: 3: must have at most 2 items"),
        ("spec.limits", "FieldValueTooMany", "Too many: 3: must have at most 2 items"),
        ("spec.limits.a", "FieldValueInvalid",
         "Invalid value: -1: spec.limits.a in body should be greater than or equal to 0"),
        ("spec.free.known", "FieldValueTypeInvalid",
         'Invalid value: "string": spec.free.known in body must be of type integer: "string"'),
        ("spec.items[0].id", "FieldValueRequired", "Required value"),
        ("spec.items[1]", "FieldValueTypeInvalid",
         'Invalid value: "string": spec.items[1] in body must be of type object: "string"'),
        ("spec.items[2]", "FieldValueTypeInvalid",
         'Invalid value: "null": spec.items[2] in body must be of type object: "null"')}
    code, body = await conformance_api.request("POST", widgets, body=widget("a", {"name": "w", "size": 0, "ratio": -0.5}))
    assert code == 422 and causes(body) == {
        ("spec.size", "FieldValueInvalid", "Invalid value: 0: spec.size in body should be greater than or equal to 1"),
        ("spec.ratio", "FieldValueInvalid", "Invalid value: -0.5: spec.ratio in body should be greater than or equal to 0")}
    code, body = await conformance_api.request("POST", widgets, body=widget("a", {"name": "w", "mode": 3}))
    assert code == 422 and causes(body) == {
        ("spec.mode", "FieldValueTypeInvalid", 'Invalid value: "integer": spec.mode in body must be of type string: "integer"'),
        ("spec.mode", "FieldValueNotSupported", f'Unsupported value: 3: {supported("fast", "slow")}')}
    code, body = await conformance_api.request("POST", widgets, body=widget("a", {"name": "w", "when": 5}))
    assert code == 422 and causes(body) == {  # a format on a number names the number's format
        ("spec.when", "FieldValueTypeInvalid", 'Invalid value: "int64": spec.when in body must be of type date-time: "int64"')}
    created = await conformance_api.ok("POST", widgets, body=widget("a", {"name": "éééééééé", "ratio": 0.25}))
    assert created["spec"]["name"] == "éééééééé"  # maxLength counts characters, whatever the message says


async def test_the_body_must_say_its_kind_and_version(conformance_api: Api, ns: str) -> None:
    rec, *_ = paths(ns)
    body = recovery("r")
    del body["kind"]
    code, answer = await conformance_api.request("POST", rec, body=body)
    assert code == 400 and answer["reason"] == "BadRequest"
    assert answer["message"].startswith("the object provided is unrecognized (must be of type Recovery): "
                                        "Object 'Kind' is missing in '{")
    code, answer = await conformance_api.request("POST", rec, body={**recovery("r"), "apiVersion": "kcover.io/v9"})
    assert code == 400 and answer["message"] == ("the API version in the data (kcover.io/v9) does not match the "
                                                 "expected API version (kcover.io/v1alpha1)")
    body = recovery("r")
    del body["apiVersion"]
    code, answer = await conformance_api.request("POST", rec, body=body)
    assert code == 400 and answer["message"] == ("the API version in the data () does not match the "
                                                 "expected API version (kcover.io/v1alpha1)")
    code, answer = await conformance_api.request("POST", rec, body={**recovery("r"), "kind": "Other"})
    assert code == 422 and causes(answer) == {("kind", "FieldValueInvalid", 'Invalid value: "Other": must be Recovery')}
    assert answer["details"]["kind"] == "Other"
    assert answer["message"] == 'Other.kcover.io "r" is invalid: kind: Invalid value: "Other": must be Recovery'


async def _warned(api: Api, method: str, path: str, body: Any, content_type: str | None = None
                  ) -> tuple[int, Any, list[str]]:
    """(status, body, the texts of the `299` warnings) of one request."""
    resp = await api.raw(method, path, body=body, content_type=content_type)
    data = orjson.loads(await resp.read())
    header = ", ".join(resp.headers.getall("Warning", []))
    resp.release()
    texts = [re.sub(r"\\(.)", r"\1", t) for t in re.findall(r'299 - "((?:[^"\\]|\\.)*)"', header)]
    return resp.status, data, texts


async def test_dropped_fields_are_warned_about_or_refused_when_strict(conformance_api: Api, ns: str) -> None:
    rec, *_, widgets = paths(ns)
    body = recovery("a", extra={"a": 1}, target={"kind": "K", "name": "j", "bogus": 1})
    body |= {"top": 1, "status": {"phase": "Acting", "junk": 2}}
    body["metadata"]["junkmeta"] = 1
    dropped = ["metadata.junkmeta", "spec.extra", "spec.target.bogus", "status.junk", "top"]
    code, created, warnings = await _warned(conformance_api, "POST", rec, body)
    assert code == 201 and warnings == [f'unknown field "{p}"' for p in dropped]  # fieldValidation=Warn, the default
    assert created["spec"] == recovery("a")["spec"] | {"target": {"kind": "K", "name": "j"}}
    code, answer, warnings = await _warned(conformance_api, "POST", f"{rec}?fieldValidation=Strict",
                                           {**body, "metadata": {"name": "b", "junkmeta": 1}})
    assert code == 400 and answer["reason"] == "BadRequest" and warnings == []
    assert answer["message"] == ('Recovery in version "v1alpha1" cannot be handled as a Recovery: strict decoding error: '
                                 + ", ".join(f'unknown field "{p}"' for p in dropped))
    code, _, warnings = await _warned(conformance_api, "POST", f"{rec}?fieldValidation=Ignore",
                                      {**body, "metadata": {"name": "c"}})
    assert code == 201 and warnings == []
    code, _, warnings = await _warned(conformance_api, "PATCH", f"{rec}/a", {"spec": {"decision": {"foo": 1}}, "zzz": 1},
                                      MERGE)
    assert code == 200 and warnings == ['unknown field "spec.decision.foo"', 'unknown field "zzz"']
    code, answer, _ = await _warned(conformance_api, "PATCH", f"{rec}/a?fieldValidation=Strict",
                                    {"spec": {"decision": {"foo": 1}}}, MERGE)
    assert code == 422 and answer["reason"] == "Invalid"
    assert answer["message"].endswith('strict decoding error: unknown field "spec.decision.foo"')
    code, _, warnings = await _warned(conformance_api, "PATCH", f"{rec}/a", {"status": {"phase": "Acting",
                                                                                              "junk": 3}}, MERGE)
    assert code == 200 and warnings == ['unknown field "status.junk"']
    code, answer, warnings = await _warned(conformance_api, "POST", rec, {**recovery("d", decision={"action": "Nope"}),
                                                                          "top": 1})
    assert code == 422 and warnings == ['unknown field "top"']  # decoding warns before validation refuses
    code, answer, _ = await _warned(conformance_api, "POST", f"{rec}?fieldValidation=Bogus", recovery("e"))
    assert code == 422 and causes(answer) == {("fieldValidation", "FieldValueNotSupported",
                                               'Unsupported value: "Bogus": supported values: "", "Ignore", "Strict", "Warn"')}
    assert answer["details"] == {"group": "meta.k8s.io", "kind": "CreateOptions", "causes": answer["details"]["causes"]}
    code, answer, _ = await _warned(conformance_api, "PATCH", f"{rec}/a?fieldValidation=strict", {"spec": {}}, MERGE)
    assert code == 422 and answer["details"]["kind"] == "PatchOptions"  # the value is case-sensitive
    code, answer, _ = await _warned(conformance_api, "POST", f"/api/v1/namespaces/{ns}/configmaps?fieldValidation=Bogus",
                                    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}})
    assert code == 422 and answer["details"]["kind"] == "CreateOptions"  # refused for every kind
    code, _, warnings = await _warned(conformance_api, "POST", widgets, widget("w", {"name": "w", "items": [
        {"id": "a", "x": 1}], "free": {"y": 1}}))
    assert code == 201 and warnings == ['unknown field "spec.items[0].x"']
    code, _, warnings = await _warned(conformance_api, "POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "j", "junk": 1}, "spec": {"x": 1}})
    assert code == 201 and warnings == ['unknown field "metadata.junk"']
