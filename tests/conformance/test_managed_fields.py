"""Conformance: managedFields a client writes, nested to any depth, kept and served as written.

kube-apiserver takes the managedFields a request carries when it can decode them, even a `fieldsV1`
nested 1,100 levels (deeper than orjson parses), stores them, serves them in gets, lists and watches,
keeps them through a write that carries none, and clears them on `[{}]`. Any writer of an object can
do this, so kcover's reads must survive it (`kcover.kube.decoding`); the simulated server must serve
such objects as the real one does for kcover's tests to mean anything.
"""

# ruff: noqa: PT018  (compound asserts read as one expectation about one answer)
from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest
from conformance_client import Api

from kcover.kube import client as client_
from kcover.kube import decoding, retrying

DEPTH = 1100
FIELDS = b'{"f:a":' * DEPTH + b"{}" + b"}" * DEPTH


def managed(manager: str = "forger") -> bytes:
    return (b'[{"manager":"' + manager.encode() + b'","operation":"Update","apiVersion":"v1",'
            b'"fieldsType":"FieldsV1","fieldsV1":' + FIELDS + b"}]")


@pytest.fixture
async def kube(conformance_api: Api) -> AsyncIterator[client_.KubeClient]:
    """kcover's own client (it sends bytes as they are: kubernetes-asyncio cannot encode such a body)."""
    kube = client_.from_configuration(conformance_api.client.configuration, retry=retrying.NO_RETRY)
    try:
        yield kube
    finally:
        await kube.close()


async def _raw(api: Api, path: str, **query: str) -> bytes:
    resp = await api.raw("GET", path, query=query or None)
    data: bytes = await resp.read()
    resp.release()
    assert resp.status == 200, data[:300]
    return data


async def test_managed_fields_of_any_depth_are_kept_and_served(conformance_api: Api, ns: str,
                                                                kube: client_.KubeClient) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    body = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"deep","managedFields":' + managed() + \
        b'},"data":{"a":"1"}}'
    created = await kube.request("POST", path, body=body)
    assert created["metadata"]["managedFields"] is None  # decoded by kcover without them
    rv = created["metadata"]["resourceVersion"]

    got = await _raw(conformance_api, f"{path}/deep")
    assert FIELDS in got, "the field set is stored and served as written"
    with pytest.raises(orjson.JSONDecodeError, match="depth"):
        orjson.loads(got)
    listed = await _raw(conformance_api, path)
    assert FIELDS in listed
    page, skipped = decoding.page(listed)
    assert [i["metadata"]["name"] for i in page["items"]] == ["deep"] and skipped == []

    # a write that carries no managedFields keeps the live ones
    updated = await kube.request("PUT", f"{path}/deep", body={
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "deep", "resourceVersion": rv},
        "data": {"a": "2"}})
    assert FIELDS in await _raw(conformance_api, f"{path}/deep")
    events = await _watch_lines(conformance_api, path, rv)
    assert events and FIELDS in events[0], "the watch event carries them too"

    # a merge patch may set them, as on any object its writer may patch
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body=pod)
    await kube.request("PATCH", f"/api/v1/namespaces/{ns}/pods/p", content_type=client_.MERGE_PATCH,
                       body=b'{"metadata":{"managedFields":' + managed("patcher") + b"}}")
    assert FIELDS in await _raw(conformance_api, f"/api/v1/namespaces/{ns}/pods/p")

    # one empty entry clears them
    await kube.request("PUT", f"{path}/deep", body={
        "apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "3"},
        "metadata": {"name": "deep", "resourceVersion": updated["metadata"]["resourceVersion"],
                     "managedFields": [{}]}})
    assert FIELDS not in await _raw(conformance_api, f"{path}/deep")


async def _watch_lines(api: Api, path: str, rv: str) -> list[bytes]:
    resp = await api.raw("GET", path, query={"watch": "true", "resourceVersion": rv, "timeoutSeconds": "5"},
                         request_timeout=10)
    lines: list[bytes] = []
    try:
        while not lines:
            line = await resp.content.readline()
            if not line:
                break
            lines.append(line)
    finally:
        resp.close()
    return lines


async def test_a_schemaless_custom_resource_nested_deep_is_kept_and_served(conformance_api: Api, ns: str,
                                                                           kube: client_.KubeClient) -> None:
    """Not only managedFields: a custom resource's fields without a schema nest as deep as its writer likes."""
    path = f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs"
    nested = b"[" * DEPTH + b"]" * DEPTH
    body = (b'{"apiVersion":"kubeflow.org/v1","kind":"PyTorchJob","metadata":{"name":"deep"},'
            b'"spec":{"x":' + nested + b',"pytorchReplicaSpecs":{}}}')
    with pytest.raises(decoding.Unreadable):
        await kube.request("POST", path, body=body)  # stored; the answer is the object, which kcover cannot read
    await kube.request("POST", path, body={"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                           "metadata": {"name": "plain"}, "spec": {"pytorchReplicaSpecs": {}}})
    assert nested in await _raw(conformance_api, f"{path}/deep")
    page, skipped = decoding.page(await _raw(conformance_api, path))
    assert [i["metadata"]["name"] for i in page["items"]] == ["plain"]
    assert [(s.kind, s.name, s.reason) for s in skipped] == [("PyTorchJob", "deep", decoding.TOO_DEEP)]
