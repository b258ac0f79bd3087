"""Synthetic arithmetic problem families, deterministic train/dev/test splits, prompt rendering, JSONL I/O.

Families (``FAMILIES``; each problem's ``answer`` is a string that math-verify accepts inside ``\\boxed{}``):

| family | problem text | universe |
|---|---|---|
| ``add2`` | ``"07+45"``: two-digit, zero-padded a+b (the CPU calibration task) | all 10,000 pairs |
| ``add3`` | ``"007+450"``: three-digit, zero-padded a+b | 10^6 pairs (sampled) |
| ``sub2`` | ``"45-07"``: two-digit, zero-padded a−b with a ≥ b | 5,050 pairs |
| ``mul1`` | ``"7*45"``: one-digit (1–9) × two-digit (10–99) | 810 pairs |
| ``chain3`` | ``"12+7-5"``: a+b−c, operands 1–99, result ≥ 0 (two steps) | ≈ 9.5·10^5 (sampled) |
| ``frac`` | ``"1/2+1/3"``: proper fractions, denominators 2–9; answer reduced ``\\frac{p}{q}`` | 1,296 |
| ``word`` | one/two-step templated word problems ("Tom has 12 apples and buys 7 more. …") | millions |

Splits are disjoint by problem text, per family, and deterministic in ``(seed, family)`` only, so adding a
family never changes another family's problems. ``difficulty`` is a rough count of elementary steps
(operations plus carries/borrows, or reductions); use it for ordering, not as a calibrated scale.
``frac`` answers are plain integers when the sum is whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from math import lcm
from pathlib import Path

from hacpo import runio
from hacpo.runio import atomic_write_text

STYLES = ("compact", "paper")
PAPER_SUFFIX = "Let's think step by step and output the final answer within \\boxed{}."

# Cap on ``n_train=None`` for families whose universe is too large to enumerate (add3, chain3, word).
LARGE_TRAIN_DEFAULT = 20_000


@dataclass(frozen=True)
class Problem:
    id: str
    problem: str
    answer: str
    family: str
    difficulty: int
    # Worked line for the "paper" SFT target, e.g. "12+34=46"; empty for problems from elsewhere (benchmarks).
    work: str = field(default="", compare=False)
    # The record's own extra fields, for a custom verifier (hacpo.reward.custom); written only when non-empty.
    metadata: dict = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        if not d["metadata"]:
            del d["metadata"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Problem:
        """Tolerant reader: ``problem`` (or ``question``) and ``answer`` are required; ``id`` defaults to a
        hash of the problem text, ``family`` to ``""``, ``difficulty`` to 0, ``work`` to ``""``,
        ``metadata`` (an object) to ``{}``."""
        text = d.get("problem", d.get("question"))
        if text is None or d.get("answer") is None:
            raise ValueError(f"a problem needs 'problem' (or 'question') and 'answer'; got keys {sorted(d)}")
        family = str(d.get("family") or "")
        return cls(
            id=str(d["id"]) if d.get("id") is not None else _pid(family or "problem", str(text)),
            problem=str(text),
            answer=str(d["answer"]),
            family=family,
            difficulty=int(d.get("difficulty") or 0),
            work=str(d.get("work") or ""),
            metadata=_metadata(d.get("metadata")),
        )


def _metadata(value) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"a problem's 'metadata' must be an object (a dict), got {type(value).__name__}")
    return value


def as_problem(x: Problem | dict) -> Problem:
    """A :class:`Problem` from a Problem (returned as is) or a JSONL row (:meth:`Problem.from_dict`)."""
    if isinstance(x, Problem):
        return x
    if isinstance(x, dict):
        return Problem.from_dict(x)
    raise TypeError(f"expected a Problem or a dict, got {type(x).__name__}")


def _pid(family: str, text: str) -> str:
    return f"{family}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"


def _mk(family: str, text: str, answer: int | str, difficulty: int, work: str) -> Problem:
    return Problem(
        id=_pid(family, text),
        problem=text,
        answer=str(answer),
        family=family,
        difficulty=difficulty,
        work=work,
    )


def _carries(a: int, b: int) -> int:
    n, c = 0, 0
    while a or b:
        c = 1 if (a % 10 + b % 10 + c) >= 10 else 0
        n += c
        a, b = a // 10, b // 10
    return n


def _borrows(a: int, b: int) -> int:
    n, br = 0, 0
    while a or b:
        br = 1 if (a % 10 - b % 10 - br) < 0 else 0
        n += br
        a, b = a // 10, b // 10
    return n


# ---------------------------------------------------------------------------------------------------------
# Families: an index space [0, size) and a map index → Problem | None (None = not a valid problem).


def _add2(i: int) -> Problem:
    a, b = divmod(i, 100)
    text = f"{a:02d}+{b:02d}"
    return _mk("add2", text, a + b, 1 + _carries(a, b), f"{text}={a + b}")


def _add3(i: int) -> Problem:
    a, b = divmod(i, 1000)
    text = f"{a:03d}+{b:03d}"
    return _mk("add3", text, a + b, 1 + _carries(a, b), f"{text}={a + b}")


def _sub2(i: int) -> Problem | None:
    a, b = divmod(i, 100)
    if b > a:
        return None
    text = f"{a:02d}-{b:02d}"
    return _mk("sub2", text, a - b, 1 + _borrows(a, b), f"{text}={a - b}")


def _mul1(i: int) -> Problem:
    a, b = 1 + i // 90, 10 + i % 90
    text = f"{a}*{b}"
    return _mk("mul1", text, a * b, 1 + _carries(a * (b // 10) * 10, a * (b % 10)), f"{text}={a * b}")


def _chain3(i: int) -> Problem | None:
    a, rest = divmod(i, 99 * 99)
    b, c = divmod(rest, 99)
    a, b, c = a + 1, b + 1, c + 1
    if c > a + b:
        return None
    text = f"{a}+{b}-{c}"
    s = a + b
    return _mk("chain3", text, s - c, 2 + _carries(a, b) + _borrows(s, c), f"{a}+{b}={s}, {s}-{c}={s - c}")


_PROPER = [(n, d) for d in range(2, 10) for n in range(1, d)]  # 36 proper fractions n/d


def _frac_answer(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"\\frac{{{x.numerator}}}{{{x.denominator}}}"


def _frac(i: int) -> Problem:
    (n1, d1), (n2, d2) = _PROPER[i // len(_PROPER)], _PROPER[i % len(_PROPER)]
    text = f"{n1}/{d1}+{n2}/{d2}"
    x = Fraction(n1, d1) + Fraction(n2, d2)
    m = lcm(d1, d2)
    a, b = n1 * m // d1, n2 * m // d2
    plain = str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"
    steps = [text]
    if d1 != d2:
        steps.append(f"{a}/{m}+{b}/{m}")
    if f"{a + b}/{m}" != plain:
        steps.append(f"{a + b}/{m}")
    steps.append(plain)
    difficulty = 1 + (d1 != d2) + (x.denominator != m)
    return _mk("frac", text, _frac_answer(x), difficulty, "=".join(steps))


NAMES = ("Tom", "Anna", "Ben", "Mia", "Sam", "Lily", "Max", "Emma", "Leo", "Zoe")
ITEMS = ("apples", "pencils", "books", "stickers", "marbles", "cookies", "cards", "flowers", "coins", "toys")

# (template, operation). Placeholders: {n} name, {m} second name, {it} item, {a} {b} {c} numbers.
WORD_TEMPLATES: tuple[tuple[str, str], ...] = (
    ("{n} has {a} {it} and buys {b} more. How many {it} does {n} have now?", "a+b"),
    ("{n} has {a} {it} and gives {b} to {m}. How many {it} does {n} have left?", "a-b"),
    ("{n} buys {a} bags with {b} {it} in each bag. How many {it} does {n} buy?", "a*b"),
    ("{n} shares {a} {it} equally among {b} friends. How many {it} does each friend get?", "a/b"),
    (
        "There are {a} {it} in a box. {n} takes {b} and puts back {c}. How many {it} are in the box now?",
        "a-b+c",
    ),
    ("{n} has {a} {it} and {m} has {b} more than {n}. How many {it} do they have together?", "a+a+b"),
)
_WORD_RANGES = {
    "a+b": (99, 99, 1),
    "a-b": (99, 99, 1),
    "a*b": (9, 12, 1),
    "a/b": (12, 9, 1),
    "a-b+c": (99, 99, 99),
}
_WORD_RANGES["a+a+b"] = (49, 49, 1)
_PAIRS = [(x, y) for x in range(len(NAMES)) for y in range(len(NAMES)) if x != y]


def _word(t: int, pair: int, item: int, a: int, b: int, c: int) -> Problem | None:
    template, op = WORD_TEMPLATES[t]
    n, m = NAMES[_PAIRS[pair][0]], NAMES[_PAIRS[pair][1]]
    if op == "a+b":
        ans, work, steps = a + b, f"{a}+{b}={a + b}", 1
    elif op == "a-b":
        if b > a:
            return None
        ans, work, steps = a - b, f"{a}-{b}={a - b}", 1
    elif op == "a*b":
        if a < 2 or b < 2:
            return None
        ans, work, steps = a * b, f"{a}*{b}={a * b}", 1
    elif op == "a/b":
        if b < 2:
            return None
        a = a * b  # dividend = a groups of b, so the division is exact
        ans, work, steps = a // b, f"{a}/{b}={a // b}", 1
    elif op == "a-b+c":
        if b > a or c > b:
            return None
        ans, work, steps = a - b + c, f"{a}-{b}={a - b}, {a - b}+{c}={a - b + c}", 2
    else:  # a+a+b
        ans, work, steps = a + a + b, f"{a}+{b}={a + b}, {a}+{a + b}={a + a + b}", 2
    text = template.format(n=n, m=m, it=ITEMS[item], a=a, b=b, c=c)
    return _mk("word", text, ans, steps, work)


def _sample_word(rng: random.Random) -> Problem | None:
    t = rng.randrange(len(WORD_TEMPLATES))
    ra, rb, rc = _WORD_RANGES[WORD_TEMPLATES[t][1]]
    return _word(
        t,
        rng.randrange(len(_PAIRS)),
        rng.randrange(len(ITEMS)),
        rng.randint(1, ra),
        rng.randint(1, rb),
        rng.randint(1, rc),
    )


def _indexed(size: int, make: Callable[[int], Problem | None]) -> Callable[[random.Random], Problem | None]:
    return lambda rng: make(rng.randrange(size))


# Enumerable families: name → (index-space size, index → Problem | None). Shuffled in full.
_ENUMERABLE: dict[str, tuple[int, Callable[[int], Problem | None]]] = {
    "add2": (100 * 100, _add2),
    "sub2": (100 * 100, _sub2),
    "mul1": (9 * 90, _mul1),
    "frac": (len(_PROPER) ** 2, _frac),
}
# Sampled families: name → rng → Problem | None (None = rejected draw). Drawn until enough distinct texts.
_SAMPLED: dict[str, Callable[[random.Random], Problem | None]] = {
    "add3": _indexed(1000 * 1000, _add3),
    "chain3": _indexed(99 * 99 * 99, _chain3),
    "word": _sample_word,
}
FAMILIES: tuple[str, ...] = ("add2", "add3", "sub2", "mul1", "chain3", "frac", "word")


def word_vocabulary() -> list[str]:
    """Every alphabetic word (and "Let's") that the word templates and the paper prompt can produce."""
    words: set[str] = set(NAMES) | set(ITEMS)
    for template, _ in WORD_TEMPLATES:
        words |= set(re.findall(r"[A-Za-z]+", re.sub(r"\{[a-z]+\}", " ", template)))
    words |= set(re.findall(r"[A-Za-z']+", PAPER_SUFFIX.replace("\\boxed", "")))
    return sorted(words)


# ---------------------------------------------------------------------------------------------------------
# Splits


def _rng(seed: int, family: str, part: str) -> random.Random:
    return random.Random(f"hacpo-synthetic:{seed}:{family}:{part}")  # str seeds hash with sha512: stable


def _enumerate(family: str) -> list[Problem]:
    size, make = _ENUMERABLE[family]
    out, seen = [], set()
    for i in range(size):
        p = make(i)
        if p is not None and p.problem not in seen:
            seen.add(p.problem)
            out.append(p)
    return out


def _sample_stream(family: str, rng: random.Random) -> Iterator[Problem]:
    draw = _SAMPLED[family]
    while True:
        p = draw(rng)
        if p is not None:
            yield p


def _take(stream: Iterable[Problem], n: int, taken: set[str], family: str) -> list[Problem]:
    out: list[Problem] = []
    misses = 0
    for p in stream:
        if len(out) >= n:
            break
        if p.problem in taken:
            misses += 1
            if misses > 100 * (n + 100):
                raise ValueError(f"family {family!r}: could not draw {n} distinct problems")
            continue
        taken.add(p.problem)
        out.append(p)
    return out


def family_split(
    family: str, seed: int, n_test: int, n_dev: int, n_train: int | None
) -> dict[str, list[Problem]]:
    """One family's disjoint splits; see :func:`make_splits`."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    if min(n_test, n_dev) < 0 or (n_train is not None and n_train < 0):
        raise ValueError(f"split sizes must be ≥ 0, got test={n_test} dev={n_dev} train={n_train}")
    if family in _ENUMERABLE:
        universe = _enumerate(family)
        _rng(seed, family, "perm").shuffle(universe)
        need = n_test + n_dev + (n_train or 0)
        if need > len(universe):
            raise ValueError(
                f"family {family!r} has {len(universe)} distinct problems; test {n_test} + dev {n_dev} + "
                f"train {n_train or 0} = {need} do not fit"
            )
        # test from the front, dev from the back: each stays fixed when the other's size changes.
        test = universe[:n_test]
        dev = universe[len(universe) - n_dev :][::-1] if n_dev else []
        middle = universe[n_test : len(universe) - n_dev]
        train = middle if n_train is None else middle[:n_train]
        return {"train": train, "dev": dev, "test": test}
    taken: set[str] = set()
    test = _take(_sample_stream(family, _rng(seed, family, "test")), n_test, taken, family)
    dev = _take(_sample_stream(family, _rng(seed, family, "dev")), n_dev, taken, family)
    n_tr = LARGE_TRAIN_DEFAULT if n_train is None else n_train
    train = _take(_sample_stream(family, _rng(seed, family, "train")), n_tr, taken, family)
    return {"train": train, "dev": dev, "test": test}


