"""hacpo.engines.core, what both engines share: the step (stage order, the metrics row and its names) and
the run loop (schedule, validation points, checkpoints, the logs' resume contract), each driven here by an
engine of plain Python that records what it is asked."""

from __future__ import annotations

import json

import pytest
import torch

from hacpo.algo import CapabilityTracker, get_method
from hacpo.config import load_train_config
from hacpo.engines.core import AgentRollouts, RunLoop, StepResult, train_step
from hacpo.engines.core.metrics import aggregate, merge_parts, update_record
from hacpo.engines.core.order import minibatch_order
from hacpo.engines.phases import Phases
from hacpo.runio import Metric, Update


def _loop(tmp_path, val_size=4, **cfg):
    config = load_train_config(
        {
            "method": "hacpo",
            "agents": [{"name": "a", "path": "x"}, {"name": "b", "path": "y"}],
            "train_file": "t",
            "out_dir": str(tmp_path),
            **cfg,
        }  # fmt: skip
    )
    return RunLoop(config, ["a", "b"], val_size=val_size)


class Engine:
    """Records what the loop asked of it, in order."""

    def __init__(self):
        self.calls = []

    def train_step(self, step):
        self.calls.append(("step", step))
        updates = [Update.row(step, agent, m, own_rows=2) for agent in "ab" for m in range(2)]
        return StepResult({"step": step, "a/reward": 0.5}, updates)

    def validate(self, step):
        self.calls.append(("validate", step))
        return [step / 10, step / 100]

    def save_checkpoint(self, step):
        self.calls.append(("checkpoint", step))


def test_a_fresh_run_validates_at_0_every_val_every_and_at_the_end(tmp_path):
    loop, engine = _loop(tmp_path, steps=5, val_every=2, checkpoint_every=2), Engine()
    loop.resume(0, engine.validate)
    loop.run(0, engine.train_step, engine.validate, engine.save_checkpoint)
    assert engine.calls == [
        ("validate", 0), ("step", 0), ("step", 1), ("validate", 2), ("checkpoint", 2), ("step", 2),
        ("step", 3), ("validate", 4), ("checkpoint", 4), ("step", 4), ("validate", 5), ("checkpoint", 5),
    ]  # fmt: skip
    rows = loop.validation.read()
    assert [(r["step"], r["agent"]) for r in rows] == [(s, a) for s in (0, 2, 4, 5) for a in "ab"]
    assert rows[-1] == {"step": 5, "agent": "b", "acc": 0.05, "n": 4}
    metrics = loop.metrics.read()
    assert [r["step"] for r in metrics] == [0, 1, 2, 3, 4]
    assert all(r["time/validate_s"] >= 0 for r in metrics)
    updates = loop.updates.read()
    assert [(r["step"], r["agent"], r["update"]) for r in updates] == [
        (s, a, m) for s in range(5) for a in "ab" for m in range(2)
    ]


def test_without_validation_problems_nothing_is_validated(tmp_path):
    loop, engine = _loop(tmp_path, val_size=0, steps=2), Engine()
    loop.resume(0, engine.validate)
    loop.run(0, engine.train_step, engine.validate, engine.save_checkpoint)
    assert ("validate", 0) not in engine.calls and loop.validation.read() == []


@pytest.mark.parametrize("lost", ["nothing", "half the validation at the checkpoint"])
def test_a_resumed_run_keeps_exactly_the_rows_before_its_checkpoint(tmp_path, lost):
    """Killed after step 3's row (checkpoint at 2): the resume at 2 keeps metrics < 2 and validation ≤ 2,
    re-validates at 2 only where a kill lost part of it, and the logs end as an uninterrupted run's."""
    whole, engine = _loop(tmp_path / "whole", steps=4, val_every=1, checkpoint_every=2), Engine()
    whole.resume(0, engine.validate)
    whole.run(0, engine.train_step, engine.validate, engine.save_checkpoint)

    loop, first = _loop(tmp_path / "run", steps=4, val_every=1, checkpoint_every=2), Engine()
    loop.resume(0, first.validate)
    loop.run(0, first.train_step, first.validate, lambda s: None)  # then "killed": logs run past step 2
    if lost != "nothing":
        kept = [r for r in loop.validation.read() if r["step"] < 2]
        kept.append({"step": 2, "agent": "a", "acc": 0.2, "n": 4})  # agent b's row at 2 lost
        (tmp_path / "run" / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    resumed = Engine()
    loop.resume(2, resumed.validate)
    assert [r["step"] for r in loop.metrics.read()] == [0, 1]
    assert sorted({r["step"] for r in loop.updates.read()}) == [0, 1]
    assert resumed.calls == ([] if lost == "nothing" else [("validate", 2)])
    loop.run(2, resumed.train_step, resumed.validate, resumed.save_checkpoint)

    def strip(rows):
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]

    assert strip(loop.metrics.read()) == strip(whole.metrics.read())
    assert loop.validation.read() == whole.validation.read()
    assert loop.updates.read() == whole.updates.read()  # no duplicates, no gaps


