"""What a custom resource's structural schema refuses: kube-apiserver's apiextensions validation, cause by cause.

Owns `causes(...)`: the (reason, field, message) triples a real server puts in a 422 `Invalid` Status's
`details.causes` for a value against a `structural.Schema`, with kube-openapi's checks and wording
(type, date-time format, maxLength, minimum/maximum with their exclusive forms, maxItems, enum,
maxProperties, required; the "Checked value must be of type integer" quirk for fractional numbers) and
apimachinery's field errors (`FieldValueTypeInvalid`, `FieldValueTooLong`, `FieldValueTooMany`,
`FieldValueNotSupported`, `FieldValueRequired`, `FieldValueInvalid`), values printed as Go prints
them. On updates it ratchets as CRDValidationRatcheting does: a subtree equal to the old one is not
held to the schema (objects correlate by key, lists not at all: none of the schemas served declares a
list type). Then the only CEL rule carried out, `self == oldSelf` (`structural.IMMUTABLE_RULE`), which
the real server skips, saying so in one more cause, when the schema errors include a blocking one.

The real server walks properties in Go map order, so the order of its causes varies from one request
to the next; this module gives them in schema order. How it fails: never; it only reports.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
from dataclasses import dataclass
from typing import Any

import orjson

from kcover.sim import structural

Cause = tuple[str, str, str]  # (reason, field, message), as `status.invalid` takes them
_MISSING: Any = object()
_INT64 = (-(2**63), 2**63 - 1)
_TIME = re.compile(r"^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$")
_BLOCKING = frozenset({"FieldValueNotSupported", "FieldValueRequired", "FieldValueTooLong", "FieldValueTooMany",
                       "FieldValueTypeInvalid"})
RULES_NOT_CHECKED = ("Invalid value: null: some validation rules were not checked because the object was invalid; "
                     "correct the existing errors to complete validation")


# --- how Go prints values ---------------------------------------------------------------------

def go_float(f: float) -> str:
    """`fmt.Sprint(f)` for a float64: the shortest digits, an exponent below 1e-4 and from 1e6 on."""
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    if f == 0:
        return "-0" if math.copysign(1.0, f) < 0 else "0"
    sign, digits, exponent = decimal.Decimal(repr(f)).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    e10 = len(digits) + exponent - 1
    if e10 < -4 or e10 >= 6:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        out = f"{mantissa}e{'-' if e10 < 0 else '+'}{abs(e10):02d}"
    elif exponent >= 0:
        out = text + "0" * exponent
    elif -exponent >= len(text):
        out = "0." + "0" * (-exponent - len(text)) + text
    else:
        out = text[:exponent] + "." + text[exponent:]
    return ("-" if sign else "") + out


def go_quote(text: str) -> str:
    """`strconv.Quote`: double quotes, backslash escapes for quotes, backslashes and control characters."""
    escapes = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\a": "\\a", "\b": "\\b",
               "\f": "\\f", "\v": "\\v"}
    out = []
    for ch in text:
        if ch in escapes:
            out.append(escapes[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def go_value(value: Any) -> str:
    """A bad value as an apimachinery field error prints it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if _INT64[0] <= value <= _INT64[1] else go_float(float(value))
    if isinstance(value, float):
        return go_float(value)
    if isinstance(value, str):
        return go_quote(value)
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _type_of(value: Any) -> str:
    """The JSON type kube-openapi sees in a decoded value (Go decodes integers past int64 to float64)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer" if _INT64[0] <= value <= _INT64[1] else "number"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _format_of(value: Any) -> str:
    kind = _type_of(value)
    return "int64" if kind == "integer" else "float64" if kind == "number" else ""


def is_date_time(text: str) -> bool:
    """kube-openapi's `IsDateTime`: an RFC 3339 date, `T`, a time with seconds and a zone (any case)."""
    if len(text) < 4:
        return False
    parts = text.lower().split("t")
    if len(parts) < 2:
        return False
    try:
        dt.datetime.strptime(parts[0], "%Y-%m-%d")
    except ValueError:
        return False
    if len(parts[0]) != 10:
        return False
    m = _TIME.match(parts[1])
    return m is not None and m.group(1) <= "23" and m.group(2) <= "59" and m.group(3) <= "59"


# --- the walk ---------------------------------------------------------------------------------

@dataclass
class _Walk:
    """One validation: where causes go and how paths are named."""

    field_root: str  # "" for the whole object, "status" for a /status write
    out: list[Cause]

    def field(self, path: str) -> str:
        path = path.lstrip(".")
        if not self.field_root:
            return path
        return f"{self.field_root}.{path}" if path else self.field_root

    def add(self, reason: str, path: str, message: str) -> None:
        self.out.append((reason, self.field(path), message))

    def type_error(self, path: str, expected: str, got: str) -> None:
        self.add("FieldValueTypeInvalid", path,
                 f"Invalid value: {go_quote(got)}: {path} in body must be of type {expected}: {go_quote(got)}")


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _node(w: _Walk, value: Any, s: structural.Schema, path: str, old: Any) -> None:
    """Check `value` (at kube-openapi path `path`) against `s`; `old` is its correlated old value or _MISSING."""
    if old is not _MISSING and value == old and type(value) is type(old):
        return  # ratcheting: an unchanged subtree is not held to the schema
    if value is None:
        if s.type and not s.nullable:
            w.type_error(path, s.type, "null")
        _enum(w, value, s, path)
        return
    _type(w, value, s, path)
    if isinstance(value, str):
        if s.max_length is not None and len(value) > s.max_length:
            unit = "byte" if s.max_length == 1 else "bytes"
            w.add("FieldValueTooLong", path, f"Too long: may not be more than {s.max_length} {unit}")
        if s.format == "date-time" and not is_date_time(value):
            w.add("FieldValueTypeInvalid", path, f"Invalid value: {go_quote(value)}: {path} in body must be of "
                  f"type date-time: {go_quote(value)}")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _number(w, value, s, path)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if s.items is not None:
                _node(w, item, s.items, f"{path}[{i}]", _MISSING)
        if s.max_items is not None and len(value) > s.max_items:
            _too_many(w, path, len(value), s.max_items)
    _enum(w, value, s, path)
    if isinstance(value, dict):
        _object(w, value, s, path, old if isinstance(old, dict) else {})


