"""Datasets of your own: a local JSONL, Parquet or CSV file and a field mapping, normalised into the records
every engine reads (``id``, ``problem``, ``answer``, ``family``, ``metadata``).

A workflow ``datasets:`` entry::

    my_train:
      local: data/my_train.parquet        # .jsonl, .parquet (pyarrow) or .csv, by its extension
      fields: {problem: question, answer: solution, id: uid}   # id: optional (default: a hash of the problem)

Every other field of a record is kept in its ``metadata`` (a record's own ``metadata`` object is merged in),
which is what a custom verifier receives (:mod:`hacpo.reward.custom`). :func:`load` reads and normalises
the whole file before any job runs: a missing file, an empty one, a record without a mapped field, or two
records with one id is a :class:`DatasetError` naming the key path and the record.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hacpo.runio import read_jsonl

FORMATS = {".jsonl": "jsonl", ".parquet": "parquet", ".csv": "csv"}


class DatasetError(ValueError):
    """A dataset of your own that cannot be used as it is; the message names the key path and the fix."""


class FieldMap(BaseModel):
    """Which of the file's fields is the problem, the answer and (optionally) the record's id."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    problem: str = Field("problem", min_length=1)
    answer: str = Field("answer", min_length=1)
    id: str | None = Field(None, min_length=1)


def read_records(path: str | Path, key: str) -> list[dict[str, Any]]:
    """The file's records as JSON values, in file order."""
    path = Path(path)
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise DatasetError(f"{key}: {path.name}: unknown format; give a {', '.join(FORMATS)} file")
    if not path.is_file():
        raise DatasetError(f"{key}: no file {path}")
    if kind == "csv":
        with path.open(newline="", encoding="utf-8") as f:
            return [dict(row) for row in csv.DictReader(f)]
    if kind == "parquet":
        try:
            import pandas as pd

            frame = pd.read_parquet(path)
        except ImportError as err:
            need = f"{key}: reading Parquet needs pyarrow: pip install 'hacpo[data]' ({err})"
            raise DatasetError(need) from err
        return json.loads(frame.to_json(orient="records", force_ascii=False))  # numpy values → JSON values
    try:
        return read_jsonl(path)  # each line a JSON object; errors name the file and line
    except ValueError as err:
        raise DatasetError(f"{key}: {err}") from err


def _text(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return value if isinstance(value, str) else str(value)


def normalise(rows: list[dict[str, Any]], fields: FieldMap, name: str, key: str) -> list[dict[str, Any]]:
    """Records ``{id, problem, answer, family: name, metadata}``; every problem found, not just the first."""
    from hacpo.data.synthetic import _pid

    if not rows:
        raise DatasetError(f"{key}: the file holds no records")
    out, errs, seen = [], [], {}
    for i, row in enumerate(rows):
        problem, answer = _text(row.get(fields.problem)), _text(row.get(fields.answer))
        for field, value in (("problem", problem), ("answer", answer)):
            if value is None:
                errs.append(f"{key}.fields.{field}: record {i} has no {getattr(fields, field)!r} "
                            f"(its fields: {', '.join(sorted(row))})")  # fmt: skip
        if problem is None or answer is None:
            continue
        rid = _text(row.get(fields.id)) if fields.id else _pid(name, problem)
        if rid is None:
            errs.append(f"{key}.fields.id: record {i} has no {fields.id!r}")
            continue
        if rid in seen:
            how = "" if fields.id else " (the same problem text; map `fields.id` to tell them apart)"
            errs.append(f"{key}: records {seen[rid]} and {i} have the same id {rid!r}{how}")
            continue
        seen[rid] = i
        mapped = {fields.problem, fields.answer, fields.id, "metadata"}
        metadata = {k: v for k, v in row.items() if k not in mapped}
        if isinstance(row.get("metadata"), dict):
            metadata |= row["metadata"]
        out.append({"id": rid, "problem": problem, "answer": answer, "family": name, "metadata": metadata})
    if errs:
        more = f"\n… and {len(errs) - 10} more" if len(errs) > 10 else ""
        raise DatasetError("\n".join(errs[:10]) + more)
    return out


def load(path: str | Path, fields: FieldMap | dict | None, name: str, key: str) -> list[dict[str, Any]]:
    """Read and normalise one dataset of your own (``key``: its config path, for the errors)."""
    fields = fields if isinstance(fields, FieldMap) else FieldMap(**(fields or {}))
    return normalise(read_records(path, key), fields, name, key)
