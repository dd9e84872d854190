"""The one Event body: where it lives, what it refers to, and the API server's limits, checked against
the simulated API server's own validation of core/v1 Events (which follows kube-apiserver's)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from kcover.kube import events
from kcover.sim import registry, strategy

NOW = dt.datetime(2026, 11, 29, 9, 0, 0, 120000, tzinfo=dt.UTC)
NODE = events.About("Node", "v1", "gpu-7", "", "u2")
JOB = events.About("PyTorchJob", "kubeflow.org/v1", "train", "ml", "u1")


def _body(about: events.About, **kw: Any) -> events.EventBody:
    fields: dict[str, Any] = {"reason": "KcoverRestartedWorkload", "action": "RestartWorkload", "message": "m",
                              "warning": False, "now": NOW, "controller": "kcover.io/controller", "instance": "a"}
    return events.body(about, **{**fields, **kw})


def _refused_by_the_api_server(body: events.EventBody) -> list[str]:
    """What the simulated API server's create validation says of `body` ([] when it takes it)."""
    res = registry.Registry().by_key("events")
    try:
        strategy.prepare_create(res, dict(body))
    except Exception as exc:  # the server's Invalid error, with its causes
        return [str(exc)]
    return []


@pytest.mark.parametrize(("about", "namespace", "has_namespace"), [
    (JOB, "ml", True),
    (NODE, "default", False),  # cluster-scoped: default
])
def test_event_lives_where_the_api_server_requires(about: events.About, namespace: str, has_namespace: bool) -> None:
    body = _body(about)
    assert body["metadata"]["namespace"] == namespace
    assert ("namespace" in body["involvedObject"]) is has_namespace
    assert body["involvedObject"]["uid"] == about.uid
    assert body["eventTime"] == "2026-11-29T09:00:00.120000Z"  # MicroTime: six digits and a zone
    assert body["reportingComponent"] == "kcover.io/controller"
    assert body["type"] == "Normal"
    assert _refused_by_the_api_server(body) == []


@pytest.mark.parametrize("namespace", ["default", "kube-system", "kcover-system", "ml"])
def test_an_event_about_a_node_in_any_namespace_is_one_the_api_server_takes(namespace: str) -> None:
    body = _body(NODE, namespace=namespace)
    assert body["metadata"]["namespace"] == namespace
    # an empty reference namespace only where the server allows it; elsewhere the Event's own
    assert body["involvedObject"].get("namespace", "") == ("" if namespace in ("default", "kube-system")
                                                            else namespace)
    assert _refused_by_the_api_server(body) == []


def test_the_rule_is_the_servers_a_bare_node_reference_elsewhere_is_refused() -> None:
    body = _body(NODE, namespace="kcover-system")
    del body["involvedObject"]["namespace"]  # what the agent's detector-failed Event looked like
    [why] = _refused_by_the_api_server(body)
    assert "does not match event.namespace" in why


def test_an_event_about_a_namespaced_object_elsewhere_is_refused_here() -> None:
    with pytest.raises(ValueError, match="must live in namespace 'ml'"):
        _body(JOB, namespace="kcover-system")


def test_a_generated_name_annotations_and_source() -> None:
    body = _body(NODE, namespace="kcover-system", generate_name="gpu-7.kcover-", annotations={"kcover.io/x": "1"},
                 source_host="gpu-7")
    assert body["metadata"] == {"namespace": "kcover-system", "generateName": "gpu-7.kcover-",
                                "annotations": {"kcover.io/x": "1"}}
    assert body["source"] == {"component": "kcover.io/controller", "host": "gpu-7"}
    assert events.path_of(body) == "/api/v1/namespaces/kcover-system/events"
    assert _refused_by_the_api_server(body) == []


def test_limits_are_the_api_servers() -> None:
    about = events.About("Pod", "v1", "p" * 300, "ns", "u")
    body = _body(about, reason="R" * 200, action="A" * 200, message="x" * 5000, warning=True, instance="i" * 300)
    assert len(body["reason"]) == 128
    assert len(body["action"]) == 128
    assert len(body["message"]) == 1024
    assert len(body["reportingInstance"]) == 128
    assert len(body["metadata"]["name"]) <= 253
    assert body["type"] == "Warning"
    assert _refused_by_the_api_server(body) == []


@pytest.mark.parametrize("char", ["x", "\u00e9", "\u8a13", "\U0001f525"])  # 1, 2, 3 and 4 UTF-8 bytes
def test_limits_are_utf8_bytes_cut_on_a_character_boundary(char: str) -> None:
    about = events.About("Pod", "v1", "p", "ns", "u")
    body = _body(about, reason=char * 200, action=char * 200, message=char * 2000, warning=True, instance=char * 300)
    fields: dict[str, Any] = dict(body)
    for field, limit in (("reason", 128), ("action", 128), ("message", 1024), ("reportingInstance", 128)):
        raw = fields[field].encode()
        assert len(raw) <= limit, field
        assert len(raw) > limit - 4, field  # cut at the last whole character that fits, not far before it
        assert fields[field].rstrip(".").strip(char) == "", field  # whole characters only
    assert body["message"].endswith("...")
    assert _refused_by_the_api_server(body) == []
