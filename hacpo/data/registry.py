"""Registry of the paper's math datasets: where each comes from and how its gold answer is read.

The paper trains on MATH train (7.5k) and evaluates on MATH-500, MATH (test), GSM8K (test), AIME2025, AMC23,
Minerva Math and OlympiadBench. Each has one frozen :class:`DatasetSpec`: its Hugging Face hub id, a
**pinned** revision (a dataset-repo commit sha), config, split, expected record count, field mapping, the
local file name used for offline copies, and the gold-answer extraction function.

Every dataset is normalised to one record schema (see :func:`normalise_record`)::

    {"id": str, "problem": str, "answer": str, "source": <dataset name>, "metadata": {...}}

``problem`` is kept raw (no prompt template; the engines render prompts). ``answer`` is the gold final answer
as a string that the project scorer (:mod:`hacpo.reward`) accepts inside ``\\boxed{}``.

Ids are stable across sources (a local copy or the Hub may order rows differently): a dataset's native id
when it has one (MATH-500 ``unique_id``, AMC23 and OlympiadBench ``id``), otherwise a hash of the problem
text (``<name>-<12 hex of sha1(problem)>``, the same scheme as :mod:`hacpo.data.synthetic`). The row
position in the source is kept as ``metadata["index"]``.

Revisions: each sha below is a commit of the dataset repo on the Hub, taken from public code that pins it
for the same dataset/config/split (docs/datasets.md names the sources). The machine the project is built on
cannot reach the Hub, so none was resolved there (:data:`REVISIONS_VERIFIED_ONLINE`); ``hacpo prefetch``
(:mod:`hacpo.pipeline.prefetch`) resolves each one a config reads where it runs, on a node with internet.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hacpo.reward import extract_boxed

__all__ = [
    "DATASETS",
    "REVISIONS_VERIFIED_ONLINE",
    "DatasetSpec",
    "GoldAnswerError",
    "UnknownDatasetError",
    "get",
    "gold_aime",
    "gold_amc",
    "gold_gsm8k",
    "gold_math_solution",
    "gold_minerva",
    "gold_olympiad",
    "last_boxed_answer",
    "latex_scientific",
    "names",
    "normalise_record",
    "record_id",
]

REVISIONS_VERIFIED_ONLINE = False
"""The pinned shas were found in public code that loads these exact datasets, not resolved on the Hub here."""


class UnknownDatasetError(KeyError, ValueError):
    """An unknown dataset name (a ``KeyError`` *and* a ``ValueError``, so the CLI reports it as bad input)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class GoldAnswerError(ValueError):
    """A record whose gold answer could not be extracted (the message names the record ids)."""


# ----------------------------------------------------------------------------------------------------------
# Gold-answer extraction. Each function takes the raw record and returns the gold string, or None.
# ----------------------------------------------------------------------------------------------------------

_BOX_CMD_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_UNBRACED_TOKEN_RE = re.compile(r"[ \t]+([^\s$]+)")


