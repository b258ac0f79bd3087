"""hacpo.reward: extraction, verdicts, fast-path/math-verify agreement, hostile inputs, pools, threads."""

from __future__ import annotations

import random
import signal
import sys
import threading
import time
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hacpo.reward import Scorer, extract_boxed, fastpath, score_batch, score_detailed, score_one, verify

MB2 = 2 * 1024 * 1024
PER_ITEM_LIMIT_S = 2.5


@pytest.fixture(scope="module")
def pool2():
    with Scorer(workers=2) as s:
        assert s.wait_ready()
        yield s


# ------------------------------------------------------------------------------------------ extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the answer is \\boxed{46}.", "46"),
        ("\\boxed{1} first, then \\boxed{2}", "2"),
        ("\\boxed{\\frac{a}{b}}", "\\frac{a}{b}"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}} done", "\\frac{\\sqrt{3}}{2}"),
        ("\\fbox{7}", "7"),
        ("\\boxed{1} and \\fbox{8}", "8"),
        ("\\fbox{8} and \\boxed{9}", "9"),
        ("\\boxed {5}", "5"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
        ("\\boxed{\\left\\{ x \\right.}", "\\left\\{ x \\right."),
        ("\\boxed{a\\\\}", "a\\\\"),
        ("\\boxed{3} then \\boxedfoo", "3"),
        ("\\boxed{}", ""),
        ("no box here 46", None),
        ("", None),
        ("\\boxed{4", None),  # truncated last box: no answer, even if an earlier box exists
        ("\\boxed{3} ... \\boxed{4", None),
        ("\\boxed", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize("bad", [None, 5, b"\\boxed{1}", ["\\boxed{1}"], object()])
def test_extract_boxed_odd_types(bad):
    assert extract_boxed(bad) is None


@pytest.mark.parametrize(
    "text",
    [
        "x" * MB2 + "\\boxed{5}",
        "\\boxed{" + "a" * MB2,
        "\\boxed{" + "{" * MB2,
        "\\boxed{" + "{}" * (MB2 // 2),
        "\\boxed{" * (MB2 // 7),
        "\\\\" * MB2 + "\\boxed{1}",
        "}" * MB2 + "\\boxed{" + "\\{" * (MB2 // 4) + "}",
    ],
    ids=["long-prefix", "unclosed", "open-braces", "pairs", "many-boxes", "backslashes", "escaped"],
)
def test_extract_boxed_linear_on_megabytes(text):
    t = time.perf_counter()
    extract_boxed(text)
    assert time.perf_counter() - t < 1.5  # ~0.5 s for the worst case here (one regex match per brace)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prefix=st.text(max_size=50),
    body=st.text(alphabet=st.characters(blacklist_characters="{}\\"), max_size=30),
)
def test_extract_boxed_roundtrip(prefix, body):
    assert extract_boxed(prefix + "\\boxed{" + body + "}") == body
    assert extract_boxed(prefix + "\\boxed{{" + body + "}}") == "{" + body + "}"


# ------------------------------------------------------------------------------------------ verdicts

CORRECT = [
    ("The answer is \\boxed{46}.", "46"),
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{\\frac{1}{2}}", "\\frac12"),
    ("\\boxed{\\sqrt{2}}", "\\sqrt 2"),
    ("first \\boxed{3}, finally \\boxed{4}", "4"),
    ("\\boxed{\\frac{a}{b}}", "a/b"),
    ("\\boxed{007}", "7"),
    ("\\boxed{1000}", "1,000"),
    ("\\boxed{2\\sqrt{3}}", "\\sqrt{12}"),
    ("\\boxed{\\pi/2}", "\\frac{\\pi}{2}"),
    ("\\boxed{$5$}", "$5$"),
    ("\\fbox{-3}", "-3"),
]
WRONG = [
    ("The answer is 46", "46"),  # no box, even though the text ends with the right number
    ("\\boxed{46} wait, no: 47", "47"),
    ("\\boxed{45}", "46"),
    ("first \\boxed{4}, finally \\boxed{3}", "4"),  # last box wins
    ("\\boxed{\\frac{1}{3}}", "0.5"),
    ("\\boxed{\\sqrt{3}}", "\\sqrt 2"),
    ("\\boxed{4", "4"),  # truncated
    ("\\boxed{}", "4"),
    ("\\boxed{4}", ""),
]


@pytest.mark.parametrize(("response", "gold"), CORRECT)
def test_correct(response, gold):
    assert score_one(response, gold) == 1.0


@pytest.mark.parametrize(("response", "gold"), WRONG)
def test_wrong(response, gold):
    assert score_one(response, gold) == 0.0


def test_score_detailed():
    d = score_detailed("so \\boxed{\\sqrt{8}}", "2\\sqrt 2")
    assert d["extracted"] == "\\sqrt{8}" and d["correct"] is True and d["method"] == "math_verify"
    d = score_detailed("so 0.5", "0.5")
    assert d["extracted"] is None and d["correct"] is False and d["method"] == "no_box"
    assert score_detailed("\\boxed{12}", "12")["method"] == "exact"
    assert score_detailed("\\boxed{012}", "12")["method"] == "int"
    assert score_detailed("\\boxed{\\frac{2}{4}}", "0.5")["method"] == "rational"


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        (None, "1"),
        ("\\boxed{1}", None),
        (b"\\boxed{1}", "1"),
        (["\\boxed{1}"], "1"),
        ({}, {}),
        (object(), object()),
        ("", ""),
        ("\\boxed{1}", ""),
        ("\\boxed{1}", float("nan")),
        ("\\boxed{1}", True),
        ("\\boxed{}", ""),
        ("   ", "   "),
    ],
)
def test_never_raises_on_odd_inputs(response, gold):
    assert score_one(response, gold) == 0.0
    assert score_detailed(response, gold)["correct"] is False


def test_numeric_gold_is_coerced():
    assert score_one("\\boxed{46}", 46) == 1.0
    assert score_one("\\boxed{0.5}", 0.5) == 1.0


def _int_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)

    def fmt(v: int) -> str:
        s, r = str(abs(v)), rng.random()
        if r < 0.25:
            s = "0" * rng.randint(1, 3) + s
        elif r < 0.5 and abs(v) >= 1000:
            s = f"{abs(v):,}"
        sign = "-" if v < 0 else ("+" if rng.random() < 0.2 else "")
        return ("-" if v == 0 and rng.random() < 0.3 else sign) + s

    pairs = []
    for _ in range(n):
        a = rng.choice([rng.randint(-20, 20), rng.randint(-(10**6), 10**6), rng.randint(0, 10**30)])
        b = a if rng.random() < 0.5 else rng.choice([a + 1, -a, 10 * a, rng.randint(-(10**6), 10**6)])
        pairs.append((fmt(a), fmt(b)))
    return pairs + [("1,000", "1000"), ("-0", "0"), ("+5", "5"), ("0" * 5, "0"), ("1" * 300, "0" + "1" * 300)]


def test_int_fast_path_agrees_with_math_verify():
    checked = 0
    for content, gold in _int_pairs(150):
        _, decided, method, key = fastpath.prepare("\\boxed{" + content + "}", gold)
        if method != "int":
            continue
        mv_verdict, mv_method = verify.verify_item(content, gold, 10.0)
        assert mv_method == "math_verify"
        assert bool(decided) == mv_verdict, (content, gold)
        checked += 1
    assert checked > 100
    # "+1,000" is read by math-verify as the set {1, 0}: such forms must not take the int fast path.
    assert fastpath.prepare("\\boxed{1000}", "+1,000")[2] == "math_verify"


def _rational_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)

    def fmt(v: Fraction) -> str:
        sign = "-" if v < 0 else ("+" if rng.random() < 0.1 else "")
        a, r = abs(v), rng.random()
        if a.denominator == 1 and r < 0.3:
            return sign + str(a.numerator) + (".0" if rng.random() < 0.3 else "")
        if r < 0.55:
            return sign + f"{float(a):.{rng.choice([1, 2, 3, 6, 7, 9])}f}"
        k = rng.choice([1, 2, 3])
        num, den = a.numerator * k, a.denominator * k
        return rng.choice(
            [f"{sign}\\frac{{{num}}}{{{den}}}", f"{sign}\\dfrac{{{num}}}{{{den}}}", f"{sign}{num}/{den}"]
            + ([f"{sign}\\frac{num}{den}"] if num < 10 and den < 10 else [])
        )

    pairs = []
    for _ in range(n):
        v = Fraction(rng.randint(-2000, 2000), rng.choice([1, 2, 3, 4, 7, 8, 12, 100, 7919]))
        r = rng.random()
        if r < 0.4:
            w = v
        elif r < 0.6:  # near misses: some within math-verify's rounding, some not
            w = v + Fraction(rng.choice([1, -1]), rng.choice([10**3, 10**5, 10**7, 10**9]))
        elif r < 0.8:
            w = -v
        else:
            w = Fraction(rng.randint(-2000, 2000), rng.choice([1, 3, 7, 100]))
        pairs.append((fmt(w), fmt(v)))
    return pairs + [("0.3333333", "\\frac{1}{3}"), ("0.333", "\\frac13"), ("-0.0", "0"), ("007.5", "7.5")]