def _type(w: _Walk, value: Any, s: structural.Schema, path: str) -> None:
    """kube-openapi's type validator (its format branches included)."""
    got = _type_of(value)
    json_integer = isinstance(value, float) and value.is_integer() and abs(value) <= 2.0**53
    fits = got == s.type or (json_integer and s.type == "integer") or (got == "integer" and s.type == "number")
    if s.format and got not in ("string", "array"):
        if not fits:
            w.type_error(path, s.format, _format_of(value))
        return
    if s.format and s.type not in ("number", "integer"):
        return
    if s.type and not fits:
        w.type_error(path, s.type, got)


def _number(w: _Walk, value: float, s: structural.Schema, path: str) -> None:
    integral = isinstance(value, float) and value.is_integer() and _INT64[0] <= value <= _INT64[1]
    if s.type == "integer" and _type_of(value) == "number" and not integral:  # a fraction, or past int64
        w.out.append(("FieldValueInvalid", w.field_root or "<nil>", f'Invalid value: "": Checked value must be '
                      f"of type integer (default format) in {path}"))
    number = float(value)
    if s.maximum is not None and (number >= s.maximum if s.exclusive_maximum else number > s.maximum):
        how = "less than" if s.exclusive_maximum else "less than or equal to"
        w.add("FieldValueInvalid", path, f"Invalid value: {go_value(value)}: {path} in body should be {how} "
              f"{go_float(s.maximum)}")
    if s.minimum is not None and (number <= s.minimum if s.exclusive_minimum else number < s.minimum):
        how = "greater than" if s.exclusive_minimum else "greater than or equal to"
        w.add("FieldValueInvalid", path, f"Invalid value: {go_value(value)}: {path} in body should be {how} "
              f"{go_float(s.minimum)}")


def _too_many(w: _Walk, path: str, count: int, limit: int) -> None:
    unit = "item" if limit == 1 else "items"
    w.add("FieldValueTooMany", path, f"Too many: {count}: must have at most {limit} {unit}")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def _enum(w: _Walk, value: Any, s: structural.Schema, path: str) -> None:
    if s.enum is None or any(_same(value, e) for e in s.enum):
        return
    allowed = ", ".join(go_quote(e if isinstance(e, str) else orjson.dumps(e).decode()) for e in s.enum)
    w.add("FieldValueNotSupported", path, f"Unsupported value: {go_value(value)}: supported values: {allowed}")


def _object(w: _Walk, value: dict[str, Any], s: structural.Schema, path: str, old: dict[str, Any]) -> None:
    if s.max_properties is not None and len(value) > s.max_properties:
        _too_many(w, path, len(value), s.max_properties)
    if s.additional is not None:
        for key, item in value.items():
            if key not in s.properties:
                _node(w, item, s.additional, f"{path}.{key}", old.get(key, _MISSING))
    for key, prop in s.properties.items():
        if key in value:
            _node(w, value[key], prop, _child(path, key), old.get(key, _MISSING))
    for key in s.required:
        if key not in value:
            w.add("FieldValueRequired", f"{path}.{key}", "Required value")


def _rules(w: _Walk, value: Any, s: structural.Schema, path: str, old: Any) -> None:
    """`self == oldSelf` rules, on updates (transition rules need the old value)."""
    if old is _MISSING or not s.has_rules:
        return
    if s.immutable_message is not None and not (value == old and type(value) is type(old)):
        w.add("FieldValueInvalid", path, f"Invalid value: {s.immutable_message}")
    if isinstance(value, dict) and isinstance(old, dict):
        for key, prop in s.properties.items():
            if key in value and key in old:
                _rules(w, value[key], prop, _child(path, key), old[key])


def causes(value: Any, s: structural.Schema, *, old: Any = _MISSING, field_root: str = "",
           rules_on: Any = _MISSING, rules_old: Any = _MISSING, rules_schema: structural.Schema | None = None
           ) -> list[Cause]:
    """Why `value` (the object, or its status with `field_root="status"`) does not pass `s`; `old` the stored
    value on updates. The CEL rules run over `rules_on` against `rules_old` with `rules_schema` (the whole
    object and the resource's schema; by default `value`, `old` and `s`)."""
    w = _Walk(field_root, [])
    _node(w, value, s, "", old)
    rs = s if rules_schema is None else rules_schema
    if not rs.has_rules:
        return w.out
    if any(reason in _BLOCKING for reason, _, _ in w.out):
        w.out.append(("FieldValueInvalid", "<nil>", RULES_NOT_CHECKED))
        return w.out
    on, was = (value, old) if rules_on is _MISSING else (rules_on, rules_old)
    rule_walk = _Walk("", w.out)
    _rules(rule_walk, on, rs, "", was)
    return w.out


MISSING = _MISSING
"""No old value: a create."""
