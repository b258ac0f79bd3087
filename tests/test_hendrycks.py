"""hacpo.reward.hendrycks: the authors' as-released verl reward (Hendrycks normalisation + exact match)."""

from __future__ import annotations

import pytest

from hacpo.reward import REWARDS, Scorer, hendrycks_score
from hacpo.reward.hendrycks import hendrycks_detailed, strip_string


def box(s: str) -> str:
    return "The answer is \\boxed{" + s + "}."


# ------------------------------------------------------------------------------------------ normalisation


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("\\frac{1}{2}", "\\frac{1}{2}"),
        ("0.5", "\\frac{1}{2}"),
        ("\\dfrac12", "\\frac{1}{2}"),
        ("\\tfrac{3}{4}", "\\frac{3}{4}"),
        ("\\frac1{72}", "\\frac{1}{72}"),
        ("\\frac{72}1", "\\frac{72}1"),  # braced numerator: left alone (as in the original)
        ("\\frac1b", "\\frac{1}{b}"),
        ("\\frac1", "\\frac1"),  # too short: unchanged
        ("1/2", "\\frac{1}{2}"),
        ("-3/4", "\\frac{-3}{4}"),
        ("01/2", "01/2"),  # not canonical integers: unchanged
        ("x/2", "x/2"),
        ("1/2/3", "1/2/3"),
        ("x = 5", "5"),
        ("k=\\frac{1}{2}", "\\frac{1}{2}"),
        ("xy = 5", "xy=5"),  # left side longer than two characters (spaces count)
        ("a=b=c", "a=b=c"),
        ("10\\%", "10"),
        ("10%", "10%"),  # only the escaped percent is removed
        ("90^\\circ", "90"),
        ("90^{\\circ}", "90"),
        ("\\$5", "5"),
        ("5 \\text{ cm}", "5"),
        ("5\\text{cm}", "5\\text{cm}"),  # no space after the brace: not a unit
        ("\\left( 1,2 \\right)", "(1,2)"),
        ("\\left[0,1\\right)", "[0,1)"),
        (".5", "\\frac{1}{2}"),
        (".25", "0.25"),
        ("x = .25", "0.25"),
        ("\\frac{.5}{2}", "\\frac{0.5}{2}"),
        ("\\sqrt3", "\\sqrt{3}"),
        ("2\\sqrt{2}", "2\\sqrt{2}"),
        ("\\sqrt 3", "\\sqrt{}3"),  # the original's quirk: the space is wrapped, then removed
        ("1,\n2", "1,2"),
        ("1\\!000", "1000"),
        ("a\\\\b", "a\\b"),
        ("", ""),
        ("  ", ""),
    ],
)
def test_strip_string(raw, expected):
    assert strip_string(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "5 \\text{ cm} \\text{ each}",  # the original's units step asserts a single "\text{ "
        "\\sqrt",
        "2\\sqrt\\sqrt{3}",
        "\\frac",
        "\\frac\\frac12",
    ],
)
def test_strip_string_never_raises_on_original_failures(raw):
    assert isinstance(strip_string(raw), str)


# ------------------------------------------------------------------------------------------ one item


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("\\frac{1}{2}", "0.5"),
        ("0.5", "\\frac{1}{2}"),
        ("\\dfrac12", "\\frac{1}{2}"),
        ("\\tfrac{1}{2}", "\\frac{1}{2}"),
        ("x = 5", "5"),
        ("10\\%", "10"),
        ("90^\\circ", "90"),
        ("90^{\\circ}", "90"),
        ("12 \\text{ cm}", "12"),
        ("\\left( 1,2 \\right)", "(1,2)"),
        ("1/2", "\\frac{1}{2}"),
        (".5", "0.5"),
        ("\\sqrt3", "\\sqrt{3}"),
        ("\\frac{\\sqrt3}{2}", "\\frac{\\sqrt{3}}{2}"),
        ("1, 2, 3", "1,2,3"),
        ("\\$18.90", "18.90"),
        ("\\text{ B}", "\\text{ C}"),  # both "units" dropped: equal (the original's quirk)
    ],
)
def test_matches(answer, gold):
    assert hendrycks_score(box(answer), gold) == 1.0


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("2", "2.0"),  # no numeric equivalence
        ("2.0", "2"),
        ("0.50", "\\frac{1}{2}"),
        ("\\frac{2}{4}", "\\frac{1}{2}"),
        ("10%", "10"),
        ("\\sqrt{8}", "2\\sqrt{2}"),
        ("xy = 5", "5"),
        ("01/2", "\\frac{1}{2}"),
        ("3", "4"),
        ("", "4"),
    ],
)
def test_mismatches(answer, gold):
    assert hendrycks_score(box(answer), gold) == 0.0


def test_box_handling():
    assert hendrycks_score("the answer is 5", "5") == 0.0  # no box
    assert hendrycks_score("\\boxed{5", "5") == 0.0  # unclosed
    assert hendrycks_score("\\boxed{4} no wait \\boxed{5}", "5") == 1.0  # last box used
    assert hendrycks_score("\\boxed{5} no wait \\boxed{4}", "5") == 0.0
    # verl's extraction, quirks included (last_boxed_only_string + remove_boxed)
    assert hendrycks_score("\\fbox{5}", "5") == 0.0  # found, then rejected by remove_boxed
    assert hendrycks_score("so \\boxed 5$ and more", "5") == 1.0  # "\\boxed " up to a $
    assert hendrycks_score("\\boxed 4 then \\boxed{5}", "5") == 0.0  # any "\\boxed " wins
    assert hendrycks_score("\\boxed{\\{1,2\\}}", "\\{1,2\\}") == 1.0  # braces counted, escapes or not
    assert hendrycks_score("\\boxed{\\frac{1}{2}}", "\\boxed{0.5}") == 1.0  # boxed gold: its content
    assert hendrycks_score("\\boxed{5}", "\\boxed{6}") == 0.0
    assert hendrycks_score("\\boxed{5}", 5) == 1.0  # numeric gold as its string


