"""Prepare the paper's datasets: find a source, normalise, check, write JSONL atomically, return a manifest.

Sources, in order (the first that exists wins):

1. ``local_file`` — an explicit file (CLI ``--file``, config key ``datasets.<name>.file``);
2. the cache folder — ``<cache_dir>/<local file name>`` (the registry's name, ``.jsonl`` or ``.jsonl.gz``);
   ``cache_dir`` defaults to ``$HACPO_DATA_CACHE`` or ``~/.cache/hacpo/datasets``;
3. the Hugging Face Hub — ``datasets.load_dataset(hub_id, config, split=..., revision=<pinned sha>)``
   (``datasets`` is imported lazily; not a dependency of the package). The raw rows are then saved to the
   cache under the local file name, so the next run is offline.

Offline (``allow_download=False``, or ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` set) with no file, or no
``datasets`` package, raises :class:`DatasetNotAvailableError` (a ``FileNotFoundError``) naming the dataset,
every path searched and how to provide it.

Checks before anything is written: the record count equals the registry's expected count (unless
``expect_count=False``, for subsets), every record has a gold answer (else :class:`GoldAnswerError` with the
record ids), and ids are unique. The output is written atomically (temp file + ``os.replace``); ``.gz``
output is gzip with a zero mtime, so identical data gives identical bytes and sha256.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hacpo.data.registry import DatasetSpec, GoldAnswerError, get, names, normalise_record
from hacpo.runio import atomic_write_bytes, atomic_write_json, read_jsonl, sha256_file

__all__ = [
    "DatasetCountError",
    "DatasetNotAvailableError",
    "GoldAnswerError",
    "add_cli",
    "default_cache_dir",
    "load_raw",
    "normalise_rows",
    "prepare_dataset",
    "update_manifest",
    "write_manifest",
]

MANIFEST_VERSION = 1


class DatasetNotAvailableError(FileNotFoundError):
    """No local file, no cached copy, and the Hub cannot be used (offline, or ``datasets`` not installed)."""


class DatasetCountError(ValueError):
    """The number of records differs from the registry's expected count."""


