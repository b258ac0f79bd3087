"""Serving a checkpoint with the local engine: prompt encoding and greedy generation, time and peak memory.

    python benchmarks/bench_serve.py --checkpoint DIR --problems FILE.jsonl [--n 128] [--precision auto]

``--checkpoint``: a model directory or a LoRA adapter checkpoint (served merged, as ``hacpo eval`` serves
it); ``--frozen`` turns ``requires_grad`` off on every weight (a plain load leaves it on, a merged adapter
comes with it off). One batch of ``--n`` problems, as evaluation batches them. Prints one JSON line:
``encode_s`` (the prompts' forward, the last position's logits kept), ``generate_s`` (all of it),
``peak_rss_mb``. docs/performance.md ("Serving a frozen model") quotes it.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import hacpo.agents.lm as lm
from hacpo.eval.local import LocalGenerator
from hacpo.eval.run import Sampling, read_benchmark
from hacpo.hardware import peak_rss_mb

GREEDY = Sampling(max_new_tokens=24, prompt_style="paper")  # config/real-claims.yaml's evaluation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--problems", required=True)
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frozen", action="store_true")
    args = ap.parse_args()

    generator = LocalGenerator(args.checkpoint, precision=args.precision, threads=args.threads)
    if args.frozen:
        generator.model.requires_grad_(False)
    problems = read_benchmark(args.problems, limit=args.n)
    timed = {}
    encode = lm.encode_prompts

    def timed_encode(*a, **k):
        start = time.perf_counter()
        out = encode(*a, **k)
        timed["encode_s"] = time.perf_counter() - start
        return out

    lm.encode_prompts = timed_encode  # generate() looks it up in its module at each call
    start = time.perf_counter()
    generator.generate(problems, GREEDY, batch_size=len(problems))
    timed["generate_s"] = time.perf_counter() - start
    peak = peak_rss_mb()
    record = {k: round(v, 4) for k, v in timed.items()}
    record.update(peak_rss_mb=round(peak), n=len(problems), precision=generator.precision, frozen=args.frozen)
    print(json.dumps({**record, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
