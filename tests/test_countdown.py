"""Countdown, the shipped task of your own (config/countdown.yaml): its verifier, and the workflow end to end
at CI size with a dataset entry and a verifier function only."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "config" / "countdown"


def _verify_module():
    spec = importlib.util.spec_from_file_location("countdown_verify", HERE / "verify.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


verify = _verify_module()


@pytest.mark.parametrize(
    ("expression", "nums", "target", "ok"),
    [
        ("3*5+7", [3, 5, 7], 22, True),
        ("(7-3)*5", [3, 5, 7], 20, True),
        ("7 × 3 ÷ 3", [3, 3, 7], 7, True),  # the signs a model may write
        ("10/4", [10, 4], 2.5, True),  # exact fractions
        ("5*5", [3, 5, 7], 25, False),  # 5 twice, given once
        ("3+5", [3, 5, 7], 9, False),  # wrong value
        ("7/(3-3)", [3, 3, 7], 0, False),  # division by zero
        ("3**2", [3, 2], 9, False),  # no other operators
        ("2.5*2", [2, 5], 5, False),  # integers only
        ("-3+10", [3, 10], 7, False),  # no unary minus
        ("__import__('os').getpid()", [1], 1, False),  # never evaluated as code
        ("(" * 300 + "1" + ")" * 300, [1], 1, False),  # too long
    ],
)
def test_the_verifier_accepts_exactly_the_valid_expressions(expression, nums, target, ok):
    assert verify.reaches(expression, nums, target) is ok


def test_the_verifier_reads_the_last_box_and_each_records_metadata():
    responses = ["\\boxed{3*5} then \\boxed{3*5+7}", "no box", "\\boxed{7+3}"]
    meta = [{"nums": [3, 5, 7], "target": 22}, {"nums": [1], "target": 1}, {"nums": [3, 7], "target": 10}]
    assert verify.countdown(responses, ["", "", ""], meta) == [1.0, 0.0, 1.0]


def test_the_shipped_files_are_what_make_data_writes(tmp_path):
    before = {p.name: p.read_text() for p in HERE.glob("*.jsonl")}
    assert set(before) == {"train.jsonl", "dev.jsonl", "test.jsonl"}
    for text in before.values():
        for row in map(json.loads, text.splitlines()):  # every reference solution is valid
            assert verify.reaches(row["solution"], row["nums"], row["target"]), row
    make = [sys.executable, str(HERE / "make_data.py"), str(tmp_path)]
    subprocess.run(make, check=True, capture_output=True)
    assert {p.name: p.read_text() for p in tmp_path.glob("*.jsonl")} == before  # deterministic


def test_countdown_config_end_to_end_at_ci_size(tmp_path):
    """config/countdown.yaml shrunk to CI size (fewer steps and warm-up steps; absolute paths, as the
    workflow runs in a scratch directory): Table 1 and the scorecard rows come out, every run and
    evaluation scored by the verifier."""
    cfg = yaml.safe_load((ROOT / "config" / "countdown.yaml").read_text())
    agents = yaml.safe_load((HERE / "agents.yaml").read_text())
    for spec in agents.values():
        spec |= {"max_steps": 80, "eval_every": 40, "target_dev_acc": None}
    (tmp_path / "agents.yaml").write_text(yaml.safe_dump(agents))
    for name, m in cfg["models"].items():
        m["warmup"] = f"{tmp_path / 'agents.yaml'}:{name}"
    for d in cfg["datasets"].values():
        d["local"] = str(ROOT / d["local"])
    reward = {"file": str(HERE / "verify.py"), "name": "countdown"}
    cfg["training"] |= {"reward": reward, "steps": 2, "prompts_per_step": 4, "val_every": 1, "val_size": 20,
                        "checkpoint_every": 1}  # fmt: skip
    cfg["benchmarks"]["countdown_test"]["reward"] = reward
    cfg["datasets"]["countdown_test"]["limit"] = 40
    cfg["seeds"] = [0]
    configfile = tmp_path / "countdown.yaml"
    configfile.write_text(yaml.safe_dump(cfg))
    work = tmp_path / "work"
    args = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "-c2",
            "--configfile", str(configfile), "--directory", str(work)]  # fmt: skip
    out = subprocess.run(args, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    res = work / "results" / "countdown"
    table = (res / "tables" / "table1.md").read_text()
    assert "Countdown (greedy)" in table and "HACPO" in table
    # a task the paper never ran: our numbers only, no paper value beside them (issue 46, item 5)
    assert "(paper " not in table and "Paper:" not in table
    assert pd.read_csv(res / "tables" / "table1.csv")["paper"].isna().all()
    card = pd.read_csv(res / "tables" / "claims.csv")
    assert "hacpo_beats_gspo_x2" in set(card["claim"]) and card["paper_diff"].isna().all()
    runs = list((res / "runs").glob("*/*/*/seed0/metrics.jsonl"))
    assert len(runs) == 6
    for path in runs:  # the verifier scored every rollout, and never failed
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert rows and all(r["verifier_failed"] == 0 for r in rows)
    summaries = list((res / "eval").rglob("countdown_test.json"))
    assert len(summaries) == 5 * 2  # base, GSPO, GSPO×2, Naive, HACPO × two agents
    for path in summaries:  # scored by the benchmark's verifier, not math-verify
        assert json.loads(path.read_text())["reward"]["name"] == "countdown"
    samples = [json.loads(line) for s in (res / "eval").rglob("countdown_test.samples.jsonl")
               for line in s.read_text().splitlines()]  # fmt: skip
    assert samples and any(s["correct"] for s in samples)


class _CannedCountdown:
    """Per problem in turn: its reference solution (right for both verifiers), the bare target (right for
    math-verify only: no number of the record's) and a wrong expression."""

    def generate(self, problems, sampling):
        out = []
        for i, p in enumerate(problems):
            box = (p["answer"], str(p["metadata"]["target"]), "1+1")[i % 3]
            out.append([f"so \\boxed{{{box}}}"])
        return out


def test_rescoring_a_countdown_evaluation_reproduces_its_accuracy(tmp_path, capsys):
    """An evaluation scored by the Countdown verifier, rescored: by that verifier (the audit records it),
    each record's metadata passed, the same accuracy exactly; the summary names the verifier. Asked for
    another one, the summary says so."""
    from hacpo.data.own import load
    from hacpo.eval import Sampling, evaluate, rescore

    rows = load(HERE / "test.jsonl", {"problem": "question", "answer": "solution", "id": "id"},
                "countdown_test", "datasets.countdown_test")[:30]  # fmt: skip
    bench = tmp_path / "countdown_test.jsonl"
    bench.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reward = {"file": str(HERE / "verify.py"), "name": "countdown"}
    evaluated = evaluate(_CannedCountdown(), bench, tmp_path / "countdown_test", Sampling(), reward=reward)
    responses = [r[0] for r in _CannedCountdown().generate(rows, None)]
    right = verify.countdown(responses, [r["answer"] for r in rows], [r["metadata"] for r in rows])
    assert evaluated["accuracy"] == sum(right) / 30 < 0.5  # the reference solutions (and a few targets)
    audit = tmp_path / "countdown_test.samples.jsonl"
    recorded = json.loads(audit.read_text().splitlines()[0])["verifier"]
    assert recorded["file"] == reward["file"] and recorded["name"] == "countdown"
    assert len(recorded["sha256"]) == 64

    again = rescore(audit, bench, tmp_path / "countdown_test.rescored.json")
    assert again["accuracy"] == evaluated["accuracy"] and again["changed"] == 0
    assert again["reward"]["name"] == "countdown" and again["verifier_from"] == "audit"
    assert "notes" not in again and "note:" not in capsys.readouterr().err

    other = rescore(audit, bench, tmp_path / "other.json", reward="math_verify")
    assert other["accuracy"] >= 20 / 30 and other["reward"] == "math_verify"  # every bare target passes
    assert other["verifier_from"] == "argument" and "countdown" in other["notes"][0]
    assert "as asked" in capsys.readouterr().err