def test_validation_must_answer_for_every_agent(tmp_path):
    loop = _loop(tmp_path)
    with pytest.raises(ValueError, match="1 accuracies for agents"):
        loop.validate(0, lambda step: [0.5])


class RecordingStepEngine:
    """A StepEngine whose agent k answers correctly with probability (k + 1) / 4, 3 tokens each."""

    def __init__(self, n):
        self.n, self.calls = n, []

    def rollout(self, k, step, problems, g):
        self.calls.append(("rollout", k))
        rewards = (torch.arange(len(problems) * g) % 4 < k + 1).float()
        return AgentRollouts(rewards, torch.full((len(problems) * g,), 3), rows=f"rows of {k}")

    def before_updates(self, rolls):
        self.calls.append(("before_updates", [r.rows for r in rolls]))

    def learner_rows(self, k, rolls, omegas, problems):
        self.calls.append(("rows", k))
        return k

    def update(self, k, rows, step, problems):
        self.calls.append(("update", k, rows, step))
        return [{"update": m, "loss": 0.25 + k + m / 2, "rows": 8, "own_rows": 8 - 4 * m} for m in range(2)]

    def sync(self):
        self.calls.append(("sync",))

    def step_extras(self):
        return {"mem/x": 1.0}


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_step_runs_the_stages_in_the_specs_order_and_names_its_metrics_once(n):
    engine, names = RecordingStepEngine(n), ["a", "b", "c"][:n]
    tracker = CapabilityTracker(n, window=5, warmup_steps=0)
    spec = get_method("hacpo").loss_spec()
    result = train_step(engine, names, 7, ["p1", "p2"], samples=4, tracker=tracker, phase=Phases(), spec=spec)
    row = result.row
    rows_of = [f"rows of {k}" for k in range(n)]
    assert engine.calls == [
        *[("rollout", k) for k in range(n)],  # every agent samples before anything else
        ("before_updates", rows_of),
        *[("rows", k) for k in range(n)],  # every learner's rows before any update (§5)
        *[("update", k, k, 7) for k in range(n)],
        ("sync",),
    ]
    assert row[Metric.STEP] == 7 and row["mem/x"] == 1.0
    for k, name in enumerate(names):
        assert row[Metric.of(name, Metric.REWARD)] == (k + 1) / 4
        assert row[Metric.of(name, Metric.RESPONSE_TOKENS)] == 3.0
        assert row[Metric.of(name, "loss")] == 0.5 + k  # the mean over its two updates
        assert row[Metric.of(name, "updates")] == 2
        assert row[Metric.of(name, Metric.P_HAT)] == pytest.approx((k + 1) / 4)
    assert (Metric.OMEGA in row) == (n > 1)
    if n > 1:
        assert torch.tensor(row[Metric.OMEGA]).shape == (n, n)
    timed = {Metric.STEP_S, Metric.TOKENS_PER_S, Metric.phase("retokenize"), Metric.phase("update")}
    assert timed <= set(row)
    assert [(u["agent"], u["update"], u["own_rows"], u["cross_rows"]) for u in result.updates] == [
        (name, m, 8 - 4 * m, 4 * m) for name in names for m in range(2)
    ]
    assert [u["cross_lo"] for u in result.updates[:2]] == [0.8, 0.825]  # lo_m of the paper's default


