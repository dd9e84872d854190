"""Pure parsers of `mx-smi` (2.2.x) and `ibv_devinfo` text output.

Owns reading the tools' text into plain dicts. It does no I/O. Unknown lines are skipped (the tools
print headers, timestamps and trailers); a value that should be a number and is not raises
`ParseError`, as does a value line before any `GPU#`/`hca_id` header.
"""

from __future__ import annotations

from kcover.detectors import contract

GPU_PREFIX = "GPU#"


class ParseError(contract.KcoverError):
    """Tool output did not have the expected shape."""


def _value(line: str) -> str:
    _, sep, value = line.partition(":")
    if not sep:
        raise ParseError(f"no ':' in {line!r}")
    return value.strip()


def parse_gpu_list(text: str) -> dict[str, str]:
    """`mx-smi -L`: GPU id (`GPU#0`) to its status word (`Available`)."""
    statuses: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[0].startswith(GPU_PREFIX):
            statuses[fields[0]] = fields[3]
    return statuses


def parse_attached_gpus(text: str) -> int | None:
    """The `Attached GPUs : N` header of `mx-smi` reports, if present."""
    for line in text.splitlines():
        if line.strip().startswith("Attached GPUs"):
            try:
                return int(_value(line))
            except ValueError as exc:
                raise ParseError(f"bad GPU count in {line!r}") from exc
    return None


def _per_gpu(text: str, key: str) -> dict[str, list[str]]:
    """Values of lines starting with `key` (after indentation), grouped by the preceding `GPU#N` header."""
    values: dict[str, list[str]] = {}
    gpu = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(GPU_PREFIX):
            gpu = line.split()[0]
            continue
        if not line.startswith(key):
            continue
        if not gpu:
            raise ParseError(f"{line!r} before any {GPU_PREFIX} header")
        values.setdefault(gpu, []).append(_value(line))
    return values


def parse_hotspot_temperatures(text: str) -> dict[str, float]:
    """`mx-smi --show-temperature`: GPU id to its hottest `hotspot(sensorN)` reading in °C."""
    out: dict[str, float] = {}
    for gpu, readings in _per_gpu(text, "hotspot(").items():
        try:
            out[gpu] = max(float(r.removesuffix("C").strip()) for r in readings)
        except ValueError as exc:
            raise ParseError(f"bad hotspot temperature for {gpu}: {readings!r}") from exc
    return out


def parse_double_bit_ecc(text: str) -> dict[str, int]:
    """`mx-smi --count-ecc`: GPU id to its `Retired Pages / Double Bit ECC` count."""
    out: dict[str, int] = {}
    for gpu, readings in _per_gpu(text, "Double Bit ECC").items():
        try:
            out[gpu] = sum(int(r) for r in readings)
        except ValueError as exc:
            raise ParseError(f"bad double-bit ECC count for {gpu}: {readings!r}") from exc
    return out


def parse_port_states(text: str) -> dict[str, dict[int, str]]:
    """`ibv_devinfo`: HCA id to {port number: state word}, e.g. {"mlx5_0": {1: "PORT_ACTIVE"}}."""
    states: dict[str, dict[int, str]] = {}
    hca = ""
    port: int | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("hca_id:"):
            hca = _value(line)
            states[hca] = {}
            port = None
        elif line.startswith("port:"):
            if not hca:
                raise ParseError(f"{line!r} before any hca_id")
            try:
                port = int(_value(line))
            except ValueError as exc:
                raise ParseError(f"bad port number in {line!r}") from exc
        elif line.startswith("state:"):
            if not hca or port is None:
                raise ParseError(f"{line!r} before any hca_id/port")
            words = _value(line).split()
            states[hca][port] = words[0] if words else ""
    return states
