"""A checkpoint damaged after it was written (issue 43): each records what it holds as its last write; resume
checks it, sets a broken one aside naming it and why, and resumes from the newest intact one; with none
intact it fails clearly. Local engine here; the OpenRLHF engine's joint checkpoints in tests/openrlhf."""

from __future__ import annotations

import json

import pytest
from toy_runs import TEST_DEVICE, metrics_without_timing, toy_train_config, train_killed_at

from hacpo.checkpoints import (
    CHECKPOINT_MANIFEST,
    checkpoint_problem,
    intact_resume_step,
    release_weights,
    write_checkpoint_manifest,
)
from hacpo.engines.local import train
from hacpo.runio import WEIGHTS_RELEASED, RunRecord


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


# ------------------------------------------------------------------ the OpenRLHF engine's joint checkpoints
def _deepspeed_run(tmp_path):
    """A joint run's files as HACPO's driver leaves them (steps 2 and 4 checkpointed): each agent's DeepSpeed
    folders ``openrlhf/agents/<a>/ckpt/_actor/global_step<N>`` with their manifests, and the controller state
    with the capability window of each saved step (the real-stack test writes them with OpenRLHF)."""
    from hacpo.config import TrainConfig
    from hacpo.engines.openrlhf.command import Layout
    from hacpo.engines.openrlhf.joint.state import write_state

    cfg = TrainConfig.model_validate({
        "method": "hacpo", "agents": [{"name": "a", "path": "x"}, {"name": "b", "path": "y"}],
        "train_file": "t.jsonl", "out_dir": str(tmp_path / "run"), "steps": 6,
    })  # fmt: skip
    layout = Layout(tmp_path / "run")
    for step in (2, 4):
        for agent in ("a", "b"):
            folder = layout.agent(agent).ckpt / "_actor" / f"global_step{step}"
            folder.mkdir(parents=True)
            (folder / "mp_rank_00_model_states.pt").write_bytes(bytes(range(200)) * step)
            (folder / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"o" * 4000)
            write_checkpoint_manifest(folder)
        write_state(layout.joint_state, step, {"history": [[step / 10]], "steps_seen": step, "window": 5})
    return cfg, layout


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_a_broken_joint_deepspeed_checkpoint_falls_back_to_the_previous_step(tmp_path, damage):
    """OpenRLHF engine (issue 43): agent b's step-4 DeepSpeed states cut short (or gone) → b's folder moves
    out of OpenRLHF's rotation (``ckpt/broken-global_step4``), the controller state falls back to step 2
    with step 2's capability window, and the message names the folder, why, and the steps redone. The
    driver then pins every agent to ``global_step2`` (:func:`pin_resume_step`)."""
    from hacpo.engines.openrlhf.joint.state import pin_resume_step, read_state
    from hacpo.engines.openrlhf.runner import intact_joint_step, resumable_joint_step

    cfg, layout = _deepspeed_run(tmp_path)
    states = layout.agent("b").ckpt / "_actor" / "global_step4" / "mp_rank_00_model_states.pt"
    if damage == "truncate":
        states.write_bytes(states.read_bytes()[:300])
    else:
        states.unlink()
    said = []
    assert intact_joint_step(cfg, layout, say=said.append) == 2 == resumable_joint_step(layout)
    why = "has 300 bytes, 800 when it was written" if damage == "truncate" else "is missing"
    assert f"global_step4 is broken: mp_rank_00_model_states.pt {why}" in said[0]
    assert said[0].endswith(str(layout.agent("b").ckpt / "broken-global_step4"))
    assert "from step 2: steps 3–4 will be trained again" in said[1]
    assert not (layout.agent("b").ckpt / "_actor" / "global_step4").exists()
    state = read_state(layout.joint_state)
    assert state["tracker"]["history"] == [[0.2]] and set(state["saved"]) == {"2"}
    pin_resume_step([layout.agent(a).ckpt for a in ("a", "b")], state["step"])
    assert all((layout.agent(a).ckpt / "_actor" / "latest").read_text() == "global_step2" for a in "ab")
    assert intact_joint_step(cfg, layout, say=said.append) == 2 and len(said) == 2  # settled: nothing more


