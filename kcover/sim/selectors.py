"""Label and field selectors, parsed once and matched many times.

Owns the grammar of `labelSelector` (``=``, ``==``, ``!=``, ``in``, ``notin``, ``key``, ``!key``,
``<``/``>``; comma means *and*) and `fieldSelector` (``=``, ``==``, ``!=`` on the field labels a
resource supports). Parse errors and unsupported field labels raise `status.ApiError` (400) exactly
as the API server answers them. Matching takes plain dicts and never raises.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kcover.sim import status

_KEY_RE = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                     r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "<", ">"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        if self.op in ("=", "in"):
            return has and value in self.values
        if self.op in ("!=", "notin"):
            return not has or value not in self.values
        if not has:
            return False
        try:
            number, bound = int(str(value)), int(self.values[0])
        except ValueError:
            return False
        return number < bound if self.op == "<" else number > bound


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _bad_label(text: str, why: str) -> status.ApiError:
    return status.bad_request(f"unable to parse requirement: {why}: {text!r}")


def _check_key(key: str, raw: str) -> str:
    if not key or len(key) > 316 or not _KEY_RE.match(key):
        raise _bad_label(raw, f"invalid label key {key!r}")
    return key


def _check_value(value: str, raw: str) -> str:
    if len(value) > 63 or not _VALUE_RE.match(value):
        raise _bad_label(raw, f"invalid label value {value!r}")
    return value


_SET_RE = re.compile(r"^\s*(\S+?)\s+(in|notin)\s*\((.*)\)\s*$")


def _requirement(raw: str) -> Requirement:
    text = raw.strip()
    if not text:
        raise _bad_label(raw, "found '', expected: !, identifier, or 'end of string'")
    m = _SET_RE.match(text)
    if m:
        key, op, inner = m.group(1), m.group(2), m.group(3)
        values = tuple(_check_value(v.strip(), raw) for v in inner.split(","))
        return Requirement(_check_key(key, raw), op, values)
    if text.startswith("!"):
        return Requirement(_check_key(text[1:].strip(), raw), "!")
    for op, norm in (("==", "="), ("!=", "!="), ("=", "="), ("<", "<"), (">", ">")):
        if op in text:
            key, _, value = text.partition(op)
            key, value = key.strip(), value.strip()
            if norm in ("<", ">") and not value.lstrip("-").isdigit():
                raise _bad_label(raw, f"for 'Gt', 'Lt' operators, the value must be an integer: {value!r}")
            return Requirement(_check_key(key, raw), norm, (_check_value(value, raw),))
    if " " in text:
        raise _bad_label(raw, "found unexpected token")
    return Requirement(_check_key(text, raw), "exists")


def parse_labels(text: str | None) -> LabelSelector:
    """Parse a `labelSelector` query value; '' or None selects everything."""
    if text is None or not text.strip():
        return LabelSelector()
    return LabelSelector(tuple(_requirement(part) for part in _split_top(text)))


FieldGetter = Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    equal: bool
    value: str


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, fields: Mapping[str, str]) -> bool:
        return all((fields.get(r.field, "") == r.value) == r.equal for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements

    def fields(self) -> set[str]:
        return {r.field for r in self.requirements}


def _split_escaped(text: str, sep: str) -> list[str]:
    parts, cur, i = [], [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            cur.append(text[i:i + 2])
            i += 2
            continue
        if ch == sep:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return parts


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def parse_fields(text: str | None, supported: Mapping[str, FieldGetter]) -> FieldSelector:
    """Parse a `fieldSelector`; a field label the resource does not support is a 400."""
    if text is None or not text.strip():
        return FieldSelector()
    reqs: list[FieldRequirement] = []
    for part in _split_escaped(text, ","):
        part = part.strip()
        if "!=" in part:
            key, _, value = part.partition("!=")
            equal = False
        elif "==" in part:
            key, _, value = part.partition("==")
            equal = True
        elif "=" in part:
            key, _, value = part.partition("=")
            equal = True
        else:
            raise status.bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        key = key.strip()
        if key not in supported:
            raise status.bad_request(f"field label not supported: {key}")
        reqs.append(FieldRequirement(key, equal, _unescape(value.strip())))
    return FieldSelector(tuple(reqs))


def field_values(obj: dict[str, Any], supported: Mapping[str, FieldGetter]) -> dict[str, str]:
    """The value of every supported field label of `obj`, as selectors compare them."""
    return {name: get(obj) for name, get in supported.items()}