def test_rational_fast_path_agrees_with_math_verify():
    checked = 0
    for content, gold in _rational_pairs(250):
        _, decided, method, key = fastpath.prepare("\\boxed{" + content + "}", gold)
        if method != "rational":
            continue
        mv_verdict, mv_method = verify.verify_item(content, gold, 10.0)
        assert mv_method == "math_verify"
        assert bool(decided) == mv_verdict, (content, gold)
        checked += 1
    assert checked > 150
    # math-verify rounds to 6 digits: this near miss must be left to it (it says equal)
    assert fastpath.prepare("\\boxed{0.3333333}", "\\frac{1}{3}")[2] == "math_verify"
    assert score_one("\\boxed{0.3333333}", "\\frac{1}{3}") == 1.0


@pytest.mark.parametrize(
    "s", ["\\frac{3}{4}", "x^2 = 4", "\\{1,2\\}", "(1,2]", "\\text{(C)}", "+1,000", "\\infty"]
)
def test_exact_fast_path_agrees_with_math_verify(s):
    assert score_detailed("\\boxed{" + s + "}", s)["method"] == "exact"
    assert verify.verify_item(s, s, 10.0) == (True, "math_verify")


# ------------------------------------------------------------------------------------------ hostile inputs

HOSTILE = [
    ("x" * MB2 + "\\boxed{5}", "5"),  # 2 MB
    ("\\boxed{" + "{" * MB2, "5"),  # 2 MB of unclosed braces
    ("\\boxed{" + "1" * MB2 + "}", "5"),  # 2 MB answer
    ("\\boxed{9^{9^{9^{9}}}}", "5"),  # exponent tower
    ("\\boxed{9^{9^{9}}}", "9"),
    ("\\boxed{10**10**10}", "5"),
    ("\\boxed{2^{2^{30}}}", "5"),
    ("\\boxed{99999999999999^{99999999999}}", "5"),
    ("\\boxed{(10^{7})!}", "5"),
    ("\\boxed{\\binom{10^{9}}{5\\cdot 10^{8}}}", "5"),
    ("\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}", "1"),  # 5000-deep nesting
    ("\\boxed{" + "\\frac{1}{" * 200 + "2" + "}" * 200 + "}", "1"),
    ("\\boxed{" + "(" * 15 + "1" + ")" * 15 + "}", "1"),
    ("\\boxed{\\frac{1}{0}}", "5"),
    ("\\boxed{\\frac{1}{0}}", "\\frac{1}{0}"),
    ("\\boxed{\x00\x00\x001\x00}", "1"),
    ("\x00" * 1000 + "\\boxed{\x00}", "\x00"),
    ("\\boxed{\ud800\uffff\u202e\U0001f600}", "\U0001f600 5"),
    ("\\boxed{(1+x)^{100000}}", "5"),  # interruptible but slow: hits the deadline
    ("\\boxed{\\int_0^{\\infty} e^{-x^{2}} dx}", "\\frac{\\sqrt{\\pi}}{2}"),
]


