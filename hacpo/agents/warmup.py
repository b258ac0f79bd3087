"""Supervised warm-up (SFT) of tiny agents so that base agents start with non-trivial, different accuracy.

Recipe (toy-calibration note §1): AdamW lr 3e-3, betas (0.9, 0.98), weight decay 0.01, 100-step linear
warm-up then constant, batch 128, grad clip 1.0, cross-entropy on answer tokens only (solution + EOS);
greedy dev evaluation every 25 steps (and at step 0), stop at the first evaluation reaching
``target_dev_acc``. Rows are ``templated prompt + solution + EOS``; prompts are left-padded when their
lengths differ (attention mask + position ids), answers right-padded. Thread count is the caller's business.

Output directory (written atomically: temp sibling, then rename): the Hugging Face model and tokenizer, and
``agent.json`` (spec, spec hash, data digest, steps, dev curve, wall time, fingerprint, parameter count).
A second call with the same spec and data returns the stored ``agent.json`` without training.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from hacpo.agents.lm import left_pad
from hacpo.agents.models import AgentArch, build_model, param_count
from hacpo.agents.prompting import exact_boxed_match, greedy_accuracy, prompt_ids
from hacpo.agents.tokenizers import build_tokenizer, tokenizer_fingerprint
from hacpo.cpu import keep_freed_memory
from hacpo.data.synthetic import Problem, solution_text
from hacpo.runio import atomic_dir, atomic_write_json

AGENT_JSON = "agent.json"


@dataclass(frozen=True)
class WarmupSpec:
    arch: AgentArch = field(default_factory=AgentArch)
    tokenizer: str = "char"  # "char" | "word"
    families: tuple[str, ...] = ("add2",)  # recorded; the data itself comes from ``splits``
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
    n_dev: int = 200  # first n_dev problems of splits["dev"]
    max_new_tokens: int | None = None  # greedy dev decoding; None: longest dev answer (tokens + EOS) + 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "families", tuple(self.families))
        object.__setattr__(self, "betas", tuple(self.betas))
        if isinstance(self.arch, dict):
            object.__setattr__(self, "arch", AgentArch.from_dict(self.arch))
        if not isinstance(self.arch, AgentArch):
            raise ValueError(f"arch must be an AgentArch or a dict, got {type(self.arch).__name__}")
        if self.tokenizer not in ("char", "word"):
            raise ValueError(f"unknown tokenizer kind {self.tokenizer!r}; use 'char' or 'word'")
        if self.style not in ("compact", "paper"):
            raise ValueError(f"unknown prompt style {self.style!r}; use 'compact' or 'paper'")
        if self.max_steps < 0 or self.eval_every < 1 or self.batch_size < 1 or self.n_dev < 1:
            raise ValueError(f"bad warm-up sizes: {self}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["families"], d["betas"] = list(self.families), list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> WarmupSpec:
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"unknown WarmupSpec keys {sorted(unknown)}; known: {list(cls.__dataclass_fields__)}"
            )
        d = dict(d)
        if isinstance(d.get("arch"), dict):
            d["arch"] = AgentArch.from_dict(d["arch"])
        return cls(**d)

    def spec_hash(self) -> str:
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


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


def _batch_loss(model, batch: dict, reduction: str = "mean") -> torch.Tensor:
    dev = next(model.parameters()).device
    on = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}  # the model's device
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
def sft_loss(model, tokenizer, problems: list[Problem], style: str, batch_size: int = 512) -> float:
    """Token-mean cross-entropy of solution + EOS given the templated prompt (teacher forcing)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for i in range(0, len(problems), batch_size):
            chunk = problems[i : i + batch_size]
            b = sft_batch(
                [prompt_ids(tokenizer, p, style) for p in chunk],
                [answer_ids(tokenizer, p, style) for p in chunk],
                tokenizer.pad_token_id,
            )
            total += float(_batch_loss(model, b, reduction="sum"))
            count += int((b["labels"] != -100).sum())
    finally:
        model.train(was_training)
    return total / max(count, 1)


# ---------------------------------------------------------------------------------------------------------
# Warm-up


