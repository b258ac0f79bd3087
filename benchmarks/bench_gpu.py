"""HACPO vs GSPO×2 vs GSPO on one GPU with the local engine, side by side in one process.

    python benchmarks/bench_gpu.py [--pairs small,realistic] [--steps 2] [--out results/bench/gpu]
    python benchmarks/bench_gpu.py --tiny --device cpu      # the same code paths in seconds, on a CPU

Two pairs (each: GSPO on either agent, GSPO×2 on either agent, HACPO on both, one after another):

- ``small``: Llama-shaped ≈ 3M and ≈ 25M parameters, character tokenizer, warmed up on synthetic additions
  (SFT on the device), real math-verify reward;
- ``realistic``: randomly initialised from the public Qwen3-0.6B and Qwen3-1.7B architecture values (no
  download: config numbers only; 151,936-token vocabulary through a local word-level tokenizer), responses of
  ``--response-tokens`` (default 512; a random model rarely stops earlier), bf16 autocast, gradient
  checkpointing, micro-batches by token budget. Random weights earn no reward, so this pair uses a
  **declared synthetic 0/1 reward** (a fixed hash of the response text) so that every code path — non-zero
  advantages, cross terms, ω — runs; its accuracies mean nothing and are labelled as such.

Per run: seconds per step by phase, generated tokens per second, peak GPU memory per phase (the allocator's
peak, reset at each phase) and of the run; then the paper's Table 7/8 analogues and the goals that
docs/performance.md ("On one GPU") states: HACPO / GSPO×2 step time ≤ 0.65, HACPO / (GSPO A + GSPO B) ≤ 1.15,
HACPO peak memory ≤ GSPO×2's + 1 point of the device. A goal missed is printed with its figure and where the
time goes. Results:
``<out>/bench_gpu.json`` and ``<out>/bench_gpu.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import torch

from hacpo.config import load_train_config
from hacpo.data.synthetic import make_splits, read_jsonl, write_jsonl
from hacpo.runio import atomic_write_text

PHASES = ("generate", "score", "logprobs", "retokenize", "update")
QWEN3 = {  # public architecture values (config.json of the Hub checkpoints); no weights are downloaded
    "qwen3_0p6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128),
    "qwen3_1p7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128),
}  # fmt: skip
QWEN3_VOCAB = 151_936
GOALS = {"hacpo_over_gspo_x2": 0.65, "hacpo_over_gspo_pair": 1.15, "memory_points_over_gspo_x2": 1.0}


# -------------------------------------------------------------------------------------------- agents
def small_pair(out: Path, device: str, tiny: bool) -> tuple[dict[str, Path], Path]:
    """Llama ≈ 3M and ≈ 25M (char tokenizer), SFT-warmed on synthetic additions on ``device``."""
    from hacpo.agents.models import AgentArch
    from hacpo.agents.warmup import WarmupSpec, build_agent

    data = out / "data"
    if not (data / "train.jsonl").exists():
        for name, rows in make_splits(["add2"], seed=0, n_test=200, n_dev=200, n_train=None).items():
            write_jsonl(data / f"{name}.jsonl", rows)
    splits = {s: read_jsonl(data / f"{s}.jsonl", as_problems=True) for s in ("train", "dev")}
    sizes = [(32, 1, 2, 64), (64, 1, 2, 128)] if tiny else [(256, 3, 4, 1024), (512, 6, 8, 2048)]
    shapes = {
        name: AgentArch("llama", hidden=h, layers=n, heads=a, intermediate=f)
        for name, (h, n, a, f) in zip(("llama_3m", "llama_25m"), sizes, strict=True)
    }
    paths = {}
    for i, (name, arch) in enumerate(shapes.items()):
        spec = WarmupSpec(
            arch=arch, tokenizer="char", seed=i, max_steps=20 if tiny else 400, eval_every=400,
            lr=3e-3 if tiny else 1e-3,
        )  # fmt: skip
        info = build_agent(spec, out / "agents" / name, splits, device=device)
        size = f"{info['n_params'] / 1e6:.1f}M parameters"
        print(f"agent {name}: {size}, dev acc {info['dev_acc']:.3f}", flush=True)
        paths[name] = Path(info["path"])
    return paths, data


def realistic_pair(out: Path, tiny: bool, device: str) -> tuple[dict[str, Path], Path]:
    """Qwen3-0.6B- and Qwen3-1.7B-shaped models, random weights (initialised on ``device``, saved in bf16;
    the engine loads fp32 master weights), one 151,936-word local tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    vocab = 512 if tiny else QWEN3_VOCAB
    words = {"<|pad|>": 0, "<|endoftext|>": 1, "<|unk|>": 2} | {f"w{i}": i for i in range(3, vocab)}
    backend = Tokenizer(models.WordLevel(words, unk_token="<|unk|>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    from tokenizers import decoders

    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<|pad|>", eos_token="<|endoftext|>", unk_token="<|unk|>",
        chat_template=(
            "{% for m in messages %}{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %} w7{% endif %}"
        ),
    )  # fmt: skip
    data = out / "data-realistic"
    if not (data / "train.jsonl").exists():  # prompts of 16 words; answers never matter (synthetic reward)
        def words_of(i: int) -> str:
            return " ".join(f"w{(i * 7 + j) % (vocab - 10) + 10}" for j in range(16))

        rows = [
            {"id": f"r{i}", "problem": words_of(i), "answer": "0", "family": "synthetic", "difficulty": 1}
            for i in range(512)
        ]
        write_jsonl(data / "train.jsonl", rows)
    paths = {}
    for i, (name, shape) in enumerate(QWEN3.items()):
        path = out / "agents" / name
        if not (path / "config.json").exists():
            if tiny:
                shape = {**shape, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip
            cfg = Qwen3Config(
                vocab_size=vocab, tie_word_embeddings=True, max_position_embeddings=4096,
                rope_theta=1_000_000.0, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id, **shape,
            )  # fmt: skip
            torch.manual_seed(i)
            with torch.device(device):
                model = Qwen3ForCausalLM(cfg)
            model.to(torch.bfloat16).save_pretrained(path)
            tok.save_pretrained(path)
            del model
        paths[name] = path
    return paths, data


def synthetic_reward(texts, golds, metadata=None, ids=None):
    """Declared synthetic 0/1 reward for random-weight models: 1 for about a third of responses (a fixed
    hash of the text). Lets every code path run; says nothing about the models."""
    return [float(int(hashlib.sha256(t.encode()).hexdigest(), 16) % 3 == 0) for t in texts]


# -------------------------------------------------------------------------------------------- runs
def run(
    out: Path, method: str, agents: dict, names: list[str], data: Path, args, realistic: bool,
    lora: int | None = None,
) -> dict:
    """One run of ``method``; ``lora``: every agent trains a LoRA adapter of that rank."""
    from hacpo.engines.local import trainer as tr

    # mini-batch = half a GSPO step (the paper's 512 of 1,024): GSPO 2 updates, GSPO×2 and HACPO 4
    settings = dict(
        steps=args.steps, prompts_per_step=args.prompts, group_size=args.group,
        minibatch_size=args.prompts * args.group // 2,
        max_new_tokens=args.response_tokens if realistic else 16,
        device=args.device, val_size=0, checkpoint_every=0, seed=0, prompt_style="compact", lr=1e-6,
    )  # fmt: skip
    if realistic:
        settings |= dict(
            precision=args.precision, gradient_checkpointing=True, micro_batch_tokens=args.micro_tokens,
            old_logp="forward",
        )  # fmt: skip
    label = method if lora is None else f"{method}+lora{lora}"
    if lora is not None:  # LoRA's lr is about 10× full fine-tuning's (Schulman et al. 2025)
        settings |= dict(adapter={"lora": {"rank": lora}}, lr=settings["lr"] * 10)
    cfg = load_train_config(
        {
            "method": method,
            "agents": [{"name": n, "path": str(agents[n])} for n in names],
            "train_file": str(data / "train.jsonl"),
            "out_dir": str(out / f"{label}-{'-'.join(names)}"),
            **settings,
        }
    )
    trainer = tr.LocalTrainer(cfg)
    if realistic:  # declared synthetic reward (module docstring)
        trainer.scorer.score = synthetic_reward
    if args.device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    rows = [trainer.train_step(s).row for s in range(cfg.steps)]
    if args.device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    trainer.scorer.close()
    phase = {p: trainer.phase.total.get(p, 0.0) / cfg.steps for p in PHASES}
    gen_tokens = trainer.gen_tokens
    result = {
        "method": label,
        "agents": names,
        "step_s": wall / cfg.steps,
        "phase_s_per_step": phase,
        "tokens_per_s": gen_tokens / max(trainer.phase.total.get("generate", 0.0), 1e-9),
        "peak_gpu_mem_mb": trainer.phase.peak_gpu_mb(),
        "phase_peak_gpu_mem_mb": dict(trainer.phase.peak_mb),
        "reward": {n: [r[f"{n}/reward"] for r in rows] for n in names},
        "synthetic_reward": realistic,
        "response_tokens": {n: rows[-1][f"{n}/response_tokens"] for n in names},
    }
    del trainer
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return result


def compare(results: list[dict], total_mb: float | None) -> dict:
    by = {(r["method"], tuple(r["agents"])): r for r in results}
    joint = next(r for r in results if r["method"] == "hacpo")
    singles = joint["agents"]
    gspo = sum(by[("gspo", (a,))]["step_s"] for a in singles)
    x2 = sum(by[("gspo_x2", (a,))]["step_s"] for a in singles)
    ratios = {"hacpo_over_gspo_x2": joint["step_s"] / x2, "hacpo_over_gspo_pair": joint["step_s"] / gspo}
    if total_mb:
        x2_mem = max(by[("gspo_x2", (a,))]["peak_gpu_mem_mb"] for a in singles)
        ratios["memory_points_over_gspo_x2"] = 100 * (joint["peak_gpu_mem_mb"] - x2_mem) / total_mb
        ratios["hacpo_memory_pct"] = 100 * joint["peak_gpu_mem_mb"] / total_mb
        ratios["gspo_x2_memory_pct"] = 100 * x2_mem / total_mb
    lora = next((r for r in results if r["method"].startswith("hacpo+lora")), None)
    if lora is not None:  # the same HACPO step with adapters
        ratios["hacpo_lora_over_hacpo_step"] = lora["step_s"] / joint["step_s"]
        if total_mb:
            ratios["hacpo_lora_memory_pct"] = 100 * lora["peak_gpu_mem_mb"] / total_mb
    ratios["goals_met"] = {k: ratios[k] <= v for k, v in GOALS.items() if k in ratios}
    ratios["hacpo_time_split"] = joint["phase_s_per_step"]
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="small,realistic")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--response-tokens", type=int, default=512)
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    ap.add_argument("--micro-tokens", type=int, default=16384, help="token budget per forward/backward")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--lora", type=int, default=8, help="rank of the LoRA HACPO run (0: none)")
    ap.add_argument("--tiny", action="store_true", help="shrunken models and lengths: a CPU smoke run")
    ap.add_argument("--out", default="results/bench/gpu")
    args = ap.parse_args()
    if args.tiny:
        args.response_tokens, args.prompts, args.group = min(args.response_tokens, 24), 4, 4
    out = Path(args.out)
    total_mb = torch.cuda.get_device_properties(0).total_memory / 2**20 if args.device == "cuda" else None
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    report = {"device": device, "args": vars(args), "torch": torch.__version__, "pairs": {}}
    for pair in args.pairs.split(","):
        realistic = pair == "realistic"
        if realistic:
            agents, data = realistic_pair(out, args.tiny, args.device)
        else:
            agents, data = small_pair(out, args.device, args.tiny)
        a, b = list(agents)
        plan = [("gspo", [a], None), ("gspo", [b], None), ("gspo_x2", [a], None), ("gspo_x2", [b], None),
                ("hacpo", [a, b], None)]  # fmt: skip
        if args.lora:
            plan.append(("hacpo", [a, b], args.lora))
        body = report["pairs"][pair] = {"runs": [], "planned": len(plan)}
        for method, names, lora in plan:
            t0 = time.perf_counter()
            body["runs"].append(run(out / "runs" / pair, method, agents, names, data, args, realistic, lora))
            done = f"{body['runs'][-1]['method']} ({'+'.join(names)})"
            print(f"{pair}: {done} in {time.perf_counter() - t0:.0f} s", flush=True)
            write_report(out, report)  # after each run: a time limit keeps the runs already done
        body["compare"] = compare(body["runs"], total_mb)
        print(json.dumps({pair: body["compare"]}, indent=2), flush=True)
        write_report(out, report)
    print(markdown(report))


def write_report(out: Path, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "bench_gpu.json", json.dumps(report, indent=2))
    atomic_write_text(out / "bench_gpu.md", markdown(report))


def markdown(report: dict) -> str:
    lines = [f"device: {report['device']}, torch {report['torch']}", ""]
    for pair, body in report["pairs"].items():
        label = " (declared synthetic reward)" if pair == "realistic" else ""
        head = "| run | s/step | " + " | ".join(PHASES) + " | tok/s | peak GPU MB |"
        lines += [f"### {pair}{label}", "", head, "|---|---|" + "---|" * len(PHASES) + "---|---|"]
        for r in body["runs"]:
            ph = " | ".join(f"{r['phase_s_per_step'][p]:.2f}" for p in PHASES)
            mem = f"{r['peak_gpu_mem_mb']:.0f}" if r["peak_gpu_mem_mb"] is not None else "–"
            name = f"{r['method']} ({'+'.join(r['agents'])})"
            lines.append(f"| {name} | {r['step_s']:.2f} | {ph} | {r['tokens_per_s']:.0f} | {mem} |")
        c = body.get("compare")
        if c is None:  # cut short: the runs above are all there is
            lines += ["", f"(incomplete: {len(body['runs'])} of {body.get('planned', 5)} runs)", ""]
            continue
        lines += ["", "| ratio | measured | goal |", "|---|---|---|"]
        for key, goal in GOALS.items():
            if key in c:
                verdict = "met" if c["goals_met"][key] else "MISSED"
                lines.append(f"| {key} | {c[key]:.3f} | ≤ {goal} ({verdict}) |")
        if "hacpo_lora_over_hacpo_step" in c:
            ratio = c["hacpo_lora_over_hacpo_step"]
            lines.append(f"| hacpo_lora_over_hacpo_step | {ratio:.3f} | (measured) |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
