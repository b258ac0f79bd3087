"""Live views of a run (issue 31): the ``logging:`` section, W&B's run per run directory and its resume
semantics, and what the OpenRLHF engine gets of it. The local engine's real runs, killed and resumed, are
checked in tests/test_local_engine.py (TensorBoard's and W&B's offline files, step for step); what the
OpenRLHF engine's commands get of ``logging.wandb`` in tests/test_openrlhf_engine.py."""

from pathlib import Path

import pytest
import yaml

from hacpo.config import RunLogging, WandbLogging
from hacpo.engines.core.trackers import (
    WANDB_DIR,
    WANDB_ID_FILE,
    WandbView,
    read_wandb_history,
    wandb_run_id,
    wandb_run_name,
)
from hacpo.pipeline import Pipeline
from hacpo.pipeline.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
OFFLINE = WandbLogging(project="hacpo-tests", mode="offline")


def rows(steps, val_steps, agents=("a", "b")):
    metrics = [{"step": s, "a/reward": s / 10, "b/reward": 1 - s / 10, "omega": [[1.0]]} for s in steps]
    val = [
        {"step": s, "agent": a, "acc": s / 100 + k, "n": 8} for s in val_steps for k, a in enumerate(agents)
    ]
    return metrics, val


def test_offline_view_holds_each_step_once_with_its_validation(tmp_path):
    """Rows as the run loop gives them (the validation at s + 1 before step s's metrics row), a rebuild from
    kept rows (a resume), new rows: one offline W&B run, each step once, validation merged into its step."""
    run = tmp_path / "joint" / "pair" / "hacpo" / "seed0"
    metrics, val = rows(range(3), [0, 2])
    view = WandbView(run, OFFLINE, {"seed": 0})
    view.rebuild([], [])
    view.validation(val[0]), view.validation(val[1])
    for m in metrics[:2]:
        view.metrics(m)
    view.close(failed=True)  # killed after step 1; kept: metrics < 2, validation ≤ 2 ... then resumed at 2
    first_id = (run / WANDB_DIR / WANDB_ID_FILE).read_text().strip()
    view = WandbView(run, OFFLINE, {"seed": 0})
    view.rebuild(metrics[:2], val[:2])
    for v in val[2:]:
        view.validation(v)
    view.metrics(metrics[2])
    view.close()
    assert (run / WANDB_DIR / WANDB_ID_FILE).read_text().strip() == first_id  # one W&B run over resumes
    assert [p.name.endswith(first_id) for p in (run / WANDB_DIR).glob("offline-run-*")] == [True]
    history = read_wandb_history(run)
    assert history["a/reward"] == [(0, 0.0), (1, 0.1), (2, 0.2)]
    assert history["val/a/acc"] == [(0, 0.0), (2, 0.02)] and history["val/b/acc"] == [(0, 1.0), (2, 1.02)]
    assert "omega" not in history and "step" not in history
    assert wandb_run_name(run) == "joint/pair/hacpo/seed0"


class FakeRun:
    def __init__(self, step):
        self.step, self.logged, self.exit_code = step, [], None

    def log(self, values, step):
        self.logged.append((step, sorted(values)))

    def finish(self, exit_code=0):
        self.exit_code = exit_code


def test_online_resume_logs_only_steps_the_server_lacks(tmp_path, monkeypatch):
    """Online, W&B keeps what it received: a run resumed where the server is at step 2 logs steps ≥ 2 only
    (the replayed rows below it are the server's already), under the run id kept in the run directory."""
    import wandb

    calls = []

    def init(**kw):
        calls.append(kw)
        return FakeRun(step=2 if len(calls) > 1 else 0)

    monkeypatch.setattr(wandb, "init", init)
    online = WandbLogging(project="p", group="g", entity="team")
    metrics, val = rows(range(4), [0, 2, 4], agents=("a",))
    view = WandbView(tmp_path, online)
    view.rebuild([], [])
    view.validation(val[0])
    view.metrics(metrics[0])
    first = view._run
    view.close(failed=True)
    assert first.logged == [(0, ["a/reward", "b/reward", "val/a/acc"])] and first.exit_code == 1
    view = WandbView(tmp_path, online)
    view.rebuild(metrics[:2], val[:2])  # resumed at step 2 (checkpoint); the server already has 0 and 1
    for m in metrics[2:]:
        view.metrics(m)
    view.validation(val[2])
    resumed = view._run
    view.close()
    assert [s for s, _ in resumed.logged] == [2, 3, 4] and resumed.exit_code == 0
    assert resumed.logged[-1] == (4, ["val/a/acc"])  # the final validation, flushed at close
    assert calls[0]["id"] == calls[1]["id"] and calls[1]["resume"] == "allow"
    assert (calls[1]["project"], calls[1]["group"], calls[1]["entity"]) == ("p", "g", "team")


def test_a_fresh_start_is_a_new_wandb_run_and_drops_earlier_offline_files(tmp_path):
    first = wandb_run_id(tmp_path, resume=False, drop_offline=True)
    (tmp_path / WANDB_DIR / f"offline-run-20260101_000000-{first}").mkdir()
    assert wandb_run_id(tmp_path, resume=True, drop_offline=False) == first
    assert list((tmp_path / WANDB_DIR).glob("offline-run-*"))
    again = wandb_run_id(tmp_path, resume=False, drop_offline=True)
    assert again != first and not list((tmp_path / WANDB_DIR).glob("offline-run-*"))


def test_wandb_settings_are_checked_before_a_run_starts(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with pytest.raises(ValueError, match="WANDB_API_KEY is not set.*mode: offline"):
        RunLogging(wandb={"project": "p"}).check_environment()
    RunLogging(wandb={"project": "p", "mode": "offline"}).check_environment()
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    RunLogging(wandb={"project": "p"}).check_environment()
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"pip install 'hacpo\[wandb\]'"):
        RunLogging(wandb={"project": "p", "mode": "offline"}).check_environment()
    with pytest.raises(ValueError, match="key"):  # never a config value
        RunLogging(wandb={"project": "p", "key": "secret"})


def test_a_workflow_config_names_the_moved_or_bad_wandb_keys():
    cfg = yaml.safe_load((ROOT / "config" / "ci.yaml").read_text())
    with pytest.raises(ConfigError, match="openrlhf.wandb moved to logging.wandb"):
        Pipeline({**cfg, "openrlhf": {"wandb": {"project": "p"}}}, base_dir=str(ROOT))
    with pytest.raises(ConfigError, match=r"logging\.wandb\.mode"):
        Pipeline({**cfg, "logging": {"wandb": {"mode": "sometimes"}}}, base_dir=str(ROOT))
    pipe = Pipeline({**cfg, "logging": {"wandb": {"project": "p", "mode": "offline"}}}, base_dir=str(ROOT))
    run = pipe.runs[0]
    assert pipe.train_runtime(run)["logging"]["wandb"]["mode"] == "offline"
    assert "logging" not in pipe.train_spec(run)  # a runtime option: never a rerun
