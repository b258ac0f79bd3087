"""Throughput / latency benchmark for :mod:`hacpo.reward` (not a test).

    python benchmarks/bench_reward.py [--batches 8] [--workers 0 1 2]

Workloads (each response is ~1 KB of reasoning text ending in a box; 70% integer answers like the toy
tasks, 30% LaTeX answers such as ``\\frac{3}{4}``, ``2\\sqrt{3}``, ``\\pi/2``, about half of them correct):

- ``ints``:   integer answers only (fast path; measures the per-item overhead of the calling process).
- ``rl``:     RL-like steps: each batch is 64 fresh prompts × 8 samples, answers drawn from a few candidates
              per prompt (so a batch repeats answers, as GRPO groups do). Default scorer (cache on).
- ``unique``: LaTeX answers drawn from wide ranges (almost never repeated) and the cache off: the cost of
              math-verify itself (worst case).

``--misbehaving-verifier``: a step's 128 items scored by a verifier of your own that raises on one item in
ten, hangs on one and scores NaN on one (30-s deadline): seconds, and whether every good item was scored.

``--slow-verifier``: 256 items scored once the step's budget is spent, by a verifier that takes 1 s an item
and hangs on one: seconds, and whether every good item was scored.

``--hanging-verifier A B``: a toy HACPO run whose verifier of your own hangs on one prompt in ten, against the
same run with it well behaved (seconds per step, items retried, timed out and shared);
``--hang-verifier misbehaves_on_three_in_ten``: one that raises, hangs and scores NaN on one item in ten
each, with the bad items and the good ones scored right counted.

Also scores a hostile corpus item by item and reports the maximum per-item wall latency, and every workload
with ``reward="hendrycks"`` (the as-released exact match: pure string code in the calling process).

Real benchmark golds (only when the dataset files are present: ``--data-dir``, a folder of the registry's
files named as in docs/datasets.md; skipped otherwise): every gold of the 8 registered datasets
(:mod:`hacpo.data.registry`, 15,336 records) is scored two ways —

- ``\\boxed{gold}`` vs gold through :meth:`Scorer.score` (the self-verification of the dataset tests; decided
  by the exact-match fast path);
- gold vs gold through math-verify itself, bypassing the fast paths (a benchmark-only call of the scorer's
  internal ``_resolve``): does math-verify parse every gold and find it equal to itself?
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from math import gcd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from hacpo.reward import Scorer  # noqa: E402
from hacpo.reward.fastpath import _norm  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA_DIR = os.path.join(os.path.dirname(ROOT), "shared", "data")

FILLER = (
    "Let us reason step by step. We first simplify the expression and then check the boundary cases. "
    "Substituting the values gives the intermediate result, and we verify it satisfies the constraints. "
) * 5


def _latex_pair(rng: random.Random, scale: int = 1) -> tuple[str, str]:
    """(boxed answer, gold) for a random LaTeX-style item; equal in about half the cases. ``scale`` widens
    the number ranges (so that items rarely repeat)."""
    kind = rng.randrange(4)
    wrong = rng.random() < 0.5
    if kind == 0:  # fraction vs reduced fraction / decimal
        b = rng.choice([2, 4, 5, 8, 10, 3, 7, 9])
        a = rng.randrange(1, 50 * scale)
        g = gcd(a, b)
        gold = f"\\frac{{{a // g}}}{{{b // g}}}"
        k = rng.randrange(1, 4)
        ans = f"\\frac{{{a * k + wrong}}}{{{b * k}}}"
        if b in (2, 4, 5, 8, 10) and rng.random() < 0.5:
            gold = repr(a / b)
    elif kind == 1:  # k sqrt m vs sqrt(k^2 m)
        k, m = rng.randrange(2, 12 * scale), rng.choice([2, 3, 5, 6, 7, 10, 11, 13, 14, 15])
        ans = f"{k}\\sqrt{{{m}}}"
        gold = f"\\sqrt{{{k * k * m + wrong}}}"
    elif kind == 2:  # multiples of pi
        k, m = rng.randrange(1, 9 * scale), rng.randrange(2, 9 * scale)
        ans = f"\\frac{{{k}\\pi}}{{{m}}}"
        gold = f"{k + wrong}\\pi/{m}"
    else:  # same form (exact-match path) or a sign slip
        a, b = rng.randrange(1, 20 * scale), rng.randrange(2, 20 * scale)
        gold = f"\\frac{{{a}}}{{{b}}}"
        ans = f"-\\frac{{{a}}}{{{b}}}" if wrong else gold
    return ans, gold


def _int_pair(rng: random.Random) -> tuple[str, str]:
    gold = rng.randrange(0, 10000)
    ans = gold if rng.random() < 0.5 else gold + rng.choice([-1, 1, 10])
    return str(ans), str(gold)


def _response(ans: str, rng: random.Random) -> str:
    return FILLER[: rng.randrange(600, len(FILLER))] + f"Therefore the answer is $\\boxed{{{ans}}}$."


def rl_batch(rng: random.Random, prompts: int = 64, samples: int = 8) -> tuple[list[str], list[str]]:
    responses, golds = [], []
    for _ in range(prompts):
        if rng.random() < 0.7:
            cands = [_int_pair(rng) for _ in range(3)]
            gold = cands[0][1]
            cands = [(a, gold) for a, _ in cands]
        else:
            a, gold = _latex_pair(rng)
            cands = [(a, gold), (gold, gold), (f"{a}+1", gold)]
        for _ in range(samples):
            ans, g = rng.choice(cands)
            responses.append(_response(ans, rng))
            golds.append(g)
    return responses, golds


def unique_batch(rng: random.Random, n: int = 512) -> tuple[list[str], list[str]]:
    responses, golds = [], []
    for _ in range(n):
        if rng.random() < 0.7:
            ans, gold = _int_pair(rng)
        else:
            ans, gold = _latex_pair(rng, scale=40)
        responses.append(_response(ans, rng))
        golds.append(gold)
    return responses, golds


def int_batch(rng: random.Random, n: int = 512) -> tuple[list[str], list[str]]:
    """Integer answers only: everything is decided by the fast path in the calling process."""
    pairs = [_int_pair(rng) for _ in range(n)]
    return [_response(a, rng) for a, _ in pairs], [g for _, g in pairs]


def hostile_corpus() -> list[tuple[str, str]]:
    mb = 2 * 1024 * 1024
    return [
        ("x" * mb + "\\boxed{5}", "5"),
        ("\\boxed{" + "{" * mb, "5"),
        ("\\boxed{9^{9^{9^{9}}}}", "5"),
        ("\\boxed{10**10**10}", "5"),
        ("\\boxed{2^{2^{30}}}", "5"),
        ("\\boxed{(10^{7})!}", "5"),
        ("\\boxed{\\binom{1000000}{500000}}", "5"),
        ("\\boxed{(1+x)^{100000}}", "5"),
        ("\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}", "1"),
        ("\\boxed{" + "(" * 15 + "1" + ")" * 15 + "}", "1"),
        ("\\boxed{\\frac{1}{0}}", "5"),
        ("\\boxed{\x00\x001\x00}", "1"),
        ("\\boxed{\ud800\uffff\u202e\U0001f600}", "5"),
        ("\\boxed{\\int_0^{\\infty} e^{-x^{2}} dx}", "\\frac{\\sqrt{\\pi}}{2}"),
        ("\\boxed{x^{100000}-1=0}", "x=1"),
        ("\\boxed{\\prod_{k=1}^{10^{6}} k}", "5"),
    ]


def _workers_cpu_s(scorer: Scorer) -> float:
    """CPU seconds used so far by the scorer's worker processes (Linux /proc; 0 elsewhere)."""
    total = 0.0
    pool = scorer._pool  # benchmark-only peek at internals
    for w in pool._workers if pool is not None else []:
        try:
            with open(f"/proc/{w.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            pass
    return total


def bench_throughput(
    workers: int, batches: list[tuple[list[str], list[str]]], cache_size: int, reward: str = "math_verify"
) -> dict:
    t0 = time.perf_counter()
    with Scorer(workers=workers, cache_size=cache_size, reward=reward) as scorer:
        scorer.wait_ready()
        scorer.score(["\\boxed{\\sqrt{8}}"], ["2\\sqrt{2}"])  # warm the parsers (in-process case)
        startup = time.perf_counter() - t0
        n = 0
        t1, c1, w1 = time.perf_counter(), time.process_time(), _workers_cpu_s(scorer)
        for responses, golds in batches:
            scorer.score(responses, golds)
            n += len(responses)
        dt = time.perf_counter() - t1
        parent_cpu, workers_cpu = time.process_time() - c1, _workers_cpu_s(scorer) - w1
        stats = dict(scorer.stats)
    return {
        "items_per_s": n / dt,
        "n": n,
        "seconds": dt,
        "startup_s": startup,
        "stats": stats,
        "parent_cpu_s": parent_cpu,
        "workers_cpu_s": workers_cpu,
    }


def bench_hostile(workers: int) -> tuple[float, str]:
    worst, which = 0.0, ""
    with Scorer(workers=workers) as scorer:
        scorer.wait_ready()
        scorer.score(["\\boxed{\\sqrt{8}}"], ["2\\sqrt{2}"])
        for resp, gold in hostile_corpus():
            t = time.perf_counter()
            scorer.score([resp], [gold])
            dt = time.perf_counter() - t
            if dt > worst:
                worst, which = dt, repr(resp[:40])
    return worst, which


def real_golds(data_dir: str) -> dict[str, list[tuple[str, str]]] | None:
    """``{dataset: [(id, gold), ...]}`` from the real files in ``data_dir``; None if any file is missing."""
    from hacpo.data.prepare import load_raw, normalise_rows
    from hacpo.data.registry import get, names

    out = {}
    for name in names():
        spec = get(name)
        path = next(
            (
                os.path.join(data_dir, f)
                for f in spec.local_file_names
                if os.path.isfile(os.path.join(data_dir, f))
            ),
            None,
        )
        if path is None:
            return None
        rows, _ = load_raw(name, local_file=path, allow_download=False)
        out[name] = [(r["id"], r["answer"]) for r in normalise_rows(spec, rows)]
    return out


def bench_real_golds(golds: dict[str, list[tuple[str, str]]], workers: int) -> None:
    with Scorer(workers=workers, cache_size=0) as scorer:
        scorer.wait_ready()
        scorer.score(["\\boxed{\\sqrt{8}}"], ["2\\sqrt{2}"])
        for name, items in golds.items():
            gs = [g for _, g in items]
            t = time.perf_counter()
            boxed = scorer.score([f"The answer is $\\boxed{{{g}}}$." for g in gs], gs)
            dt_boxed = time.perf_counter() - t
            t = time.perf_counter()
            mv = scorer._resolve([(_norm(g), _norm(g)) for g in gs])  # benchmark-only: math-verify directly
            dt_mv = time.perf_counter() - t
            bad = [i for (i, _), (ok, _) in zip(items, mv, strict=True) if not ok]
            print(
                f"real golds {name:10s} w={workers}: {len(gs):5d} items | boxed self-check "
                f"{sum(boxed) / len(gs):.4f} at {len(gs) / dt_boxed:8.0f} items/s | math-verify gold≡gold "
                f"{1 - len(bad) / len(gs):.4f} at {len(gs) / dt_mv:6.0f} items/s"
                + (f" | failing: {', '.join(bad[:5])}" if bad else "")
            )


HANGING_VERIFIER = """
import hashlib, re, time

def _boxed(r):
    found = re.findall(r"\\\\boxed\\{([^}]*)\\}", r)
    return found[-1] if found else None

def exact(responses, answers, metadata):
    return [1.0 if _boxed(r) == a else 0.0 for r, a in zip(responses, answers)]

def misbehaves_on_three_in_ten(responses, answers, metadata):
    # item by item, keyed by the response: one in ten raises, one hangs, one scores NaN; the rest are exact
    out = []
    for r, a in zip(responses, answers):
        kind = int(hashlib.sha256(r.encode()).hexdigest(), 16) % 10
        if kind == 0:
            raise ValueError("this verifier cannot read " + r[:20])
        if kind == 1:
            time.sleep(3600)
        out.append(float("nan") if kind == 2 else 1.0 if _boxed(r) == a else 0.0)
    return out

def slow_hangs_on_one(responses, answers, metadata):
    # a slow verifier (1 s an item, waiting on a solver or a service) that hangs on one response
    for r in responses:
        time.sleep(3600 if "hang" in r else 1.0)
    return exact(responses, answers, metadata)

def hangs_on_one_prompt_in_ten(responses, answers, metadata):
    # a pathological case keyed by the problem: every answer to one problem in ten never verifies
    if any(int(hashlib.sha256(a.encode()).hexdigest(), 16) % 10 == 0 for a in answers):
        time.sleep(3600)
    return exact(responses, answers, metadata)
"""


def _account(seen: list[tuple[str, str, float]]) -> None:
    """Of the items ``misbehaves_on_three_in_ten`` scored (response, gold, reward): the bad ones, and the
    good ones scored right (as ``exact`` would)."""
    import hashlib
    import re

    kind = [int(hashlib.sha256(r.encode()).hexdigest(), 16) % 10 for r, _, _ in seen]
    good = [(r, g, v) for (r, g, v), k in zip(seen, kind, strict=True) if k >= 3]
    right = 0
    for r, g, v in good:
        b = re.findall(r"\\boxed\{([^}]*)\}", r)
        right += v == (1.0 if b and b[-1] == g else 0.0)
    zero = sum(v == 0 for _, _, v in seen)
    bad = len(seen) - len(good)
    print(f"  {len(seen)} items, {bad} bad; {right} of {len(good)} good items scored right; {zero} scored 0",
          flush=True)  # fmt: skip


def bench_hanging_verifier(agents: list[str], data: str, steps: int, timeout_s: float | None,
                           engine: str = "local", reward_file: str | None = None,
                           verifier: str = "hangs_on_one_prompt_in_ten") -> None:  # fmt: skip
    """A toy HACPO run (2 agents, 8 prompts × G 8) with a verifier of your own that hangs on one
    prompt in ten, against the same run with it well behaved; seconds per step and the verifier's counts.
    ``engine="openrlhf"``: the joint run on the real stack (CPU rehearsal settings; agents vLLM serves, e.g.
    .cache/test-agents/rehearsal-{llama,qwen}); ``reward_file``: another reward file for OpenRLHF's engines
    (an older version, for a before/after)."""
    import json
    import tempfile
    from pathlib import Path

    from hacpo.config import load_train_config
    from hacpo.engines.local.trainer import LocalTrainer

    if engine == "openrlhf":
        from hacpo.engines.openrlhf import command
        from hacpo.engines.openrlhf.runner import train as openrlhf_train
        from hacpo.runio import read_jsonl

        if reward_file:
            command.reward_file = lambda: Path(reward_file).resolve()

    with tempfile.TemporaryDirectory() as tmp:
        verify = Path(tmp) / "verify.py"
        verify.write_text(HANGING_VERIFIER)
        for name in ("exact", verifier):
            run = {
                "method": "hacpo", "agents": [{"name": Path(a).name, "path": a} for a in agents],
                "train_file": str(Path(data) / "train.jsonl"), "out_dir": str(Path(tmp) / name),
                "steps": steps, "prompts_per_step": 8, "group_size": 8, "minibatch_size": 64,
                "val_every": 0, "val_size": 0, "checkpoint_every": 0, "seed": 0,
                "reward": {"file": str(verify), "name": name}, "reward_timeout_s": timeout_s,
            }  # fmt: skip
            if engine == "openrlhf":  # the CPU rehearsal's settings
                run["openrlhf"] = {"cpu": True, "gpus_per_node": 1, "max_prompt_tokens": 64,
                                   "micro_train_batch_size": 4, "gradient_checkpointing": False,
                                   "vllm_gpu_memory_utilization": 0.1}  # fmt: skip
            cfg = load_train_config(run)
            if engine == "openrlhf":  # the joint driver logs the verifier's seconds, not a scoring phase
                openrlhf_train(cfg, cfg.openrlhf)
                rows = read_jsonl(Path(cfg.out_dir) / "metrics.jsonl")
                score_key, failed = "verifier/seconds", sum(r.get("verifier/failed", 0) for r in rows)
            else:
                trainer = LocalTrainer(cfg)
                seen: list[tuple[str, str, float]] = []  # every item scored: response, gold, reward
                score = trainer.scorer.score

                def watched(responses, golds, *rest, _score=score, _seen=seen):
                    got = _score(responses, golds, *rest)
                    _seen.extend(zip(responses, golds, got, strict=True))
                    return got

                trainer.scorer.score = watched
                rows = [trainer.train_step(s).row for s in range(steps)]
                if name == "misbehaves_on_three_in_ten":
                    _account(seen)
                trainer.scorer.close()
                score_key, failed = "time/score_s", rows[-1]["verifier_failed"]
            step_s = [r["time/step_s"] for r in rows]
            kinds = ("retried", "timed_out", "shared")
            counts = {k: sum(r.get(f"verifier/{k}", 0) for r in rows) for k in kinds}
            score_s = sum(r.get(score_key, 0.0) for r in rows) / steps
            print(f"verifier {name}: s/step {json.dumps([round(x, 1) for x in step_s])} (mean "
                  f"{sum(step_s) / steps:.1f}), score s/step {score_s:.1f}, items over the run: {counts}, "
                  f"failed {failed:.0f}", flush=True)  # fmt: skip


def bench_misbehaving_verifier(timeout_s: float, workers: int) -> None:
    """A step's scoring with a verifier of your own that raises on one item in ten, hangs on one and scores
    NaN on one (two agents' 8 prompts × G 8 = 128 items in one step, ``timeout_s`` deadline): seconds, items
    scored, items failed.
    Only the 3 in 10 bad items should score 0, every good one scored."""
    import hashlib
    import tempfile
    from pathlib import Path

    from hacpo.reward.custom import CustomReward, VerifierRunner

    rng = random.Random(0)
    responses, answers = [], []
    for p in range(16):  # 8 prompts × G 8 for each of two agents
        gold = str(rng.randrange(10, 200))
        for g in range(8):
            said = gold if rng.random() < 0.5 else str(int(gold) + 1)
            responses.append(f"prompt {p} sample {g}: {FILLER[:200]} \\boxed{{{said}}}")
            answers.append(gold)
    bad = sum(int(hashlib.sha256(r.encode()).hexdigest(), 16) % 10 < 3 for r in responses)
    with tempfile.TemporaryDirectory() as tmp:
        verify = Path(tmp) / "verify.py"
        verify.write_text(HANGING_VERIFIER)
        spec = CustomReward(file=str(verify), name="misbehaves_on_three_in_ten")
        runner = VerifierRunner(spec, workers=workers, timeout_s=timeout_s)
        for p in runner.pools:
            p.wait_ready(60.0)
        t0 = time.monotonic()
        runner.new_step()  # one step: both agents' items, one call each, as the local engine scores them
        half = len(responses) // 2
        got = runner.score(responses[:half], answers[:half], ids=[str(i) for i in range(half)])
        got += runner.score(
            responses[half:], answers[half:], ids=[str(i) for i in range(half, len(responses))]
        )
        took = time.monotonic() - t0
        counts = runner.take_counts()
        for p in runner.pools:
            p.close()
    good = [i for i, r in enumerate(responses) if int(hashlib.sha256(r.encode()).hexdigest(), 16) % 10 >= 3]
    right = sum(got[i] == (1.0 if f"boxed{{{answers[i]}}}" in responses[i] else 0.0) for i in good)
    print(
        f"misbehaving verifier ({len(responses)} items, {bad} bad, deadline {timeout_s:g} s, "
        f"{workers} workers): "
        f"{took:.1f} s; {right} of {len(good)} good items scored right; {counts['failed']:.0f} scored 0 "
        f"as failures; retried {counts['retried']:.0f}, timed out {counts['timed_out']:.0f}",
        flush=True,
    )


def bench_slow_verifier(timeout_s: float, workers: int, n: int = 256) -> None:
    """A step's ``n`` items scored once the step's budget is spent (an earlier call of the step used it up),
    by a slow verifier of your own (1 s an item) that hangs on one: seconds, good items scored, items
    scored 0. Each item then has a tenth of the deadline of its own; a well-behaved one is never lost."""
    import tempfile
    from pathlib import Path

    from hacpo.reward.custom import CustomReward, VerifierRunner

    responses = [f"item {i}: \\boxed{{{i}}}" for i in range(n - 1)] + ["item hang: \\boxed{0}"]
    answers = [str(i) for i in range(n - 1)] + ["0"]
    with tempfile.TemporaryDirectory() as tmp:
        verify = Path(tmp) / "verify.py"
        verify.write_text(HANGING_VERIFIER)
        runner = VerifierRunner(CustomReward(file=str(verify), name="slow_hangs_on_one"), workers=workers,
                                timeout_s=timeout_s)  # fmt: skip
        runner.new_step()
        runner.budget_left, runner.batch_ok = 0.0, False  # benchmark-only: the step's budget already spent
        t0 = time.monotonic()
        got = runner.score(responses, answers, ids=[str(i) for i in range(n)])
        took = time.monotonic() - t0
        counts = runner.take_counts()
        for p in runner.pools:
            p.close()
    print(
        f"slow verifier, budget spent ({n} items at 1 s, 1 hanging, deadline {timeout_s:g} s): "
        f"{took:.1f} s; {sum(v == 1.0 for v in got[:-1])} of {n - 1} good items scored; "
        f"{counts['failed']:.0f} scored 0 as failures, timed out {counts['timed_out']:.0f}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hanging-verifier", nargs=2, metavar=("AGENT_A", "AGENT_B"),
                    help="only the hanging-verifier case, on these two toy agents")  # fmt: skip
    ap.add_argument("--hang-data", default=".cache/test-agents/data-add2-s0", help="its train.jsonl's folder")
    ap.add_argument("--hang-steps", type=int, default=3)
    ap.add_argument("--hang-timeout", type=float, default=None, help="the verifier's deadline (default 30 s)")
    ap.add_argument("--hang-engine", choices=["local", "openrlhf"], default="local",
                    help="openrlhf: the joint run on the real stack (.venv-rehearsal)")  # fmt: skip
    ap.add_argument("--hang-reward-file", default=None, help="openrlhf: another reward file (a before/after)")
    ap.add_argument("--hang-verifier", default="hangs_on_one_prompt_in_ten",
                    choices=["hangs_on_one_prompt_in_ten", "misbehaves_on_three_in_ten"],
                    help="the misbehaving verifier of the toy run (against `exact`)")  # fmt: skip
    ap.add_argument(
        "--misbehaving-verifier",
        action="store_true",
        help="only a step's scoring with a verifier that raises, hangs or scores NaN on 3 items in 10",
    )
    ap.add_argument(
        "--slow-verifier",
        action="store_true",
        help="only 256 items by a slow verifier (1 s an item) with one hanging, the budget spent",
    )
    ap.add_argument("--batches", type=int, default=8, help="batches of 512 responses per workload")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-hostile", action="store_true")
    ap.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="folder with the real dataset files")
    ap.add_argument("--only-real-golds", action="store_true", help="run only the real-golds case")
    args = ap.parse_args()

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    if args.slow_verifier:
        bench_slow_verifier(args.hang_timeout or 30.0, max(1, args.workers[-1]))
        return
    if args.misbehaving_verifier:
        bench_misbehaving_verifier(args.hang_timeout or 30.0, max(1, args.workers[-1]))
        return
    if args.hanging_verifier:
        bench_hanging_verifier(args.hanging_verifier, args.hang_data, args.hang_steps, args.hang_timeout,
                               args.hang_engine, args.hang_reward_file, args.hang_verifier)  # fmt: skip
        return
    golds = real_golds(args.data_dir) if os.path.isdir(args.data_dir) else None
    if golds is None:
        print(f"real golds: skipped ({args.data_dir} does not hold the dataset files)")
    else:
        for w in [w for w in args.workers if w > 0] or [0]:
            bench_real_golds(golds, w)
    if args.only_real_golds:
        return
    workloads = {
        "ints only": (lambda rng: int_batch(rng), None),
        "rl (cache on)": (lambda rng: rl_batch(rng), None),
        "unique (cache off)": (lambda rng: unique_batch(rng), 0),
    }
    for name, (make, cache) in workloads.items():
        rng = random.Random(args.seed)
        batches = [make(rng) for _ in range(args.batches)]
        for w in args.workers:
            kw = {} if cache is None else {"cache_size": cache}
            r = bench_throughput(w, batches, kw.get("cache_size", 32768))
            mv = r["stats"].get("math_verify", 0)
            cpu = r["parent_cpu_s"] + r["workers_cpu_s"]
            pc, wc = r["parent_cpu_s"], r["workers_cpu_s"]
            print(
                f"{name:18s} w={w}: {r['items_per_s']:6.0f} items/s wall | {r['n'] / cpu:6.0f} items/CPU-s"
                f" (CPU: parent {pc:.2f}s + workers {wc:.2f}s) | {r['n']} items,"
                f" {mv} math-verify calls, startup {r['startup_s']:.2f}s"
            )
        r = bench_throughput(0, batches, 0, reward="hendrycks")
        print(f"{name:18s} hendrycks: {r['items_per_s']:6.0f} items/s wall (in-process, no pool)")
    if not args.skip_hostile:
        for w in args.workers:
            worst, which = bench_hostile(w)
            print(f"hostile corpus       workers={w}: max per-item latency {worst:.3f}s ({which})")


if __name__ == "__main__":
    main()
