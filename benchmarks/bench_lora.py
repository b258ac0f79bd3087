"""Cost of one joint HACPO step on the real pair: full fine-tuning against LoRA adapters of several ranks.

    python benchmarks/bench_lora.py --pair results/models/smollm2 results/models/gemma3 \
        --train results/data/real_train.jsonl [--ranks 1 8 32] [--repeats 2] [--precision fp32]

The pinned step of docs/performance.md: 4 prompts × G 4, 48 new tokens, ``kl_beta: 1e-3`` (full fine-tuning
then holds a reference copy of each model; LoRA switches its adapter off instead), micro-batches of 1,024
tokens. Each setting runs ``hacpo train`` for one step in a fresh process, so ``mem/peak_rss_mb`` is that
step's peak; the settings run in turn (full, r1, r8, r32, full, …) so that machine drift hits them alike, and
each figure is the median over the repeats with the update's and the step's ratio to full fine-tuning.
Generation samples from each setting's own seeded stream: before the first update every setting computes the
same function (LoRA's B starts at zero), so their rollouts, and so their update's rows, are identical.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def one_step(args, rank: int | None, out: Path) -> dict:
    names = [Path(p).name for p in args.pair]
    cfg = {
        "method": "hacpo", "train_file": args.train, "out_dir": str(out), "seed": 0,
        "agents": [{"name": n, "path": p} for n, p in zip(names, args.pair, strict=True)],
        "steps": 1, "prompts_per_step": 4, "group_size": 4, "minibatch_size": 16, "kl_beta": args.kl_beta,
        "prompt_style": "paper", "max_new_tokens": args.max_new_tokens, "precision": args.precision,
        "micro_batch_tokens": 1024, "threads": args.threads, "val_every": 0, "val_size": 0,
        "gradient_checkpointing": args.checkpointing, "checkpoint_every": 0,
    }  # fmt: skip
    if rank is not None:
        cfg["adapter"] = {"lora": {"rank": rank, "alpha": 32}}
    subprocess.run([sys.executable, "-m", "hacpo", "train", json.dumps(cfg)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    return {
        "peak_rss_mb": row["mem/peak_rss_mb"],
        "update_s": row["time/update_s"],
        "step_s": row["time/step_s"],
        "rewards": [row[f"{n}/reward"] for n in names],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", nargs=2, required=True, help="two imported model directories")
    ap.add_argument("--train", default="results/data/real_train.jsonl")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"])
    ap.add_argument("--kl-beta", type=float, default=1e-3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--checkpointing", action="store_true", help="gradient checkpointing on")
    ap.add_argument("--out", help="write the results as JSON here too")
    args = ap.parse_args()
    settings: list[tuple[str, int | None]] = [("full", None), *((f"lora r{r}", r) for r in args.ranks)]
    runs: dict[str, list[dict]] = {name: [] for name, _ in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for name, rank in settings:
                res = one_step(args, rank, Path(tmp) / f"{rep}-{name.replace(' ', '')}")
                runs[name].append(res)
                print(f"# {rep} {name}: {json.dumps(res)}", flush=True)
    full = runs["full"]
    print(f"\n{'setting':<10} {'peak RSS GB':>11} {'update s':>9} {'step s':>7} {'update/full':>11} "
          f"{'step/full':>9}")  # fmt: skip
    table = {}
    for name, _ in settings:
        med = {k: statistics.median(r[k] for r in runs[name]) for k in ("peak_rss_mb", "update_s", "step_s")}
        # ratios pair by pair (repeat i of this setting against repeat i of full), then their median
        upd = statistics.median(r["update_s"] / f["update_s"] for r, f in zip(runs[name], full, strict=True))
        stp = statistics.median(r["step_s"] / f["step_s"] for r, f in zip(runs[name], full, strict=True))
        table[name] = {**med, "update_ratio": upd, "step_ratio": stp, "runs": runs[name]}
        print(f"{name:<10} {med['peak_rss_mb'] / 1024:>11.2f} {med['update_s']:>9.1f} {med['step_s']:>7.1f} "
              f"{upd:>11.2f} {stp:>9.2f}")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
