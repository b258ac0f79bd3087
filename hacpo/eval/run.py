"""Evaluate one checkpoint on one benchmark file: generate k responses, score, write audit + summary."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from hacpo.reward import REWARDS, CustomReward, Scorer, VerifierError, extract_boxed
from hacpo.runio import RunRecord, atomic_write_json, atomic_write_text, run_lock, sweep_temporaries

from .metrics import is_correct, summarize


@dataclass(frozen=True)
class Decoding:
    """How answers are drawn: greedy (one answer per problem) or k samples at a temperature and top-p.

    The one type (and the one check) for decoding: workflow configs use it for ``benchmarks.<b>.sampling``
    (errors then name that key), evaluation for every benchmark."""

    greedy: bool = True
    k: int = 1
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"k must be ≥ 1, got {self.k}")
        if self.greedy and self.k != 1:
            raise ValueError(
                "greedy decoding gives one answer per problem: use k=1, or greedy=False to sample k"
            )
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class Sampling(Decoding):
    """Decoding plus the generation settings of an evaluation (token budget, prompt style, seed)."""

    max_new_tokens: int = 13
    prompt_style: str = "compact"
    seed: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens}")


def read_benchmark(path: str | Path, limit: int | None = None) -> list[dict]:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for i, r in enumerate(rows):
        if "problem" not in r or "answer" not in r:
            raise ValueError(f"{path}: record {i} needs 'problem' and 'answer' fields (got {sorted(r)})")
        r.setdefault("id", str(i))
    return rows[:limit] if limit else rows


def verifier_record(reward: str | dict | CustomReward | None) -> str | dict:
    """What an audit file records of the verifier that scored it, enough to load it again: a built-in's name,
    or a verifier of your own's entry (``file`` + ``name``, or ``function``) with its source's SHA-256."""
    if reward is None or isinstance(reward, str):
        return reward or "math_verify"
    spec = reward if isinstance(reward, CustomReward) else CustomReward(**reward)
    return spec.planned()


def reward_from_spec(text: str) -> str | dict:
    """A verifier named on a command line: ``math_verify``, ``hendrycks``, ``pkg.module:name`` or
    ``path/to/verify.py:name`` → the value ``Scorer(reward=…)`` takes."""
    if text in REWARDS:
        return text
    where, _, name = text.rpartition(":")
    if not where or not name:
        raise ValueError(
            f"verifier {text!r}: give {', '.join(REWARDS)}, pkg.module:name or path/to/verify.py:name"
        )
    if where.endswith(".py") or Path(where).is_file():
        return CustomReward(file=where, name=name).model_dump(exclude_none=True)
    return CustomReward(function=text).model_dump(exclude_none=True)


def _name(reward: str | dict) -> str:
    return reward if isinstance(reward, str) else CustomReward(**loadable_verifier(reward)).target


def loadable_verifier(reward: str | dict) -> str | dict:
    """A recorded verifier without its hash, as ``Scorer(reward=…)`` loads it: rescoring with a verifier
    edited since (a fixed one) is allowed; the change is noted instead (:func:`recorded_verifier`)."""
    return reward if isinstance(reward, str) else {k: v for k, v in reward.items() if k != "sha256"}


def recorded_verifier(
    samples: str | Path, rows: list[dict] | None = None
) -> tuple[str | dict, str, list[str]]:
    """The verifier that scored an audit file of :func:`evaluate`: ``(reward, where from, notes)``.

    From the audit's own record; an older audit without one: the ``reward`` of its evaluation's summary
    beside it (``<bench>.json``), else math-verify, assumed; both are said in the notes."""
    if rows is None:
        with open(samples) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    found = {json.dumps(r["verifier"], sort_keys=True) for r in rows if "verifier" in r}
    if len(found) > 1:
        raise ValueError(
            f"{samples}: its answers were scored by different verifiers ({', '.join(sorted(found))}); "
            "rescore with one named explicitly"
        )
    if found:
        if not all("verifier" in r for r in rows):
            raise ValueError(f"{samples}: some answers record their verifier and some do not; rescore with "
                             "one named explicitly")  # fmt: skip
        return json.loads(found.pop()), "audit", []
    name = Path(samples).name
    summary = Path(samples).with_name(name.removesuffix(".samples.jsonl") + ".json")
    recorded = None
    if name.endswith(".samples.jsonl") and summary.is_file():
        recorded = json.loads(summary.read_text()).get("reward")
    if recorded is not None:
        note = (f"{samples} does not record its verifier (an older evaluation): using the one its summary "
                f"{summary} names, {_name(recorded)}")  # fmt: skip
        return recorded, "evaluation summary", [note]
    note = (f"{samples} does not record its verifier (an older evaluation) and no evaluation summary beside "
            "it names one: math_verify assumed; name another with --reward")  # fmt: skip
    return "math_verify", "assumed", [note]


def evaluate(
    generator,
    benchmark: str | Path,
    out_prefix: str | Path,
    sampling: Sampling,
    *,
    limit: int | None = None,
    scorer_workers: int = 0,
    name: str | None = None,
    pass_ks: list[int] | None = None,
    reward: str | dict | None = None,
) -> dict:
    """Writes ``{out_prefix}.samples.jsonl`` (one line per response: its ``reward`` and ``correct``, full
    credit) and ``{out_prefix}.json`` (summary: avg@k = ``accuracy``, the mean reward, and unbiased pass@k
    for k in {1, k} ∪ ``pass_ks``, a sample correct at full credit; :mod:`hacpo.eval.metrics`).
    ``reward``: math-verify (None), ``hendrycks``, or a verifier of your own (:mod:`hacpo.reward.custom`),
    which gets each record's ``metadata``."""
    problems = read_benchmark(benchmark, limit)
    t0 = time.perf_counter()
    responses = generator.generate(problems, sampling)
    t_gen = time.perf_counter() - t0
    flat = [r for rs in responses for r in rs]
    picked = [p for p, rs in zip(problems, responses, strict=True) for _ in rs]
    golds, ids = [p["answer"] for p in picked], [p["id"] for p in picked]
    metadata = [p.get("metadata") or {} for p in picked]
    verifier = verifier_record(reward)  # before scoring: the source that scores is the one hashed
    t0 = time.perf_counter()
    with Scorer(workers=scorer_workers, reward=reward or "math_verify") as scorer:
        scores = scorer.score(flat, golds, metadata, ids)
    t_score = time.perf_counter() - t0
    lines, correct, i = [], [], 0
    for p, rs in zip(problems, responses, strict=True):
        row_scores = []
        for sample, text in enumerate(rs):
            c = scores[i]
            i += 1
            row_scores.append(c)
            lines.append(
                json.dumps(
                    {
                        "id": p["id"],
                        "sample": sample,
                        "response": text,
                        "extracted": extract_boxed(text),
                        "gold": p["answer"],
                        "reward": c,
                        "correct": is_correct(c),  # full credit (hacpo.eval.metrics)
                        "verifier": verifier,
                    }
                )
            )
        correct.append(row_scores)
    summary = {
        "benchmark": name or Path(benchmark).stem,
        "file": str(benchmark),
        **summarize(correct, sorted({1, sampling.k, *(pass_ks or [])})),  # avg@k = accuracy: mean reward
        "sampling": asdict(sampling),
        "reward": reward or "math_verify",
        "time_generate_s": t_gen,
        "time_score_s": t_score,
    }
    out_prefix = Path(out_prefix)
    atomic_write_text(out_prefix.with_name(out_prefix.name + ".samples.jsonl"), "\n".join(lines) + "\n")
    atomic_write_json(out_prefix.with_name(out_prefix.name + ".json"), summary)
    return summary


