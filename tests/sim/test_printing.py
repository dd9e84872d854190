"""The simulated server's Table output: kube-apiserver's custom-resource table convertor, as kubectl reads it."""

from __future__ import annotations

import datetime as dt

import pytest

from kcover.sim import printing, registry, status

NOW = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
RECOVERIES = registry.Registry().by_key("recoveries.kcover.io")
KUBECTL_ACCEPT = ("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,"
                  "application/json")


@pytest.mark.parametrize(("seconds", "text"), [
    (-5, "<invalid>"), (-0.5, "0s"), (0, "0s"), (119, "119s"), (120, "2m"), (130, "2m10s"), (600, "10m"),
    (3 * 3600 - 1, "179m"), (3 * 3600, "3h"), (3 * 3600 + 60, "3h1m"), (8 * 3600, "8h"), (47 * 3600, "47h"),
    (48 * 3600, "2d"), (49 * 3600, "2d1h"), (10 * 86400, "10d"), (800 * 86400, "2y70d"), (9 * 365 * 86400, "9y"),
])
def test_ages_read_as_kubectl_prints_them(seconds: float, text: str) -> None:
    assert printing.human_duration(seconds) == text


@pytest.mark.parametrize(("accept", "resource", "table"), [
    (KUBECTL_ACCEPT, RECOVERIES, True),
    ("application/json", RECOVERIES, False),
    (KUBECTL_ACCEPT, registry.Registry().by_key("pods"), True),  # built-in kinds with a printer
    (KUBECTL_ACCEPT, registry.Registry().by_key("pytorchjobs.kubeflow.org"), False),  # no printer columns
])
def test_only_a_table_request_for_a_kind_with_columns_gets_one(accept: str, resource: registry.Resource,
                                                               table: bool) -> None:
    assert printing.wants_table(accept, resource) is table


def test_rows_carry_name_columns_and_metadata() -> None:
    obj = {"metadata": {"name": "r1", "namespace": "ml", "creationTimestamp": "2026-05-01T11:55:00Z"},
           "spec": {"decision": {"action": "RestartWorkload"}, "target": {"name": "train", "kind": "PyTorchJob"}},
           "status": {"phase": "Recovered", "mttrSeconds": 1.5, "detectedAt": "2026-05-01T11:58:00Z"}}
    out = printing.table(RECOVERIES, [obj], include="", now=NOW)
    names = [c["name"] for c in out["columnDefinitions"]]
    assert names[:3] == ["Name", "Phase", "Action"]
    assert names[-1] == "Age"
    row = out["rows"][0]
    cells = dict(zip(names, row["cells"], strict=True))
    assert cells["MTTR"] == 1.5
    assert cells["Detected"] == "2m"
    assert cells["Age"] == "5m"
    assert cells["Cause"] is None
    assert row["object"] == {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
    assert printing.table(RECOVERIES, [obj], include="Object", now=NOW)["rows"][0]["object"] == obj
    assert printing.table(RECOVERIES, [obj], include="None", now=NOW)["rows"][0]["object"] is None  # Go: null
    with pytest.raises(status.ApiError):
        printing.table(RECOVERIES, [obj], include="Everything", now=NOW)
