"""GPU smoke test of the OpenRLHF engine, for anyone with a CUDA machine (``EXTRAS=dev,gpu`` environment):

    python scripts/gpu_smoke.py [--out results/gpu-smoke] [--gpus 1]

Two randomly initialised small Qwen3-shaped models are built on the fly (no download); one trains 2 GSPO steps
on synthetic additions through ``python -m openrlhf.cli.train_ppo_ray`` (vLLM rollouts, DeepSpeed, our
reward file, the hybrid engine), then its final checkpoint is evaluated on 20 problems with
``hacpo eval --engine vllm``. Checks: run.json complete, metrics.jsonl has 2 steps, a step-2 checkpoint,
profile.json with peak GPU memory, and an evaluation summary. Random weights: accuracy is about 0.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from hacpo.agents.models import AgentArch, build_model
from hacpo.agents.tokenizers import build_tokenizer
from hacpo.data.synthetic import make_splits, write_jsonl


def smoke_inputs(out: Path, agents: list[tuple[str, str, str]]) -> None:
    """Synthetic additions (64 train, 20 dev, 20 test) and randomly initialised small models, one per
    ``(name, arch, tokenizer kind)``, under ``out`` (shared with scripts/gpu_smoke_joint.py)."""
    splits = make_splits(["add2"], seed=0, n_test=20, n_dev=20, n_train=64)
    for name, problems in splits.items():
        write_jsonl(out / "data" / f"{name}.jsonl", [x.to_dict() for x in problems])
    for i, (name, arch, kind) in enumerate(agents):
        tok = build_tokenizer(kind)
        shape = AgentArch(arch, hidden=256, layers=2, heads=4, intermediate=512, max_positions=512)
        build_model(shape, tok, seed=i).save_pretrained(out / "models" / name)
        tok.save_pretrained(out / "models" / name)


def smoke_run(
    out: Path, method: str, names: list[str], steps: int, minibatch: int, gpus: int, **openrlhf
) -> dict:
    """The run config of a smoke run: 8 prompts × 4 samples, 32 new tokens, validation and a checkpoint
    every step, OpenRLHF on ``gpus`` GPUs with small micro-batches and prompts."""
    return {
        "method": method,
        "agents": [{"name": n, "path": str(out / "models" / n)} for n in names],
        "train_file": str(out / "data" / "train.jsonl"),
        "val_file": str(out / "data" / "dev.jsonl"),
        "out_dir": str(out / "run"),
        "steps": steps,
        "prompts_per_step": 8,
        "group_size": 4,
        "minibatch_size": minibatch,
        "max_new_tokens": 32,
        "val_every": 1,
        "val_size": 20,
        "checkpoint_every": 1,
        "lr": 1e-6,
        "openrlhf": {
            "gpus_per_node": gpus,
            "micro_rollout_batch_size": 4,
            "max_prompt_tokens": 64,
            **openrlhf,
        },
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/gpu-smoke")
    p.add_argument("--gpus", type=int, default=1)
    args = p.parse_args()
    out = Path(args.out).resolve()
    smoke_inputs(out, [("m0", "qwen3", "word"), ("m1", "qwen3", "char")])  # two models, two tokenizers
    run = smoke_run(
        out, "gspo", ["m0"], steps=2, minibatch=16, gpus=args.gpus,
        micro_train_batch_size=16 // args.gpus // 4 or 1, vllm_gpu_memory_utilization=0.3,
    )  # fmt: skip
    hacpo = [sys.executable, "-m", "hacpo"]
    subprocess.run([*hacpo, "train", json.dumps(run), "--engine", "openrlhf"], check=True)
    record = json.loads((out / "run" / "run.json").read_text())
    assert record["status"] == "complete", record
    rows = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1], rows
    profile = json.loads((out / "run" / "profile.json").read_text())
    final = record["final_checkpoints"]["m0"]
    subprocess.run(
        [*hacpo, "eval", "--engine", "vllm", "--checkpoint", final, "--benchmark",
         str(out / "data" / "test.jsonl"), "--out", str(out / "eval"), "--max-new-tokens", "32"],
        check=True,
    )  # fmt: skip
    summary = json.loads((out / "eval" / "test.json").read_text())
    report = {"steps": len(rows), "reward": [r.get("m0/reward") for r in rows]}
    report |= {"peak_gpu_mem_mb": profile.get("peak_gpu_mem_mb"), "eval_avg@1": summary["avg@1"]}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
