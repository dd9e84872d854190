"""The fault trace of the fleet replay: onsets in time, generated from the taxonomy or read from a file.

Owns `Onset` (one root cause striking one node, and GPU, at one time), the generator (`generate`: each
class's onsets drawn from its rate per GPU-day, Poisson in number, uniform in time, node and GPU, its
signal drawn by weight; seeded, so a seed is a trace) and the JSON-lines format of `--trace FILE` and
`--write-trace FILE`, one onset per line:

    {"time": 5231.0, "node": 17, "gpu": 3, "class": "faulty-gpu", "signal": "xid", "xid": 79}

`time` is seconds from the replay's start; `node` the node's index (0 .. nodes-1: `node-0017`); `gpu`
the GPU's index on it (null for a fault of the whole node; an `xid` line without one names GPU 0; for a
`link` line, the rail: RDMA port `mlx5_<gpu>`, 0 without one); `class` a class of the taxonomy (which
gives the fault's truth and physics); `signal` one of `xid`, `exit`, `nccl`, `link`, `notready` (`xid`
needs `xid`, the code). Blank lines and lines starting with
`#` are skipped. The trace does not depend on any policy: what an onset does depends on what runs on
the node at that time, which differs between policies; that is the replay's business.

Reading fails with `errors.ConfigError` listing each bad line by number (unknown class, node or GPU
out of range, a line that is not JSON).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kcover import errors
from kcover.sim.fleet import taxonomy as tax


@dataclass(frozen=True, order=True)
class Onset:
    time: float
    node: int
    gpu: int | None
    fault_class: str
    signal: tax.SignalKind
    xid: int | None = None

    def to_json(self) -> str:
        doc: dict[str, object] = {"time": round(self.time, 3), "node": self.node, "gpu": self.gpu,
                                  "class": self.fault_class, "signal": self.signal.value}
        if self.xid is not None:
            doc["xid"] = self.xid
        return json.dumps(doc, separators=(", ", ": "))


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    time: float = Field(ge=0)
    node: int = Field(ge=0)
    gpu: int | None = Field(None, ge=0)
    fault_class: str = Field(alias="class", min_length=1)
    signal: tax.SignalKind
    xid: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _xid(self) -> _Line:
        if (self.signal is tax.SignalKind.XID) != (self.xid is not None):
            raise ValueError("an xid signal needs its `xid` code, and only an xid signal has one")
        return self


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw (Knuth's method for small means, a rounded normal beyond 500)."""
    if mean <= 0:
        return 0
    if mean > 500:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def generate(taxonomy: tax.Taxonomy, *, nodes: int, gpus_per_node: int, days: float, seed: int,
             scale: float = 1.0) -> list[Onset]:
    """Every onset of `days` on a fleet of `nodes` x `gpus_per_node`, in time order; `scale` multiplies
    every rate (to see a small fleet's faults in a short run)."""
    rng = random.Random(f"kcover-fleet-trace/{seed}")
    horizon = days * 86400.0
    out: list[Onset] = []
    for cls in taxonomy.classes:
        mean = taxonomy.rate_per_gpu_day(cls) * nodes * gpus_per_node * days * scale
        weights = [s.weight for s in cls.signals]
        for _ in range(_poisson(rng, mean)):
            at = rng.uniform(0.0, horizon)
            node = rng.randrange(nodes)
            gpu = rng.randrange(gpus_per_node)
            sig = rng.choices(cls.signals, weights=weights)[0]
            keep_gpu = cls.blame is tax.Blame.DEVICE or sig.signal in (tax.SignalKind.XID, tax.SignalKind.LINK)
            out.append(Onset(at, node, gpu if keep_gpu else None, cls.name, sig.signal, sig.xid))
    return sorted(out)


def write(onsets: Iterable[Onset], path: str) -> None:
    Path(path).write_text("".join(o.to_json() + "\n" for o in onsets), "utf-8")


def parse(lines: Sequence[str], taxonomy: tax.Taxonomy, *, nodes: int, gpus_per_node: int,
          source: str = "trace") -> list[Onset]:
    """Read JSON lines (see the module docstring) against the taxonomy and fleet; ConfigError lists bad lines."""
    classes = taxonomy.by_name()
    out: list[Onset] = []
    problems: list[str] = []
    for number, raw in enumerate(lines, 1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        try:
            line = _Line.model_validate(json.loads(text))
        except json.JSONDecodeError as exc:
            problems.append(f"{source}:{number}: not JSON: {exc.msg}")
            continue
        except ValidationError as exc:
            problems += [f"{source}:{number}: {'.'.join(str(p) for p in e['loc']) or '(line)'}: {e['msg']}"
                         for e in exc.errors()]
            continue
        if line.fault_class not in classes:
            problems.append(f"{source}:{number}: class {line.fault_class!r} is not in the taxonomy "
                            f"(known: {', '.join(sorted(classes))})")
            continue
        if line.node >= nodes:
            problems.append(f"{source}:{number}: node {line.node} is past the fleet's {nodes} nodes")
            continue
        if line.gpu is not None and line.gpu >= gpus_per_node:
            problems.append(f"{source}:{number}: gpu {line.gpu} is past the node's {gpus_per_node} GPUs")
            continue
        gpu = line.gpu
        if gpu is None and line.signal in (tax.SignalKind.XID, tax.SignalKind.LINK):
            gpu = 0  # an XID is always some GPU's, a link some rail's; a line without one names the first
        out.append(Onset(line.time, line.node, gpu, line.fault_class, line.signal, line.xid))
    if problems:
        raise errors.ConfigError("invalid fault trace", problems)
    return sorted(out)


def read(path: str, taxonomy: tax.Taxonomy, *, nodes: int, gpus_per_node: int) -> list[Onset]:
    try:
        text = Path(path).read_text("utf-8")
    except OSError as exc:
        raise errors.ConfigError(f"{path}: cannot read the fault trace: {exc}") from exc
    return parse(text.splitlines(), taxonomy, nodes=nodes, gpus_per_node=gpus_per_node, source=path)
