"""One answer from both engines: the same checkpoint, greedy, on the same items, by vLLM and by the
local engine (transformers).

Greedy decoding is a function of the weights, the prompt ids and the stop ids, so two engines that agree on
the last two can differ only where their kernels round differently (matmul order, bf16 or fp32, fused
attention) and the top two logits of a step are closer than that rounding. :func:`decoding_setup` reads
what each engine *actually* decodes with (prompt ids, the BOS they start with, the stop ids and the length
limit) so that a test can hold them equal exactly; :func:`agreement` then decodes and scores both and
reports the share of identical responses and of identical rewards, with the items where they differ.

``python -m hacpo.eval.agreement MODEL_DIR BENCHMARK.jsonl [...]`` writes the report (JSON); it needs vLLM
(``.venv-rehearsal`` on CPU, or a CUDA machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hacpo.agents.prompting import prompt_ids
from hacpo.data.synthetic import as_problem


def vllm_stop_ids(llm) -> frozenset[int]:
    """The ids vLLM 0.29 stops a request at: its own ``SamplingParams.update_from_generation_config`` with
    the engine's generation-config fields and the renderer's EOS (``v1/engine/input_processor.py``), read
    back from the engine rather than re-derived."""
    from vllm import SamplingParams

    processor = llm.llm_engine.input_processor
    params = SamplingParams(max_tokens=1)
    eos = processor.renderer.get_eos_token_id()
    params.update_from_generation_config(processor.generation_config_fields, eos)
    return frozenset(params.all_stop_token_ids)


def decoding_setup(local, vllm, problems: list[dict], sampling) -> dict:
    """What each engine decodes ``problems`` with: prompt ids (as each engine's own tokenizer renders them),
    their first ids (BOS where the prompt format starts with one), stop ids, the longest prompt + response
    it allows (``max_len``; ``None``: no limit below the model's) and the longest it is asked for."""
    llm = vllm.llm
    engines = {
        "local": {
            "prompts": [prompt_ids(local.tok, as_problem(p), sampling.prompt_style) for p in problems],
            "stop_ids": sorted(local.stops),
            "max_len": None,
        },
        "vllm": {
            "prompts": [prompt_ids(vllm.tok, as_problem(p), sampling.prompt_style) for p in problems],
            "stop_ids": sorted(vllm_stop_ids(llm)),
            "max_len": int(llm.llm_engine.model_config.max_model_len),
        },
    }
    for e in engines.values():
        e["first_ids"] = sorted({p[0] for p in e["prompts"] if p})  # BOS where the format starts with one
        e["longest"] = max((len(p) for p in e["prompts"]), default=0) + sampling.max_new_tokens
    return engines


def agreement(
    path: str,
    benchmarks: dict[str, list[dict]],
    sampling,
    *,
    reward="math_verify",
    precision: str = "fp32",
    cpu: bool = True,
    threads: int = 2,
    show: int = 5,
) -> dict[str, dict]:
    """Greedy answers of checkpoint ``path`` on each benchmark's problems by both engines (each loaded once),
    scored by ``reward``: per benchmark, the share of identical responses and of identical rewards, each
    engine's accuracy and decoding set-up, and up to ``show`` items where they differ (both responses and
    the first differing character)."""
    from hacpo.eval.local import LocalGenerator
    from hacpo.eval.run import verifier_record
    from hacpo.eval.vllm import VLLMGenerator

    if not sampling.greedy:
        raise ValueError("engine agreement compares greedy answers: use a greedy sampling")
    t0 = time.perf_counter()
    local = LocalGenerator(path, device="cpu" if cpu else "auto", threads=threads, precision=precision)
    vllm = VLLMGenerator(
        path, gpu_memory_utilization=0.1 if cpu else 0.5, max_num_seqs=64, enforce_eager=cpu, cpu=cpu,
        dtype="bfloat16" if precision == "bf16" else "float32",
    )  # fmt: skip
    load = round(time.perf_counter() - t0, 1)
    out = {}
    for name, problems in benchmarks.items():
        out[name] = _compare(local, vllm, problems, sampling, reward, show)
        out[name].update(model=str(path), precision=precision, load_seconds=load)
        out[name]["reward"] = verifier_record(reward)
    return out


def score_answers(answers: dict[str, list[str]], problems: list[dict], reward) -> dict[str, list[float]]:
    """Each engine's answers scored by ``reward`` as an evaluation scores them: golds, and for a verifier of
    your own each record's ``metadata`` and id."""
    from hacpo.reward.scorer import Scorer

    golds = [str(p["answer"]) for p in problems]
    metadata = [p.get("metadata") or {} for p in problems]
    ids = [str(p.get("id", i)) for i, p in enumerate(problems)]
    with Scorer(workers=1, reward=reward) as scorer:
        return {k: scorer.score(v, golds, metadata, ids) for k, v in answers.items()}


def _compare(local, vllm, problems: list[dict], sampling, reward, show: int) -> dict:
    setup = decoding_setup(local, vllm, problems, sampling)
    answers, seconds = {}, {}
    for name, gen in (("local", local), ("vllm", vllm)):
        t = time.perf_counter()
        answers[name] = [r[0] for r in gen.generate(problems, sampling)]
        seconds[name] = round(time.perf_counter() - t, 1)
    rewards = score_answers(answers, problems, reward)
    same = [a == b for a, b in zip(answers["local"], answers["vllm"], strict=True)]
    same_reward = [a == b for a, b in zip(rewards["local"], rewards["vllm"], strict=True)]
    n = len(problems)
    diffs = []
    for i in (i for i, ok in enumerate(same) if not ok):
        if len(diffs) == show:
            break
        a, b = answers["local"][i], answers["vllm"][i]
        at = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        diffs.append({"item": i, "id": problems[i].get("id"), "first_difference": at, "local": a, "vllm": b,
                      "reward_local": rewards["local"][i], "reward_vllm": rewards["vllm"][i]})  # fmt: skip
    return {
        "items": n,
        "max_new_tokens": sampling.max_new_tokens,
        "prompt_style": sampling.prompt_style,
        "identical_responses": sum(same) / n if n else 0.0,
        "identical_rewards": sum(same_reward) / n if n else 0.0,
        "accuracy": {k: sum(v) / n if n else 0.0 for k, v in rewards.items()},
        "setup": {
            k: {"stop_ids": e["stop_ids"], "first_ids": e["first_ids"], "max_len": e["max_len"],
                "longest": e["longest"]}
            for k, e in setup.items()
        },  # fmt: skip
        "same_prompts": setup["local"]["prompts"] == setup["vllm"]["prompts"],
        "differences": diffs,
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    from hacpo.eval.run import (
        Sampling,
        loadable_verifier,
        read_benchmark,
        recorded_verifier,
        reward_from_spec,
    )  # fmt: skip

    p = argparse.ArgumentParser(prog="python -m hacpo.eval.agreement", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a Hugging Face model directory (e.g. results/models/smollm2)")
    p.add_argument("benchmarks", nargs="+", help="benchmark JSONL files (hacpo data's records)")
    p.add_argument("--limit", type=int, default=50, help="items per benchmark (default 50)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--prompt-style", default="paper")
    p.add_argument(
        "--reward", default=None,
        help="the verifier: math_verify (default), hendrycks, pkg.module:name or path/to/verify.py:name",
    )  # fmt: skip
    p.add_argument(
        "--audit", default=None,
        help="score with the verifier an evaluation's audit file (<bench>.samples.jsonl) records",
    )  # fmt: skip
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--out", help="write the report here (JSON) as well as to stdout")
    args = p.parse_args(argv)
    if args.reward and args.audit:
        p.error("give --reward or --audit, not both")
    reward = reward_from_spec(args.reward) if args.reward else "math_verify"
    if args.audit:
        reward, _, notes = recorded_verifier(args.audit)
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        reward = loadable_verifier(reward)
    sampling = Sampling(max_new_tokens=args.max_new_tokens, prompt_style=args.prompt_style)
    benchmarks = {Path(b).stem: read_benchmark(b, limit=args.limit) for b in args.benchmarks}
    report = agreement(
        args.model, benchmarks, sampling, reward=reward, precision=args.precision, cpu=not _has_cuda()
    )
    text = json.dumps(report, indent=1)
    if args.out:
        from hacpo.runio import atomic_write_text

        atomic_write_text(args.out, text + "\n")
    print(text)
    return 0


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
