"""Supervised fine-tuning, the one loop every warm-up runs (:func:`sft`), and its recipe
(:class:`SftRecipe`): cross-entropy on the answer tokens only (answer + its end), AdamW with a linear warm-up
then a constant rate, gradient clipping, greedy dev evaluation at step 0 and every ``eval_every`` steps,
stopping at the first evaluation reaching ``target_dev_acc``. Rows are ``templated prompt + answer + end``;
prompts are left-padded when their lengths differ (attention mask + position ids), answers right-padded.
Thread count is the caller's business. Its users: :mod:`hacpo.agents.warmup` (tiny agents from scratch and
pretrained models)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from hacpo.agents.lm import left_pad, token_logprobs
from hacpo.agents.prompting import exact_boxed_match, greedy_accuracy, prompt_ids
from hacpo.data.synthetic import Problem, solution_text


@dataclass(frozen=True)
class SftRecipe:
    """What every supervised warm-up shares (:func:`sft`): the optimiser (AdamW, linear warm-up then
    constant), the batch, the stopping rule and the prompt style, checked once here. Its two kinds give their
    own defaults: :class:`WarmupSpec` (a tiny agent from scratch) and :class:`ModelWarmup` (a pretrained
    model); the workflow's ``warm:`` key (:class:`hacpo.pipeline.config.WarmFrom`) takes ModelWarmup's."""

    style: str = "compact"  # "compact" | "paper"
    seed: int = 0
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.01
    warmup_steps: int = 100
    batch_size: int = 128
    grad_clip: float = 1.0
    target_dev_acc: float | None = None  # None: train max_steps
    max_steps: int = 2000
    eval_every: int = 25
    n_dev: int = 200  # the first n_dev problems of the dev split
    max_new_tokens: int | None = None  # greedy dev decoding; None: the longest dev answer (tokens + EOS) + 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(self.betas))
        if self.style not in ("compact", "paper"):
            raise ValueError(f"unknown prompt style {self.style!r}; use 'compact' or 'paper'")
        sizes = (self.max_steps, self.batch_size - 1, self.eval_every - 1, self.n_dev - 1)
        if min(sizes) < 0 or (self.max_new_tokens is not None and self.max_new_tokens < 1):
            raise ValueError(f"bad warm-up sizes: {self}")

    def to_dict(self) -> dict:
        return {**asdict(self), "betas": list(self.betas)}

    def recorded(self) -> dict:
        """The fields a warm-up's identity records (:meth:`spec_hash`): all of them, here."""
        return self.to_dict()

    def spec_hash(self) -> str:
        blob = json.dumps(self.recorded(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, d: dict):
        """A recipe from a mapping (a spec file, a recorded ``agent.json``); an unknown key is an error that
        lists the known ones."""
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            known = list(cls.__dataclass_fields__)
            raise ValueError(f"unknown {cls.__name__} keys {sorted(unknown)}; known: {known}")
        return cls(**d)


def data_digest(train: list[Problem], dev: list[Problem]) -> str:
    """Identity of the data a warm-up saw (ids in order); part of the cache key."""
    h = hashlib.sha256()
    for name, rows in (("train", train), ("dev", dev)):
        h.update(name.encode())
        for p in rows:
            h.update(p.id.encode() + b"\0")
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------------
# Encoding


def answer_ids(tokenizer, problem: Problem, style: str) -> list[int]:
    """SFT target ids: solution text + EOS."""
    return tokenizer(solution_text(problem, style), add_special_tokens=False)["input_ids"] + [
        tokenizer.eos_token_id
    ]


def sft_batch(prompts: list[list[int]], answers: list[list[int]], pad_id: int) -> dict:
    """``input_ids`` = left-padded prompts + right-padded answers; ``labels`` = answer ids, -100 elsewhere;
    ``attention_mask``/``position_ids`` only when prompt lengths differ (else None)."""
    p_ids, p_mask = left_pad(prompts, pad_id)
    a_len = max(len(a) for a in answers)
    a_ids = torch.full((len(answers), a_len), pad_id, dtype=torch.long)
    labels = torch.full((len(answers), a_len), -100, dtype=torch.long)
    for i, a in enumerate(answers):
        a_ids[i, : len(a)] = torch.tensor(a, dtype=torch.long)
        labels[i, : len(a)] = a_ids[i, : len(a)]
    input_ids = torch.cat([p_ids, a_ids], dim=1)
    attn = pos = None
    if not bool(p_mask.all()):
        attn = torch.cat([p_mask, torch.ones_like(a_ids, dtype=torch.bool)], dim=1).long()
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return {
        "input_ids": input_ids,
        "labels": labels,
        "response_start": p_ids.shape[1],
        "attention_mask": attn,
        "position_ids": pos,
    }


def _batch_loss(model, batch: dict, reduction: str = "mean", sliced: bool = False) -> torch.Tensor:
    """Cross-entropy of the answer tokens. ``sliced``: through :func:`hacpo.agents.lm.token_logprobs` (the
    vocabulary head on answer positions only, in slices: a pretrained model's 262,144-token head would
    otherwise make ``[rows, tokens, V]`` float32 logits of every prompt position)."""
    dev = next(model.parameters()).device
    on = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}  # the model's device
    if sliced:
        start, labels = on["response_start"], on["labels"]
        mask = labels != -100
        logp = token_logprobs(model, on["input_ids"], start, attention_mask=on["attention_mask"])
        total = -(logp * mask).sum()
        return total if reduction == "sum" else total / mask.sum().clamp(min=1)
    logits = model(
        input_ids=on["input_ids"],
        attention_mask=on["attention_mask"],
        position_ids=on["position_ids"],
    ).logits
    start = on["response_start"]
    logits = logits[:, start - 1 : -1, :].float()
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), on["labels"].reshape(-1), reduction=reduction
    )


