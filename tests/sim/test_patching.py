"""JSON patch, merge patch and strategic merge patch, as tables."""

from __future__ import annotations

from typing import Any

import pytest

from kcover.sim import patching, status

POD: dict[str, Any] = {
    "metadata": {"name": "p", "labels": {"a": "1"}, "finalizers": ["x"],
                 "ownerReferences": [{"uid": "u1", "name": "j1"}]},
    "spec": {"containers": [{"name": "c1", "image": "i1", "env": [{"name": "E", "value": "1"}]},
                            {"name": "c2", "image": "i2"}],
             "tolerations": [{"key": "t1"}], "taints": [{"key": "k1", "effect": "NoSchedule"}]},
    "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "X", "status": "True"}]},
}
SMP = patching.STRATEGIC_MERGE_PATCH


# Merged lists are ordered as apimachinery's mergeSortedSlice orders them: items new in the patch come
# before server-only items (confirmed on a real kube-apiserver by the conformance suite).
@pytest.mark.parametrize(("patch", "path", "expected"), [
    ({"spec": {"containers": [{"name": "c2", "image": "new"}]}}, ("spec", "containers"),
     [{"name": "c1", "image": "i1", "env": [{"name": "E", "value": "1"}]}, {"name": "c2", "image": "new"}]),
    ({"spec": {"containers": [{"name": "c1", "$patch": "delete"}]}}, ("spec", "containers"),
     [{"name": "c2", "image": "i2"}]),
    ({"spec": {"containers": [{"name": "c1", "env": [{"name": "F", "value": "2"}]}]}},
     ("spec", "containers", 0, "env"), [{"name": "F", "value": "2"}, {"name": "E", "value": "1"}]),
    ({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}, ("status", "conditions"),
     [{"type": "Ready", "status": "True"}, {"type": "X", "status": "True"}]),
    ({"status": {"conditions": [{"type": "Y", "status": "True"}]}}, ("status", "conditions"),
     [{"type": "Y", "status": "True"}, {"type": "Ready", "status": "False"}, {"type": "X", "status": "True"}]),
    ({"status": {"conditions": [{"$patch": "replace"}, {"type": "Z", "status": "True"}]}},
     ("status", "conditions"), [{"type": "Z", "status": "True"}]),
    ({"metadata": {"ownerReferences": [{"uid": "u2", "name": "j2"}]}}, ("metadata", "ownerReferences"),
     [{"uid": "u2", "name": "j2"}, {"uid": "u1", "name": "j1"}]),
    ({"spec": {"taints": [{"key": "k2", "effect": "NoExecute"}]}}, ("spec", "taints"),
     [{"key": "k2", "effect": "NoExecute"}]),
    ({"spec": {"tolerations": [{"key": "t2"}]}}, ("spec", "tolerations"), [{"key": "t2"}]),
    ({"metadata": {"finalizers": ["y"]}}, ("metadata", "finalizers"), ["x", "y"]),
    ({"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}}, ("metadata", "finalizers"), []),
    ({"metadata": {"labels": {"a": None, "b": "2"}}}, ("metadata", "labels"), {"b": "2"}),
    ({"metadata": {"labels": {"$patch": "replace", "c": "3"}}}, ("metadata", "labels"), {"c": "3"}),
])
def test_strategic_merge(patch: dict[str, Any], path: tuple[Any, ...], expected: Any) -> None:
    out: Any = patching.apply(POD, patch, SMP)
    for part in path:
        out = out[part]
    assert out == expected


def test_patches_leave_the_original_alone() -> None:
    before = repr(POD)
    patching.apply(POD, {"spec": {"containers": [{"name": "c1", "image": "z"}]}}, SMP)
    patching.apply(POD, {"spec": {"containers": None}}, patching.MERGE_PATCH)
    patching.apply(POD, [{"op": "remove", "path": "/spec/containers/0"}], patching.JSON_PATCH)
    assert repr(POD) == before


@pytest.mark.parametrize(("doc", "patch", "expected"), [
    ({"a": 1, "b": {"c": 2}}, {"b": {"c": None, "d": 3}}, {"a": 1, "b": {"d": 3}}),
    ({"a": [1, 2]}, {"a": [3]}, {"a": [3]}),
    ({"a": 1}, {"a": None}, {}),
    ({}, {"a": {"b": {"c": 1}}}, {"a": {"b": {"c": 1}}}),
])
def test_merge_patch(doc: dict[str, Any], patch: dict[str, Any], expected: dict[str, Any]) -> None:
    assert patching.apply(doc, patch, patching.MERGE_PATCH) == expected


@pytest.mark.parametrize(("ops", "expected"), [
    ([{"op": "add", "path": "/a/-", "value": 3}], {"a": [1, 2, 3], "b": {"c": "x"}}),
    ([{"op": "add", "path": "/a/0", "value": 0}], {"a": [0, 1, 2], "b": {"c": "x"}}),
    ([{"op": "remove", "path": "/a/1"}], {"a": [1], "b": {"c": "x"}}),
    ([{"op": "replace", "path": "/b/c", "value": "y"}], {"a": [1, 2], "b": {"c": "y"}}),
    ([{"op": "move", "from": "/b/c", "path": "/d"}], {"a": [1, 2], "b": {}, "d": "x"}),
    ([{"op": "copy", "from": "/b/c", "path": "/d"}], {"a": [1, 2], "b": {"c": "x"}, "d": "x"}),
    ([{"op": "test", "path": "/b/c", "value": "x"}], {"a": [1, 2], "b": {"c": "x"}}),
    ([{"op": "add", "path": "/b/a~1b", "value": 1}], {"a": [1, 2], "b": {"c": "x", "a/b": 1}}),
])
def test_json_patch(ops: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    assert patching.apply({"a": [1, 2], "b": {"c": "x"}}, ops, patching.JSON_PATCH) == expected


@pytest.mark.parametrize(("ops", "code"), [
    ([{"op": "test", "path": "/b/c", "value": "nope"}], 422),
    ([{"op": "remove", "path": "/missing"}], 422),
    ([{"op": "replace", "path": "/missing/x", "value": 1}], 422),
    ([{"op": "frobnicate", "path": "/a"}], 400),
    ({"not": "a list"}, 400),
])
def test_json_patch_errors(ops: Any, code: int) -> None:
    with pytest.raises(status.ApiError) as info:
        patching.apply({"a": [1, 2], "b": {"c": "x"}}, ops, patching.JSON_PATCH)
    assert info.value.status == code


def test_apply_patch_is_unsupported() -> None:
    with pytest.raises(status.ApiError) as info:
        patching.apply({}, {}, patching.APPLY_PATCH)
    assert info.value.status == 415