def default_cache_dir() -> Path:
    env = os.environ.get("HACPO_DATA_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "hacpo" / "datasets"


def _offline_env() -> bool:
    return any(
        os.environ.get(k, "").strip().lower() in ("1", "true", "yes")
        for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


# ----------------------------------------------------------------------------------------------------------
# Reading and writing
# ----------------------------------------------------------------------------------------------------------


def _jsonl_bytes(rows: Iterable[Mapping[str, Any]], gz: bool) -> bytes:
    text = "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows).encode("utf-8")
    if not gz:
        return text
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as f:
        f.write(text)
    return buf.getvalue()


# ----------------------------------------------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------------------------------------------


def _how_to_provide(spec: DatasetSpec, cache: Path) -> str:
    config = f" (config {spec.config})" if spec.config else ""
    return (
        f"Provide it in one of these ways: (0) on a node with internet, `hacpo prefetch --configfile <your "
        f"config files>` fetches every dataset and model of a workflow config into {cache}; (1) pass "
        f"--file PATH (config key datasets.{spec.name}.file) "
        f"pointing to a JSONL copy with the fields of {spec.hub_id}; (2) put {spec.local_file} into {cache}; "
        f"(3) run online once with `pip install datasets` and `hacpo prepare-data --dataset {spec.name} "
        f"--cache {cache} --out results/data/{spec.name}.jsonl`, which downloads {spec.hub_id}{config} split "
        f"{spec.split} at revision {spec.revision} and caches it."
    )


def _download(spec: DatasetSpec, cache: Path) -> tuple[list[dict[str, Any]], str]:
    import datasets  # lazy: optional dependency

    ds = datasets.load_dataset(spec.hub_id, spec.config, split=spec.split, revision=spec.revision)
    rows = [dict(r) for r in ds]
    target = cache / spec.local_file
    atomic_write_bytes(target, _jsonl_bytes(rows, target.name.endswith(".gz")))
    return rows, f"hub:{spec.hub_id}@{spec.revision}"


def load_raw(
    name: str,
    *,
    local_file: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    allow_download: bool = True,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Raw rows of ``name`` and the source used: ``{"kind": "file"|"cache"|"hub", "path", "sha256"}``.

    See the module docstring for the order. An explicit ``local_file`` that does not exist is an error (it is
    not silently replaced by another source).
    """
    spec = get(name)
    if local_file is not None:
        p = Path(local_file)
        if not p.is_file():
            raise DatasetNotAvailableError(
                f"dataset {spec.name!r}: the given file {str(p)!r} does not exist "
                f"(expected a JSONL copy such as {spec.local_file})"
            )
        return read_jsonl(p), {"kind": "file", "path": str(p), "sha256": sha256_file(p)}
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    searched = [cache / f for f in spec.local_file_names]
    for p in searched:
        if p.is_file():
            return read_jsonl(p), {"kind": "cache", "path": str(p), "sha256": sha256_file(p)}
    why = None
    if not allow_download:
        why = "downloading is disabled (--offline)"
    elif _offline_env():
        why = "HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set"
    else:
        try:
            import datasets  # noqa: F401
        except ImportError:
            why = "the Hugging Face `datasets` package is not installed (pip install datasets)"
    if why is None:
        try:
            rows, src = _download(spec, cache)
        except Exception as e:  # network, auth, missing revision ...
            why = f"the download failed: {type(e).__name__}: {e}"
        else:
            target = cache / spec.local_file
            return rows, {"kind": "hub", "path": src, "cache": str(target), "sha256": sha256_file(target)}
    raise DatasetNotAvailableError(
        f"dataset {spec.name!r} is not available: no local file given, none of "
        f"{', '.join(repr(str(p)) for p in searched)} exists, and {why}. {_how_to_provide(spec, cache)}"
    )


# ----------------------------------------------------------------------------------------------------------
# Normalise, check, write
# ----------------------------------------------------------------------------------------------------------


def normalise_rows(spec: DatasetSpec, rows: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Normalise every row; :class:`GoldAnswerError` (naming the ids) if any gold is missing, ``ValueError``
    on duplicate ids."""
    out = [normalise_record(spec, r, i) for i, r in enumerate(rows)]
    missing = [r["id"] for r in out if not r["answer"]]
    if missing:
        shown = ", ".join(missing[:10]) + (f" … ({len(missing)} in all)" if len(missing) > 10 else "")
        raise GoldAnswerError(
            f"dataset {spec.name!r}: no gold answer could be extracted from field {spec.answer_field!r} for "
            f"record(s) {shown}; fix the extraction or add a documented override (registry gold_overrides)"
        )
    seen: set[str] = set()
    dups = [r["id"] for r in out if r["id"] in seen or seen.add(r["id"])]
    if dups:
        raise ValueError(f"dataset {spec.name!r}: duplicate record ids {', '.join(dups[:10])}")
    return out


def prepare_dataset(
    name: str,
    out_path: str | os.PathLike,
    *,
    local_file: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    allow_download: bool = True,
    expect_count: bool = True,
    prompt_style: str | None = None,
) -> dict[str, Any]:
    """Prepare ``name`` into ``out_path`` (normalised JSONL; gzip if it ends in ``.gz``); return its manifest
    entry. Nothing is written when a check fails. With ``prompt_style`` (e.g. ``"paper"``) every record also
    gets ``prompt``, the user message in that wording (what an engine that reads prompt files, such as
    OpenRLHF's ``input_key``, wraps in the model's chat template)."""
    spec = get(name)
    rows, source = load_raw(name, local_file=local_file, cache_dir=cache_dir, allow_download=allow_download)
    if expect_count and len(rows) != spec.expected_count:
        raise DatasetCountError(
            f"dataset {spec.name!r}: {len(rows)} records in {source['path']}, expected {spec.expected_count} "
            f"({spec.hub_id} split {spec.split}); use expect_count=False (--no-count-check) for a subset"
        )
    records = normalise_rows(spec, rows)
    if prompt_style is not None:
        from hacpo.data.synthetic import as_problem, user_message

        for r in records:
            r["prompt"] = user_message(as_problem(r), prompt_style)
    out = Path(out_path)
    atomic_write_bytes(out, _jsonl_bytes(records, out.name.endswith(".gz")))
    return {
        "name": spec.name,
        "hub_id": spec.hub_id,
        "revision": spec.revision,
        "config": spec.config,
        "split": spec.split,
        "source": source["path"],
        "source_kind": source["kind"],
        "source_sha256": source["sha256"],
        "count": len(records),
        "expected_count": spec.expected_count,
        "count_checked": bool(expect_count),
        "output": str(out),
        "sha256": sha256_file(out),
        "missing_gold": 0,
        "prompt_style": prompt_style,
        "gold_overrides": sum(1 for r in records if "gold_override" in r["metadata"]),
    }


def write_manifest(entries: Iterable[Mapping[str, Any]], path: str | os.PathLike) -> Path:
    """Write ``{"version": 1, "datasets": {name: entry}}`` atomically (later entries of a name win)."""
    datasets = {str(e["name"]): dict(e) for e in entries}
    path = Path(path)
    atomic_write_json(path, {"version": MANIFEST_VERSION, "datasets": datasets})
    return path


def update_manifest(entry: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Add or replace one entry in the manifest at ``path`` (created if absent). Not safe against concurrent
    writers of the same file: give parallel jobs separate manifests."""
    path = Path(path)
    entries: list[Mapping[str, Any]] = []
    if path.is_file():
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        entries = list((old.get("datasets") or {}).values())
    return write_manifest([*entries, entry], path)


# ----------------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------------


def cmd_prepare_data(args) -> int:
    entry = prepare_dataset(
        args.dataset,
        args.out or f"results/data/{args.dataset}.jsonl",
        local_file=args.file,
        cache_dir=args.cache,
        allow_download=not args.offline,
        expect_count=not args.no_count_check,
    )
    if args.manifest:
        update_manifest(entry, args.manifest)
    print(json.dumps(entry, sort_keys=True))
    return 0


def add_cli(subparsers) -> Any:
    """Register ``prepare-data`` on an ``argparse`` subparsers object; returns the new parser."""
    p = subparsers.add_parser(
        "prepare-data",
        help="prepare one of the paper's datasets (local file → cache → Hugging Face Hub) as JSONL",
    )
    p.add_argument("--dataset", required=True, help=f"one of: {', '.join(names())}")
    p.add_argument(
        "--file", default=None, help="local JSONL(.gz) copy to read (config key datasets.<name>.file)"
    )
    p.add_argument(
        "--cache", default=None, help="cache folder (default $HACPO_DATA_CACHE or ~/.cache/hacpo/datasets)"
    )
    p.add_argument("--offline", action="store_true", help="never download from the Hub")
    p.add_argument("--out", default=None, help="output JSONL (.gz = gzip); default results/data/<name>.jsonl")
    p.add_argument("--manifest", default=None, help="manifest JSON to add this dataset's entry to")
    p.add_argument(
        "--no-count-check", action="store_true", help="allow a record count other than the canonical one"
    )
    p.set_defaults(func=cmd_prepare_data)
    return p
