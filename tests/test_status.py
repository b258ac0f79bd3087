"""``hacpo status`` and the run lifecycle it shares with ``hacpo train --marker`` (issue 31): each state read
from a run directory alone, without locking or writing it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from hacpo.cli import main
from hacpo.lifecycle import move_aside, moved_aside, standing
from hacpo.pipeline import Pipeline
from hacpo.pipeline.status import read_status, render, summary, workflow_status
from hacpo.runio import Metric, RunRecord, Validation, run_lock

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp: Path, name: str, status: str, steps_done: int, steps: int = 10, config_hash: str = "h1",
         step_s: float = 2.0) -> Path:  # fmt: skip
    d = tmp / name
    d.mkdir(parents=True)
    profile = {"wall_s": 25.0} if status == "complete" else None
    RunRecord(status, steps_done, config_hash, {"steps": steps}, "local", profile=profile).write(d)
    with open(d / "metrics.jsonl", "w") as f:
        for s in range(steps_done):
            f.write(json.dumps({Metric.STEP: s, Metric.STEP_S: step_s, Metric.VALIDATE_S: 0.5}) + "\n")
    with open(d / "validation.jsonl", "w") as f:
        for s in range(0, steps_done + 1, 5):
            for agent, acc in (("small", 0.1 + s / 100), ("big", 0.5 + s / 100)):
                f.write(json.dumps(Validation.row(s, agent, acc, 20)) + "\n")
    old = time.time() - 3600  # written an hour ago: nobody is writing it now
    for p in d.iterdir():
        os.utime(p, (old, old))
    return d


def test_each_state_from_the_directory_alone(tmp_path):
    assert standing(tmp_path / "nothing").state == "planned"
    done = _run(tmp_path, "done", "complete", 10)
    assert standing(done, "h1").state == "complete"
    assert standing(done, "h2").why == "another spec" and standing(done, "h2").state == "stale"
    (done / "inputs.json").write_text(json.dumps({"data": "abc"}))
    assert standing(done, "h1", {"data": "abc"}).state == "complete"
    assert (standing(done, "h1", {"data": "new"}).state, standing(done, "h1", {"data": "new"}).why) == (
        "stale",
        "other inputs",
    )
    half = _run(tmp_path, "half", "running", 4)
    assert standing(half, "h1").state == "interrupted"  # says running, but nobody holds it or writes it
    with run_lock(half):  # a trainer holds the lock: running, seen without taking it
        assert standing(half, "h1").state == "running"
    assert standing(half, "h1").state == "interrupted"
    os.utime(half / "metrics.jsonl")  # written just now (a job on another node: no lock visible here)
    assert standing(half, "h1").state == "running"
    assert standing(_run(tmp_path, "broke", "failed", 3), "h1").state == "failed"
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    for d in ("done", "half", "broke", "nothing"):
        read_status(tmp_path / d)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before  # nothing written, nothing new


def test_step_validation_time_so_far_and_left(tmp_path):
    half = read_status(_run(tmp_path, "half", "running", 4, steps=10, step_s=2.0))
    assert (half.state, half.step, half.steps) == ("interrupted", 4, 10)
    assert half.val_acc == {"small": 0.1, "big": 0.5}  # the last validation point (step 0 here)
    assert half.elapsed_s == pytest.approx(4 * 2.5) and half.left_s == pytest.approx(6 * 2.5)
    done = read_status(_run(tmp_path, "done", "complete", 10))
    assert (done.step, done.elapsed_s, done.left_s) == (10, 25.0, 0.0)
    (tmp_path / "half" / "metrics.jsonl").open("a").write('{"step": 4, "time/st')  # a torn last line
    assert read_status(tmp_path / "half").step == 4
    planned = read_status(tmp_path / "runs" / "joint" / "size" / "hacpo" / "seed0", steps=10)
    assert (planned.state, planned.step, planned.elapsed_s, planned.left_s) == ("planned", 0, None, None)
    total = summary([half, done, planned])
    assert (total["complete"], total["left"], total["interrupted"], total["planned"]) == (1, 2, 1, 1)
    text = render([half, done, planned], tty=True)
    assert "3 runs: 1 complete, 2 left (1 interrupted, 1 planned)" in text
    assert text.splitlines()[-1].endswith("1/3 complete")


def test_moved_aside_runs_are_counted(tmp_path):
    d = _run(tmp_path, "run", "complete", 10)
    first = move_aside(d)
    _run(tmp_path, "run", "complete", 10)
    second = move_aside(d)
    assert (
        [p.name for p in moved_aside(d)]
        == [first.name, second.name]
        == ["run.superseded-1", "run.superseded-2"]
    )
    assert read_status(d).moved_aside == 2 and read_status(d).state == "planned"


def test_a_config_none_of_whose_runs_started(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cfg = yaml.safe_load((ROOT / "config" / "ci.yaml").read_text())
    runs = workflow_status(Pipeline(cfg))
    assert len(runs) == 12 and {r.state for r in runs} == {"planned"}
    assert main(["status", "--configfile", str(ROOT / "config" / "ci.yaml"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total"] == {
        "runs": 12,
        "complete": 0,
        "planned": 12,
        "running": 0,
        "interrupted": 0,
        "failed": 0,
        "stale": 0,
        "left": 12,
        "left_s": None,
        "left_s_unknown": 12,
    }
    assert not (tmp_path / "results").exists()  # status writes nothing, not even a results folder


def test_a_run_that_spends_most_of_its_time_verifying_says_so(tmp_path):
    """Issue 43: a custom verifier's seconds per step (metrics ``verifier/seconds``) against the step time:
    past half of it, the status line says so, so a slow verifier is not read as a slow model."""
    slow = _run(tmp_path, "slow", "interrupted", 4)
    rows = [json.loads(line) for line in (slow / "metrics.jsonl").read_text().splitlines()]
    lines = "".join(json.dumps({**r, "verifier/seconds": 2.0}) + "\n" for r in rows)
    (slow / "metrics.jsonl").write_text(lines)
    fast = _run(tmp_path, "fast", "interrupted", 4)
    runs = [read_status(slow, 10, "h1"), read_status(fast, 10, "h1")]
    assert runs[0].verifying == pytest.approx(2.0 / 2.5) and runs[1].verifying == 0.0
    text = render(runs).splitlines()
    assert "verifying 80% of the time" in text[1] and "verifying" not in text[2]
