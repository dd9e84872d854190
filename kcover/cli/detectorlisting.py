"""`kcover detectors`: the installed detectors, or a running process's.

Owns listing the detectors discovered here (name, roles, distribution, version, whether it loads) and a
running controller's or agent's (its health server's /detectors: state, restarts, detail, what is
degraded), as a table or JSON. Does not own discovering them (`kcover.detectors.registry`) nor their
runtime state (the role's supervisor).

How it fails: exit 1 when a plugin fails to load (`--strict`), or, with `--url`, when a detector failed or
the process says it is degraded; 3 when the process cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kcover.detectors import registry


def cmd_detectors(args: argparse.Namespace) -> int:
    if args.url:
        return _running_detectors(args.url, args.output)
    reg = registry.discover()
    rows = [{"name": i.name, "roles": ",".join(sorted(r.value for r in i.roles)) or "-",
             "distribution": i.distribution, "version": i.version, "entry_point": i.value,
             "status": "ok" if i.cls is not None else f"error: {i.error}"} for i in reg.infos]
    if args.output == "json":
        print(json.dumps(rows, indent=2))
    else:
        widths = {k: max(len(k), *(len(r[k]) for r in rows)) if rows else len(k)
                  for k in ("name", "roles", "distribution", "version")}
        print("  ".join(k.upper().ljust(widths[k]) for k in widths) + "  STATUS")
        for r in rows:
            print("  ".join(r[k].ljust(widths[k]) for k in widths) + "  " + r["status"])
    return 1 if any(i.cls is None for i in reg.infos) and args.strict else 0


def _running_detectors(url: str, output: str) -> int:
    """`kcover detectors --url`: a running process's detectors (its /detectors); 1 when one failed or the process
    says it is degraded (an agent that cannot see its GPUs), 3 unreachable."""
    import urllib.request  # imported by the command that runs it (roles stay lean)

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/detectors", timeout=10) as answer:
            doc = json.loads(answer.read())
            states: dict[str, dict[str, Any]] = doc["detectors"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: cannot read {url}/detectors: {exc}", file=sys.stderr)
        return 3
    degraded = {str(k): str(v) for k, v in (doc.get("degraded") or {}).items()}
    if output == "json":
        print(json.dumps(states, indent=2))
    else:
        rows = [(name, str(s.get("state", "")), "yes" if s.get("required") else "no",
                 "yes" if s.get("isolated") else "no", str(s.get("restarts", 0)), str(s.get("detail", "")))
                for name, s in sorted(states.items())]
        heads = ("NAME", "STATE", "REQUIRED", "ISOLATED", "RESTARTS", "DETAIL")
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(heads)]
        for row in (heads, *rows):
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        for name, text in sorted(degraded.items()):
            print(f"DEGRADED ({name}): {text}")
    return 1 if degraded or any(s.get("state") == "failed" for s in states.values()) else 0