def _run_corpus(scorer: Scorer) -> list[tuple[float, dict]]:
    out = []
    for response, gold in HOSTILE:
        t = time.perf_counter()
        d = scorer.score_detailed([response], [gold])[0]
        out.append((time.perf_counter() - t, d))
    return out


def _check_corpus(results):
    for (response, _), (elapsed, d) in zip(HOSTILE, results, strict=True):
        assert elapsed < PER_ITEM_LIMIT_S, (response[:60], elapsed, d["method"])
        assert isinstance(d["correct"], bool)
    methods = {d["method"] for _, d in results}
    assert "too_big" in methods and "too_long" in methods


# The deadline can fire inside a GC callback (hypothesis installs one); Python then reports our _Deadline as
# "unraisable", and the item still ends as a timeout (the fired flag): what this test checks.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_hostile_corpus_in_process_main_thread():
    assert threading.current_thread() is threading.main_thread()
    with Scorer(workers=0) as s:
        _check_corpus(_run_corpus(s))


def test_hostile_corpus_pool(pool2):
    _check_corpus(_run_corpus(pool2))
    assert pool2.score(["\\boxed{\\frac{2}{4}}"], ["0.5"]) == [1.0]  # still healthy afterwards


@pytest.mark.parametrize("workers", [1, 2])
def test_pool_kills_a_hung_worker(monkeypatch, workers):
    """A hang no signal can interrupt (SIGALRM blocked, via the test hook) → killed at timeout_s, scored 0.
    With one worker the rest of the batch waits for the replacement; with two the other worker carries on."""
    monkeypatch.setenv("HACPO_REWARD_HANG_FOR_TESTS", "HANG")
    with Scorer(workers=workers, timeout_s=1.0) as s:
        assert s.wait_ready()
        t = time.perf_counter()
        responses = ["\\boxed{HANG}", "\\boxed{\\sqrt{8}}", "\\boxed{x+1}"]
        d = s.score_detailed(responses, ["0.5", "2\\sqrt{2}", "1+x"])
        elapsed = time.perf_counter() - t
        assert [(x["correct"], x["method"]) for x in d] == [
            (False, "killed"),
            (True, "math_verify"),
            (True, "math_verify"),
        ]
        assert elapsed < (1.0 + 5.0 if workers == 1 else 1.0 + 1.0)  # the hang (1 s) [+ a worker start]
        assert s.pool_kills == 1
        assert s.score(["\\boxed{\\sqrt{4}}"], ["2"]) == [1.0]


