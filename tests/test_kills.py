"""Resume loses nothing: a two-agent HACPO run and its evaluation are SIGKILLed at random points, rerun, and
must end exactly as an uninterrupted run (metrics, validation curve, final checkpoints, evaluation outputs).

Each kill point is named (``tests/faults.py``: generation, scoring, the update, a checkpoint being written,
metrics/validation lines being appended, run.json being replaced, pruning, evaluation); which occurrence is
hit is drawn at random from the uninterrupted run's counts, seeded by ``HACPO_KILL_SEED`` (printed on
failure; CI uses the default). After every kill, before the rerun, no file a reader would take for complete
may be partial.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from toy_runs import assert_events_match_logs

from hacpo.checkpoints import CHECKPOINT_MANIFEST, checkpoint_steps
from hacpo.runio import MetricsLog, RunRecord, read_jsonl

pytestmark = pytest.mark.slow

FAULTS = Path(__file__).with_name("faults.py")
SEED = int(os.environ.get("HACPO_KILL_SEED", "20261130"))
TRAIN_POINTS = [
    "generate",
    "score",
    "update",
    "metrics",
    "validate",
    "validation",
    "checkpoint",
    "run_json",
    "prune",
    "timer",
]
EVAL_POINTS = ["eval_generate", "eval_write", "timer"]
AGENTS = ("llama", "qwen")
# Two LoRA adapters on one shared base (llama's) beside a model of its own (qwen): the shared-base layout
SHARED = {
    "a": {"model": "llama", "shared_base": "llama", "adapter": {"lora": {"rank": 4, "alpha": 8}}},
    "b": {"model": "llama", "shared_base": "llama", "adapter": {"lora": {"rank": 2, "alpha": 4}}, "lr": 1e-4},
    "qwen": {"model": "qwen"},
}
SHARED_POINTS = ["update", "checkpoint", "prune"]
STEPS = 4
CHECKPOINT_FILES = {"config.json", "model.safetensors", "trainer_state.pt", "tokenizer_config.json"}
ADAPTER_FILES = {"adapter_config.json", "adapter_model.safetensors", "trainer_state.pt"}


def hacpo(kill: str, counts: Path, *args: str) -> tuple[int, float]:
    """``hacpo ARGS`` under fault injection; (return code, seconds)."""
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, str(FAULTS), kill, str(counts), "--", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    if out.returncode not in (0, -9):
        raise AssertionError(f"hacpo {args[0]} under {kill!r} failed ({out.returncode}):\n{out.stderr}")
    return out.returncode, time.perf_counter() - t0


def agent_entries(agents: dict[str, Path], shared: bool) -> list[dict]:
    if not shared:
        return [{"name": n, "path": str(agents[n])} for n in AGENTS]
    return [
        {"name": n, "path": str(agents[e["model"]]), **{k: v for k, v in e.items() if k != "model"}}
        for n, e in SHARED.items()
    ]


def run_config(out_dir: Path, data: Path, agents: dict[str, Path], shared: bool = False) -> str:
    """A small HACPO run that reaches every kill point: validation coincides with both checkpoints, older
    checkpoints are pruned, scoring uses a worker pool. Two agents of different architectures and
    tokenizers; ``shared``: two adapters on one base beside them (:data:`SHARED`)."""
    return json.dumps(
        {
            "method": "hacpo",
            "agents": agent_entries(agents, shared),
            "train_file": str(data / "train.jsonl"),
            "val_file": str(data / "dev.jsonl"),
            "out_dir": str(out_dir),
            "steps": STEPS,
            "prompts_per_step": 4,
            "group_size": 4,
            "minibatch_size": 8,
            "val_every": 2,
            "val_size": 20,
            "checkpoint_every": 2,
            "keep_checkpoints": 1,
            "scorer_workers": 1,
            "seed": 5,
        }
    )


def eval_args(run_dir: Path, data: Path, out: Path) -> list[str]:
    settings = {
        "max_new_tokens": 13,
        "benchmarks": {
            "greedy": {"file": str(data / "dev.jsonl"), "metric": "avg@1"},
            "sampled": {"file": str(data / "dev.jsonl"), "greedy": False, "k": 4, "metric": "avg@4"},
        },
    }
    source = {"run": str(run_dir), "agent": "qwen"}
    return ["eval", "--source", json.dumps(source), "--settings", json.dumps(settings), "--out", str(out)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, toy_data, small_agent, other_agent):
    """The uninterrupted run and evaluation, with how often each kill point was reached."""
    root = tmp_path_factory.mktemp("reference")
    agents = {"llama": small_agent, "qwen": other_agent}
    data = root / "data"  # a small dev split keeps every evaluation short
    data.mkdir()
    shutil.copy(toy_data / "train.jsonl", data / "train.jsonl")
    (data / "dev.jsonl").write_text("".join((toy_data / "dev.jsonl").read_text().splitlines(True)[:30]))
    run_dir = root / "run"
    rc, train_s = hacpo("none", root / "train.counts", "train", run_config(run_dir, data, agents))
    rc_eval, eval_s = hacpo("none", root / "eval.counts", *eval_args(run_dir, data, root / "eval"))
    assert rc == rc_eval == 0
    return {
        "run": run_dir,
        "eval": root / "eval",
        "data": data,
        "agents": agents,
        "counts": {
            "train": json.loads((root / "train.counts").read_text()),
            "eval": json.loads((root / "eval.counts").read_text()),
        },
        "seconds": {"train": train_s, "eval": eval_s},
        "shared": False,
    }


@pytest.fixture(scope="module")
def shared_reference(reference, tmp_path_factory):
    """The uninterrupted run of the shared-base layout (:data:`SHARED`), on the same data and models."""
    root = tmp_path_factory.mktemp("shared-reference")
    args = run_config(root / "run", reference["data"], reference["agents"], shared=True)
    rc, train_s = hacpo("none", root / "train.counts", "train", args)
    assert rc == 0
    counts = {"train": json.loads((root / "train.counts").read_text())}
    return {
        **reference,
        "run": root / "run",
        "counts": counts,
        "seconds": {"train": train_s},
        "shared": True,
    }


def draw(reference, stage: str, point: str, salt: int) -> str:
    """The kill spec: the n-th occurrence of ``point`` (n uniform over the reference run's count), or a
    wall-clock delay uniform over 20–95 % of the reference's time (start-up included)."""
    rng = random.Random(f"{SEED}:{stage}:{point}:{salt}")
    if point == "timer":
        return f"timer:{rng.uniform(0.2, 0.95) * reference['seconds'][stage]:.2f}"
    count = reference["counts"][stage].get(point, 0)
    assert count > 0, f"the {stage} never reached {point!r}: the kill test does not cover it"
    return f"{point}:{rng.randint(1, count)}"


def without_timing(obj):
    """JSON data with wall-time and memory fields removed (they differ between any two runs)."""
    if isinstance(obj, dict):
        return {
            k: without_timing(v)
            for k, v in obj.items()
            if not k.startswith(("time/", "mem/", "time_")) and k != "profile"
        }
    if isinstance(obj, list):
        return [without_timing(v) for v in obj]
    return obj


def temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*") if p.name != ".lock"]


def is_complete(run_dir: Path) -> bool:
    record = RunRecord.read(run_dir)  # replaced atomically: it always parses
    return record is not None and record.complete


def checkpoint_files(agent: str) -> set[str]:
    """What an agent's complete checkpoint holds: its model, or its adapter alone on a shared base."""
    return ADAPTER_FILES if "shared_base" in SHARED.get(agent, {}) else CHECKPOINT_FILES


def assert_nothing_partial_passes_for_complete(run_dir: Path, names=AGENTS) -> None:
    """What a killed, unfinished run leaves, as a reader sees it: every checkpoint folder a reader would find
    (``step-N``) is whole; the step run.json records is resumable (every agent has its checkpoint: pruning
    never runs ahead of it); every JSONL line but a torn last one parses."""
    if record := RunRecord.read(run_dir):
        step = record.step
        assert step == 0 or step in checkpoint_steps(run_dir, names), f"run.json's step {step} is gone"
    for ckpt in (run_dir / "checkpoints").glob("*/step-*"):
        assert checkpoint_files(ckpt.parent.name) <= {p.name for p in ckpt.iterdir()}, ckpt
    for log in ("metrics.jsonl", "validation.jsonl", "updates.jsonl"):
        lines = (run_dir / log).read_text().split("\n") if (run_dir / log).exists() else []
        for line in lines[:-1]:
            json.loads(line)


def assert_same_run(ref: Path, run: Path, names=AGENTS) -> None:
    record = RunRecord.read(run)
    assert record.complete and record.step == STEPS
    strip = [without_timing(r) for r in read_jsonl(ref / "metrics.jsonl")]
    assert [without_timing(r) for r in read_jsonl(run / "metrics.jsonl")] == strip  # strict: no torn line
    assert read_jsonl(run / "validation.jsonl") == read_jsonl(ref / "validation.jsonl")
    assert read_jsonl(run / "updates.jsonl") == read_jsonl(ref / "updates.jsonl")  # no duplicates, no gaps
    assert_events_match_logs(run)  # the live curves too, whatever the kill interrupted
    assert sorted(p.relative_to(run) for p in (run / "checkpoints").rglob("*")) == sorted(
        p.relative_to(ref) for p in (ref / "checkpoints").rglob("*")
    )
    for name in names:
        a, b = ref / "checkpoints" / name / f"step-{STEPS}", run / "checkpoints" / name / f"step-{STEPS}"
        assert checkpoint_files(name) <= {f.name for f in a.iterdir()}, name
        for f in a.iterdir():
            if f.name == "trainer_state.pt":  # optimizer, RNG and capability state: equal tensors
                sa, sb = torch.load(f, weights_only=False), torch.load(b / f.name, weights_only=False)
                assert_equal_state(sa, sb, f"{name}/trainer_state")
            elif f.name == CHECKPOINT_MANIFEST:  # the same files, sizes and hashes but the state's pickle
                ma, mb = (json.loads(x.read_text())["files"] for x in (f, b / f.name))
                assert ma.keys() == mb.keys(), f"{name}/{f.name}"
                ma.pop("trainer_state.pt"), mb.pop("trainer_state.pt")
                assert ma == mb, f"{name}/{f.name}"
            else:
                assert f.read_bytes() == (b / f.name).read_bytes(), f"{name}/{f.name}"
    assert temporaries(run) == [], "a rerun leaves no temporaries of the killed writes"


def assert_equal_state(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_equal_state(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_equal_state(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def wait_gone(pids: list[int], timeout: float = 15) -> None:
    """The scorer's workers exit once their parent is gone (EOF on their pipe); zombies count as gone."""
    t0 = time.time()
    for pid in pids:
        status = Path(f"/proc/{pid}/status")
        while status.exists() and "\nState:\tZ" not in status.read_text():
            assert time.time() - t0 < timeout, f"scorer worker {pid} outlived its killed parent"
            time.sleep(0.1)


# Fixed points that once hid bugs, beside the random draws: run.json's write after the last checkpoint (the
# old checkpoint was never pruned on resume) and the second agent's final checkpoint (agents pruned one by one
# could leave no common step).
HARD_POINTS = ["run_json:3", "checkpoint:4", "prune:2"]


def kill_rerun_and_compare(reference, tmp_path: Path, point: str) -> None:
    """Train under the kill ``point``, check what the killed run left, rerun, compare with ``reference`` (its
    layout: the two models, or :data:`SHARED`)."""
    shared = reference["shared"]
    run_dir, names = tmp_path / "run", tuple(SHARED) if shared else AGENTS
    args = ["train", run_config(run_dir, reference["data"], reference["agents"], shared=shared)]
    spec = point if ":" in point else draw(reference, "train", point, int(shared))
    rc, _ = hacpo(spec, tmp_path / "killed.counts", *args)
    context = f"kill {spec} (HACPO_KILL_SEED={SEED})"
    if not point.startswith("timer"):
        assert rc == -9, f"{context}: the run was not killed"
    if rc == -9 and is_complete(run_dir):  # a timer can fire after the run finished, in the exit
        assert_same_run(reference["run"], run_dir, names)
    elif rc == -9:
        assert_nothing_partial_passes_for_complete(run_dir, names)
    orphans = tmp_path / "killed.orphans"
    if orphans.exists():
        wait_gone(json.loads(orphans.read_text()))
    assert hacpo("none", tmp_path / "rerun.counts", *args)[0] == 0, context
    assert_same_run(reference["run"], run_dir, names)


@pytest.mark.parametrize("point", TRAIN_POINTS + HARD_POINTS)
def test_training_killed_then_rerun_equals_uninterrupted(reference, tmp_path, point):
    kill_rerun_and_compare(reference, tmp_path, point)


@pytest.mark.parametrize("point", SHARED_POINTS)
def test_a_shared_base_run_killed_then_rerun_equals_uninterrupted(shared_reference, tmp_path, point):
    """Two adapters on one base beside a model of its own: killed in an update, while a checkpoint (an
    adapter alone) is written, or while older ones are pruned, the rerun ends as the uninterrupted run."""
    kill_rerun_and_compare(shared_reference, tmp_path, point)


@pytest.mark.parametrize("point", EVAL_POINTS)
def test_evaluation_killed_then_rerun_equals_uninterrupted(reference, tmp_path, point):
    out = tmp_path / "eval"
    args = eval_args(reference["run"], reference["data"], out)
    spec = draw(reference, "eval", point, 0)
    rc, _ = hacpo(spec, tmp_path / "killed.counts", *args)
    if point != "timer":
        assert rc == -9, f"kill {spec}: the evaluation was not killed"
    if rc == -9:  # summary.json is written last: its absence says the setting is unfinished
        assert not (out / "summary.json").exists()
        for summary in out.glob("*.json"):  # a benchmark's summary is written after its whole audit
            s = json.loads(summary.read_text())
            audit = read_jsonl(summary.with_suffix(".samples.jsonl"))
            assert len(audit) == s["n_problems"] * s["samples_per_problem"], summary.name
    assert hacpo("none", tmp_path / "rerun.counts", *args)[0] == 0
    ref = reference["eval"]
    assert sorted(p.name for p in out.iterdir() if p.name != ".lock") == sorted(
        p.name for p in ref.iterdir() if p.name != ".lock"
    )
    for f in ref.glob("*.samples.jsonl"):
        assert f.read_bytes() == (out / f.name).read_bytes(), f.name
    for f in ref.glob("*.json"):
        assert without_timing(json.loads(f.read_text())) == without_timing(
            json.loads((out / f.name).read_text())
        )
    assert temporaries(out) == []


def test_torn_metrics_line_is_dropped_on_read(tmp_path):
    """The reader's side of a torn append: complete rows are read, the half line is not taken for a row."""
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.append({"step": 0, "x": 1.0})
    with open(log.path, "a") as f:
        f.write('{"step": 1, "x"')
    assert log.read() == [{"step": 0, "x": 1.0}]
    log.truncate_to(1)
    assert read_jsonl(log.path) == [{"step": 0, "x": 1.0}]
