"""Peak memory of one joint HACPO step on the real pair, full-vocabulary logits vs vocabulary slices.

    python benchmarks/bench_vocab.py --pair results/models/smollm2 results/models/gemma3 \
        [--precision fp32] [--checkpointing off on] [--budgets full 16777216]

Each setting runs ``hacpo train`` (one step, a fresh process, so ``mem/peak_rss_mb`` is that step's peak) with
``HACPO_LOGITS_BUDGET`` at 2^24 floats (slices: the default) or 2^40 (one slice: every pass builds its full
``[rows, tokens, V]`` logits, as before the head was sliced). The fixed part, by arithmetic: each agent's
weights, gradients and two AdamW states, plus a reference model when ``kl_beta > 0`` (fp32: 4 B each). Numbers
in docs/performance.md ("Real models on a laptop"). The runtime (interpreter, torch, both tokenizers) is
measured too: it is part of every peak, whatever the step does.
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


def one_step(args, budget: int, precision: str, kl: float, checkpointing: bool, out: Path) -> dict:
    names = [Path(p).name for p in args.pair]
    cfg = {
        "method": "hacpo", "train_file": args.train, "out_dir": str(out), "seed": 0,
        "agents": [{"name": n, "path": p} for n, p in zip(names, args.pair, strict=True)],
        "steps": 1, "prompts_per_step": 4, "group_size": 4, "minibatch_size": 16, "kl_beta": kl,
        "prompt_style": "paper", "max_new_tokens": args.max_new_tokens, "precision": precision,
        "micro_batch_tokens": 1024, "threads": args.threads, "gradient_checkpointing": checkpointing,
    }  # fmt: skip
    env = {**os.environ, "HACPO_LOGITS_BUDGET": str(budget)}
    subprocess.run([sys.executable, "-m", "hacpo", "train", json.dumps(cfg)], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return json.loads((out / "metrics.jsonl").read_text().splitlines()[0])


RUNTIME = """
import sys
from transformers import AutoTokenizer
import hacpo.engines.local.trainer
from hacpo.agents.tokenizers import tokenizer_fingerprint
for path in sys.argv[1:]:
    tokenizer_fingerprint(AutoTokenizer.from_pretrained(path))
print(int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20)
"""


def runtime_mb(pair: list[str]) -> float:
    """RSS of a process holding what every step's process holds before its first model: the interpreter,
    torch, transformers, hacpo's trainer and the two tokenizers (Linux: /proc)."""
    out = subprocess.run([sys.executable, "-c", RUNTIME, *pair], check=True, capture_output=True, text=True)
    return float(out.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", nargs=2, required=True, help="two imported model directories")
    ap.add_argument("--train", default="results/data/real_train.jsonl")
    ap.add_argument("--precision", nargs="+", default=["fp32"])
    ap.add_argument("--kl-beta", type=float, default=1e-3, help="> 0 loads a reference model per agent")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--checkpointing",
        nargs="+",
        choices=["off", "on"],
        default=["off", "on"],
        help="gradient checkpointing of the update's forward",
    )
    ap.add_argument(
        "--budgets",
        nargs="+",
        default=["full", str(1 << 24)],
        help="logits per slice (HACPO_LOGITS_BUDGET); full: one slice, the full-logits baseline",
    )
    args = ap.parse_args()
    total = sum(params(p) for p in args.pair)
    copies = 4 + (args.kl_beta > 0)  # weights, gradients, AdamW m and v (+ reference)
    fixed_mb = total * 4 * copies / 2**20
    print(f"fixed part: {total / 1e6:.1f} M parameters × 4 B × {copies} = {fixed_mb:.0f} MB")
    print(f"runtime before any model: {runtime_mb(args.pair):.0f} MB")
    print("| logits | checkpointing | precision | peak RSS MB | rest MB | step s | update s | log-probs s |")
    print("|---|---|---|---|---|---|---|---|")
    for precision in args.precision:
        for ckpt in args.checkpointing:
            for label in args.budgets:
                budget = 1 << 40 if label == "full" else int(label)
                with tempfile.TemporaryDirectory() as tmp:
                    r = one_step(args, budget, precision, args.kl_beta, ckpt == "on", Path(tmp) / "run")
                peak = r["mem/peak_rss_mb"]
                times = " | ".join(f"{r[f'time/{k}_s']:.1f}" for k in ("step", "update", "logprobs"))
                print(
                    f"| {label} | {ckpt} | {precision} | {peak:.0f} | {peak - fixed_mb:.0f} | {times} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
