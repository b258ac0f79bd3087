"""Re-scoring saved responses without generating (issue 5: a separate rule)."""

from __future__ import annotations

import json

import pytest

from hacpo.eval import rescore


def test_rescore_uses_the_benchmarks_current_golds(tmp_path):
    samples = tmp_path / "b.samples.jsonl"
    rows = [
        {
            "id": "p1",
            "sample": 0,
            "response": r"so \boxed{12}",
            "extracted": "12",
            "gold": "12",
            "correct": True,
        },
        {
            "id": "p1",
            "sample": 1,
            "response": r"\boxed{13}",
            "extracted": "13",
            "gold": "12",
            "correct": False,
        },
        {
            "id": "p2",
            "sample": 0,
            "response": r"\boxed{\frac{1}{2}}",
            "extracted": None,
            "gold": "7",
            "correct": False,
        },
        {
            "id": "p2",
            "sample": 1,
            "response": "0.5 without a box",
            "extracted": None,
            "gold": "7",
            "correct": False,
        },
    ]
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bench = tmp_path / "bench.jsonl"  # p2's gold was wrong (7) and is now fixed (0.5)
    bench.write_text(
        json.dumps({"id": "p1", "problem": "x", "answer": "12"})
        + "\n"
        + json.dumps({"id": "p2", "problem": "y", "answer": "0.5"})
        + "\n"
    )
    summary = rescore(samples, bench, tmp_path / "b.rescored.json")
    assert summary["changed"] == 1  # only the boxed 1/2 flips; the unboxed answer still scores 0
    assert summary["avg@2"] == 0.5 and summary["pass@2"] == 1.0
    audit = [json.loads(x) for x in (tmp_path / "b.rescored.samples.jsonl").read_text().splitlines()]
    assert [r["correct"] for r in audit] == [True, False, True, False] and audit[2]["gold"] == "0.5"
    assert json.loads((tmp_path / "b.rescored.json").read_text()) == summary


def test_rescore_rejects_unknown_problem_ids(tmp_path):
    samples = tmp_path / "s.samples.jsonl"
    samples.write_text(json.dumps({"id": "zz", "sample": 0, "response": "", "correct": False}) + "\n")
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"id": "p1", "problem": "x", "answer": "1"}) + "\n")
    try:
        rescore(samples, bench, tmp_path / "o.json")
    except ValueError as err:
        assert "not in" in str(err) and "zz" in str(err)
    else:
        raise AssertionError("expected a ValueError")
    assert not (tmp_path / "o.json").exists()


class _FixedGenerator:
    """k canned responses per problem: the i-th sample is correct iff i < (number in the problem id)."""

    def generate(self, problems, sampling):
        return [
            [rf"\boxed{{{p['answer'] if i < int(p['id']) else 'x'}}}" for i in range(sampling.k)]
            for p in problems
        ]


def test_evaluate_setting_writes_every_benchmark_then_the_summary(tmp_path):
    from hacpo.eval import evaluate_setting

    bench = tmp_path / "b.jsonl"
    bench.write_text(
        "".join(json.dumps({"id": str(i), "problem": "q", "answer": str(7 + i)}) + "\n" for i in (0, 2, 4))
    )
    settings = {
        "max_new_tokens": 8,
        "benchmarks": {
            "greedy": {"file": str(bench), "metric": "avg@1"},
            "sampled": {"file": str(bench), "metric": "avg@4", "greedy": False, "k": 4, "pass_ks": [2]},
        },
    }
    results = evaluate_setting(_FixedGenerator(), settings, tmp_path / "out")
    s = results["sampled"]  # per problem 0/4, 2/4, 4/4 correct
    assert s["value"] == s["avg@4"] == 0.5 and s["pass@4"] == 2 / 3
    assert abs(s["pass@2"] - (0 + (1 - 1 / 6) + 1) / 3) < 1e-12  # the "best@k" reading: unbiased pass@2
    assert results["greedy"]["value"] == 2 / 3  # sample 0 is correct for ids 2 and 4
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert set(summary["benchmarks"]) == {"greedy", "sampled"}
    assert (tmp_path / "out" / "sampled.samples.jsonl").read_text().count("\n") == 12


@pytest.mark.parametrize(
    "flag,expected",
    [([], (5000, "bf16")), (["--batch-tokens", "700", "--precision", "fp32"], (700, "fp32"))],
)
def test_a_workflow_evaluation_generates_with_the_settings_budget_and_precision(
    tmp_path, monkeypatch, flag, expected
):
    """`batch_tokens` and `precision` of an evaluation setting reach the local generator; flags override."""
    import hacpo.eval.local
    from hacpo.cli import main

    made = []

    class Recorder(_FixedGenerator):
        def __init__(self, path, device="auto", threads=1, batch_tokens=None, precision="fp32"):
            made.append((path, batch_tokens, precision))

    monkeypatch.setattr(hacpo.eval.local, "LocalGenerator", Recorder)
    bench = tmp_path / "b.jsonl"
    bench.write_text(json.dumps({"id": "1", "problem": "q", "answer": "7"}) + "\n")
    settings = {"max_new_tokens": 8, "batch_tokens": 5000, "precision": "bf16"}
    settings["benchmarks"] = {"b": {"file": str(bench)}}
    argv = ["eval", "--source", json.dumps({"model": "m"}), "--settings", json.dumps(settings)]
    assert main([*argv, "--out", str(tmp_path / "out"), *flag]) == 0
    assert made == [("m", *expected)]


