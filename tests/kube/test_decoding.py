"""Decoding API bodies: a document nested too deep costs at most its one object, never the list or watch.

The bodies are the bytes kube-apiserver sends (list pages with `items`, one watch event per line, an
object whose `metadata.managedFields[].fieldsV1` nests 1,100 levels, which it accepts and stores);
a property test checks that removing managedFields changes nothing else in any JSON document,
whatever its strings hold (escaped quotes, brackets, the word managedFields itself).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcover.kube import decoding

DEPTH = 1100


def deep(depth: int = DEPTH) -> bytes:
    """A fieldsV1 nesting `depth` objects, as a Server-Side Apply field set writes them."""
    return b'{"f:a":' * depth + b"{}" + b"}" * depth


def pod(name: str, *, managed: bytes = b"", extra: bytes = b"") -> bytes:
    fields = (b',"managedFields":[{"manager":"m","operation":"Update","apiVersion":"v1","fieldsType":"FieldsV1",'
              b'"fieldsV1":' + managed + b"}]") if managed else b""
    return (b'{"metadata":{"name":"' + name.encode() + b'","namespace":"ns","uid":"uid-' + name.encode()
            + b'","resourceVersion":"7"' + fields + b'},"spec":{"nodeName":"n1"' + extra
            + b'},"status":{"phase":"Running"}}')


def listing(*items: bytes) -> bytes:
    return (b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9","continue":"tok"},"items":['
            + b",".join(items) + b"]}")


def test_a_deep_managed_fields_costs_nothing_but_its_managed_fields() -> None:
    body = listing(pod("a"), pod("b", managed=deep()), pod("c", managed=b'{"f:spec":{}}'))
    with pytest.raises(orjson.JSONDecodeError, match="depth"):  # the premise: orjson alone fails the page
        orjson.loads(body)
    doc, skipped = decoding.page(body)
    assert skipped == []
    assert [i["metadata"]["name"] for i in doc["items"]] == ["a", "b", "c"]
    assert doc["items"][1]["metadata"]["managedFields"] is None
    assert doc["items"][1]["spec"] == {"nodeName": "n1"}
    assert doc["items"][2]["metadata"]["managedFields"] is None, "every managedFields of the page goes"
    assert doc["metadata"] == {"resourceVersion": "9", "continue": "tok"}


def test_an_object_deep_elsewhere_is_left_out_of_its_list_and_named() -> None:
    nested = b',"x":' + b"[" * DEPTH + b"]" * DEPTH
    body = listing(pod("a"), pod("bad", extra=nested), pod("c", managed=deep()))
    doc, skipped = decoding.page(body)
    assert [i["metadata"]["name"] for i in doc["items"]] == ["a", "c"]
    assert doc["metadata"]["resourceVersion"] == "9"
    assert [(s.kind, s.namespace, s.name, s.reason) for s in skipped] == [("Pod", "ns", "bad", decoding.TOO_DEEP)]


def test_a_watch_line_decodes_or_is_skipped_never_raised() -> None:
    line = b'{"type":"MODIFIED","object":' + pod("a", managed=deep()) + b"}"
    got, skipped = decoding.event(line, kind="Pod")
    assert skipped is None
    assert got["object"]["metadata"]["name"] == "a"
    bad = b'{"type":"MODIFIED","object":' + pod("b", extra=b',"x":' + b"[" * DEPTH + b"]" * DEPTH) + b"}"
    got, skipped = decoding.event(bad, kind="Pod")
    assert got is None
    assert skipped is not None
    assert (skipped.kind, skipped.name, skipped.reason) == ("Pod", "b", decoding.TOO_DEEP)


def test_a_document_that_is_no_list_fails_alone_with_a_kube_error() -> None:
    with pytest.raises(decoding.Unreadable):
        decoding.page(pod("b", extra=b',"x":' + b"[" * DEPTH + b"]" * DEPTH))
    with pytest.raises(decoding.Unreadable):
        decoding.page(b'{"kind":"PodList","items":[{"metadata":')  # cut short: no items to find
    assert decoding.loads(pod("a", managed=deep()))["metadata"]["name"] == "a"


def test_skips_are_counted_by_kind_and_reason() -> None:
    skips = decoding.Skips()
    for name in ("a", "b"):
        skips.add(decoding.Skipped("Event", "t", name, decoding.TOO_DEEP, "depth"))
    skips.add(decoding.Skipped("Pod", "t", "c", decoding.UNREADABLE, "bad"))
    samples = {(s.labels["kind"], s.labels["reason"]): s.value for f in skips.metrics() for s in f.samples
               if s.name == "kcover_objects_skipped_total"}
    assert samples == {("Event", "too_deep"): 2, ("Pod", "unreadable"): 1}


# ------------------------------------------------------------------------------------------ property

_text = st.text(alphabet=st.sampled_from(list('ab"\\{}[]:,managedFields \n\u00e9')), max_size=24)
_keys = st.one_of(_text, st.just("managedFields"))
_json: Any = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4), max_leaves=30)


def _expected(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: (None if k == "managedFields" and isinstance(v, list | dict) else _expected(v))
                for k, v in doc.items()}
    if isinstance(doc, list):
        return [_expected(v) for v in doc]
    return doc


@settings(max_examples=200, deadline=None)
@given(_json, st.booleans())
def test_removing_managed_fields_changes_nothing_else(doc: Any, indent: bool) -> None:
    data = orjson.dumps(doc, option=orjson.OPT_INDENT_2 if indent else 0)
    stripped = decoding.without_managed_fields(data)
    expected = _expected(doc)
    if stripped is None:
        assert expected == doc
    else:
        assert orjson.loads(stripped) == expected