def last_boxed_answer(text: Any) -> str | None:
    """Content of the LAST ``\\boxed``/``\\fbox`` of a reference solution, stripped; None if there is none.

    ``\\boxed{...}`` with nested and escaped braces is read with :func:`hacpo.reward.extract_boxed`.
    Unlike the response-side extractor, the unbraced TeX form ``\\boxed 2`` (one token after a space, as in
    two MATH train solutions) is accepted too: it is the same box to TeX. An empty box gives ``None``.
    """
    if not isinstance(text, str):
        return None
    matches = list(_BOX_CMD_RE.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    rest = text[m.end() :]
    if rest.lstrip(" \t\r\n").startswith("{"):
        content = extract_boxed(text[m.start() :])
    else:
        tok = _UNBRACED_TOKEN_RE.match(rest)
        content = tok.group(1).rstrip(".,;") if tok else None
    if content is None:
        return None
    content = content.strip()
    return content or None


def _str_field(record: Mapping[str, Any], key: str) -> str | None:
    v = record.get(key)
    if v is None:
        return None
    s = str(v).strip()
    return s or None


def gold_math_solution(record: Mapping[str, Any]) -> str | None:
    """MATH (train/test): the last ``\\boxed{}`` of ``solution`` (nested braces, ``\\boxed 2`` form)."""
    return last_boxed_answer(record.get("solution"))


def gold_math500(record: Mapping[str, Any]) -> str | None:
    """MATH-500: the ``answer`` field (equal to the last box of ``solution`` in all 500 records)."""
    return _str_field(record, "answer") or last_boxed_answer(record.get("solution"))


_GSM8K_RE = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


def gold_gsm8k(record: Mapping[str, Any]) -> str | None:
    """GSM8K: the number after the final ``####`` of ``answer``, commas removed (``1,000`` → ``1000``)."""
    text = record.get("answer")
    if not isinstance(text, str) or "####" not in text:
        return None
    m = _GSM8K_RE.search(text[text.rindex("####") :])
    if m is None:
        return None
    return m.group(1).replace(",", "").strip() or None


def _number_str(v: Any) -> str | None:
    """An int-valued number (``27``, ``27.0``, ``"027"``, ``"27.0"``) → ``"27"``; others kept as text."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return None
        return str(int(v)) if v.is_integer() else repr(v)
    s = str(v).strip()
    if re.fullmatch(r"[+-]?\d+(?:\.0*)?", s):
        return str(int(s.split(".")[0]))
    return s or None


def gold_aime(record: Mapping[str, Any]) -> str | None:
    """AIME 2025: the integer ``answer`` (0–999), as a canonical integer string."""
    return _number_str(record.get("answer"))


def gold_amc(record: Mapping[str, Any]) -> str | None:
    """AMC23: ``answer`` is stored as a float (``27.0``); int-valued floats become ``"27"``."""
    return _number_str(record.get("answer"))


_SCI_RE = re.compile(r"([+-]?\d+(?:\.\d+)?)\s*[eE]\s*([+-]?\d+)")


def latex_scientific(s: str) -> str:
    """``"4.5e33"`` → ``"4.5 \\times 10^{33}"`` (whole-string e-notation only; anything else unchanged).

    math-verify reads ``4.5e33`` as ``4.5·e·33`` (Euler's number), so a gold in e-notation would never match a
    correct ``4.5 \\times 10^{33}``; the LaTeX form is parsed as the number it means.
    """
    m = _SCI_RE.fullmatch(s.strip())
    if m is None:
        return s
    return f"{m.group(1)} \\times 10^{{{int(m.group(2))}}}"


def gold_minerva(record: Mapping[str, Any]) -> str | None:
    """Minerva Math: the ``answer`` field (if absent, the last ``\\boxed{}`` of ``solution``), with a plain
    e-notation number rewritten in LaTeX (:func:`latex_scientific`; 58 of the 272 golds)."""
    g = _str_field(record, "answer") or last_boxed_answer(record.get("solution"))
    return latex_scientific(g) if g is not None else None


_DOLLAR_RE = re.compile(r"(?<!\\)\$")


def _olympiad_part(s: str) -> str:
    """``"$\\frac{32}{9}$"`` → ``"\\frac{32}{9}"``; ``"$69$,$84$"`` → ``"69,84"``; drops a trailing period."""
    s = _DOLLAR_RE.sub("", s).strip()
    if s.endswith(".") and not s.endswith("\\."):
        s = s[:-1].rstrip()
    return s


def gold_olympiad(record: Mapping[str, Any]) -> str | None:
    """OlympiadBench: ``final_answer`` is a list of LaTeX strings wrapped in ``$…$``. The math delimiters
    (unescaped ``$``) and a trailing period are removed; several elements are joined with ``", "``."""
    fa = record.get("final_answer")
    if isinstance(fa, str):
        fa = [fa]
    if not isinstance(fa, list | tuple):
        return None
    parts = [_olympiad_part(str(x)) for x in fa if x is not None]
    parts = [p for p in parts if p]
    return ", ".join(parts) or None


# ----------------------------------------------------------------------------------------------------------
# Specs
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    title: str
    hub_id: str
    revision: str
    config: str | None
    split: str
    expected_count: int
    problem_fields: tuple[str, ...]
    """Candidate fields for the problem text; the first one present and non-empty is used (local copies and
    Hub copies sometimes name it differently, e.g. AMC23 ``problem`` vs ``question``)."""
    answer_field: str
    """The raw field the gold answer comes from (documentation; :attr:`extract` does the reading)."""
    local_file: str
    """File name of the offline copy (JSONL, ``.jsonl.gz`` when large), as in the project's data folder."""
    extract: Callable[[Mapping[str, Any]], str | None] = field(repr=False)
    id_field: str | None = None
    """Native id field; without it (or when a record lacks it) the id is a hash of the problem text."""
    metadata_fields: tuple[str, ...] = ()
    gold_overrides: tuple[tuple[str, str, str], ...] = ()
    """Documented dataset quirks: ``(record id, gold, reason)`` for records whose reference has no
    extractable answer. Applied only when extraction finds nothing."""
    role: str = "eval"

    @property
    def problem_field(self) -> str:
        return self.problem_fields[0]

    @property
    def local_file_names(self) -> tuple[str, ...]:
        """The local file name and its compressed/uncompressed twin: both are accepted in a cache folder."""
        f = self.local_file
        twin = f[:-3] if f.endswith(".gz") else f + ".gz"
        return (f, twin)

    def overrides(self) -> dict[str, str]:
        return {rid: gold for rid, gold, _ in self.gold_overrides}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "hub_id": self.hub_id,
            "revision": self.revision,
            "config": self.config,
            "split": self.split,
            "expected_count": self.expected_count,
            "problem_fields": list(self.problem_fields),
            "answer_field": self.answer_field,
            "local_file": self.local_file,
            "id_field": self.id_field,
            "role": self.role,
        }


# Pinned dataset-repo commits (see the module docstring and docs/datasets.md for where each was found).
MATH_LIGHTEVAL_REVISION = "0530c78699ea5e8eb5530600900e1f328b48acad"
MATH500_REVISION = "6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be"
GSM8K_REVISION = "740312add88f781978c0658806c59bc2815b9866"
AIME25_REVISION = "563bb8404243c5f09de6ec262f2db674fe5bce9b"
AMC23_REVISION = "80815d37005feb82cd7f8fbc6901d5d3eff43057"
MINERVA_REVISION = "ee46ddc498933b1977577953250ca5c66be64f96"
OLYMPIADBENCH_REVISION = "91184b52131e7fc9455fef848035173aea8cc01a"

_MATH_META = ("level", "type", "solution")

# Two MATH train solutions end in an empty box ("there are $\boxed{}$ primes in that range", "... so the
# answer is $\boxed{}$."), as in the original release. Both are multiple-choice problems whose correct choice
# is "(A) 0"; the gold is set to 0.
_MATH_TRAIN_OVERRIDES = (
    (
        "math_train-b77f061a4485",
        "0",
        "empty \\boxed{} in the reference; choice (A) 0 (no primes in n!+2..n!+n-1)",
    ),
    ("math_train-f97683aee99a", "0", "empty \\boxed{} in the reference; choice (A) 0 (P+n is never prime)"),
)

DATASETS: dict[str, DatasetSpec] = {
    s.name: s
    for s in (
        DatasetSpec(
            name="math_train",
            title="MATH train (Hendrycks et al. 2021)",
            hub_id="DigitalLearningGmbH/MATH-lighteval",
            revision=MATH_LIGHTEVAL_REVISION,
            config="default",
            split="train",
            expected_count=7500,
            problem_fields=("problem",),
            answer_field="solution",
            local_file="math_train.jsonl.gz",
            extract=gold_math_solution,
            metadata_fields=_MATH_META,
            gold_overrides=_MATH_TRAIN_OVERRIDES,
            role="train",
        ),
        DatasetSpec(
            name="math500",
            title="MATH-500 (PRM800K test subset)",
            hub_id="HuggingFaceH4/MATH-500",
            revision=MATH500_REVISION,
            config=None,
            split="test",
            expected_count=500,
            problem_fields=("problem",),
            answer_field="answer",
            local_file="math500.jsonl",
            extract=gold_math500,
            id_field="unique_id",
            metadata_fields=("subject", "level", "unique_id", "solution"),
        ),
        DatasetSpec(
            name="math",
            title="MATH test (5,000)",
            hub_id="DigitalLearningGmbH/MATH-lighteval",
            revision=MATH_LIGHTEVAL_REVISION,
            config="default",
            split="test",
            expected_count=5000,
            problem_fields=("problem",),
            answer_field="solution",
            local_file="math_test.jsonl",
            extract=gold_math_solution,
            metadata_fields=_MATH_META,
        ),
        DatasetSpec(
            name="gsm8k",
            title="GSM8K test",
            hub_id="openai/gsm8k",
            revision=GSM8K_REVISION,
            config="main",
            split="test",
            expected_count=1319,
            problem_fields=("question", "problem"),
            answer_field="answer",
            local_file="gsm8k_test.jsonl",
            extract=gold_gsm8k,
            metadata_fields=(),  # the worked solution is kept as metadata["solution"] (see normalise_record)
        ),
        DatasetSpec(
            name="aime2025",
            title="AIME 2025 I and II",
            hub_id="math-ai/aime25",
            revision=AIME25_REVISION,
            config=None,
            split="test",
            expected_count=30,
            problem_fields=("problem", "question"),
            answer_field="answer",
            local_file="aime25.jsonl",
            extract=gold_aime,
        ),
        DatasetSpec(
            name="amc23",
            title="AMC 2023 (Qwen2.5-Math evaluation set)",
            hub_id="math-ai/amc23",
            revision=AMC23_REVISION,
            config=None,
            split="test",
            expected_count=40,
            problem_fields=("problem", "question"),
            answer_field="answer",
            local_file="amc23.jsonl",
            extract=gold_amc,
            id_field="id",
            metadata_fields=("id", "url"),
        ),
        DatasetSpec(
            name="minerva",
            title="Minerva Math (MIT OCW)",
            hub_id="math-ai/minervamath",
            revision=MINERVA_REVISION,
            config=None,
            split="test",
            expected_count=272,
            problem_fields=("problem", "question"),
            answer_field="answer",
            local_file="minerva_math.jsonl",
            extract=gold_minerva,
            metadata_fields=("type", "idx", "answer", "solution"),  # metadata["answer"]: the gold as stored
        ),
        DatasetSpec(
            name="olympiad",
            title="OlympiadBench (OE_TO_maths_en_COMP)",
            hub_id="Hothan/OlympiadBench",
            revision=OLYMPIADBENCH_REVISION,
            config="OE_TO_maths_en_COMP",
            split="train",  # the Hub copy stores every OlympiadBench subset as a single 'train' split
            expected_count=675,
            problem_fields=("question", "problem"),
            answer_field="final_answer",
            local_file="olympiadbench.jsonl",
            extract=gold_olympiad,
            id_field="id",
            metadata_fields=(
                "id",
                "subfield",
                "context",
                "final_answer",
                "is_multiple_answer",
                "unit",
                "answer_type",
                "error",
                "solution",
            ),
        ),
    )
}


def names() -> tuple[str, ...]:
    """Registered dataset names, in registry order (training set first)."""
    return tuple(DATASETS)


def get(name: str) -> DatasetSpec:
    """The spec of ``name``; :class:`UnknownDatasetError` (KeyError and ValueError) lists the known names."""
    try:
        return DATASETS[name]
    except (KeyError, TypeError):
        raise UnknownDatasetError(
            f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}"
        ) from None


