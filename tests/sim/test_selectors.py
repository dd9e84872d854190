"""Label and field selector parsing and matching, as tables."""

from __future__ import annotations

import pytest

from kcover.sim import registry, selectors, status

LABELS = {"app": "x", "tier": "1", "n": "5"}


@pytest.mark.parametrize(("selector", "expected"), [
    ("", True), ("app=x", True), ("app==x", True), ("app=y", False), ("app!=y", True), ("missing!=y", True),
    ("app in (x,y)", True), ("app in (y)", False), ("app notin (y)", True), ("missing notin (y)", True),
    ("app", True), ("missing", False), ("!missing", True), ("!app", False), ("app=x,tier=1", True),
    ("app=x,tier=2", False), ("app in (x, y), !missing", True), ("n>4", True), ("n<4", False),
    ("example.com/app", False),
])
def test_label_selector(selector: str, expected: bool) -> None:
    assert selectors.parse_labels(selector).matches(LABELS) is expected


@pytest.mark.parametrize("selector", ["app=x=y", "a b", "app in x", "-bad=1", "app=in valid", ",", "n>x"])
def test_label_selector_errors_are_400(selector: str) -> None:
    with pytest.raises(status.ApiError) as info:
        selectors.parse_labels(selector)
    assert info.value.status == 400


POD = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n1", "restartPolicy": "Never"},
       "status": {"phase": "Running"}}


@pytest.mark.parametrize(("selector", "expected"), [
    ("spec.nodeName=n1", True), ("spec.nodeName==n1", True), ("spec.nodeName!=n1", False),
    ("spec.nodeName=n1,status.phase=Running", True), ("status.phase=Failed", False),
    ("metadata.name=p,metadata.namespace=ns", True), ("spec.restartPolicy=Never", True),
])
def test_pod_field_selector(selector: str, expected: bool) -> None:
    fields = selectors.field_values(POD, registry.POD_FIELDS)
    assert selectors.parse_fields(selector, registry.POD_FIELDS).matches(fields) is expected


@pytest.mark.parametrize(("fields", "selector"), [
    (registry.POD_FIELDS, "spec.containers=x"), (registry.NODE_FIELDS, "metadata.namespace=x"),
    (registry.CORE_EVENT_FIELDS, "regarding.name=x"), (registry.NEW_EVENT_FIELDS, "involvedObject.name=x"),
])
def test_unsupported_field_label(fields: dict[str, selectors.FieldGetter], selector: str) -> None:
    with pytest.raises(status.ApiError) as info:
        selectors.parse_fields(selector, fields)
    assert info.value.status == 400
    assert info.value.status_obj["message"] == f"field label not supported: {selector.split('=')[0]}"


def test_node_unschedulable_field() -> None:
    node = {"metadata": {"name": "n"}, "spec": {"unschedulable": True}}
    fields = selectors.field_values(node, registry.NODE_FIELDS)
    assert selectors.parse_fields("spec.unschedulable=true", registry.NODE_FIELDS).matches(fields)
    assert not selectors.parse_fields("spec.unschedulable=false", registry.NODE_FIELDS).matches(fields)
