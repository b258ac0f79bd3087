"""A joint run's resume point on the OpenRLHF engine, without Ray or OpenRLHF (the runner reads it before any
actor starts): the controller's state file and the DeepSpeed tag every agent loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hacpo.runio import atomic_write_json


def read_state(path: Path) -> dict:
    """The controller's state file, or step 0 when there is none yet: the newest resumable ``step``, its
    capability ``tracker``, and ``saved``: the tracker at every checkpointed step, so that a resume can fall
    back to an older intact checkpoint (:func:`hacpo.engines.openrlhf.runner.intact_joint_step`)."""
    path = Path(path)
    if not path.is_file():
        return {"step": 0, "tracker": None, "saved": {}}
    state = json.loads(path.read_text())
    state.setdefault("saved", {str(state["step"]): state["tracker"]} if state["step"] else {})
    return state


def write_state(path: Path, step: int, tracker: dict | None, saved: dict | None = None) -> None:
    """``step`` is resumable with ``tracker`` (a :class:`CapabilityTracker` state); ``saved`` defaults to the
    file's, with this step added."""
    saved = dict(read_state(path)["saved"] if saved is None else saved)
    if step:
        saved[str(step)] = tracker
    atomic_write_json(path, {"step": step, "tracker": tracker, "saved": saved})


def pin_resume_step(ckpt_dirs: list[Path], step: int) -> None:
    """Make every agent load the DeepSpeed states of the controller's ``step`` (``_actor/latest``): an
    agent that saved a newer step before a kill is rolled back to it; with no step yet, leftovers go."""
    for ckpt in ckpt_dirs:
        actor = Path(ckpt) / "_actor"
        if step == 0:
            shutil.rmtree(actor, ignore_errors=True)
            continue
        tag = f"global_step{step}"
        if not (actor / tag).is_dir():
            raise RuntimeError(
                f"{actor} lacks the DeepSpeed checkpoint {tag} of the controller's step {step}: raise "
                "keep_checkpoints, or delete the run directory to start over"
            )
        (actor / "latest").write_text(tag)
