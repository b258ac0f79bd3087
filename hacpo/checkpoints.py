"""A checkpoint's integrity, one rule for both engines: a manifest of every file (name, bytes, SHA-256)
written last, checked before a resume; a damaged newest checkpoint set aside and the run resumed from the
newest intact one; a completed run's checkpoints cut to its final weights, and its weights released once its
evaluations are written (docs/guide/watching.md, "Disk")."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

from hacpo.runio import WEIGHTS_RELEASED, RunRecord, atomic_write_json, rename_to_free, sha256_file

CHECKPOINT_MANIFEST = "hacpo-checkpoint.json"  # what a checkpoint holds: its last write


def write_checkpoint_manifest(folder: str | Path) -> None:
    """Record every file of a checkpoint folder (name, bytes, SHA-256) in :data:`CHECKPOINT_MANIFEST`, the
    folder's last write: a checkpoint damaged later (a disk error, a copy cut short) no longer matches it."""
    folder = Path(folder)
    files = {
        p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != CHECKPOINT_MANIFEST
    }
    atomic_write_json(folder / CHECKPOINT_MANIFEST, {"version": 1, "files": files})


def keep_final_weights(
    checkpoints: str | Path, final_step: int, trainer_state: str = "trainer_state.pt"
) -> int:
    """A completed run's ``checkpoints/<agent>/step-*`` cut to the final step's weights: every other step
    removed, the final one's ``trainer_state`` dropped (its manifest rewritten first, so a kill midway
    leaves an intact checkpoint either way). Returns the bytes freed."""
    freed = 0
    for agent in sorted(p for p in Path(checkpoints).iterdir() if p.is_dir()):
        final = agent / f"step-{final_step}"
        if not final.is_dir():
            raise FileNotFoundError(f"{final} is missing: not a completed run of {final_step} steps")
        for old in agent.glob("step-*"):
            if old != final and old.is_dir():
                freed += sum(f.stat().st_size for f in old.rglob("*") if f.is_file())
                shutil.rmtree(old)
        state = final / trainer_state
        if state.is_file():
            freed += state.stat().st_size
            keep = {n: v for n, v in _manifest_files(final).items() if n != trainer_state}
            atomic_write_json(final / CHECKPOINT_MANIFEST, {"version": 1, "files": keep})
            state.unlink()
    return freed


# Where a run keeps weights: its checkpoints (both engines), OpenRLHF's DeepSpeed states and final models
WEIGHT_FOLDERS = ("checkpoints", "openrlhf/ckpt", "openrlhf/final", "openrlhf/agents/*/ckpt",
                  "openrlhf/agents/*/final")  # fmt: skip
RELEASING = ".releasing"  # a weight folder being removed is first renamed into this hidden folder


def release_weights(run_dir: str | Path, evaluations: Iterable[str | Path] = ()) -> int:
    """Remove a completed run's weights (:data:`WEIGHT_FOLDERS`) once its ``evaluations`` (their summary
    files) are written; the records, logs, profile and evaluations stay. Returns the bytes freed.

    Crash-safe in this order: the note :data:`~hacpo.runio.WEIGHTS_RELEASED` first (an evaluation asked
    for later names the run and how to get its weights back), then each folder renamed into ``.releasing/``
    (atomic: a folder is whole or out of the way) and removed there. A kill at any point leaves the records
    and evaluations whole; calling it again finishes the removal."""
    run_dir = Path(run_dir)
    record = RunRecord.read(run_dir)
    if record is None or not record.complete:
        raise ValueError(f"{run_dir}: not a complete run ({record.status if record else 'no run.json'}); "
                         "its weights are kept")  # fmt: skip
    missing = [str(e) for e in evaluations if not Path(e).is_file()]
    if missing:
        raise FileNotFoundError(f"{run_dir}: evaluations not written yet, its weights are kept: {missing}")
    trash = run_dir / RELEASING
    folders = [f for pattern in WEIGHT_FOLDERS for f in sorted(run_dir.glob(pattern)) if f.is_dir()]
    freed = sum(_size(f) for f in [*folders, trash])
    note = {"bytes": freed, "evaluations": sorted(map(str, evaluations)), "folders": [
        f.relative_to(run_dir).as_posix() for f in folders]}  # fmt: skip
    if not (run_dir / WEIGHTS_RELEASED).is_file() or folders:
        atomic_write_json(run_dir / WEIGHTS_RELEASED, note)
    trash.mkdir(exist_ok=True)
    for folder in folders:
        rename_to_free(folder, lambda n: f"{n}", trash)
    _remove(trash)
    return freed


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0


