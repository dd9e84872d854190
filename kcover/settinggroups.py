"""The base of kcover's settings groups: what a group refuses besides one field's own bad value.

Owns `Group`, the pydantic model every group of `kcover.settings` derives from (unknown fields refused,
defaults validated), with its removed settings (`Group.removed`: a file still naming one is refused with
what replaced it, at the field) and its relations between fields (`Group.relations`, judged after the
fields), and the error types of both (`REMOVED`, `RELATION`). It does not own any group or the root
(`kcover.settings`), nor merging the sources (`kcover.layering`).

Fails with one `pydantic.ValidationError` holding every line at once: the removed settings, the fields'
own errors, and the relations among the fields that did validate (a relation that reads an invalid field
is left for the next run).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple

from pydantic import BaseModel, ConfigDict, ModelWrapValidatorHandler, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

REMOVED = "removed_setting"
"""Error type of a setting that no longer exists (see `Group.removed`)."""
RELATION = "settings_relation"
"""Error type of a field that contradicts another field of its group (see `Group.relations`)."""


def _error(kind: str, message: str, field: str, value: Any) -> InitErrorDetails:
    return {"type": PydanticCustomError(kind, message), "loc": (field,), "input": value}


class Relation(NamedTuple):
    """A field that contradicts another one of its group (`Group.relations`)."""

    field: str
    problem: str
    others: tuple[str, ...] = ()
    """The group's other fields the judgement read: it is not made while one of them is itself invalid."""


def _reraised(exc: ValidationError) -> list[InitErrorDetails]:
    """A ValidationError's lines as details to raise again together with others (type and message kept)."""
    return [{"type": PydanticCustomError(e["type"], e["msg"]), "loc": e["loc"], "input": e["input"]}
            for e in exc.errors()]


class Group(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)

    removed: ClassVar[Mapping[str, str]] = {}
    """Settings this group no longer has -> what to do instead. A file still naming one is refused with that
    text, at the field, rather than the generic "extra inputs are not permitted"."""

    def relations(self) -> list[Relation]:
        """Each field that contradicts another one; checked after the fields."""
        return []

    @model_validator(mode="wrap")
    @classmethod
    def _check_group(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        gone = [k for k in data if k in cls.removed] if isinstance(data, Mapping) else []
        details = [_error(REMOVED, f"removed setting: {cls.removed[k]}", k, data[k]) for k in gone]
        kept = {k: v for k, v in data.items() if k not in gone} if gone else data
        try:
            group = handler(kept)
        except ValidationError as exc:
            details += _reraised(exc)
            details += cls._relations_beside(kept, exc, handler)
        else:
            details += [_error(RELATION, r.problem, r.field, getattr(group, r.field)) for r in group.relations()]
            if not details:
                return group
        raise ValidationError.from_exception_data(cls.__name__, details)

    @classmethod
    def _relations_beside(cls, data: Any, exc: ValidationError,
                          handler: ModelWrapValidatorHandler[Any]) -> list[InitErrorDetails]:
        """The relations among the fields that did validate, so that one run reports them with the field errors
        (a relation that reads an invalid field is left for the next run)."""
        bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
        if not isinstance(data, Mapping) or not bad:
            return []
        try:
            group = handler({k: v for k, v in data.items() if k not in bad})
        except ValidationError:
            return []  # an error outside the fields (a nested group's own): nothing more to judge
        return [_error(RELATION, r.problem, r.field, getattr(group, r.field)) for r in group.relations()
                if r.field not in bad and not bad & set(r.others)]
