"""Where a run directory stands, read one way by ``hacpo train --marker`` (reuse, resume or move aside) and by
``hacpo status``, beside the run-directory contract (:mod:`hacpo.runio`).

A run directory is

- **planned**: nothing there yet (no ``run.json``);
- **running**: a process holds its lock (``.lock``, seen in ``/proc/locks`` without taking it), or its logs
  moved within the last :data:`ACTIVE_S` seconds (a job on another node, where the lock is not visible);
- **interrupted**: started, not complete, nobody writing it: ``hacpo train`` resumes it from its checkpoint;
- **failed**: the engine stopped with an error (``run.json`` says so); resumable like an interrupted run;
- **complete**: finished, of the spec and inputs asked for: reused;
- **stale**: a run of another spec (``config_hash``) or other inputs (``inputs.json``): ``hacpo train
  --marker`` moves it aside to ``<dir>.superseded-<n>`` (never deleted) and trains anew.

Reading never locks or writes anything, so ``hacpo status`` is safe beside a running workflow.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hacpo.runio import RunRecord, atomic_write_json, input_fingerprint, read_json, rename_to_free

ACTIVE_S = 600.0  # logs written this recently count as a run in progress where no lock is visible
INPUTS = "inputs.json"


@dataclass(frozen=True)
class Standing:
    state: str  # planned | running | interrupted | failed | complete | stale
    why: str = ""  # stale: "another spec" | "other inputs"
    record: RunRecord | None = None


def locked(run_dir: str | Path) -> bool:
    """Whether a process holds ``run_dir/.lock`` (:func:`hacpo.runio.run_lock`'s flock), from the kernel's
    lock table: nothing is opened for writing or locked."""
    lock = Path(run_dir) / ".lock"
    try:
        st = lock.stat()
        table = Path("/proc/locks").read_text()
    except OSError:
        return False
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any(line.split()[1] == "FLOCK" and inode in line.split() for line in table.splitlines() if line)


def last_write(run_dir: str | Path) -> float | None:
    """The newest modification time of the run's logs and record (None: none exist)."""
    times = [p.stat().st_mtime for name in ("run.json", "metrics.jsonl", "validation.jsonl")
             if (p := Path(run_dir) / name).exists()]  # fmt: skip
    return max(times) if times else None


def standing(run_dir: str | Path, config_hash: str | None = None, inputs: dict | None = None) -> Standing:
    """Where ``run_dir`` stands for a run of ``config_hash`` and ``inputs`` (None: whatever it holds)."""
    run_dir = Path(run_dir)
    record = RunRecord.read(run_dir)
    busy = locked(run_dir)
    if record is None:
        return Standing("running" if busy else "planned")
    if config_hash is not None and record.config_hash != config_hash:
        return Standing("stale", "another spec", record)
    recorded = read_json(run_dir / INPUTS) if (run_dir / INPUTS).exists() else None
    if inputs is not None and recorded not in (None, inputs):
        return Standing("stale", "other inputs", record)
    if record.complete:
        return Standing("complete", record=record)
    recent = (t := last_write(run_dir)) is not None and time.time() - t < ACTIVE_S
    if busy or (recent and record.status == "running"):
        return Standing("running", record=record)
    return Standing("failed" if record.status == "failed" else "interrupted", record=record)


def moved_aside(run_dir: str | Path) -> list[Path]:
    """Earlier runs of this directory that :func:`reuse_or_supersede` moved aside, oldest first."""
    run_dir = Path(run_dir)
    found = run_dir.parent.glob(f"{run_dir.name}.superseded-*")
    found = [p for p in found if p.name.rsplit("-", 1)[1].isdigit()]
    return sorted(found, key=lambda p: int(p.name.rsplit("-", 1)[1]))


def move_aside(run_dir: str | Path) -> Path:
    """Rename ``run_dir`` to the next free ``<dir>.superseded-<n>``; returns the new path."""
    name = Path(run_dir).name
    return rename_to_free(run_dir, lambda n: f"{name}.superseded-{n}")


def run_inputs(cfg) -> dict[str, str]:
    """What a run reads, by content (:func:`hacpo.runio.input_fingerprint`)."""
    return input_fingerprint([cfg.train_file, cfg.val_file], [a.path for a in cfg.agents])


def reuse_or_supersede(cfg) -> bool:
    """Workflow mode (``hacpo train --marker``): the workflow asked for this run. A complete run of the same
    spec and inputs is reused (True: nothing to train); an interrupted or failed one resumes; a stale one is
    moved aside, never deleted. The inputs read are recorded (``inputs.json``) for the next time."""
    out, inputs = Path(cfg.out_dir), run_inputs(cfg)
    now = standing(out, cfg.config_hash(), inputs)
    if now.state == "complete":
        print(f"reusing the complete run in {out} (same spec and inputs)", file=sys.stderr)
        return True
    if now.state == "stale":
        moved = move_aside(out)
        print(f"moved the previous run to {moved.name} ({now.record.status}, {now.why})", file=sys.stderr)
    if now.state in ("planned", "stale"):
        atomic_write_json(out / INPUTS, inputs)
    return False