@torch.no_grad()
def sft_loss(
    model, tokenizer, problems: list[Problem], style: str, batch_size: int = 512, answers=None,
    sliced: bool = False,
) -> float:  # fmt: skip
    """Token-mean cross-entropy of solution + EOS (or ``answers[i]``, ids) given the templated prompt."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for i in range(0, len(problems), batch_size):
            chunk = problems[i : i + batch_size]
            b = sft_batch(
                [prompt_ids(tokenizer, p, style) for p in chunk],
                answers[i : i + batch_size] if answers else [answer_ids(tokenizer, p, style) for p in chunk],
                tokenizer.pad_token_id,
            )
            total += float(_batch_loss(model, b, reduction="sum", sliced=sliced))
            count += int((b["labels"] != -100).sum())
    finally:
        model.train(was_training)
    return total / max(count, 1)


# ---------------------------------------------------------------------------------------------------------
# Warm-up


def sft(
    model, tok, train: list[Problem], dev: list[Problem], hyper: SftRecipe, answer_of, max_new: int,
    autocast=None, sliced: bool = False,
):  # fmt: skip
    """Supervised fine-tuning (the module docstring's recipe, ``hyper``'s optimiser and stopping fields: an
    :class:`SftRecipe`): cross-entropy of ``answer_of(problem)`` (ids) after the
    templated prompt, greedy dev accuracy at step 0 and every ``eval_every`` steps, stopping at the first
    evaluation reaching ``target_dev_acc``. ``autocast``: a context factory for the passes (bf16 on CPU);
    ``sliced``: the loss through the vocabulary head in slices (:func:`_batch_loss`). Returns (steps taken,
    dev curve)."""
    t0 = time.perf_counter()
    autocast = autocast or contextlib.nullcontext
    style = hyper.style
    p_rows = [prompt_ids(tok, p, style) for p in train]
    a_rows = [answer_of(p) for p in train]
    dev_answers = [answer_of(p) for p in dev]
    opt = torch.optim.AdamW(
        model.parameters(), lr=hyper.lr, betas=hyper.betas, weight_decay=hyper.weight_decay
    )
    warm = max(hyper.warmup_steps, 0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    gen = torch.Generator().manual_seed(hyper.seed)
    perm, cursor = torch.randperm(len(train), generator=gen), 0
    curve: list[dict] = []
    window: list[float] = []
    dev_batch = hyper.batch_size if sliced else 512  # a pretrained model's teacher forcing: its batch size

    def evaluate(step: int) -> float:
        with autocast():
            acc = greedy_accuracy(model, tok, dev, style, max_new, judge=exact_boxed_match)
            loss = sft_loss(model, tok, dev, style, dev_batch, answers=dev_answers, sliced=sliced)
        train_loss = sum(window) / len(window) if window else None
        curve.append({"step": step, "dev_acc": acc, "dev_loss": loss, "train_loss": train_loss,
                      "wall_s": round(time.perf_counter() - t0, 3)})  # fmt: skip
        window.clear()
        return acc

    def reached(acc: float) -> bool:
        return hyper.target_dev_acc is not None and acc >= hyper.target_dev_acc

    model.train()
    step = 0
    acc = evaluate(0)
    while not reached(acc) and step < hyper.max_steps:
        idx: list[int] = []
        while len(idx) < hyper.batch_size:
            if cursor >= len(perm):
                perm, cursor = torch.randperm(len(train), generator=gen), 0
            take = perm[cursor : cursor + hyper.batch_size - len(idx)].tolist()
            cursor += len(take)
            idx += take
        batch = sft_batch([p_rows[i] for i in idx], [a_rows[i] for i in idx], tok.pad_token_id)
        with autocast():
            loss = _batch_loss(model, batch, sliced=sliced)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), hyper.grad_clip)
        opt.step()
        sched.step()
        step += 1
        window.append(float(loss.detach()))
        if step % hyper.eval_every == 0 or step == hyper.max_steps:
            acc = evaluate(step)
    return step, curve
