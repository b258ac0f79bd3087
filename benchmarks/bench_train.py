"""Per-step wall time of HACPO vs GSPO×2 vs GSPO on the toy size pair, side by side in one process.

    python benchmarks/bench_train.py [--steps 30] [--repeats 3] [--out results/bench/train]

Every run uses one torch thread; runs execute one after another so they never compete for a core. Reports
per-run wall time and the per-phase split (generate / score / log-probs / retokenise / update), and the
ratios the paper's Table 7 is about: HACPO / (GSPO×2 for both agents) and HACPO / (GSPO for both agents).
The plan runs ``--repeats`` times, interleaved (machine noise hits every method alike); each figure is the
median over repeats, and the HACPO run's min and max are printed too. Each repeat is a fresh run of the
same seed, so the work is identical and only the machine varies.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

import torch

from hacpo.config import load_train_config
from hacpo.demo import build_agents
from hacpo.engines.local import train

PHASES = ("generate", "score", "logprobs", "retokenize", "update")


def run(out: Path, method: str, agents: dict[str, Path], names: list[str], steps: int, data: Path) -> dict:
    cfg = load_train_config(
        dict(
            method=method,
            agents=[{"name": n, "path": str(agents[n])} for n in names],
            train_file=str(data / "train.jsonl"),
            out_dir=str(out / f"{method}-{'-'.join(names)}"),
            steps=steps,
            val_size=0,
            checkpoint_every=0,
            seed=0,
        )
    )
    t0 = time.perf_counter()
    info = train(cfg)
    wall = time.perf_counter() - t0
    prof = info["profile"]
    return {"method": method, "agents": names, "wall_s": wall, "train_s": prof["wall_s"], **prof["phase_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="results/bench/train")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    agents = build_agents(out)
    plan = [
        ("gspo", ["small"]),
        ("gspo", ["big"]),
        ("gspo_x2", ["small"]),
        ("gspo_x2", ["big"]),
        ("gspo_updates_x2", ["small"]),
        ("gspo_updates_x2", ["big"]),
        ("hacpo", ["small", "big"]),
    ]
    repeats = []
    for _ in range(args.repeats):
        shutil.rmtree(out / "runs", ignore_errors=True)
        repeats.append([run(out / "runs", m, agents, names, args.steps, out / "data") for m, names in plan])
    results = [
        {**runs[0], **{k: statistics.median(r[k] for r in runs) for k in ("wall_s", "train_s", *PHASES)}}
        for runs in zip(*repeats, strict=True)
    ]
    by = {(r["method"], tuple(r["agents"])): r for r in results}

    def pair(method: str) -> float:
        return by[(method, ("small",))]["train_s"] + by[(method, ("big",))]["train_s"]

    hacpo = by[("hacpo", ("small", "big"))]["train_s"]
    hacpo_all = [runs[-1]["train_s"] for runs in repeats]
    print(f"median of {args.repeats} repeat(s), seconds per {args.steps}-step run")
    print(f"{'run':32s} {'train s':>8s} " + " ".join(f"{p:>10s}" for p in PHASES))
    for r in results:
        name = f"{r['method']} ({'+'.join(r['agents'])})"
        print(f"{name:32s} {r['train_s']:8.2f} " + " ".join(f"{r.get(p, 0.0):10.2f}" for p in PHASES))
    ratios = {
        "hacpo_over_gspo_x2": hacpo / pair("gspo_x2"),
        "hacpo_over_gspo": hacpo / pair("gspo"),
        "hacpo_over_gspo_updates_x2": hacpo / pair("gspo_updates_x2"),
        "hacpo_30_steps_s": hacpo,
        "hacpo_30_steps_min_max_s": [min(hacpo_all), max(hacpo_all)],
    }
    print(json.dumps(ratios, indent=2))
    report = {"runs": results, "ratios": ratios, "repeats": repeats}
    (out / "bench_train.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
