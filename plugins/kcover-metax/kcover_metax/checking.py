"""Pure day-2 check decisions over parsed MetaX tool output.

Owns the rules: enough GPUs `Available`; no hotspot at or above the limit (the Go kcover's rule);
no GPU with more double-bit-ECC retired pages than the limit; every port of each configured HCA
`PORT_ACTIVE`. Each rule returns a `CheckResult` naming its offenders, sorted. No I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


class Check(enum.StrEnum):
    GPU_COUNT = "gpu-count"
    TEMPERATURE = "temperature"
    ECC = "ecc"
    HCA = "hca"


AVAILABLE = "Available"
PORT_ACTIVE = "PORT_ACTIVE"


@dataclass(frozen=True)
class CheckResult:
    check: Check
    ok: bool
    message: str
    offenders: tuple[str, ...] = field(default=())


def gpu_count(statuses: Mapping[str, str], *, expected: int) -> CheckResult:
    available = sum(1 for status in statuses.values() if status == AVAILABLE)
    offenders = tuple(sorted(f"{gpu}={status}" for gpu, status in statuses.items() if status != AVAILABLE))
    if available >= expected:
        return CheckResult(Check.GPU_COUNT, True, f"{available} GPUs available (expected {expected})")
    detail = f": {', '.join(offenders)}" if offenders else ""
    return CheckResult(Check.GPU_COUNT, False, f"{available} of {expected} expected GPUs available{detail}", offenders)


def temperature(hotspots: Mapping[str, float], *, limit_celsius: float) -> CheckResult:
    offenders = tuple(sorted(f"{gpu}={value:.2f}C" for gpu, value in hotspots.items() if value >= limit_celsius))
    if not hotspots:
        return CheckResult(Check.TEMPERATURE, False, "mx-smi reported no hotspot temperature")
    if offenders:
        return CheckResult(Check.TEMPERATURE, False,
                           f"hotspot temperature at or above {limit_celsius:g}C: {', '.join(offenders)}", offenders)
    return CheckResult(Check.TEMPERATURE, True, f"hotspots below {limit_celsius:g}C")


def double_bit_ecc(counts: Mapping[str, int], *, limit: int) -> CheckResult:
    offenders = tuple(sorted(f"{gpu}={value}" for gpu, value in counts.items() if value > limit))
    if not counts:
        return CheckResult(Check.ECC, False, "mx-smi reported no double-bit ECC counts")
    if offenders:
        return CheckResult(Check.ECC, False, f"double-bit ECC retired pages above {limit}: {', '.join(offenders)}",
                           offenders)
    return CheckResult(Check.ECC, True, f"double-bit ECC retired pages within {limit}")


def hca_ports(states: Mapping[str, Mapping[int, str]], *, hca_ids: Sequence[str]) -> CheckResult:
    offenders: list[str] = []
    for hca in hca_ids:
        ports = states.get(hca)
        if not ports:
            offenders.append(f"{hca}=missing")
            continue
        offenders += [f"{hca}/{port}={state}" for port, state in sorted(ports.items()) if state != PORT_ACTIVE]
    if offenders:
        ordered = tuple(sorted(offenders))
        return CheckResult(Check.HCA, False, f"InfiniBand ports not {PORT_ACTIVE}: {', '.join(ordered)}", ordered)
    return CheckResult(Check.HCA, True, f"all ports of {', '.join(hca_ids)} {PORT_ACTIVE}")
