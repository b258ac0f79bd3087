"""Warm-ups (:func:`hacpo.agents.sft.sft`) that give base agents a non-trivial, different start: a tiny agent
built from scratch (:class:`WarmupSpec`, :func:`build_agent`; the toy recipe: AdamW lr 3e-3, betas (0.9,
0.98), weight decay 0.01, 100-step linear warm-up, batch 128, dev evaluation every 25 steps) and a
pretrained model warmed on the task (:class:`ModelWarmup`, :func:`warm_model`).

A tiny agent's directory (written atomically: temp sibling, then rename): the Hugging Face model and
tokenizer, and ``agent.json`` (spec, spec hash, data digest, steps, dev curve, wall time, fingerprint,
parameter count). A second call with the same spec and data returns the stored ``agent.json`` without
training; :func:`warm_model` caches the same way by its recorded identity.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hacpo.agents import adapters
from hacpo.agents import sft as _sft
from hacpo.agents.formats import ANSWER_FORMS, few_shot_answer
from hacpo.agents.models import AgentArch, build_model, param_count
from hacpo.agents.sft import SftRecipe
from hacpo.agents.tokenizers import build_tokenizer, tokenizer_fingerprint
from hacpo.data.synthetic import Problem, solution_text
from hacpo.hardware import keep_freed_memory
from hacpo.runio import atomic_dir, atomic_write_json

AGENT_JSON = "agent.json"


@dataclass(frozen=True)
class WarmupSpec(SftRecipe):
    """A tiny agent built from scratch (:func:`build_agent`): its architecture and tokenizer, then the
    module docstring's recipe."""

    arch: AgentArch = field(default_factory=AgentArch)
    tokenizer: str = "char"  # "char" | "word"
    families: tuple[str, ...] = ("add2",)  # recorded; the data itself comes from ``splits``

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "families", tuple(self.families))
        if isinstance(self.arch, dict):
            object.__setattr__(self, "arch", AgentArch.from_dict(self.arch))
        if not isinstance(self.arch, AgentArch):
            raise ValueError(f"arch must be an AgentArch or a dict, got {type(self.arch).__name__}")
        if self.tokenizer not in ("char", "word"):
            raise ValueError(f"unknown tokenizer kind {self.tokenizer!r}; use 'char' or 'word'")

    def to_dict(self) -> dict:
        return {**super().to_dict(), "families": list(self.families)}


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
    spec_hash, digest = spec.spec_hash(), _sft.data_digest(train, dev)
    meta = _read_meta(out_dir)
    if meta is not None and meta.get("spec_hash") == spec_hash and meta.get("data_digest") == digest:
        return {**meta, "path": str(out_dir), "cached": True}

    t0 = time.perf_counter()
    tok = build_tokenizer(spec.tokenizer)
    model = build_model(spec.arch, tok, spec.seed).to(device)
    max_new = spec.max_new_tokens or max(len(_sft.answer_ids(tok, p, spec.style)) for p in dev) + 2
    step, curve = _sft.sft(
        model, tok, train, dev, spec, lambda p: _sft.answer_ids(tok, p, spec.style), max_new
    )
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
# Pretrained models: the same warm-up on an imported model (the real pairs' warmed agents)