# ----------------------------------------------------------------------------------------------------------
# Normalisation
# ----------------------------------------------------------------------------------------------------------


def _problem_text(spec: DatasetSpec, record: Mapping[str, Any]) -> str | None:
    for key in spec.problem_fields:
        v = record.get(key)
        if isinstance(v, str) and v.strip():
            return v
    return None


def record_id(spec: DatasetSpec, record: Mapping[str, Any], problem: str) -> str:
    """``<name>-<native id>`` when the spec has a native id field present in ``record``, else
    ``<name>-<12 hex of sha1(problem text)>``."""
    if spec.id_field is not None and record.get(spec.id_field) not in (None, ""):
        return f"{spec.name}-{record[spec.id_field]}"
    return f"{spec.name}-{hashlib.sha1(problem.encode('utf-8')).hexdigest()[:12]}"


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, str | int | float | bool):
        return v
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)


def normalise_record(spec: DatasetSpec, record: Mapping[str, Any], index: int) -> dict[str, Any]:
    """One raw record → the normalised schema. ``answer`` is ``""`` when no gold could be extracted (the
    caller, :func:`hacpo.data.prepare.normalise_rows`, reports such records); a ``ValueError`` is raised when
    the problem text itself is missing."""
    problem = _problem_text(spec, record)
    if problem is None:
        raise ValueError(
            f"{spec.name}: record {index} has no problem text (looked for {', '.join(spec.problem_fields)}; "
            f"keys: {', '.join(sorted(map(str, record)))})"
        )
    rid = record_id(spec, record, problem)
    gold = spec.extract(record)
    meta: dict[str, Any] = {"index": index}
    if gold is None and rid in spec.overrides():
        gold = spec.overrides()[rid]
        meta["gold_override"] = next(r for i, _, r in spec.gold_overrides if i == rid)
    for key in spec.metadata_fields:
        if key in record and record[key] is not None:
            meta[key] = _jsonable(record[key])
    if spec.name == "gsm8k" and isinstance(record.get("answer"), str):
        meta["solution"] = record["answer"]
    return {"id": rid, "problem": problem, "answer": gold or "", "source": spec.name, "metadata": meta}