def make_splits(
    families: list[str], seed: int, n_test: int, n_dev: int, n_train: int | None
) -> dict[str, list[Problem]]:
    """Disjoint (by problem text) ``{"train", "dev", "test"}`` lists, deterministic in ``seed``.

    Sizes are **per family**; the lists concatenate the families in the order given. ``n_train=None`` takes
    every remaining problem of an enumerable family (add2: 10,000 − test − dev) and ``LARGE_TRAIN_DEFAULT``
    problems of a sampled one (add3, chain3, word). Each family's problems depend only on ``(seed, family)``.
    Within an enumerable family, the test list is a prefix-stable draw (test-200 ⊂ test-1000 for one seed)
    and the dev list does not change with ``n_test``.
    """
    if not families:
        raise ValueError("families is empty; pass at least one of " + ", ".join(FAMILIES))
    if len(set(families)) != len(families):
        raise ValueError(f"families has duplicates: {families}")
    out: dict[str, list[Problem]] = {"train": [], "dev": [], "test": []}
    for fam in families:
        for k, v in family_split(fam, seed, n_test, n_dev, n_train).items():
            out[k].extend(v)
    return out


# ---------------------------------------------------------------------------------------------------------
# Prompts and SFT targets


def user_message(problem: Problem, style: str) -> str:
    """The user turn: ``compact`` → ``"12+34="``; ``paper`` → the paper's instruction after the problem."""
    if style == "compact":
        return f"{problem.problem}="
    if style == "paper":
        return f"{problem.problem} Let's think step by step and output the final answer within \\boxed{{}}."
    raise ValueError(f"unknown prompt style {style!r}; use one of {STYLES}")


