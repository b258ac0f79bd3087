"""``hacpo demo``: the whole story at toy scale on a CPU in a few minutes.

Synthetic two-digit addition → two tiny heterogeneous agents (size pair, warmed up by SFT) → GSPO and
GSPO×2 for each agent alone, Naive sharing and HACPO for the pair → greedy test accuracy, as a Markdown table.
"""

from __future__ import annotations

import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

from hacpo.runio import MetricsLog, atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
PAIR = ("small", "big")
SINGLE = ("gspo", "gspo_x2")
JOINT = ("naive", "hacpo")
LABELS = {"gspo": "GSPO", "gspo_x2": "GSPO×2", "naive": "Naive", "hacpo": "HACPO"}


def build_agents(out: Path, names=PAIR) -> dict[str, Path]:
    import torch

    from hacpo.agents.warmup import WarmupSpec, build_agent
    from hacpo.data.synthetic import make_splits, read_jsonl, write_jsonl

    torch.set_num_threads(1)
    data = out / "data"
    if not (data / "test.jsonl").exists():
        for name, rows in make_splits(["add2"], seed=0, n_test=1000, n_dev=200, n_train=None).items():
            write_jsonl(data / f"{name}.jsonl", rows)
    splits = {s: read_jsonl(data / f"{s}.jsonl", as_problems=True) for s in ("train", "dev")}
    specs = yaml.safe_load((ROOT / "config" / "agents" / "toy.yaml").read_text())
    paths = {}
    for name in names:
        info = build_agent(WarmupSpec(**specs[name]), out / "agents" / name, splits)
        print(f"agent {name}: dev acc {info['dev_acc']:.3f} after {info['steps']} SFT steps", flush=True)
        paths[name] = Path(info["path"])
    return paths


def run_name(method: str, agents: tuple[str, ...], seed: int) -> str:
    """Run directory name: single-agent runs carry the agent, joint runs the method alone."""
    return f"{method}-{agents[0]}-s{seed}" if len(agents) == 1 else f"{method}-s{seed}"


def _train(cfg: dict) -> str:
    from hacpo.config import load_train_config
    from hacpo.engines.local import train

    train(load_train_config(cfg))
    return cfg["out_dir"]


def run_demo(out: Path, seeds=(0,), steps: int = 30, workers: int = 2) -> str:
    out = Path(out)
    agents = build_agents(out)
    data = out / "data"
    common = dict(
        train_file=str(data / "train.jsonl"), val_file=str(data / "test.jsonl"), steps=steps, val_every=0
    )
    runs = [(m, (name,)) for m in SINGLE for name in PAIR] + [(m, PAIR) for m in JOINT]
    jobs = [
        dict(
            common,
            method=method,
            seed=seed,
            agents=[{"name": n, "path": str(agents[n])} for n in names],
            out_dir=str(out / "runs" / run_name(method, names, seed)),
        )
        for seed in seeds
        for method, names in runs
    ]
    with ProcessPoolExecutor(workers) as pool:
        for done in pool.map(_train, jobs):
            print(f"finished {done}", flush=True)

    def acc(run: str, agent: str, step: int) -> float:
        rows = MetricsLog(out / "runs" / run / "validation.jsonl").read()
        return next(r["acc"] for r in rows if r["agent"] == agent and r["step"] == step)

    def mean_acc(method: str, name: str) -> float:
        names = PAIR if method in JOINT else (name,)
        return statistics.mean(acc(run_name(method, names, s), name, steps) for s in seeds)

    methods = [*SINGLE, *JOINT]
    lines = ["| agent | base | " + " | ".join(LABELS[m] for m in methods) + " | HACPO − GSPO |"]
    lines.append("|---" * (len(methods) + 3) + "|")
    for name in PAIR:
        base = acc(run_name("gspo", (name,), seeds[0]), name, 0)
        vals = {m: mean_acc(m, name) for m in methods}
        cells = " | ".join(f"{vals[m]:.3f}" for m in methods)
        lines.append(f"| {name} | {base:.3f} | {cells} | {100 * (vals['hacpo'] - vals['gspo']):+.1f} pts |")
    table = (
        f"Greedy test-1000 accuracy after {steps} RL steps (mean over seeds {list(seeds)}).\n\n"
        + "\n".join(lines)
        + "\n"
    )
    atomic_write_text(out / "table.md", table)
    print(table)
    return table
