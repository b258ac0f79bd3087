"""GPU smoke test of HACPO on OpenRLHF (joint runs), for anyone with a CUDA machine (``EXTRAS=dev,gpu``):

    python scripts/gpu_smoke_joint.py [--out results/gpu-smoke-joint] [--gpus 1]

Three randomly initialised small models are built on the fly (no download): a Llama and a Qwen3 sharing the
character tokenizer (token ids reused between them) and a Qwen3 with the word tokenizer (text re-encoded).
They train 3 HACPO steps together through ``hacpo train --engine openrlhf`` (one vLLM engine, DeepSpeed
actor and reference per agent, all on the same GPUs with sleep modes; our reward file in each engine). The
first launch is stopped with SIGTERM (as ``scancel`` does) once the step-1 checkpoint is complete; the
second resumes from it. Checks: run.json complete, metrics.jsonl has steps 0–2 with ω and HACPO's loss
metrics per agent, step-3 checkpoints of all three agents, profile.json with peak GPU memory.
Random weights: rewards are about 0, so advantages are mostly 0; the code paths all run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gpu_smoke import smoke_inputs, smoke_run  # noqa: E402  (the single-agent smoke script's pieces)

AGENTS = [("llama_char", "llama", "char"), ("qwen3_char", "qwen3", "char"), ("qwen3_word", "qwen3", "word")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/gpu-smoke-joint")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per launch")
    args = p.parse_args()
    out = Path(args.out).resolve()
    smoke_inputs(out, AGENTS)
    names = [name for name, _, _ in AGENTS]
    # 3 agents × 8 prompts × 4 samples = 96 rows per learner: 2 updates of 48 per step
    run = smoke_run(
        out, "hacpo", names, steps=3, minibatch=48, gpus=args.gpus,
        micro_train_batch_size=4, vllm_gpu_memory_utilization=0.2,
    )  # fmt: skip
    hacpo = [sys.executable, "-m", "hacpo", "train", json.dumps(run), "--engine", "openrlhf"]
    state = out / "run" / "openrlhf" / "joint_state.json"
    first = subprocess.Popen(hacpo, start_new_session=True)
    deadline = time.monotonic() + args.timeout
    while first.poll() is None and time.monotonic() < deadline:
        if state.is_file() and json.loads(state.read_text())["step"] >= 1:
            os.killpg(first.pid, signal.SIGTERM)  # as scancel: the job's Ray cluster must stop with it
            break
        time.sleep(2)
    rc = first.wait(timeout=300)
    print(f"first launch ended with {rc} after the step-1 checkpoint", flush=True)
    subprocess.run(hacpo, check=True, timeout=args.timeout)

    run_dir = out / "run"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "complete", record
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2], rows
    for name, _, _ in AGENTS:
        assert Path(record["final_checkpoints"][name]).is_dir(), name
        assert f"{name}/s_homo_mean" in rows[-1] and f"{name}/cross_in_bounds_frac" in rows[-1], rows[-1]
    profile = json.loads((run_dir / "profile.json").read_text())
    report = {
        "steps": len(rows),
        "reward": {name: [r[f"{name}/reward"] for r in rows] for name, _, _ in AGENTS},
        "s_hete": {name: rows[-1][f"{name}/s_hete_mean"] for name, _, _ in AGENTS},
        "omega": rows[-1]["omega"],
        "peak_gpu_mem_mb": profile.get("peak_gpu_mem_mb"),
        "phase_s": profile.get("phase_s"),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