def _remove(folder: Path) -> None:
    shutil.rmtree(folder)


def _manifest_files(folder: Path) -> dict:
    try:
        return json.loads((folder / CHECKPOINT_MANIFEST).read_text())["files"]
    except (FileNotFoundError, ValueError, KeyError):  # no manifest yet: record the folder as it is
        write_checkpoint_manifest(folder)
        return json.loads((folder / CHECKPOINT_MANIFEST).read_text())["files"]


def checkpoint_problem(folder: str | Path, legacy: str = "trainer_state.pt") -> str | None:
    """Why the checkpoint at ``folder`` cannot be resumed from (a file missing, cut short or changed against
    its manifest), or None when it is intact. A checkpoint from before manifests is taken as it is when it
    holds the file ``legacy`` (the local engine's trainer state; a DeepSpeed folder's model states)."""
    folder = Path(folder)
    manifest = folder / CHECKPOINT_MANIFEST
    if not folder.is_dir():
        return "the folder is missing"
    if not manifest.is_file():
        return None if (folder / legacy).is_file() else f"no manifest and no {legacy}"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError) as err:
        return f"its manifest {CHECKPOINT_MANIFEST} is unreadable ({err})"
    for name, want in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != want["bytes"]:
            return f"{name} has {size:,} bytes, {want['bytes']:,} when it was written"
        if sha256_file(path) != want["sha256"]:
            return f"{name} differs from what was written (SHA-256)"
    return None


def set_aside(folder: str | Path, into: str | Path | None = None) -> Path:
    """Move a broken checkpoint ``…/step-N`` out of resume's and pruning's way, to ``broken-step-N`` (``-2``,
    ``-3`` … if that exists) beside it or in ``into``; returns the new path."""
    name = Path(folder).name  # `into`: out of a folder another tool prunes (OpenRLHF's rotation of `_actor/`)
    return rename_to_free(folder, lambda n: f"broken-{name}" + (f"-{n}" if n > 1 else ""), into)


def newest_intact_step(run_dir: str | Path, steps: Iterable[int], folders_of, say=print,
                       legacy: str = "trainer_state.pt", aside=set_aside) -> int:  # fmt: skip
    """The newest of ``steps`` whose checkpoint folders (``folders_of(step)``: one per agent) are all intact
    (0: no step). Broken checkpoints newer than it are set aside (``aside``: :func:`set_aside`), each named
    with why.
    When checkpoints exist but none is intact, a ValueError says so and nothing is moved: a rerun fails the
    same way instead of training over them."""
    broken: list[tuple[Path, str]] = []
    for step in sorted(steps, reverse=True):
        problems = [(f, why) for f in map(Path, folders_of(step)) if (why := checkpoint_problem(f, legacy))]
        if not problems:
            for folder, why in broken:
                if folder.exists():
                    say(f"hacpo: checkpoint {folder} is broken: {why}; moved to {aside(folder)}")
                else:
                    say(f"hacpo: checkpoint {folder} is broken: {why}")
            return step
        broken += problems
    if broken:
        listed = "; ".join(f"{f} ({why})" for f, why in broken)
        raise ValueError(
            f"{run_dir}: no intact checkpoint to resume from ({listed}): restore them from a copy, or "
            "delete the run directory to train it again from the start"
        )
    return 0


def intact_resume_step(run_dir: str | Path, agents: Iterable[str], say=print) -> int:
    """The local engine's resume step: the newest ``checkpoints/<agent>/step-N`` every agent has intact
    (:func:`newest_intact_step`)."""
    agents = list(agents)
    folders = lambda step: [Path(run_dir) / "checkpoints" / a / f"step-{step}" for a in agents]  # noqa: E731
    return newest_intact_step(run_dir, checkpoint_steps(run_dir, agents), folders, say)


def checkpoint_steps(run_dir: str | Path, agents: Iterable[str]) -> list[int]:
    """Steps for which *every* agent has a complete checkpoint, ascending."""
    agents = list(agents)
    common: set[int] | None = None
    for agent in agents:
        d = Path(run_dir) / "checkpoints" / agent
        steps = {
            int(p.name.split("-")[1])
            for p in d.glob("step-*")
            if p.is_dir() and (p / "trainer_state.pt").exists() and p.name.split("-")[1].isdigit()
        }
        common = steps if common is None else common & steps
    return sorted(common or [])