def test_pool_survives_a_dead_worker(pool2):
    victim = pool2._pool._workers[0].proc
    victim.kill()
    victim.wait()
    golds = ["\\frac{\\sqrt{2}}{2}", "\\sqrt{12}", "2", "\\pi/2"]
    responses = [
        "\\boxed{\\frac{1}{\\sqrt{2}}}",
        "\\boxed{2\\sqrt{3}}",
        "\\boxed{\\sqrt{4}}",
        "\\boxed{\\frac{\\pi}{2}}",
    ]
    assert pool2.score(responses, golds) == [1.0, 1.0, 1.0, 1.0]


# ----------------------------------------------------------------------------------------- batch API, threads


def test_scorer_batch_fast_path_and_cache():
    with Scorer(workers=0) as s:
        responses = [
            "\\boxed{5}",
            "\\boxed{\\sqrt{8}}",
            "5",
            "\\boxed{\\sqrt{8}}",
            "\\boxed{6}",
            "\\boxed{0.5}",
        ]
        golds = ["5", "2\\sqrt{2}", "5", "2\\sqrt{2}", "5", "\\frac{1}{2}"]
        assert s.score(responses, golds) == [1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
        assert s.stats.get("math_verify") == 1  # the duplicate pair was scored once
        assert s.stats.get("rational") == 1
        assert s.score(["\\boxed{\\sqrt{8}}"], ["2\\sqrt{2}"]) == [1.0]
        assert s.stats.get("cache") == 1
        with pytest.raises(ValueError):
            s.score(["a"], [])
    with pytest.raises(RuntimeError):
        s.score(["\\boxed{1}"], ["1"])


def test_scorer_rejects_bad_config():
    with pytest.raises(ValueError):
        Scorer(workers=-1)
    with pytest.raises(ValueError):
        Scorer(timeout_s=0)


def test_pool_results_match_in_process(pool2):
    responses = [r for r, _ in CORRECT + WRONG]
    golds = [g for _, g in CORRECT + WRONG]
    expected = [1.0] * len(CORRECT) + [0.0] * len(WRONG)
    with Scorer(workers=0, cache_size=0) as s:
        assert s.score(responses, golds) == expected
    assert pool2.score(responses, golds) == expected
    assert score_batch(responses, golds) == expected


def test_worker_thread_falls_back_to_pool():
    responses = ["\\boxed{\\frac{1}{2}}", "\\boxed{\\sqrt{3}}", "\\boxed{7}", "\\boxed{\\sqrt{8}}"]
    golds = ["0.5", "\\sqrt 2", "7", "2\\sqrt{2}"]
    out: dict = {}

    def work():
        try:
            with Scorer(workers=0) as s:
                out["batch"] = s.score(responses, golds)
                out["used_pool"] = s._fallback is not None
            out["one"] = [score_one(r, g) for r, g in zip(responses, golds, strict=True)]
        except BaseException as e:  # pragma: no cover - reported below
            out["error"] = e

    th = threading.Thread(target=work)
    th.start()
    th.join(timeout=30)
    assert not th.is_alive()
    assert "error" not in out, out.get("error")
    assert out["batch"] == [1.0, 0.0, 1.0, 1.0]
    assert out["used_pool"] is True
    assert out["one"] == [1.0, 0.0, 1.0, 1.0]


def test_in_process_restores_outer_alarm():
    """An outer SIGALRM user (e.g. pytest-timeout) keeps its handler and its remaining time."""
    fired = []

    def outer(signum, frame):
        fired.append(signum)

    old = signal.signal(signal.SIGALRM, outer)
    try:
        signal.setitimer(signal.ITIMER_REAL, 100.0)
        with Scorer(workers=0, cache_size=0) as s:
            assert s.score(["\\boxed{\\frac{1}{2}}", "\\boxed{(1+x)^{2}}"], ["0.5", "x^2+2x+1"]) == [1.0, 1.0]
        assert signal.getsignal(signal.SIGALRM) is outer
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 90.0 < remaining <= 100.0
        assert not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_swallowed_interrupt_counts_as_timeout():
    """A library that eats the deadline exception (bare ``except:``) must not produce an "ok" verdict."""

    def swallow():
        try:
            time.sleep(0.3)
        except BaseException:
            pass
        return True, "math_verify"

    t = time.perf_counter()
    assert verify.call_with_deadline(swallow, 0.05) == ("timeout", None)
    assert time.perf_counter() - t < 0.3  # the sleep was interrupted
    time.sleep(0.15)  # and nothing fires after the call returned
    assert verify.call_with_deadline(lambda: 42, 1.0) == ("ok", 42)


def test_deadline_never_aborts_an_import(tmp_path, monkeypatch):
    """An import cut half-way leaves a broken module behind; the deadline waits for the import to finish."""
    (tmp_path / "hacpo_slow_import_probe.py").write_text("import time\ntime.sleep(0.3)\nDONE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def load():
        import hacpo_slow_import_probe

        return hacpo_slow_import_probe.DONE

    try:
        assert verify.call_with_deadline(load, 0.05) == ("timeout", None)
        assert sys.modules["hacpo_slow_import_probe"].DONE is True
    finally:
        sys.modules.pop("hacpo_slow_import_probe", None)


def test_deadline_never_fires_inside_a_finalizer(monkeypatch):
    """The garbage collector runs ``__del__`` inside any code (SymPy's objects have finalizers): a deadline
    raised there is swallowed by Python and handed to ``sys.unraisablehook`` (seen in CI: its re-fire then
    broke pytest's report of it). The deadline waits until the finalizer is done, then fires."""
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    class Slow:
        def __del__(self):
            time.sleep(0.3)

    def collect():
        obj = Slow()
        del obj  # the finalizer runs here, past the deadline
        time.sleep(1.0)
        return True

    t = time.perf_counter()
    assert verify.call_with_deadline(collect, 0.05) == ("timeout", None)
    assert 0.3 <= time.perf_counter() - t < 1.0  # the finalizer ran whole, the sleep after it was cut
    assert unraisable == []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(response=st.text(max_size=200), gold=st.text(max_size=20))
def test_score_one_total(response, gold):
    assert score_one(response, gold) in (0.0, 1.0)
    assert score_one("\\boxed{" + response + "}", gold) in (0.0, 1.0)
