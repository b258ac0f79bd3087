"""Prompting and greedy answering, shared by warm-up, training, validation and evaluation.

One rendering of a problem into an agent's prompt (its chat template, the config's prompt style) and one
greedy accuracy, judged by the exact boxed answer (the SFT stopping rule: cheap, in-process) or by the
training reward (validation curves: math-verify); both read answers with :func:`hacpo.reward.extract_boxed`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from hacpo.agents.lm import generate, left_pad, rows_per_batch
from hacpo.agents.retokenize import response_text, stop_token_ids
from hacpo.data.synthetic import Problem, user_message
from hacpo.reward import extract_boxed

Judge = Callable[[Sequence[str], Sequence[str]], Sequence[float]]


def prompt_text(tokenizer, problem: Problem, style: str) -> str:
    """The learner's templated prompt as text: one user turn, the generation prompt, Qwen3 thinking off."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": user_message(problem, style)}],
        add_generation_prompt=True,
        tokenize=False,
        enable_thinking=False,  # Qwen3 hybrid models: the paper disables thinking; other templates ignore it
    )


def prompt_ids(tokenizer, problem: Problem, style: str) -> list[int]:
    """The learner's templated prompt (BOS/role markers from the chat template), no extra specials; what
    OpenRLHF's rollout actors make of :func:`prompt_text` too (``add_special_tokens=False``)."""
    return tokenizer(prompt_text(tokenizer, problem, style), add_special_tokens=False)["input_ids"]


def exact_boxed_match(responses: Sequence[str], golds: Sequence[str]) -> list[float]:
    """1.0 where the last ``\\boxed{}`` content equals the gold answer (whitespace-stripped), else 0.0."""
    out = []
    for response, gold in zip(responses, golds, strict=True):
        got = extract_boxed(response)
        out.append(float(got is not None and got.strip() == gold.strip()))
    return out


@torch.no_grad()
def greedy_responses(
    model,
    tokenizer,
    problems: list[Problem],
    style: str,
    max_new_tokens: int,
    batch_size: int = 512,
    batch_tokens: int | None = None,
) -> list[str]:
    """Greedy response texts (EOS stripped), in the order of ``problems``."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    prompts = [prompt_ids(tokenizer, p, style) for p in problems]
    stops = stop_token_ids(tokenizer, model)
    longest = max((len(x) for x in prompts), default=0)
    batch_size = rows_per_batch(batch_tokens, longest + max_new_tokens, batch_size)
    order = sorted(range(len(problems)), key=lambda i: len(prompts[i]))  # similar lengths → little padding
    out: list[str] = [""] * len(problems)
    try:
        for s in range(0, len(order), batch_size):
            idx = order[s : s + batch_size]
            ids, mask = left_pad([prompts[i] for i in idx], tokenizer.pad_token_id)
            gen = generate(
                model,
                ids.to(device),
                max_new_tokens,
                eos_id=stops,
                pad_id=tokenizer.pad_token_id,
                prompt_mask=mask.to(device),
                greedy=True,
            )
            for row, i in zip(gen.tokens.cpu(), idx, strict=True):
                out[i] = response_text(tokenizer, row, stops=stops)
    finally:
        model.train(was_training)
    return out


def greedy_accuracy(
    model,
    tokenizer,
    problems: list[Problem],
    style: str,
    max_new_tokens: int,
    judge: Judge,
    batch_size: int = 512,
    batch_tokens: int | None = None,
) -> float:
    """Fraction of ``problems`` whose greedy response ``judge`` accepts (mean of its 0/1 verdicts)."""
    if not problems:
        raise ValueError("greedy_accuracy needs at least one problem")
    texts = greedy_responses(model, tokenizer, problems, style, max_new_tokens, batch_size, batch_tokens)
    return sum(judge(texts, [p.answer for p in problems])) / len(problems)