def test_joint_checkpoints_all_broken_fail_clearly_and_nothing_moves(tmp_path):
    from hacpo.engines.openrlhf.runner import intact_joint_step

    cfg, layout = _deepspeed_run(tmp_path)
    for step in (2, 4):
        states = layout.agent("a").ckpt / "_actor" / f"global_step{step}" / "mp_rank_00_model_states.pt"
        states.write_bytes(b"")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for _ in range(2):
        with pytest.raises(ValueError, match="no intact checkpoint to resume from.*step4.*step2"):
            intact_joint_step(cfg, layout, say=print)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_an_intact_joint_run_and_one_from_before_manifests_resume_where_they_stood(tmp_path):
    """Nothing to do for intact checkpoints; a state file from before the capability history (``saved``)
    and DeepSpeed folders without manifests resume from the state's step, as before."""
    from hacpo.engines.openrlhf.runner import intact_joint_step

    cfg, layout = _deepspeed_run(tmp_path)
    said = []
    assert intact_joint_step(cfg, layout, say=said.append) == 4 and said == []
    for manifest in layout.root.rglob(CHECKPOINT_MANIFEST):
        manifest.unlink()
    state = json.loads(layout.joint_state.read_text())
    layout.joint_state.write_text(json.dumps({"step": 4, "tracker": state["tracker"]}))
    assert intact_joint_step(cfg, layout, say=said.append) == 4 and said == []


# ---------------------------------------------------------- retention (docs/guide/watching.md, "Disk")
def _complete_run(root) -> tuple:
    """A complete two-agent run's files (weights of both engines' layouts, records) and one evaluation."""
    run = root / "runs" / "joint" / "pair" / "hacpo" / "seed0"
    for folder in ("checkpoints/a/step-4", "checkpoints/b/step-4", "openrlhf/agents/a/ckpt/_actor"):
        (run / folder).mkdir(parents=True)
        for name in ("model.safetensors", "config.json", "tokenizer.json"):
            (run / folder / name).write_bytes(b"w" * 100)
    final = {a: str(run / "checkpoints" / a / "step-4") for a in "ab"}
    RunRecord("complete", 4, "h", {}, "local", final_checkpoints=final).write(run)
    records = {"done.json": "{}", "metrics.jsonl": "{}\n", "profile.json": "{}", "validation.jsonl": "{}\n"}
    for name, text in records.items():
        (run / name).write_text(text)
    summary = root / "eval" / "main" / "joint" / "pair" / "hacpo" / "seed0" / "a" / "summary.json"
    summary.parent.mkdir(parents=True)
    summary.write_text("{}")
    return run, summary, {n: (run / n).read_bytes() for n in [*records, "run.json"]}


def test_released_weights_go_records_stay_and_a_later_evaluation_names_the_run_and_the_fix(tmp_path):
    run, summary, records = _complete_run(tmp_path)
    missing = tmp_path / "eval" / "other" / "summary.json"
    with pytest.raises(FileNotFoundError, match="evaluations not written yet"):
        release_weights(run, [summary, missing])
    assert (run / "checkpoints").is_dir() and not (run / WEIGHTS_RELEASED).exists()
    assert release_weights(run, [summary]) == 900
    assert not (run / "checkpoints").exists() and not (run / "openrlhf" / "agents" / "a" / "ckpt").exists()
    assert {n: (run / n).read_bytes() for n in records} == records and summary.is_file()
    note = json.loads((run / WEIGHTS_RELEASED).read_text())
    assert note["evaluations"] == [str(summary)] and "checkpoints" in note["folders"]
    assert release_weights(run, [summary]) == 0  # again: nothing left, the note as it was
    assert json.loads((run / WEIGHTS_RELEASED).read_text()) == note
    with pytest.raises(FileNotFoundError, match=r"retention: \{weights: keep\}") as err:
        RunRecord.read(run).final_checkpoint("a", run)  # what `hacpo eval` reads
    assert f"delete {run}" in str(err.value)
    (run / "run.json").write_text(json.dumps({**json.loads(records["run.json"]), "status": "running"}))
    with pytest.raises(ValueError, match="not a complete run"):
        release_weights(run)


def test_a_release_killed_midway_loses_no_record_and_its_rerun_finishes_it(tmp_path):
    """SIGKILL with half the weights' files removed (tests/faults.py `release`): the records and the
    evaluation are whole, the note names the run, no weight folder is left half-removed where a reader looks;
    the same command then finishes the removal."""
    import subprocess
    import sys
    from pathlib import Path

    run, summary, records = _complete_run(tmp_path)
    faults = Path(__file__).with_name("faults.py")
    args = ["release-weights", str(run), "--evaluations", str(summary)]
    out = subprocess.run([sys.executable, str(faults), "release:1", str(tmp_path / "c.json"), "--", *args],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == -9, out.stderr
    assert (run / WEIGHTS_RELEASED).is_file() and not (run / "checkpoints").exists()
    left = [f for f in (run / ".releasing").rglob("*") if f.is_file()]
    assert 0 < len(left) < 9  # the kill fell half-way through the files
    assert {n: (run / n).read_bytes() for n in records} == records and summary.is_file()
    subprocess.run([sys.executable, "-m", "hacpo.cli", *args], check=True, capture_output=True, timeout=120)
    assert sorted(p.name for p in run.iterdir()) == sorted([*records, WEIGHTS_RELEASED, "openrlhf"])
    assert not any(p.is_file() for p in (run / "openrlhf").rglob("*"))
