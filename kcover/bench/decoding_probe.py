"""Decoding cost: a list page and a watch line, as they are and with one object nested too deep.

`python -m kcover.bench.decoding_probe --pods 500 --runs 30` builds a page of `--pods` worker pods as
kube-apiserver sends them (each with the managedFields an operator's create and the kubelet's status
writes leave), and prints one JSON document of milliseconds (the best of `--runs`: the least disturbed
by other work on the machine, as `timeit` reports) and their ratios to plain `orjson.loads` of the same
bytes, for

* `decoding.page` on that page (the path every list takes: orjson as it is);
* stripping managedFields before every parse (the alternative of always removing them first);
* `decoding.page` on the page with one pod whose managedFields nest 1,100 levels (orjson alone fails
  the page; the fallback removes managedFields and parses again);
* `decoding.page` on the page with one pod nested 1,100 levels outside managedFields (items decoded one
  by one, that one skipped);
* one watch line, as it is and with the deep managedFields.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable
from typing import Any

import orjson

from kcover.bench import objects
from kcover.kube import decoding

DEPTH = 1100


def field_set(value: Any) -> Any:
    """A FieldsV1 field set of `value`, shaped as Server-Side Apply writes one (`f:` keys, `k:` list keys)."""
    if isinstance(value, dict):
        return {f"f:{k}": field_set(v) for k, v in value.items()}
    if isinstance(value, list):
        out: dict[str, Any] = {}
        for i, item in enumerate(value):
            key = (json.dumps({"name": item["name"]}, separators=(",", ":"))
                   if isinstance(item, dict) and "name" in item else json.dumps({"i": i}))
            out[f"k:{key}"] = {".": {}, **(field_set(item) if isinstance(item, dict) else {})}
        return out
    return {}


def with_managed_fields(pod: dict[str, Any]) -> dict[str, Any]:
    """`pod` with the managedFields of an operator's create and a kubelet's status update."""
    spec_owner = {"metadata": {k: v for k, v in pod["metadata"].items() if k in ("labels", "annotations",
                                                                                "ownerReferences")},
                  "spec": pod["spec"]}
    entries = [
        {"manager": "pytorch-operator", "operation": "Update", "apiVersion": "v1", "time": "2026-01-01T00:00:00Z",
         "fieldsType": "FieldsV1", "fieldsV1": field_set(spec_owner)},
        {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": "2026-01-01T00:00:01Z",
         "fieldsType": "FieldsV1", "fieldsV1": field_set({"status": pod["status"]}), "subresource": "status"},
    ]
    return {**pod, "metadata": {**pod["metadata"], "uid": f"uid-{pod['metadata']['name']}",
                                "resourceVersion": "1000", "managedFields": entries}}


def page_bytes(pods: list[dict[str, Any]], *, deep_at: int | None = None, where: str = "managedFields") -> bytes:
    items = [orjson.dumps(p) for p in pods]
    if deep_at is not None:
        nest = b'{"f:a":' * DEPTH + b"{}" + b"}" * DEPTH
        raw = items[deep_at]
        if where == "managedFields":
            raw = raw.replace(b'"fieldsV1":{', b'"fieldsV1":{"f:deep":' + nest + b",", 1)
        else:
            raw = raw.replace(b'"spec":{', b'"spec":{"x":' + b"[" * DEPTH + b"]" * DEPTH + b",", 1)
        items[deep_at] = raw
    return (b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1000"},"items":['
            + b",".join(items) + b"]}")


def best_ms(fn: Callable[[], Any], runs: int) -> float:
    """The fastest of `runs` calls, the cyclic GC off meanwhile (as `timeit` measures)."""
    fn()
    times = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(runs):
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
    finally:
        gc.enable()
    return min(times) * 1000


def measure(pods: int, runs: int) -> dict[str, Any]:
    made = [with_managed_fields(objects.pod("bench", "train", i, node_name=f"gpu-{i}", owner=None))
            for i in range(pods)]
    plain = page_bytes(made)
    deep = page_bytes(made, deep_at=pods // 2)
    elsewhere = page_bytes(made, deep_at=pods // 2, where="spec")
    line = b'{"type":"MODIFIED","object":' + orjson.dumps(made[0]) + b"}"
    deep_line = b'{"type":"MODIFIED","object":' + page_bytes(made[:1], deep_at=0)[
        len(b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1000"},"items":['):-2] + b"}"
    base = best_ms(lambda: orjson.loads(plain), runs)
    line_base = best_ms(lambda: orjson.loads(line), runs * 20)
    stripped = decoding.without_managed_fields(plain) or b""
    managed_share = 1 - len(stripped) / len(plain)
    cases = {
        "page": best_ms(lambda: decoding.page(plain), runs),
        "strip_then_parse": best_ms(lambda: orjson.loads(decoding.without_managed_fields(plain) or plain), runs),
        "page_one_deep_managed_fields": best_ms(lambda: decoding.page(deep), runs),
        "page_one_deep_elsewhere": best_ms(lambda: decoding.page(elsewhere), runs),
    }
    lines = {"line": best_ms(lambda: decoding.event(line), runs * 20),
             "line_deep_managed_fields": best_ms(lambda: decoding.event(deep_line), runs * 20)}
    return {
        "pods": pods, "page_bytes": len(plain), "managed_fields_share": round(managed_share, 3),
        "orjson_loads_ms": round(base, 3),
        **{f"{k}_ms": round(v, 3) for k, v in cases.items()},
        **{f"{k}_ratio": round(v / base, 2) for k, v in cases.items()},
        "line_bytes": len(line), "orjson_line_us": round(line_base * 1000, 1),
        **{f"{k}_us": round(v * 1000, 1) for k, v in lines.items()},
        **{f"{k}_ratio": round(v / line_base, 2) for k, v in lines.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    print(json.dumps(measure(args.pods, args.runs), indent=2))


if __name__ == "__main__":
    main()
