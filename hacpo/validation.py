"""What a pydantic validation error tells a user: each problem by its key path, and for an unknown key the
closest key the model has (``lrr: Extra inputs are not permitted (did you mean lr?)``), at any depth."""

from __future__ import annotations

import difflib
import typing

from pydantic import BaseModel, ValidationError


def _models_in(annotation) -> list[type[BaseModel]]:
    """The pydantic models a field's type can hold (through Optional, unions, list, dict, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _keys(model: type[BaseModel]) -> set[str]:
    """The keys ``model`` reads: its field names and their aliases."""
    keys = set(model.model_fields)
    for f in model.model_fields.values():
        keys |= {a for a in (f.alias, f.validation_alias) if isinstance(a, str)}
    return keys


def _field(model: type[BaseModel], key):
    return next((f for n, f in model.model_fields.items() if key in (n, f.alias)), None)


def _models_at(root: type[BaseModel], path) -> list[type[BaseModel]]:
    """The models that may sit at ``path`` under ``root``. A part that names no field (a list index, a dict
    key, pydantic's tag for a union member or a validator) keeps the models found so far."""
    models = [root]
    for part in path:
        fields = [f for m in models if (f := _field(m, part)) is not None]
        if fields:
            models = [m for f in fields for m in _models_in(f.annotation)]
    return models


def did_you_mean(root: type[BaseModel], loc: tuple) -> str:
    """`` (did you mean KEY?)`` for an unknown key at ``loc``: the closest key of the model there, or ''."""
    if not loc or not isinstance(loc[-1], str):
        return ""
    candidates = sorted({k for m in _models_at(root, loc[:-1]) for k in _keys(m)})
    close = difflib.get_close_matches(loc[-1], candidates, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def problem_lines(root: type[BaseModel], err: ValidationError) -> list[tuple[str, str]]:
    """(key path, message) for each problem of ``err`` (from validating ``root``), an unknown key's message
    with the closest known key."""
    out = []
    for e in err.errors():
        shown = [str(x) for x in e["loc"] if not str(x).endswith("Table]") and "function-" not in str(x)]
        loc = ".".join(shown)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg += did_you_mean(root, e["loc"])
        out.append((loc, msg))
    return out