def resolve_source(source: dict) -> str:
    """Weights to evaluate: ``{"model": path_or_hub_id}`` or ``{"run": run_dir, "agent": name}`` (the run's
    final checkpoint of that agent, from its ``run.json``)."""
    if "model" in source:
        return source["model"]
    record = RunRecord.read(source["run"])
    if record is None:
        raise FileNotFoundError(f"{Path(source['run']) / RunRecord.FILE} missing: train the run first")
    return record.final_checkpoint(source["agent"], source["run"])


def evaluate_setting(
    generator, settings: dict, out_dir: str | Path, *, seed: int = 0, scorer_workers: int = 0
):
    """Every benchmark of one evaluation setting → ``<bench>.json`` + ``<bench>.samples.jsonl``, then
    ``summary.json`` (written last: its presence means the whole setting is done).

    ``settings`` = ``{"max_new_tokens", "prompt_style", "benchmarks": {name: {"file", "metric", "greedy",
    "k", "temperature", "top_p"}}}`` (built by :meth:`hacpo.pipeline.Pipeline.eval_settings`)."""
    with run_lock(out_dir):
        sweep_temporaries(out_dir)  # a killed evaluation's half-written files; finished ones are redone
        return _evaluate_setting(generator, settings, Path(out_dir), seed, scorer_workers)