def test_failed_normalisation_falls_back_to_raw_equality():
    raw = "5 \\text{ cm} \\text{ each}"
    d = hendrycks_detailed(box(raw), raw)
    assert d == {"extracted": raw, "correct": True, "method": "hendrycks_raw"}
    assert hendrycks_score(box(raw), "5") == 0.0  # normalised, these would be equal; the original says no
    assert hendrycks_score(box("\\frac"), "\\frac") == 1.0
    assert hendrycks_score(box("\\dfrac"), "\\frac") == 0.0


@pytest.mark.parametrize(
    ("response", "gold"), [(None, "1"), (5, "5"), ("\\boxed{1}", None), ("\\boxed{1}", [1])]
)
def test_bad_input(response, gold):
    assert hendrycks_score(response, gold) == 0.0
    assert hendrycks_detailed(response, gold)["method"] == "bad_input"


def test_large_inputs_are_fast():
    import time

    t0 = time.perf_counter()
    for junk in ("\\frac" * 100_000 + "12", "\\sqrt" * 100_000 + "3", "1/" * 100_000, "9" * 100_000 + "/7"):
        hendrycks_score(box(junk), junk)
    assert time.perf_counter() - t0 < 2.0


# ------------------------------------------------------------------------------------------ Scorer

RESPONSES = [box("\\frac{1}{2}"), box("x = 5"), box("2"), "no box 5", box("10\\%"), box("7"), box("0.50")]
GOLDS = ["0.5", "5", "2.0", "5", "10", "7", "\\frac{1}{2}"]
EXPECTED = [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]


def test_rewards_constant():
    assert REWARDS == ("math_verify", "hendrycks")


@pytest.mark.parametrize("workers", [0, 2])
def test_scorer_hendrycks_batch(workers):
    with Scorer(workers=workers, reward="hendrycks") as s:
        assert s._pool is None  # pure string code: never a worker pool
        assert s.wait_ready()
        assert s.score(RESPONSES, GOLDS) == EXPECTED
        detailed = s.score_detailed(RESPONSES, GOLDS)
        assert s._pool is None and s._fallback is None
        assert s.pool_kills == 0
    assert [float(d["correct"]) for d in detailed] == EXPECTED
    assert detailed[3] == {"extracted": None, "correct": False, "method": "no_box"}
    assert detailed[0]["extracted"] == "\\frac{1}{2}" and detailed[0]["method"] == "hendrycks"
    assert s.stats["no_box"] == 2
    assert [hendrycks_score(r, g) for r, g in zip(RESPONSES, GOLDS, strict=True)] == EXPECTED
    with pytest.raises(RuntimeError):
        s.score(RESPONSES, GOLDS)


def test_scorer_hendrycks_length_mismatch():
    with Scorer(reward="hendrycks") as s, pytest.raises(ValueError):
        s.score(["\\boxed{1}"], [])


def test_scorer_hendrycks_from_a_thread():
    import threading

    out: dict = {}

    def work():
        with Scorer(reward="hendrycks") as s:
            out["scores"] = s.score(RESPONSES, GOLDS)
            out["fallback"] = s._fallback

    th = threading.Thread(target=work)
    th.start()
    th.join(timeout=30)
    assert out == {"scores": EXPECTED, "fallback": None}


def test_scorer_rejects_unknown_reward():
    with pytest.raises(ValueError, match="math_verify, hendrycks") as e:
        Scorer(reward="bogus")
    assert "bogus" in str(e.value)


# Pairs where the two rewards disagree (math-verify verdicts checked with the project's Scorer).
DIFFER = [
    (box("0.50"), "\\frac{1}{2}", 1.0, 0.0),
    (box("2.0"), "2", 1.0, 0.0),
    (box("\\frac{2}{4}"), "\\frac{1}{2}", 1.0, 0.0),
    (box("\\sqrt{8}"), "2\\sqrt{2}", 1.0, 0.0),
    (box("(1+x)^2"), "x^2+2x+1", 1.0, 0.0),
    (box("10%"), "10", 1.0, 0.0),
    (box("y = 2"), "x = 2", 0.0, 1.0),
    (box("\\text{ B}"), "\\text{ C}", 0.0, 1.0),
]
AGREE = [
    (box("\\frac{1}{2}"), "0.5", 1.0),
    (box("1/2"), "\\frac{1}{2}", 1.0),
    (box("x = 5"), "5", 1.0),
    (box("3"), "4", 0.0),
    ("no box 4", "4", 0.0),
]


def test_rewards_differ_where_expected():
    responses = [r for r, *_ in DIFFER + AGREE]
    golds = [g for _, g, *_ in DIFFER + AGREE]
    with Scorer(cache_size=0) as mv, Scorer(reward="hendrycks") as h:
        assert mv.score(responses, golds) == [v for *_, v, _ in DIFFER] + [v for *_, v in AGREE]
        assert h.score(responses, golds) == [v for *_, v in DIFFER] + [v for *_, v in AGREE]
