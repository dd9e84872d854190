from __future__ import annotations

import datetime as dt

import pytest

from kcover.recovery import auditing
from kcover.recovery import steps as actions

NOW = dt.datetime(2026, 11, 29, 9, 0, 0, 120000, tzinfo=dt.UTC)


@pytest.mark.parametrize(("about", "namespace", "has_namespace"), [
    (actions.ObjectRef("PyTorchJob", "kubeflow.org/v1", "train", "ml", "u1"), "ml", True),
    (actions.ObjectRef("Node", "v1", "gpu-7", "", "u2"), "default", False),  # cluster-scoped: default
])
def test_event_lives_where_the_api_server_requires(about: actions.ObjectRef, namespace: str,
                                                  has_namespace: bool) -> None:
    body = auditing.event_body(about, reason="KcoverRestartedWorkload", action="RestartWorkload", message="m",
                               warning=False, now=NOW, controller="kcover.io/controller", instance="a")
    assert body["metadata"]["namespace"] == namespace
    assert ("namespace" in body["involvedObject"]) is has_namespace
    assert body["involvedObject"]["uid"] == about.uid
    assert body["eventTime"] == "2026-11-29T09:00:00.120000Z"  # MicroTime: six digits and a zone
    assert body["reportingComponent"] == "kcover.io/controller"
    assert body["type"] == "Normal"


def test_limits_are_the_api_servers() -> None:
    about = actions.ObjectRef("Pod", "v1", "p" * 300, "ns", "u")
    body = auditing.event_body(about, reason="R" * 200, action="A" * 200, message="x" * 5000, warning=True,
                               now=NOW, controller="kcover.io/controller", instance="i" * 300)
    assert len(body["reason"]) == 128
    assert len(body["action"]) == 128
    assert len(body["message"]) == 1024
    assert len(body["reportingInstance"]) == 128
    assert len(body["metadata"]["name"]) <= 253
    assert body["type"] == "Warning"


@pytest.mark.parametrize("char", ["x", "\u00e9", "\u8a13", "\U0001f525"])  # 1, 2, 3 and 4 UTF-8 bytes
def test_limits_are_utf8_bytes_cut_on_a_character_boundary(char: str) -> None:
    about = actions.ObjectRef("Pod", "v1", "p", "ns", "u")
    body = auditing.event_body(about, reason=char * 200, action=char * 200, message=char * 2000, warning=True,
                               now=NOW, controller="kcover.io/controller", instance=char * 300)
    for field, limit in (("reason", 128), ("action", 128), ("message", 1024), ("reportingInstance", 128)):
        raw = body[field].encode()
        assert len(raw) <= limit, field
        assert len(raw) > limit - 4, field  # cut at the last whole character that fits, not far before it
        assert body[field].rstrip(".").strip(char) == "", field  # whole characters only
    assert body["message"].endswith("...")