def test_parts_merge_to_the_whole_mini_batchs_metrics():
    """Micro-batches (or data-parallel shares) of one update: shares add up, means cover their own rows."""
    parts = [
        (4, {"rows": 4, "own_rows": 4, "loss": 0.25, "own_clip_frac": 0.5, "s_homo_min": 0.9}),
        (4, {"rows": 4, "own_rows": 1, "loss": 0.5, "own_clip_frac": 0.0, "cross_in_bounds_frac": 1 / 3,
             "s_homo_min": 0.7, "grad_norm": 2.0}),
    ]  # fmt: skip
    whole = merge_parts(parts)
    assert (whole["rows"], whole["own_rows"], whole["loss"]) == (8, 5, 0.75)
    assert whole["own_clip_frac"] == pytest.approx(0.4)  # 2 of 5 own rows
    assert whole["cross_in_bounds_frac"] == pytest.approx(1 / 3) and whole["s_homo_min"] == 0.7
    step = aggregate([{"update": 0, "loss": 1.0, "kl": 0.5}, {"update": 1, "loss": 3.0}])
    assert step == {"updates": 2.0, "loss": 2.0, "kl": 0.5}  # kl: only the update that had own rows


def test_update_records_say_lo_m_even_without_cross_rows():
    hacpo, gspo = get_method("hacpo").loss_spec(), get_method("gspo").loss_spec()
    own_only = {"update": 3, "rows": 8, "own_rows": 8, "own_clip_frac": 0.25, "kl": 0.1}
    rec = update_record(5, "a", own_only, hacpo)
    assert rec == {
        "step": 5, "agent": "a", "update": 3, "own_rows": 8, "cross_rows": 0, "cross_lo": 0.875,
        "cross_in_bounds_frac": None, "own_clip_frac": 0.25, "cross_clip_frac": None, "kl_term": True,
        "skipped": False,
    }  # fmt: skip
    cross = {"update": 0, "rows": 8, "own_rows": 0, "cross_in_bounds_frac": 0.75}
    rec = update_record(5, "a", cross, hacpo)
    assert (rec["cross_rows"], rec["cross_clip_frac"], rec["kl_term"]) == (8, 0.25, False)
    assert update_record(5, "a", own_only, gspo)["cross_lo"] is None


ROWS = dict(  # a learner's buffer: agent 1's rows (its own) first, then agent 0's, prompts interleaved
    own=[True, True, True, False, False, False], agent=[1, 1, 1, 0, 0, 0], prompt=[1, 0, 0, 1, 0, 1]
)


def test_mixed_order_is_a_permutation_seeded_by_run_step_and_learner():
    draw = lambda **k: minibatch_order("mixed", **ROWS, **{"seed": 3, "step": 5, "learner": 1, **k})  # noqa: E731
    assert sorted(draw()) == list(range(6)) and draw() == draw()
    assert len({tuple(draw(step=s)) for s in range(8)}) > 1  # another step, another order
    assert len({tuple(draw(learner=k)) for k in range(8)}) > 1


def test_self_first_and_agent_order():
    fixed = dict(seed=0, step=0, learner=1)
    assert minibatch_order("self_first", **ROWS, **fixed) == [0, 1, 2, 3, 4, 5]
    # by generating agent, then prompt; a prompt's samples keep their order
    assert minibatch_order("agent_order", **ROWS, **fixed) == [4, 3, 5, 1, 2, 0]
    with pytest.raises(ValueError, match="choose one of mixed, self_first, agent_order"):
        minibatch_order("random", **ROWS, **fixed)


def _problems_with_a_repeated_id(path, line: int = 4):
    """Four problems, a blank line after the second; the one on ``line`` repeats the first one's id."""
    rows = [{"id": f"p{i}", "problem": f"{i} + 1", "answer": str(i + 1)} for i in range(4)]
    rows[{2: 1, 4: 2, 5: 3}[line]]["id"] = "p0"
    lines = [json.dumps(r) for r in rows]
    path.write_text("\n".join([*lines[:2], "", *lines[2:]]) + "\n")
    return path


