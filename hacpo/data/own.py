"""Datasets of your own: a local JSONL, Parquet or CSV file, or a Hub dataset at a pinned revision, and a
field mapping, normalised into the records every engine reads (``id``, ``problem``, ``answer``, ``family``,
``metadata``).

A workflow ``datasets:`` entry::

    my_train:
      local: data/my_train.parquet        # .jsonl, .parquet (pyarrow) or .csv, by its extension
      fields: {problem: question, answer: solution, id: uid}   # id: optional (default: a hash of the problem)
    my_test:
      hub: {repo: org/name, revision: <40-hex commit>, split: test, config: null}   # the Hub, where reachable
      fields: {problem: question, answer: solution}

A Hub dataset is read once with ``datasets.load_dataset`` at its commit and kept as JSONL in the data cache
(``$HACPO_DATA_CACHE``, default ``~/.cache/hacpo/datasets``, under ``own/``): offline, or without the Hub,
that copy is what is read (put one there by hand to run offline), and without it the error names the file.

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


class HubDataset(BaseModel):
    """A Hub dataset at a pinned commit: ``repo`` (``org/name``), ``revision`` (40 hex digits: a branch or
    tag moves, and the runs that read it would change without their identity changing), ``split``,
    ``config`` (the dataset's subset, where it has several)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    repo: str = Field(pattern=r"^[\w.-]+/[\w.-]+$", description="The Hub dataset's id, `org/name`.")
    revision: str = Field(pattern=r"^[0-9a-f]{40}$", description="The commit to read, 40 hex digits (a "
                          "branch or tag would move under the runs that read it).")
    split: str = Field("train", description="The split to read.")
    config: str | None = Field(None, description="The dataset's subset, where it has several.")

    def cache_file(self, cache: Path) -> Path:
        subset = f"-{self.config}" if self.config else ""
        return cache / "own" / f"{self.repo.replace('/', '__')}@{self.revision}{subset}-{self.split}.jsonl"


class FieldMap(BaseModel):
    """Which of the file's fields is the problem, the answer and (optionally) the record's id."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    problem: str = Field("problem", min_length=1, description="The field holding the problem text.")
    answer: str = Field("answer", min_length=1, description="The field holding the reference answer.")
    id: str | None = Field(None, min_length=1, description="The field holding the record's id; unset: a hash "
                           "of the dataset's name and the problem text.")


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


def hub_file(hub: HubDataset | dict, key: str, cache: str | Path | None = None) -> Path:
    """The Hub dataset's JSONL copy in the data cache, downloaded at its revision when not there yet."""
    from hacpo.data.prepare import _jsonl_bytes, _offline_env, default_cache_dir
    from hacpo.runio import atomic_write_bytes

    hub = hub if isinstance(hub, HubDataset) else HubDataset(**hub)
    target = hub.cache_file(Path(cache) if cache is not None else default_cache_dir())
    if target.is_file():
        return target
    where = f"{hub.repo}@{hub.revision[:12]} ({hub.split})"
    if _offline_env():
        raise DatasetError(
            f"{key}.hub: {where} is not in the data cache and HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set: "
            f"run `hacpo prefetch --configfile <your config files>` on a node with internet, put its records "
            f"at {target} (JSONL) or unset it"
        )
    try:
        import datasets
    except ImportError:
        need = "reading the Hub needs the `datasets` package: pip install 'hacpo[data]'"
        raise DatasetError(f"{key}.hub: {need}") from None
    try:
        ds = datasets.load_dataset(hub.repo, hub.config, split=hub.split, revision=hub.revision)
        rows = [dict(r) for r in ds]
    except Exception as err:  # network, auth, a revision or split that does not exist
        raise DatasetError(
            f"{key}.hub: {where} could not be read: {type(err).__name__}: {err} (offline: put its records "
            f"at {target})"
        ) from err
    atomic_write_bytes(target, _jsonl_bytes(rows, False))
    return target


def load_entry(entry: dict, name: str, key: str, cache: str | Path | None = None) -> tuple[list[dict], Path]:
    """A ``local:`` or ``hub:`` dataset entry (as the workflow config gives it) normalised, and the file read
    (the local file, or the Hub dataset's cached copy)."""
    path = Path(entry["local"]) if entry.get("local") is not None else hub_file(entry["hub"], key, cache)
    return load(path, entry.get("fields"), name, key), path
