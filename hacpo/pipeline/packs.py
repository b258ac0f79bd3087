"""A results folder without its weights, to carry to another machine: ``hacpo pack-results`` and
``hacpo unpack-results``.

A pack holds every finished run's record, evaluation, table, look and log of a results folder, and none of
its weights: no checkpoint and no starting point (``models/``, ``agents/``: the imported, warmed and built
models the runs train from). The starting points are rebuilt on the destination by the workflow itself, and
the pack records the SHA-256 of their weights so that unpacking can check the rebuilt ones are the very
models the packed runs started from (on one CPU type they come out bit for bit).

Two uses (docs/guide/watching.md, "Carrying results to another machine"):

- **Continue** a workflow, a sequential scorecard's looks above all, on another machine of the same CPU type:
  the packed runs count as done there, so ``snakemake decide_<name>`` goes on at the next look and trains
  only the seeds no machine has trained.
- **Pool** another machine type's runs (``--other-machine``): unpacked into a folder of their own and named
  in a scorecard's ``results_from:``.

Unpacking checks everything before it writes anything: the pack's machine type against this one, the
starting points' weights, and every file the destination already holds (an identical one is kept as it is,
a different one refuses the unpack, but for this machine's own logs and timings, which are kept). Files
land atomically, with modification times in the order the source wrote them and newer than the
destination's starting points, so Snakemake sees the packed jobs as up to date rather than as jobs to redo.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hacpo.pipeline.hooks import OWNER
from hacpo.provenance import machine, machine_type
from hacpo.runio import atomic_write_bytes, sha256_file

FORMAT = 1
MANIFEST = "hacpo-pack.json"  # the pack's first member
STARTING_POINTS = ("models", "agents")  # rebuilt on the destination: their weights are not carried
WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
KEPT_HERE = ("logs", "benchmarks")  # a job's log or timing on this machine is kept over the pack's


@dataclass
class Packed:
    """What :func:`pack` put in a pack: the files carried, the unfinished runs and evaluations it left out
    (in flight, or trained and awaiting an evaluation; they are redone where the pack is unpacked), and the
    machine types of its runs."""

    files: int
    bytes: int
    left_out: list[str]
    machine_types: list[str]


def _is_run(d: Path) -> bool:
    return (d / "run.json").is_file()


def _finished(d: Path) -> bool:
    """A run directory whose job finished (``done.json``, the train rule's output), or an evaluation whose
    summary was written; anything else is a job in flight or interrupted."""
    return (d / "done.json").is_file() if _is_run(d) else (d / "summary.json").is_file()


def _starting_point_weights(root: Path) -> dict[str, dict[str, str]]:
    """``{"models/<name>": {weight file: sha256}}`` for every starting point in ``root``."""
    out = {}
    for kind in STARTING_POINTS:
        for d in sorted(p for p in (root / kind).glob("*") if p.is_dir()):
            out[f"{kind}/{d.name}"] = {
                f.relative_to(d).as_posix(): sha256_file(f)
                for f in sorted(d.rglob("*"))
                if f.is_file() and f.suffix in WEIGHTS
            }
    return out


def _evaluations(root: Path, run: Path) -> set[tuple[str, str]]:
    """``(setting, agent)`` of every finished evaluation of a run's final agents: ``eval/<setting>/<run>/``
    for a one-agent run, ``eval/<setting>/<run>/<agent>/`` for a joint one (the evaluate rule's paths)."""
    agents = json.loads((run / "run.json").read_text()).get("final_checkpoints") or {}
    rel = run.relative_to(root / "runs")
    out = set()
    for setting in (p.name for p in (root / "eval").glob("*") if p.is_dir()):
        base = root / "eval" / setting / rel
        if len(agents) == 1 and (base / "summary.json").is_file():
            out.add((setting, next(iter(agents))))
        out |= {(setting, a) for a in agents if (base / a / "summary.json").is_file()}
    return out


def _awaiting_evaluation(root: Path, runs: list[Path]) -> list[Path]:
    """Finished runs without an evaluation that most of their other seeds have, two at least (same setting,
    same agent). Such an evaluation needs the checkpoints a pack leaves behind, so these runs are left out
    and trained again where the pack is unpacked. Not "one other seed": a table may evaluate seed 0 alone
    in a setting (Table 1 at 8k tokens) beside a multi-seed one; and a run no seed of which is evaluated
    (one for timings only) is carried. An evaluation the rule misses fails where the pack is unpacked, with
    the run to delete named."""
    evaluated = {run: _evaluations(root, run) for run in runs}
    designs: dict[Path, list[Path]] = {}
    for run in runs:
        designs.setdefault(run.parent, []).append(run)  # <design>/seed<k>: a run's other seeds
    awaiting = []
    for run, done in evaluated.items():
        others = [evaluated[o] for o in designs[run.parent] if o != run]
        have = [sum(e in o for o in others) for e in set().union(*others) - done]
        if any(n >= 2 and 2 * n > len(others) for n in have):
            awaiting.append(run)
    return awaiting


def _carried(root: Path) -> tuple[list[Path], list[str]]:
    """The files a pack carries, and the unfinished job directories it leaves out: runs and evaluations in
    flight, and trained runs still awaiting an evaluation (:func:`_awaiting_evaluation`)."""
    skip_dirs, left_out = set(), []
    for marker in [*root.glob("runs/**/run.json"), *root.glob("eval/**/*.samples.jsonl")]:
        d = marker.parent
        if d not in skip_dirs and not _finished(d):
            skip_dirs.add(d)
            left_out.append(d.relative_to(root).as_posix())
    trained = [m.parent for m in root.glob("runs/**/run.json") if m.parent not in skip_dirs]
    for d in _awaiting_evaluation(root, trained):
        skip_dirs.add(d)
        left_out.append(d.relative_to(root).as_posix())
    files = []
    for f in sorted(root.rglob("*")):
        rel = f.relative_to(root)
        if (
            not f.is_file()
            or f.is_symlink()
            or rel.parts[0] in STARTING_POINTS
            or (rel.parts[0] in KEPT_HERE and rel.parts[1:2] and rel.parts[1] in STARTING_POINTS)
            or "checkpoints" in rel.parts
            or f.suffix in WEIGHTS
            or any(part.startswith(".") for part in rel.parts)  # locks, temp files of atomic writes
            or any(d in f.parents for d in skip_dirs)
        ):
            continue
        files.append(f)
    return files, sorted(left_out)


def _run_records(files) -> list[dict]:
    return [json.loads(f.read_text()) for f in files if f.name == "run.json"]


def _machine_types(records: list[dict]) -> list[str]:
    return sorted({machine_type(r["machine"]) for r in records if r.get("machine")})


def _versions(records: list[dict]) -> dict[str, list[str]]:
    """Each package's versions among the runs (``run.json``'s ``versions``: hacpo, torch, …, the lock)."""
    seen: dict[str, set[str]] = {}
    for r in records:
        for pkg, v in r.get("versions", {}).items():
            seen.setdefault(pkg, set()).add(str(v))
    return {pkg: sorted(vs) for pkg, vs in sorted(seen.items())}


def drift(pack_file: str | Path) -> list[str]:
    """What differs between the packed runs and this machine within one machine type: package versions, the
    commit of hacpo's code, the CPU's generation (``cpu_id``). Runs added here continue the packed ones
    only as far as the same code computes the same numbers."""
    from hacpo.provenance import versions

    with tarfile.open(pack_file, "r:gz") as tar:
        manifest = read_manifest(tar, str(pack_file))
    here = {**versions(), "CPU": machine().get("cpu_id")}
    theirs = {**manifest.get("versions", {}), "CPU": manifest.get("cpu_ids", [])}
    return [
        f"{pkg} {', '.join(vs)} in the pack, {here.get(pkg) or 'none'} here"
        for pkg, vs in theirs.items()
        if vs and vs != [here.get(pkg)]
    ]


def pack(results: str | Path, out: str | Path) -> Packed:
    """Write ``out`` (a ``.tar.gz``): the finished part of the results folder ``results`` without weights,
    with a manifest first (what made it, its runs' machine types, its starting points' weight hashes)."""
    root = Path(results)
    if not (root / OWNER).is_file():
        raise ValueError(f"{root} is not a hacpo results folder (no {OWNER}); name a folder under results/")
    files, left_out = _carried(root)
    records = _run_records(files)
    types = _machine_types(records)
    manifest = {
        "format": FORMAT,
        "source": root.as_posix(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine_types": types,
        "versions": _versions(records),
        "cpu_ids": sorted({r["machine"]["cpu_id"] for r in records if r.get("machine", {}).get("cpu_id")}),
        "starting_points": _starting_point_weights(root),
        "left_out": left_out,
        # the order the source wrote them in, so the destination keeps Snakemake's view of what is newer
        "files": [f.relative_to(root).as_posix() for f in sorted(files, key=lambda f: f.stat().st_mtime_ns)],
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = json.dumps(manifest, indent=2).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mtime = len(data), time.time()
        tar.addfile(info, io.BytesIO(data))
        for rel in manifest["files"]:
            tar.add(root / rel, arcname=rel, recursive=False)
    atomic_write_bytes(out, buf.getvalue())
    return Packed(len(files), sum((root / f).stat().st_size for f in manifest["files"]), left_out, types)


def read_manifest(tar: tarfile.TarFile, where: str) -> dict:
    try:
        manifest = json.load(tar.extractfile(MANIFEST))
    except KeyError:
        raise ValueError(f"{where} is not a hacpo results pack (no {MANIFEST}); make one with "
                         "`hacpo pack-results`") from None  # fmt: skip
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{where} is a pack of format {manifest.get('format')}; this hacpo reads {FORMAT}")
    return manifest


def _check_machine(manifest: dict, dest: Path, other_machine: bool, where: str) -> None:
    here = machine_type(machine())
    theirs = manifest["machine_types"]
    if not other_machine and theirs and theirs != [here]:
        raise ValueError(
            f"{where} holds runs of {', '.join(theirs)}; this machine is {here}. Runs of another CPU type "
            "are another sample: they cannot be continued here. To pool them, unpack them into a folder of "
            "their own with --other-machine and name it in a scorecard's `results_from:`"
        )
    if other_machine:
        mine = _machine_types(_run_records(dest.glob("runs/**/run.json")))
        if mixed := sorted(set(mine) - set(theirs)):
            raise ValueError(
                f"{dest} holds runs of {', '.join(mixed)}, and --other-machine would put "
                f"{', '.join(theirs)}'s beside them: unpack into a folder of its own "
                "(results/<name>-<machine>/)"
            )


def _check_starting_points(manifest: dict, dest: Path, where: str, configs: list[str]) -> None:
    """Every starting point the packed runs trained from is built here, from the same weights (``configs``:
    the workflow configs that made them, for the command that builds them)."""
    built = _starting_point_weights(dest)
    missing = [rel for rel in manifest["starting_points"] if rel not in built]
    differ = [
        f"{rel} ({len(built[rel])} weight files here, {len(weights)} in the pack)"
        for rel, weights in manifest["starting_points"].items()
        if rel in built and built[rel] != weights
    ]
    if missing:
        marker = {"models": "hacpo-model.json", "agents": "agent.json"}
        folder = os.path.relpath(dest)  # a Snakemake target is relative to its working directory
        targets = " ".join(f"{folder}/{rel}/{marker[rel.split('/')[0]]}" for rel in missing)
        config = f"--configfile {configs[0].replace(', ', ' ')} " if configs else "--configfile <the config> "
        raise ValueError(
            f"{dest} lacks the models the packed runs start from (imported, warmed or built): "
            f"{', '.join(missing)}. Build them on this machine first (their weights are not in the pack): "
            f"snakemake -c2 {config}{targets}"
        )
    if differ:
        raise ValueError(
            f"the models built here are not the ones the runs of {where} started from: {'; '.join(differ)} "
            "differ in their weights (another hacpo, torch or CPU type built them). The packed runs cannot "
            "be continued here; unpack them with --other-machine into a folder of their own to read them"
        )


def unpack(pack_file: str | Path, results: str | Path, other_machine: bool = False) -> list[str]:
    """Unpack ``pack_file`` into the results folder ``results``; returns the files written. Checks first
    (see the module's docstring) and writes nothing if one fails."""
    dest, where = Path(results), str(pack_file)
    with tarfile.open(pack_file, "r:gz") as tar:
        manifest = read_manifest(tar, where)
        _check_machine(manifest, dest, other_machine, where)
        if not other_machine:
            owner = (dest / OWNER).read_bytes() if (dest / OWNER).is_file() else tar.extractfile(OWNER).read()
            _check_starting_points(manifest, dest, where, json.loads(owner)["configs"])
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest, prefix=".unpack-") as tmp:
            tar.extractall(tmp, members=[tar.getmember(f) for f in manifest["files"]], filter="data")
            new, conflicts = [], []
            for rel in manifest["files"]:
                mine, theirs = dest / rel, Path(tmp) / rel
                if rel == OWNER and mine.is_file():  # the configs of both, the destination's first
                    configs = json.loads(mine.read_text())["configs"]
                    configs += [c for c in json.loads(theirs.read_text())["configs"] if c not in configs]
                    theirs.write_text(json.dumps({"configs": configs}, indent=2) + "\n")
                    new.append(rel)
                elif not mine.exists():
                    new.append(rel)
                elif mine.read_bytes() != theirs.read_bytes() and rel.split("/")[0] not in KEPT_HERE:
                    conflicts.append(rel)
            if conflicts:
                shown = ", ".join(conflicts[:5]) + (
                    f" and {len(conflicts) - 5} more" if len(conflicts) > 5 else ""
                )
                raise ValueError(
                    f"{dest} already holds other versions of {len(conflicts)} of the pack's files ({shown}): "
                    "it is another workflow's folder, or ran these jobs itself. Unpack into an empty folder "
                    "or one that holds only its starting points"
                )
            start = time.time()  # newer than everything already here, in the order the source wrote them
            for rank, rel in enumerate(new):
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(Path(tmp) / rel, target)
                stamp = start + 1e-3 * rank
                os.utime(target, (stamp, stamp))
    return new
