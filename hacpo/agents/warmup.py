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

import contextlib
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from hacpo.agents.formats import ANSWER_FORMS, few_shot_answer
from hacpo.agents.lm import left_pad, token_logprobs
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
    model, tok, train: list[Problem], dev: list[Problem], hyper, answer_of, max_new: int, autocast=None,
    sliced: bool = False,
):  # fmt: skip
    """Supervised fine-tuning (the module docstring's recipe, ``hyper``'s optimiser and stopping fields: a
    :class:`WarmupSpec` or a :class:`ModelWarmup`): cross-entropy of ``answer_of(problem)`` (ids) after the
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
    max_new = spec.max_new_tokens or max(len(answer_ids(tok, p, spec.style)) for p in dev) + 2
    step, curve = sft(model, tok, train, dev, spec, lambda p: answer_ids(tok, p, spec.style), max_new)
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
        "reached_target": spec.target_dev_acc is not None and curve[-1]["dev_acc"] >= spec.target_dev_acc,
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


# ---------------------------------------------------------------------------------------------------------
# Pretrained models: the same warm-up on an imported model (issue 44's warmed agents)


@dataclass(frozen=True)
class ModelWarmup:
    """A short SFT of a pretrained (imported) model on the task's train split, in its own prompt format: the
    answer (``answer``) is the worked one-line solution (``"solution"``: ``" 12+34=46. \\boxed{46}"``) or the
    few-shot examples' form (``"few_shot"``: ``" 12 + 34 = 46. The answer is \\boxed{46}."``, what the
    imported model already writes: a warm-up that teaches the arithmetic, not a new form), ending at the
    format's first stop (the newline of ``few_shot``/``completion``, else EOS). Full fine-tuning, AdamW, fp32
    master weights, bf16 autocast where the CPU runs it natively (``precision: auto``)."""

    style: str = "paper"
    seed: int = 0
    lr: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    warmup_steps: int = 0
    batch_size: int = 16
    grad_clip: float = 1.0
    target_dev_acc: float | None = None
    max_steps: int = 40
    eval_every: int = 10
    n_dev: int = 100
    max_new_tokens: int = 32
    precision: str = "auto"
    answer: str = "solution"

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(self.betas))
        if self.style not in ("compact", "paper"):
            raise ValueError(f"unknown prompt style {self.style!r}; use 'compact' or 'paper'")
        if self.answer not in ANSWER_FORMS:
            raise ValueError(f"unknown answer form {self.answer!r}; use one of {', '.join(ANSWER_FORMS)}")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"precision must be auto, fp32 or bf16, got {self.precision!r}")
        if (
            min(
                self.max_steps,
                self.batch_size - 1,
                self.eval_every - 1,
                self.n_dev - 1,
                self.max_new_tokens - 1,
            )
            < 0
        ):
            raise ValueError(f"bad warm-up sizes: {self}")

    def to_dict(self) -> dict:
        return {**asdict(self), "betas": list(self.betas)}

    def spec_hash(self) -> str:
        fields = self.to_dict()
        if fields["answer"] == "solution":  # the default: warm-ups recorded before the field keep their hash
            del fields["answer"]
        blob = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def answer_text(self, problem: Problem) -> str:
        """The SFT target's text, before the format's stop (see ``answer``)."""
        if self.answer == "few_shot":
            return few_shot_answer(problem.work, problem.answer)
        return solution_text(problem, self.style)


BASE_IDENTITY = ("source_sha256", "prompt_format", "importer_version", "warmup")  # what makes the base


def answer_end_id(tok, prompt_format: str) -> int:
    """The id that ends an answer in ``prompt_format``: its first stop text (one token), else EOS."""
    from hacpo.agents.formats import get_format

    stops = get_format(prompt_format).stops
    if not stops:
        return tok.eos_token_id
    ids = tok(stops[0], add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(
            f"prompt format {prompt_format!r}: stop {stops[0]!r} is {len(ids)} tokens here, not one"
        )
    return ids[0]


def warm_model(
    spec: ModelWarmup, base: str | os.PathLike, out_dir: str | os.PathLike, splits: dict[str, list[Problem]],
    device: str = "cpu",
) -> dict:  # fmt: skip
    """Warm the imported model at ``base`` by :func:`sft` and save it to ``out_dir`` as an imported model
    (weights, tokenizer with its prompt format, generation config with its stop ids) with
    ``hacpo-model.json``: the base's manifest plus ``warmup`` (spec, data digest, the base's identity, dev
    curve, steps, wall time).
    Cached: a second call with the same base, spec and data returns the stored manifest without training."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hacpo.agents.sources import MANIFEST
    from hacpo.cpu import resolve_precision

    keep_freed_memory()
    base, out_dir = Path(base), Path(out_dir)
    base_manifest = json.loads((base / MANIFEST).read_text())
    train, dev = list(splits["train"]), list(splits["dev"])[: spec.n_dev]
    if not train or not dev:
        raise ValueError(f"warm-up needs non-empty train and dev splits (got {len(train)} / {len(dev)})")
    identity = {
        "base": {
            k: base_manifest.get(k) for k in ("source_sha256", "prompt_format", "importer_version", "warmup")
        },
        "spec_hash": spec.spec_hash(),
        "data_digest": data_digest(train, dev),
    }
    try:
        stored = json.loads((out_dir / MANIFEST).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        stored = None
    if stored is not None and stored.get("warmup", {}).get("identity") == identity:
        return {**stored, "cached": True}

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).to(device)
    end = answer_end_id(tok, base_manifest["prompt_format"])

    def answer_of(p: Problem) -> list[int]:
        return tok(" " + spec.answer_text(p), add_special_tokens=False)["input_ids"] + [end]

    precision = resolve_precision(spec.precision, torch.device(device).type)

    def autocast():
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16")

    torch.manual_seed(spec.seed)
    steps, curve = sft(model, tok, train, dev, spec, answer_of, spec.max_new_tokens, autocast, sliced=True)
    import transformers

    warmup = {
        "identity": identity,
        "spec": spec.to_dict(),
        "from": str(base),
        "steps": steps,
        "dev_acc": curve[-1]["dev_acc"],
        "dev_acc_start": curve[0]["dev_acc"],
        "dev_curve": curve,
        "n_train": len(train),
        "n_dev": len(dev),
        "precision": precision,
        "threads": torch.get_num_threads(),
        "wall_s": round(time.perf_counter() - t0, 3),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    manifest = {**{k: v for k, v in base_manifest.items() if k not in ("cache", "cache_hit", "seconds")},
                "warmup": warmup}  # fmt: skip
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        atomic_write_json(tmp / MANIFEST, manifest)  # last: its presence marks a complete directory
    return {**manifest, "cached": False}


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
