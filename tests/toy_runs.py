"""Run configs of the local engine on the toy data, shared by the engine's tests."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from hacpo.config import TrainConfig, load_train_config

TEST_DEVICE = os.environ.get("HACPO_TEST_DEVICE", "cpu")  # checked in conftest.py


def train_killed_at(cfg, step: int, monkeypatch) -> None:
    """Train ``cfg`` (local engine) until a KeyboardInterrupt at the start of ``step`` (a kill: the
    checkpoints written before it stay); the trainer is restored."""
    import pytest

    import hacpo.engines.local.trainer as tr

    real_step = tr.LocalTrainer.train_step

    def dying(self, s):
        if s == step:
            raise KeyboardInterrupt("injected kill")
        return real_step(self, s)

    monkeypatch.setattr(tr.LocalTrainer, "train_step", dying)
    with pytest.raises(KeyboardInterrupt):
        tr.train(cfg)
    monkeypatch.setattr(tr.LocalTrainer, "train_step", real_step)


def metrics_without_timing(run_dir) -> list[dict]:
    """A run's ``metrics.jsonl`` rows without the wall-time and memory fields (they differ between runs)."""
    from hacpo.runio import MetricsLog

    rows = MetricsLog(Path(run_dir) / "metrics.jsonl").read()
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "mem/"))} for r in rows]


def toy_train_config(tmp_path, agents, method: str, *, data, **overrides) -> TrainConfig:
    """``method`` on ``agents`` (``[(name, path)]``) over ``data``'s train/test files, in ``tmp_path/method``:
    2 steps of 4 prompts × G = 4, mini-batches of 8, no validation or checkpoints, seed 3, on the test device;
    ``overrides`` change any of it."""
    base = dict(
        method=method,
        agents=[{"name": n, "path": str(p)} for n, p in agents],
        train_file=str(data / "train.jsonl"),
        val_file=str(data / "test.jsonl"),
        out_dir=str(tmp_path / method),
        steps=2,
        prompts_per_step=4,
        group_size=4,
        minibatch_size=8,
        val_size=40,
        val_every=0,
        checkpoint_every=0,
        seed=3,
        device=TEST_DEVICE,
    )
    base.update(overrides)
    return load_train_config(base)


def _logged_values(run_dir) -> dict[str, list[tuple[int, float]]]:
    """What the live views should hold: every validation accuracy and numeric metrics field by step."""
    from pathlib import Path

    from hacpo.engines.core.trackers import scalars, validation_tag
    from hacpo.runio import read_jsonl

    want: dict[str, list[tuple[int, float]]] = {}
    for row in read_jsonl(Path(run_dir) / "validation.jsonl"):
        want.setdefault(validation_tag(row["agent"]), []).append((row["step"], row["acc"]))
    for row in read_jsonl(Path(run_dir) / "metrics.jsonl"):
        for tag, value in scalars(row).items():
            want.setdefault(tag, []).append((row["step"], value))
    return want


def assert_wandb_matches_logs(run_dir) -> None:
    """The run's offline W&B files hold one run (one id, over resumes) with every metrics and validation
    row's numbers exactly once, step for step and unrounded (issue 31)."""
    from pathlib import Path

    from hacpo.engines.core.trackers import WANDB_DIR, WANDB_ID_FILE, read_wandb_history

    folder = Path(run_dir) / WANDB_DIR
    run_id = (folder / WANDB_ID_FILE).read_text().strip()
    assert [p.name.rsplit("-", 1)[1] for p in folder.glob("offline-run-*")] == [run_id]
    got, want = read_wandb_history(run_dir), _logged_values(run_dir)
    assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
    for key, points in want.items():
        assert sorted(got[key]) == sorted(points), key  # each step once, the same numbers


def assert_events_match_logs(run_dir) -> None:
    """The run's TensorBoard event files, read with TensorBoard's own reader, hold every metrics and
    validation row's numbers exactly once, step for step (issue 31): no duplicate or missing step."""
    from hacpo.engines.core.trackers import read_scalars

    events, want = read_scalars(run_dir), _logged_values(run_dir)
    assert events.keys() == want.keys(), sorted(set(events) ^ set(want))
    for tag, points in want.items():
        got = sorted(events[tag])
        assert [s for s, _ in got] == [s for s, _ in points], tag  # each step once
        for (_, a), (_, b) in zip(got, points, strict=True):
            assert a == float(np.float32(b)), tag  # event files store float32
