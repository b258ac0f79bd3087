"""Reading the files a report is made of, with errors that name the table row that needed them (tables and
the claims scorecard read the same run and evaluation files)."""

from __future__ import annotations

import json
from pathlib import Path

from hacpo.runio import read_jsonl


def read_json(path: str | Path, where: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{where}: file {str(p)!r} does not exist")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: {str(p)!r} is not valid JSON ({err})") from err


def read_rows(path: str | Path, where: str) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{where}: file {str(p)!r} does not exist")
    try:
        return read_jsonl(p)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from err


def required(d: dict, key: str, where: str):
    """``d[key]``; a missing key (or a ``d`` that is no mapping) is an error naming ``where``."""
    if not isinstance(d, dict) or key not in d:
        raise ValueError(f"{where}: missing key {key!r}")
    return d[key]