@dataclass(frozen=True)
class ModelWarmup(SftRecipe):
    """A short SFT of a pretrained (imported) model on the task's train split, in its own prompt format: the
    answer (``answer``) is the worked one-line solution (``"solution"``: ``" 12+34=46. \\boxed{46}"``) or the
    few-shot examples' form (``"few_shot"``: ``" 12 + 34 = 46. The answer is \\boxed{46}."``, what the
    imported model already writes: a warm-up that teaches the arithmetic, not a new form), ending at the
    format's first stop (the newline of ``few_shot``/``completion``, else EOS). Full fine-tuning, or with
    ``lora`` (a :class:`~hacpo.agents.adapters.LoraSpec`'s fields) a LoRA adapter over the frozen model,
    saved alone: several warm-ups of one model are then adapters that can share its weights in a run.
    AdamW, fp32 master weights, bf16 autocast where the CPU runs it natively (``precision: auto``)."""

    style: str = "paper"
    lr: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    warmup_steps: int = 0
    batch_size: int = 16
    max_steps: int = 40
    eval_every: int = 10
    n_dev: int = 100
    max_new_tokens: int = 32
    precision: str = "auto"
    answer: str = "solution"
    lora: dict | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.answer not in ANSWER_FORMS:
            raise ValueError(f"unknown answer form {self.answer!r}; use one of {', '.join(ANSWER_FORMS)}")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"precision must be auto, fp32 or bf16, got {self.precision!r}")
        if self.lora is not None:  # checked, and recorded with its defaults filled in
            object.__setattr__(self, "lora", self.lora_spec().model_dump())

    def lora_spec(self):
        """The adapter it trains (:class:`~hacpo.agents.adapters.LoraSpec`), or None for full fine-tuning."""
        return None if self.lora is None else adapters.LoraSpec.model_validate(self.lora)

    @staticmethod
    def without_default_answer(fields: dict) -> dict:
        """``fields`` without ``answer`` where it is the default, and without ``lora`` where it is unset:
        warm-ups recorded before those fields existed keep their identity (:meth:`spec_hash`) and the
        workflow's rule its parameters (``WarmFrom.spec``)."""
        default = fields.get("answer") == ModelWarmup.answer
        return {
            k: v
            for k, v in fields.items()
            if not (k == "answer" and default) and not (k == "lora" and v is None)
        }

    def recorded(self) -> dict:
        return self.without_default_answer(self.to_dict())

    def answer_text(self, problem: Problem) -> str:
        """The SFT target's text, before the format's stop (see ``answer``)."""
        if self.answer == "few_shot":
            return few_shot_answer(problem.work, problem.answer)
        return solution_text(problem, self.style)


BASE_IDENTITY = ("source_sha256", "prompt_format", "importer_version", "warmup")  # what makes the base


def answer_end_id(tok, prompt_format: str | dict) -> int:
    """The id that ends an answer in ``prompt_format`` (a manifest's: a built-in's name or a format's
    fields): its first stop text (one token), else EOS."""
    from hacpo.agents.formats import get_format

    fmt = get_format(prompt_format)
    if not fmt.stops:
        return tok.eos_token_id
    ids = tok(fmt.stops[0], add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(f"prompt format {fmt.name!r}: stop {fmt.stops[0]!r} is {len(ids)} tokens, not one")
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
    from hacpo.hardware import resolve_precision

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
        "data_digest": _sft.data_digest(train, dev),
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
    if (lora := spec.lora_spec()) is not None:  # the base frozen; B starts at 0: step 0 is the base
        model = adapters.attach(model, lora, base, what="warm.lora")
    end = answer_end_id(tok, base_manifest["prompt_format"])

    def answer_of(p: Problem) -> list[int]:
        return tok(" " + spec.answer_text(p), add_special_tokens=False)["input_ids"] + [end]

    precision = resolve_precision(spec.precision, torch.device(device).type)

    def autocast():
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16")

    torch.manual_seed(spec.seed)
    steps, curve = _sft.sft(
        model, tok, train, dev, spec, answer_of, spec.max_new_tokens, autocast, sliced=True
    )
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
        if lora is not None:  # the adapter alone (megabytes), its base by path, as a run's adapter checkpoint
            adapters.save(model, tmp)
            adapters.inner(model).generation_config.save_pretrained(tmp)
        else:
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


def __getattr__(name: str):
    if name in ("sft", "sft_loss", "sft_batch", "answer_ids", "data_digest"):  # moved in 0.2.0; gone in 0.3.0
        import warnings

        message = f"hacpo.agents.warmup.{name} is now hacpo.agents.sft.{name} (deprecated)"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return getattr(_sft, name)
    raise AttributeError(f"module 'hacpo.agents.warmup' has no attribute {name!r}")