def _evaluate_setting(generator, settings: dict, out_dir: Path, seed: int, scorer_workers: int) -> dict:
    results = {}
    for name, b in settings["benchmarks"].items():
        sampling = Sampling(
            **{f.name: b[f.name] for f in fields(Decoding) if f.name in b},
            max_new_tokens=settings["max_new_tokens"],
            prompt_style=settings.get("prompt_style", "compact"),
            seed=seed,
        )
        summary = evaluate(
            generator,
            b["file"],
            out_dir / name,
            sampling,
            scorer_workers=scorer_workers,
            name=name,
            pass_ks=b.get("pass_ks"),
            reward=b.get("reward"),
        )
        metric = b.get("metric", f"avg@{sampling.k}")
        if metric not in summary:
            raise ValueError(
                f"benchmark {name}: metric {metric!r} not computed; available: {sorted(summary)}"
            )
        results[name] = {"metric": metric, "value": summary[metric], **summary}
    atomic_write_json(out_dir / "summary.json", {"benchmarks": results})
    return results


def rescore(
    samples: str | Path,
    benchmark: str | Path,
    out: str | Path,
    *,
    scorer_workers: int = 0,
    reward: str | dict | None = None,
) -> dict:
    """Score saved responses again (new golds or a fixed scorer) without generating: ``samples`` is an audit
    file of :func:`evaluate`; golds and each item's metadata come from ``benchmark`` (by id). Scored by the
    verifier the audit records (:func:`recorded_verifier`), or by ``reward`` when given; the summary names
    it (``reward``), where it came from (``verifier_from``) and, in ``notes`` (also on stderr), an assumed
    verifier, one other than the audit's, or one whose source changed since. Writes ``out`` (summary JSON)
    and the re-scored audit beside it (``<out stem>.samples.jsonl``)."""
    records = {r["id"]: r for r in read_benchmark(benchmark)}
    with open(samples) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    missing = sorted({r["id"] for r in rows} - set(records))
    if missing:
        raise ValueError(f"{samples}: {len(missing)} problem ids not in {benchmark} (e.g. {missing[0]!r})")
    recorded, source, notes = recorded_verifier(samples, rows)
    if reward is not None:
        asked = verifier_record(reward)
        if source == "audit" and loadable_verifier(asked) != loadable_verifier(recorded):
            notes.append(f"scored with {_name(asked)} as asked, not with {_name(recorded)}, the verifier "
                         f"{samples} records")  # fmt: skip
        recorded, source = asked, "argument"
    use = loadable_verifier(recorded)
    try:
        verifier = verifier_record(use)
    except VerifierError as err:
        raise VerifierError(f"{samples}: cannot load its verifier here ({err}); name it with --reward "
                            "(path/to/verify.py:name or pkg.module:name)") from err  # fmt: skip
    if isinstance(recorded, dict) and recorded.get("sha256"):
        now, then = verifier["sha256"], recorded["sha256"]
        if now != then:
            notes.append(f"{_name(recorded)} changed since the evaluation (sha256 {then[:12]}… → "
                         f"{now[:12]}…): rescored with its current source")  # fmt: skip
    for note in notes:
        print(f"hacpo rescore: note: {note}", file=sys.stderr)
    before = [bool(r["correct"]) for r in rows]
    picked = [records[r["id"]] for r in rows]
    with Scorer(workers=scorer_workers, reward=use) as scorer:
        scores = scorer.score(
            [r["response"] for r in rows], [p["answer"] for p in picked],
            [p.get("metadata") or {} for p in picked], [r["id"] for r in rows],
        )  # fmt: skip
    by_problem: dict[str, list[float]] = {}
    for r, p, c in zip(rows, picked, scores, strict=True):
        r.update(gold=p["answer"], extracted=extract_boxed(r["response"]), reward=c, correct=is_correct(c),
                 verifier=verifier)  # fmt: skip
        by_problem.setdefault(r["id"], []).append(c)
    correct = list(by_problem.values())
    summary = {
        "benchmark": Path(benchmark).stem,
        "file": str(benchmark),
        "rescored_from": str(samples),
        **summarize(correct),
        "changed": sum(is_correct(c) != b for b, c in zip(before, scores, strict=True)),
        "reward": verifier,
        "verifier_from": source,
        **({"notes": notes} if notes else {}),
    }
    out = Path(out)
    atomic_write_text(out.with_name(out.stem + ".samples.jsonl"), "".join(json.dumps(r) + "\n" for r in rows))
    atomic_write_json(out, summary)
    return summary