def test_a_repeated_problem_id_is_refused_naming_the_id_and_both_lines(tmp_path):
    from hacpo.engines.core.schedule import read_problems

    with pytest.raises(ValueError, match=r"train\.jsonl: problem id 'p0' on lines 1 and 4: .*another id"):
        read_problems(_problems_with_a_repeated_id(tmp_path / "train.jsonl"))
    path = tmp_path / "ok.jsonl"
    path.write_text('{"id": 1, "problem": "q", "answer": "a"}\n{"id": "2", "problem": "q", "answer": "a"}\n')
    assert [r["id"] for r in read_problems(path)] == [1, "2"]


@pytest.mark.parametrize("split", ["train_file", "val_file"])
def test_both_engines_refuse_a_repeated_problem_id_before_training(split, tmp_path, toy_data, small_agent):
    """The local trainer and the OpenRLHF engine's prompt files read problems through one reader: a train
    or validation file with a repeated id stops them before any model is loaded or file written."""
    from hacpo.engines.local.trainer import LocalTrainer
    from hacpo.engines.openrlhf.command import Layout
    from hacpo.engines.openrlhf.runner import write_inputs

    bad = _problems_with_a_repeated_id(tmp_path / "bad.jsonl", line=5)
    cfg = load_train_config(
        {"method": "grpo", "agents": [{"name": "a", "path": str(small_agent)}], "out_dir": str(tmp_path),
         "train_file": str(toy_data / "train.jsonl"), "val_file": str(toy_data / "test.jsonl"), "val_size": 8,
         split: str(bad), "steps": 1, "prompts_per_step": 2, "group_size": 2, "minibatch_size": 4}
    )  # fmt: skip
    message = r"bad\.jsonl: problem id 'p0' on lines 1 and 5"
    with pytest.raises(ValueError, match=message):
        LocalTrainer(cfg)
    layout = Layout(tmp_path)
    layout.root.mkdir(parents=True, exist_ok=True)
    with pytest.raises(ValueError, match=message):
        write_inputs(cfg, layout)
    assert not layout.prompts.exists()


def test_phases_on_cuda_time_each_phase_s_own_gpu_work(monkeypatch):
    """CUDA runs a kernel after its launch: a phase whose work is still queued when it ends must wait for it,
    else its seconds land in whichever later phase first syncs (here ``update``, reading a scalar)."""
    import time

    queued, calls = [0.0], []

    def synchronize(device=None):  # a fake GPU: syncing waits for the work launched so far
        calls.append(device)
        time.sleep(queued[0])
        queued[0] = 0.0

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**20)
    dev = torch.device("cuda", 0)
    phases = Phases(dev)
    with phases("generate"):
        queued[0] = 0.3  # launched, not done
    with phases("update"):
        torch.cuda.synchronize(dev)  # e.g. ``.item()`` of a loss
    assert phases.total["generate"] >= 0.3 > phases.total["update"], dict(phases.total)
    assert calls.count(dev) == 5 and phases.peak_mb == {"generate": 3.0, "update": 3.0}  # 2 per phase + 1
    calls.clear()
    with Phases(torch.device("cpu"))("generate"):  # nothing to wait for on the CPU
        pass
    assert calls == []


@pytest.mark.parametrize(("platform", "unit"), [("linux", 2**10), ("darwin", 1)])
def test_peak_rss_reads_getrusage_in_the_platform_s_unit(monkeypatch, platform, unit):
    """``ru_maxrss`` is KiB on Linux and bytes on macOS: 512 MiB either way."""
    import resource
    import sys

    from hacpo.hardware import peak_rss_mb

    usage = type("Usage", (), {"ru_maxrss": 512 * 2**20 // unit})
    monkeypatch.setattr(resource, "getrusage", lambda who: usage)
    monkeypatch.setattr(sys, "platform", platform)
    assert peak_rss_mb() == 512.0


def test_ru_maxrss_is_read_only_through_peak_rss_mb():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readers = [
        str(p.relative_to(root))
        for folder in ("hacpo", "benchmarks", "scripts", "workflow")
        for p in (root / folder).rglob("*.py")
        if "ru_maxrss" in p.read_text() and p != root / "hacpo" / "hardware.py"
    ]
    assert readers == [], "read ru_maxrss through hacpo.hardware.peak_rss_mb (its unit is the platform's)"
