"""Does LoRA learn as much as full fine-tuning? GSPO on SmolLM2-135M-Instruct, ADD2, over seeds.

    python benchmarks/bench_lora_learning.py --model results/models/smollm2 --data DIR \
        [--steps 24] [--seeds 0 1 2] [--full-lr 1e-5] [--lora-lrs 1e-4 3e-4] [--rank 8] [--out FILE]

Each setting runs ``hacpo train`` (GSPO, one agent, a fresh process) with greedy validation on ``--val-size``
dev problems at step 0, every ``--val-every`` steps and at the end; the figure is the gain of the final
validation accuracy over the step-0 one, per seed, with its mean ± std over seeds, per step and per second of
training (the run's wall time). The LoRA learning rate is chosen by a small sweep on the first seed
(``--lora-lrs``, the best final accuracy), then run on every seed; full fine-tuning keeps ``--full-lr``
(config/real.yaml's). Settings as config/real.yaml's: the paper's prompt wording in the few-shot format,
exact-match reward, 32 new tokens, gradient checkpointing, micro-batches of 1,024 tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def run(args, seed: int, lr: float, rank: int | None, out: Path) -> dict:
    cfg = {
        "method": "gspo", "seed": seed, "out_dir": str(out),
        "agents": [{"name": "smollm2", "path": args.model}],
        "train_file": str(Path(args.data) / "train.jsonl"), "val_file": str(Path(args.data) / "dev.jsonl"),
        "steps": args.steps, "prompts_per_step": args.prompts, "group_size": args.group,
        "minibatch_size": args.prompts * args.group, "lr": lr, "kl_beta": 0.0, "reward": "hendrycks",
        "prompt_style": "paper", "max_new_tokens": 32, "precision": args.precision,
        "micro_batch_tokens": 1024, "gradient_checkpointing": True, "threads": args.threads,
        "val_every": args.val_every, "val_size": args.val_size, "checkpoint_every": 0,
    }  # fmt: skip
    if rank is not None:
        cfg["adapter"] = {"lora": {"rank": rank, "alpha": 32}}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hacpo", "train", json.dumps(cfg)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    wall = time.perf_counter() - t0
    val = [json.loads(line) for line in (out / "validation.jsonl").read_text().splitlines()]
    curve = [(v["step"], v["acc"]) for v in val if v["agent"] == "smollm2"]
    train_s = json.loads((out / "profile.json").read_text())["wall_s"]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    rewards = [json.loads(line)["smollm2/reward"] for line in lines]
    return {
        "seed": seed, "lr": lr, "rank": rank, "curve": curve, "gain": curve[-1][1] - curve[0][1],
        "final": curve[-1][1], "start": curve[0][1], "train_s": train_s, "process_s": wall,
        "mean_reward": statistics.fmean(rewards),
    }  # fmt: skip


def summary(runs: list[dict]) -> dict:
    gains = [r["gain"] for r in runs]
    secs = statistics.fmean(r["train_s"] for r in runs)
    return {
        "gain_mean": statistics.fmean(gains), "gain_std": statistics.stdev(gains) if len(gains) > 1 else 0.0,
        "final_mean": statistics.fmean(r["final"] for r in runs), "train_s_mean": secs,
        "gain_per_hour": statistics.fmean(gains) / secs * 3600, "seeds": len(runs),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the imported SmolLM2 directory")
    ap.add_argument("--data", required=True, help="a directory with add2 train.jsonl and dev.jsonl")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--full-lr", type=float, default=1e-5)
    ap.add_argument("--lora-lrs", type=float, nargs="+", default=[1e-4, 3e-4])
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--val-size", type=int, default=100)
    ap.add_argument("--val-every", type=int, default=8)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default="results/bench/lora_learning")
    ap.add_argument("--out", help="write every run and the summary as JSON here")
    args = ap.parse_args()
    work = Path(args.work)
    report: dict = {"args": vars(args), "sweep": [], "full": [], "lora": []}

    def save() -> None:
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=2))

    first = args.seeds[0]
    for lr in args.lora_lrs:  # the LoRA lr by a small sweep on the first seed
        r = run(args, first, lr, args.rank, work / f"sweep-lr{lr:g}-s{first}")
        report["sweep"].append(r)
        print(f"# sweep lora r{args.rank} lr {lr:g} seed {first}: {json.dumps(r)}", flush=True)
        save()
    best = max(report["sweep"], key=lambda r: (r["final"], -r["lr"]))
    report["lora_lr"] = best["lr"]
    for seed in args.seeds:
        full = run(args, seed, args.full_lr, None, work / f"full-s{seed}")
        report["full"].append(full)
        print(f"# full lr {args.full_lr:g} seed {seed}: {json.dumps(full)}", flush=True)
        lora = best if seed == first else run(args, seed, best["lr"], args.rank, work / f"lora-s{seed}")
        report["lora"].append(lora)
        print(f"# lora r{args.rank} lr {best['lr']:g} seed {seed}: {json.dumps(lora)}", flush=True)
        save()
    report["summary"] = {"full": summary(report["full"]), "lora": summary(report["lora"])}
    save()
    print(json.dumps(report["summary"], indent=2))


if __name__ == "__main__":
    main()