def solution_text(problem: Problem, style: str) -> str:
    """SFT target (without EOS): ``compact`` → ``\\boxed{46}``; ``paper`` → ``"12+34=46. \\boxed{46}"``."""
    box = f"\\boxed{{{problem.answer}}}"
    if style == "compact":
        return box
    if style == "paper":
        return f"{problem.work}. {box}" if problem.work else box
    raise ValueError(f"unknown prompt style {style!r}; use one of {STYLES}")


# ---------------------------------------------------------------------------------------------------------
# JSONL


def write_jsonl(path: str | os.PathLike, rows: Iterable[Problem | dict]) -> Path:
    """Write one JSON object per line atomically (temp file in the same directory, then ``os.replace``)."""
    path = Path(path)
    lines = (
        json.dumps(r.to_dict() if isinstance(r, Problem) else r, ensure_ascii=False) + "\n" for r in rows
    )
    atomic_write_text(path, "".join(lines))
    return path


def read_jsonl(path: str | os.PathLike, as_problems: bool = False) -> list:
    """Read a JSONL file (:func:`hacpo.runio.read_jsonl`); ``as_problems=True`` returns :class:`Problem`s."""
    rows = runio.read_jsonl(path)
    return [Problem.from_dict(r) for r in rows] if as_problems else rows
