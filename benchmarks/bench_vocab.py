"""Peak memory of one joint HACPO step on the real pair, full-vocabulary logits vs vocabulary slices.

    python benchmarks/bench_vocab.py --pair results/models/smollm2 results/models/gemma3 [--precision fp32]

Each setting runs ``hacpo train`` (one step, a fresh process, so ``mem/peak_rss_mb`` is that step's peak)
with ``HACPO_LOGITS_BUDGET`` at 2^24 floats (slices: the default) or 2^40 (one slice: every pass builds its
full ``[rows, tokens, V]`` logits, as before issue 35). The fixed part, by arithmetic: each agent's weights,
gradients and two AdamW states, plus a reference model when ``kl_beta > 0`` (fp32: 4 B each). Numbers in
docs/performance.md ("Real models: memory and precision").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def params(path: str) -> int:
    return json.loads((Path(path) / "hacpo-model.json").read_text())["parameters"]


def one_step(args, budget: int, precision: str, kl: float, out: Path) -> dict:
    names = [Path(p).name for p in args.pair]
    cfg = {
        "method": "hacpo", "train_file": args.train, "out_dir": str(out), "seed": 0,
        "agents": [{"name": n, "path": p} for n, p in zip(names, args.pair, strict=True)],
        "steps": 1, "prompts_per_step": 4, "group_size": 4, "minibatch_size": 16, "kl_beta": kl,
        "prompt_style": "paper", "max_new_tokens": args.max_new_tokens, "precision": precision,
        "micro_batch_tokens": 1024, "threads": args.threads,
    }  # fmt: skip
    env = {**os.environ, "HACPO_LOGITS_BUDGET": str(budget)}
    subprocess.run([sys.executable, "-m", "hacpo", "train", json.dumps(cfg)], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return json.loads((out / "metrics.jsonl").read_text().splitlines()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", nargs=2, required=True, help="two imported model directories")
    ap.add_argument("--train", default="results/data/real_train.jsonl")
    ap.add_argument("--precision", nargs="+", default=["fp32"])
    ap.add_argument("--kl-beta", type=float, default=1e-3, help="> 0 loads a reference model per agent")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    total = sum(params(p) for p in args.pair)
    copies = 4 + (args.kl_beta > 0)  # weights, gradients, AdamW m and v (+ reference)
    fixed_mb = total * 4 * copies / 2**20
    print(f"fixed part: {total / 1e6:.1f} M parameters × 4 B × {copies} = {fixed_mb:.0f} MB")
    print("| logits | precision | peak RSS MB | rest MB | step s | update s | log-probs s |")
    print("|---|---|---|---|---|---|---|")
    for precision in args.precision:
        for label, budget in (("full", 1 << 40), ("sliced", 1 << 24)):
            with tempfile.TemporaryDirectory() as tmp:
                r = one_step(args, budget, precision, args.kl_beta, Path(tmp) / "run")
            peak = r["mem/peak_rss_mb"]
            print(f"| {label} | {precision} | {peak:.0f} | {peak - fixed_mb:.0f} | {r['time/step_s']:.1f} | "
                  f"{r['time/update_s']:.1f} | {r['time/logprobs_s']:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