PARTIAL = """
def half_for_x(responses, answers, metadata):  # full credit for the gold, half for an "x" answer
    return [1.0 if "{" + a + "}" in r else 0.5 if "{x}" in r else 0.0 for r, a in zip(responses, answers)]
"""


def test_partial_credit_counts_its_share_in_accuracy_and_never_a_pass(tmp_path):
    """One definition (hacpo.eval.metrics): accuracy = avg@k = the mean reward; pass@k and the audit's
    `correct` count a sample correct at full credit only, so the summary and the audit agree."""
    from hacpo.eval import Sampling, evaluate
    from hacpo.eval.metrics import summarize

    s = summarize([[0.5, 0.5, 1.0, 0.0]])
    assert s["avg@4"] == s["accuracy"] == 0.5
    assert s["pass@1"] == 0.25  # one sample of four at full credit, not two halves counted as one
    with pytest.raises(ValueError, match=r"outside \[0, 1\].*reward\.range"):
        summarize([[2.0, 0.0]])
    verify = tmp_path / "verify.py"
    verify.write_text(PARTIAL)
    bench = tmp_path / "b.jsonl"
    bench.write_text(
        "".join(json.dumps({"id": str(i), "problem": "q", "answer": str(7 + i)}) + "\n" for i in (1, 3))
    )
    sampling = Sampling(greedy=False, k=4)
    reward = {"file": str(verify), "name": "half_for_x"}
    summary = evaluate(_FixedGenerator(), bench, tmp_path / "out", sampling, reward=reward, scorer_workers=1)
    # id 1: rewards 1, .5, .5, .5; id 3: 1, 1, 1, .5
    assert summary["accuracy"] == summary["avg@4"] == (2.5 / 4 + 3.5 / 4) / 2
    assert summary["pass@1"] == (1 / 4 + 3 / 4) / 2
    audit = [json.loads(x) for x in (tmp_path / "out.samples.jsonl").read_text().splitlines()]
    assert [r["correct"] for r in audit] == [r["reward"] == 1.0 for r in audit]
    assert sum(r["correct"] for r in audit) == 4 and [r["reward"] for r in audit][:2] == [1.0, 0.5]


def test_rescoring_an_audit_without_its_verifier_says_which_it_assumes(tmp_path, capsys):
    """An audit from before audits recorded their verifier: the verifier its evaluation summary names, or
    math-verify, and the summary and stderr say which, never silently."""
    samples = tmp_path / "b.samples.jsonl"
    row = {"id": "p1", "sample": 0, "response": r"\boxed{12}", "correct": True}
    samples.write_text(json.dumps(row) + "\n")
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"id": "p1", "problem": "x", "answer": "12"}) + "\n")
    summary = rescore(samples, bench, tmp_path / "o.json")
    assert summary["reward"] == "math_verify" and summary["verifier_from"] == "assumed"
    assert "math_verify assumed" in summary["notes"][0] and "math_verify assumed" in capsys.readouterr().err
    (tmp_path / "b.json").write_text(json.dumps({"reward": "hendrycks"}))  # its evaluation's summary
    summary = rescore(samples, bench, tmp_path / "o.json")
    assert summary["reward"] == "hendrycks" and summary["verifier_from"] == "evaluation summary"
    assert "hendrycks" in summary["notes"][0] and "b.json" in capsys.readouterr().err


def test_a_verifiers_detailed_scores_and_the_engine_agreement_pass_each_records_metadata():
    from pathlib import Path

    from hacpo.eval.agreement import score_answers
    from hacpo.reward import Scorer

    reward = {"file": str(Path(__file__).parent / "fixtures" / "verifiers.py"), "name": "exact"}
    with Scorer(workers=1, reward=reward) as s:
        got = s.score_detailed(["answer: 3", "answer: 4"], ["3", "4"], [{"credit": 0.5}, {}])
    assert [d["reward"] for d in got] == [0.5, 1.0]
    problems = [{"id": "a", "answer": "3", "metadata": {"credit": 0.25}}, {"id": "b", "answer": "5"}]
    answers = {"local": ["answer: 3", "answer: 5"], "vllm": ["answer: 3", "answer: 4"]}
    assert score_answers(answers, problems, reward) == {"local": [0.25, 1.0], "vllm": [0.25, 0.0]}


def test_rescoring_an_audit_whose_verifier_is_gone_says_how_to_name_one(tmp_path):
    from hacpo.reward import VerifierError

    samples = tmp_path / "b.samples.jsonl"
    gone = {"file": str(tmp_path / "gone.py"), "name": "verify", "sha256": "0" * 64}
    row = {"id": "p1", "sample": 0, "response": r"\boxed{12}", "correct": True, "verifier": gone}
    samples.write_text(json.dumps(row) + "\n")
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"id": "p1", "problem": "x", "answer": "12"}) + "\n")
    with pytest.raises(VerifierError, match=r"b\.samples\.jsonl: cannot load its verifier.*--reward"):
        rescore(samples, bench, tmp_path / "o.json")
    assert rescore(samples, bench, tmp_path / "o.json", reward="math_verify")["accuracy"] == 1.0
