"""Synthetic problem families: determinism, disjoint splits, verifiable answers, prompts, JSONL."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest

from hacpo.data.synthetic import (
    FAMILIES,
    STYLES,
    Problem,
    as_problem,
    family_split,
    make_splits,
    read_jsonl,
    solution_text,
    user_message,
    word_vocabulary,
    write_jsonl,
)

SMALL = dict(n_test=40, n_dev=20, n_train=100)


@pytest.fixture(scope="module")
def splits():
    return make_splits(list(FAMILIES), seed=0, **SMALL)


def test_deterministic_by_seed(splits):
    again = make_splits(list(FAMILIES), seed=0, **SMALL)
    other = make_splits(list(FAMILIES), seed=1, **SMALL)
    assert again == splits
    assert [p.id for p in other["test"]] != [p.id for p in splits["test"]]


def test_splits_disjoint_and_sized(splits):
    texts = {k: [p.problem for p in v] for k, v in splits.items()}
    for k, v in texts.items():
        assert len(v) == len(set(v)), f"duplicates within {k}"
        assert len(v) == len(FAMILIES) * SMALL[f"n_{k}"]
    assert not set(texts["train"]) & set(texts["dev"])
    assert not set(texts["train"]) & set(texts["test"])
    assert not set(texts["dev"]) & set(texts["test"])
    ids = [p.id for v in splits.values() for p in v]
    assert len(ids) == len(set(ids))


def test_add2_universe_and_stability():
    s = make_splits(["add2"], seed=0, n_test=1000, n_dev=200, n_train=None)
    assert (len(s["test"]), len(s["dev"]), len(s["train"])) == (1000, 200, 8800)
    every = {p.problem for v in s.values() for p in v}
    assert every == {f"{a:02d}+{b:02d}" for a in range(100) for b in range(100)}
    small = make_splits(["add2"], seed=0, n_test=200, n_dev=200, n_train=None)
    assert small["test"] == s["test"][:200]  # test-200 ⊂ test-1000
    assert small["dev"] == s["dev"]  # dev independent of n_test
    # a family's problems do not depend on which other families are requested
    mixed = make_splits(["sub2", "add2"], seed=0, n_test=1000, n_dev=200, n_train=None)
    assert [p for p in mixed["test"] if p.family == "add2"] == s["test"]


def test_too_small_universe_and_unknown_names():
    with pytest.raises(ValueError, match="mul1"):
        family_split("mul1", 0, n_test=1000, n_dev=0, n_train=0)
    with pytest.raises(ValueError, match="unknown family"):
        make_splits(["nope"], 0, 1, 1, 1)
    with pytest.raises(ValueError, match="style"):
        user_message(Problem("x", "1+1", "2", "add2", 1), "chatty")


def _value(p: Problem) -> Fraction:
    """Independent evaluation of the problem (not via ``answer``)."""
    if p.family == "word":
        return Fraction(re.findall(r"=(\d+)", p.work)[-1])
    expr = p.problem
    if p.family == "frac":
        a, b = expr.split("+")
        return Fraction(a) + Fraction(b)
    if p.family == "mul1":
        a, b = expr.split("*")
        return Fraction(int(a) * int(b))
    signed = re.findall(r"([+-]?)(\d+)", expr)
    return Fraction(sum(-int(n) if s == "-" else int(n) for s, n in signed))


def test_answers_verify_with_math_verify(splits):
    from math_verify import parse, verify

    per_family: dict[str, int] = {}
    for p in splits["test"]:
        if per_family.get(p.family, 0) >= 8:
            continue
        per_family[p.family] = per_family.get(p.family, 0) + 1
        gold = parse(f"\\boxed{{{p.answer}}}")
        assert gold, f"math-verify cannot parse {p.answer!r}"
        v = _value(p)
        alt = str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"
        assert verify(gold, parse(f"${alt}$")), (p, alt)
        for style in STYLES:
            assert verify(gold, parse(solution_text(p, style))), (p, style)
        assert not verify(gold, parse(f"\\boxed{{{v + 1}}}"))
    assert set(per_family) == set(FAMILIES)


def test_prompts_and_solutions():
    p = Problem(id="add2-x", problem="12+34", answer="46", family="add2", difficulty=1, work="12+34=46")
    assert user_message(p, "compact") == "12+34="
    assert user_message(p, "paper") == (
        "12+34 Let's think step by step and output the final answer within \\boxed{}."
    )
    assert solution_text(p, "compact") == "\\boxed{46}"
    assert solution_text(p, "paper") == "12+34=46. \\boxed{46}"
    bare = Problem.from_dict({"id": "b", "problem": "What is 1+1?", "answer": "2"})
    assert solution_text(bare, "paper") == "\\boxed{2}"


def test_families_render_expected_shapes(splits):
    by_fam = {p.family: p for p in splits["test"]}
    assert re.fullmatch(r"\d\d\+\d\d", by_fam["add2"].problem)
    assert re.fullmatch(r"\d{3}\+\d{3}", by_fam["add3"].problem)
    assert re.fullmatch(r"\d\d-\d\d", by_fam["sub2"].problem)
    assert re.fullmatch(r"\d\*\d\d", by_fam["mul1"].problem)
    assert re.fullmatch(r"\d+\+\d+-\d+", by_fam["chain3"].problem)
    assert re.fullmatch(r"\d/\d\+\d/\d", by_fam["frac"].problem)
    assert by_fam["word"].problem.endswith("?")
    for p in splits["test"]:
        assert not p.answer.startswith("-")
        assert p.difficulty >= 1
    assert {"apples", "Let's", "think", "boxed"} - set(word_vocabulary()) == {"boxed"}


def test_jsonl_roundtrip(tmp_path, splits):
    path = tmp_path / "sub" / "train.jsonl"
    write_jsonl(path, splits["train"])
    assert read_jsonl(path, as_problems=True) == splits["train"]
    assert [Problem.from_dict(d) for d in read_jsonl(path)] == splits["train"]
    assert sorted(x.name for x in path.parent.iterdir()) == ["train.jsonl"]  # no temp files left
    write_jsonl(path, [{"a": 1}])
    assert read_jsonl(path) == [{"a": 1}]


def test_as_problem_tolerant_rows():
    p = Problem(id="add2-x", problem="12+34", answer="46", family="add2", difficulty=1, work="12+34=46")
    assert as_problem(p) is p
    assert as_problem(p.to_dict()) == p and as_problem(p.to_dict()).work == p.work
    bench = as_problem({"problem": "What is 1+1?", "answer": 2, "level": "Level 1"})
    assert (bench.answer, bench.family, bench.difficulty, bench.work) == ("2", "", 0, "")
    assert bench.id == as_problem({"problem": "What is 1+1?", "answer": "2"}).id  # stable derived id
    assert as_problem({"id": 7, "question": "Q?", "answer": "3"}).problem == "Q?"
    with pytest.raises(ValueError, match="answer"):
        as_problem({"problem": "no answer"})
