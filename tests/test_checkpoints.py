"""A checkpoint damaged after it was written (issue 43): each records what it holds as its last write; resume
checks it, sets a broken one aside naming it and why, and resumes from the newest intact one; with none
intact it fails clearly. Local engine here; the OpenRLHF engine's joint checkpoints in tests/openrlhf."""

from __future__ import annotations

import json

import pytest
from toy_runs import TEST_DEVICE, metrics_without_timing, toy_train_config, train_killed_at

from hacpo.engines.local import train
from hacpo.runio import (
    CHECKPOINT_MANIFEST,
    RunRecord,
    checkpoint_problem,
    intact_resume_step,
    write_checkpoint_manifest,
)


def test_manifest_names_a_truncated_a_changed_and_a_missing_file(tmp_path):
    folder = tmp_path / "step-2"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"x" * 1000)
    (folder / "trainer_state.pt").write_bytes(b"y" * 10)
    write_checkpoint_manifest(folder)
    files = json.loads((folder / CHECKPOINT_MANIFEST).read_text())["files"]
    assert files["model.safetensors"]["bytes"] == 1000
    assert checkpoint_problem(folder) is None
    (folder / "model.safetensors").write_bytes(b"x" * 500)
    assert "model.safetensors has 500 bytes, 1,000 when it was written" == checkpoint_problem(folder)
    (folder / "model.safetensors").write_bytes(b"z" * 1000)
    assert "differs" in checkpoint_problem(folder)
    (folder / "model.safetensors").unlink()
    assert checkpoint_problem(folder) == "model.safetensors is missing"


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_a_damaged_checkpoint_is_set_aside_and_the_run_resumes_from_the_previous_one(
    tmp_path, toy_data, small_agent, other_agent, monkeypatch, capfd, damage
):
    """Kill a HACPO run after its step-4 checkpoint, cut one agent's model.safetensors to half (or delete
    it), rerun: it resumes from step 2, says which checkpoint was broken and why and which steps are redone,
    and ends with the metrics of an uninterrupted run."""
    agents = [("llama", small_agent), ("qwen", other_agent)]
    kw = dict(data=toy_data, steps=6, checkpoint_every=2, keep_checkpoints=2, val_every=0, val_size=10)
    ref = toy_train_config(tmp_path / "ref", agents, "hacpo", **kw)
    train(ref)
    cfg = toy_train_config(tmp_path / "killed", agents, "hacpo", **kw)
    train_killed_at(cfg, 5, monkeypatch)
    run = tmp_path / "killed/hacpo"
    assert RunRecord.read(run).step == 4
    weights = run / "checkpoints/qwen/step-4/model.safetensors"
    if damage == "truncate":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
    else:
        weights.unlink()
    capfd.readouterr()
    record = train(cfg)
    err = capfd.readouterr().err
    assert record.status == "complete"
    assert "checkpoints/qwen/step-4 is broken: model.safetensors" in err and "broken-step-4" in err
    assert "steps 3–4" in err and "from its step-2 checkpoint" in err
    assert (run / "checkpoints/qwen/broken-step-4").is_dir()

    a = metrics_without_timing(tmp_path / "ref/hacpo")
    b = metrics_without_timing(run)
    assert [r["step"] for r in b] == list(range(6))
    if TEST_DEVICE == "cpu":
        assert a == b


def test_no_intact_checkpoint_fails_clearly(tmp_path, toy_data, small_agent, monkeypatch):
    cfg = toy_train_config(tmp_path, [("llama", small_agent)], "gspo", data=toy_data, steps=4,
                           checkpoint_every=1, keep_checkpoints=1)  # fmt: skip
    train_killed_at(cfg, 2, monkeypatch)
    run = tmp_path / "gspo"
    for ckpt in (run / "checkpoints/llama").glob("step-*"):
        (ckpt / "trainer_state.pt").write_bytes(b"garbage")
    for _ in range(2):  # nothing is moved: a rerun fails the same way instead of training over them
        with pytest.raises(ValueError, match="no intact checkpoint to resume from.*trainer_state.pt"):
            train(cfg)
    with pytest.raises(ValueError, match="delete the run directory"):
        intact_resume_step(run, ["llama"])