def _read_meta(out_dir: Path) -> dict | None:
    try:
        return json.loads((out_dir / AGENT_JSON).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def build_agent(
    spec: WarmupSpec, out_dir: str | os.PathLike, splits: dict[str, list[Problem]], device: str = "cpu"
) -> dict:
    """Build tokenizer + model, run SFT (on ``device``), save both and ``agent.json`` to ``out_dir``;
    returns the metadata (plus ``"path"`` and ``"cached"``). Cached on (spec hash, data digest): the device
    is not part of it. Deterministic in ``spec.seed`` for a fixed device and thread count."""
    keep_freed_memory()
    out_dir = Path(out_dir)
    train = list(splits["train"])
    dev = list(splits["dev"])[: spec.n_dev]
    if not train or not dev:
        raise ValueError(f"warm-up needs non-empty train and dev splits (got {len(train)} / {len(dev)})")
    spec_hash, digest = spec.spec_hash(), data_digest(train, dev)
    meta = _read_meta(out_dir)
    if meta is not None and meta.get("spec_hash") == spec_hash and meta.get("data_digest") == digest:
        return {**meta, "path": str(out_dir), "cached": True}

    t0 = time.perf_counter()
    tok = build_tokenizer(spec.tokenizer)
    model = build_model(spec.arch, tok, spec.seed).to(device)
    pad = tok.pad_token_id
    p_rows = [prompt_ids(tok, p, spec.style) for p in train]
    a_rows = [answer_ids(tok, p, spec.style) for p in train]
    max_new = spec.max_new_tokens or max(len(answer_ids(tok, p, spec.style)) for p in dev) + 2

    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=spec.betas, weight_decay=spec.weight_decay)
    warm = max(spec.warmup_steps, 0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    gen = torch.Generator().manual_seed(spec.seed)
    perm, cursor = torch.randperm(len(train), generator=gen), 0

    curve: list[dict] = []
    window: list[float] = []

    def evaluate(step: int) -> float:
        acc = greedy_accuracy(model, tok, dev, spec.style, max_new, judge=exact_boxed_match)
        curve.append(
            {
                "step": step,
                "dev_acc": acc,
                "dev_loss": sft_loss(model, tok, dev, spec.style),
                "train_loss": sum(window) / len(window) if window else None,
                "wall_s": round(time.perf_counter() - t0, 3),
            }
        )
        window.clear()
        return acc

    def reached(acc: float) -> bool:
        return spec.target_dev_acc is not None and acc >= spec.target_dev_acc

    model.train()
    step = 0
    acc = evaluate(0)
    while not reached(acc) and step < spec.max_steps:
        idx: list[int] = []
        while len(idx) < spec.batch_size:
            if cursor >= len(perm):
                perm, cursor = torch.randperm(len(train), generator=gen), 0
            take = perm[cursor : cursor + spec.batch_size - len(idx)].tolist()
            cursor += len(take)
            idx += take
        batch = sft_batch([p_rows[i] for i in idx], [a_rows[i] for i in idx], pad)
        loss = _batch_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        opt.step()
        sched.step()
        step += 1
        window.append(float(loss.detach()))
        if step % spec.eval_every == 0 or step == spec.max_steps:
            acc = evaluate(step)
    wall = time.perf_counter() - t0

    import transformers

    meta = {
        "spec": spec.to_dict(),
        "spec_hash": spec_hash,
        "data_digest": digest,
        "n_train": len(train),
        "n_dev": len(dev),
        "steps": step,
        "dev_acc": curve[-1]["dev_acc"],
        "reached_target": reached(curve[-1]["dev_acc"]),
        "dev_curve": curve,
        "wall_s": round(wall, 3),
        "threads": torch.get_num_threads(),
        "max_new_tokens": max_new,
        "fingerprint": tokenizer_fingerprint(tok),
        "n_params": param_count(model),
        "model_class": type(model).__name__,
        "device": str(device),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    _save_atomically(out_dir, model, tok, meta)
    return {**meta, "path": str(out_dir), "cached": False}


def _save_atomically(out_dir: Path, model, tok, meta: dict) -> None:
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        atomic_write_json(tmp / AGENT_JSON, meta)  # last: its presence marks a complete directory


def load_spec_file(spec: str | os.PathLike) -> WarmupSpec:
    """A :class:`WarmupSpec` from YAML: ``FILE`` holding one spec mapping, or ``FILE:NAME`` selecting one
    entry of a file of named specs (e.g. ``config/agents/toy.yaml:small``)."""
    import yaml

    path, name = str(spec), None
    if path.lstrip().startswith("{"):  # inline JSON, as the workflow passes it
        return WarmupSpec.from_dict(json.loads(path))
    if not Path(path).is_file() and ":" in path:
        path, name = path.rsplit(":", 1)
    if not Path(path).is_file():
        raise FileNotFoundError(f"warm-up spec file {path!r} does not exist")
    doc = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping, got {type(doc).__name__}")
    if name is not None:
        if name not in doc:
            raise ValueError(f"{path}: no spec named {name!r}; available: {', '.join(map(str, doc))}")
        doc = doc[name]
    elif "arch" not in doc:
        raise ValueError(f"{path} holds named specs ({', '.join(map(str, doc))}); select one with FILE:NAME")
    return WarmupSpec.from_dict(doc)


def build_agent_from_args(args) -> dict:
    """``hacpo build-agent``: ``args.spec`` (see :func:`load_spec_file`), ``args.data`` (directory with
    ``train.jsonl`` and ``dev.jsonl``), ``args.out``, optional ``args.threads``. Returns the metadata of
    :func:`build_agent` plus ``"params"`` (= ``n_params``)."""
    from hacpo.data.synthetic import read_jsonl

    spec = load_spec_file(args.spec)
    if getattr(args, "train", None) or getattr(args, "dev", None):
        files = {"train": Path(args.train or ""), "dev": Path(args.dev or "")}
    elif getattr(args, "data", None):
        files = {name: Path(args.data) / f"{name}.jsonl" for name in ("train", "dev")}
    else:
        raise ValueError("give --data DIR, or --train FILE and --dev FILE")
    splits = {}
    for name, f in files.items():
        if not f.is_file():
            raise FileNotFoundError(f"{name} problems {str(f)!r} do not exist (write them with `hacpo data`)")
        splits[name] = read_jsonl(f, as_problems=True)
    if getattr(args, "threads", None):
        torch.set_num_threads(int(args.threads))
    device = getattr(args, "device", None) or "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA device here; use --device cpu")
    info = build_agent(spec, args.out, splits, device=device)
    return {**info, "params": info["n_params"]}


def load_agent(out_dir: str | os.PathLike):
    """``(model, tokenizer, meta)`` from a :func:`build_agent` directory (model in eval mode)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir = Path(out_dir)
    meta = _read_meta(out_dir)
    if meta is None:
        raise FileNotFoundError(f"{out_dir / AGENT_JSON} missing or unreadable; run build_agent first")
    model = AutoModelForCausalLM.from_pretrained(out_dir).float().eval()
    return model, AutoTokenizer.from_pretrained(out_dir), meta
