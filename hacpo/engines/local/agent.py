"""An agent of the local engine: its model (with its frozen reference and LoRA adapter), tokenizer,
optimizer and sampling stream, loaded from a checkpoint directory. Agents on one ``shared_base`` are named
adapters on one peft model: the base once in memory, each agent's adapter switched on while it is used
(:meth:`Agent.activate`)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hacpo.agents import adapters
from hacpo.agents.lm import (
    left_pad,
)
from hacpo.agents.prompting import prompt_ids
from hacpo.agents.retokenize import (
    pad_token_id,
    stop_token_ids,
)
from hacpo.agents.vocab import sparse_tied_embedding_grads
from hacpo.config import TrainConfig
from hacpo.data.synthetic import as_problem


@dataclass
class Agent:
    name: str
    path: str
    model: torch.nn.Module
    ref: torch.nn.Module | None
    tok: object
    opt: torch.optim.Optimizer
    gen: torch.Generator
    stop_ids: frozenset[int]  # every id that ends this model's generations (EOS list, end of turn)
    pad_id: int
    peft: torch.nn.Module | None = None  # peft's wrapper of ``model`` when a LoRA adapter trains
    adapter: str = "default"  # its adapter's name in ``peft`` (one of several on a shared base)
    prompt_cache: dict = field(default_factory=dict)

    def activate(self) -> Agent:
        """Switch this agent's adapter on: on a shared base, ``model`` computes whichever adapter was last
        switched on, so every use of an agent's model starts here."""
        if self.peft is not None:
            adapters.activate(self.peft, self.adapter)
        return self

    def trained(self) -> list[torch.nn.Parameter]:
        """The weights this agent's optimizer updates (its adapter's, or every weight)."""
        return [p for group in self.opt.param_groups for p in group["params"]]

    @contextlib.contextmanager
    def reference(self):
        """The KL reference: the base with the adapter off (LoRA), else the frozen copy (full)."""
        if self.peft is not None:
            with adapters.reference(self.peft) as model:
                yield model
        else:
            yield self.ref

    def prompt_ids(self, problems: list[dict], style: str, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt ids ``[B, Tp]`` and mask, rendered with this agent's chat template."""
        seqs = []
        for p in problems:
            # keyed by what the prompt is made of, not the id alone: two files (train, validation) may
            # reuse an id for another problem, and a style change must render anew
            key = (p.get("id"), p.get("problem", p.get("question")), style)
            ids = self.prompt_cache.get(key)
            if ids is None:
                ids = self.prompt_cache[key] = prompt_ids(self.tok, as_problem(p), style)
            seqs.append(ids)
        ids, mask = left_pad(seqs, self.pad_id)
        return ids.to(device), mask.to(device)


def shared_base_problems(cfg: TrainConfig) -> list[str]:
    """Agents naming one ``shared_base`` must start from the same base weights: one copy serves them all."""
    bases: dict[str, dict[str, list[str]]] = {}  # shared_base → base directory → agents
    for a in cfg.agents:
        if a.shared_base is not None:
            try:  # a starting adapter's base is the one it records
                base = adapters.base_path(a.path)
            except ValueError as err:
                return [f"agent {a.name!r}: {err}"]
            bases.setdefault(a.shared_base, {}).setdefault(str(base.resolve()), []).append(a.name)
    return [
        f"shared_base {name!r}: its agents must have one base model, got "
        + "; ".join(f"{', '.join(names)} on {base}" for base, names in found.items())
        + ": point each one's `path` at the same base (or an adapter checkpoint trained on it), or give "
        "agents on another base another shared_base name"
        for name, found in bases.items()
        if len(found) > 1
    ]


def starting_adapter_problems(cfg: TrainConfig) -> list[str]:
    """Every agent starting from an adapter checkpoint declares that adapter's rank, alpha and targets."""
    return [
        problem
        for k, a in enumerate(cfg.agents)
        if adapters.is_adapter(a.path) and (lora := cfg.agent_adapter(k)) is not None
        for problem in adapters.fit_problems(a.path, lora, f"agents.{k} ({a.name!r}): adapter.lora")
    ]


def load_agents(cfg: TrainConfig, device, with_ref: bool) -> list[Agent]:
    """Every agent of the run, in order; agents on one ``shared_base`` get one peft model between them."""
    shared: dict[str, torch.nn.Module] = {}  # shared_base name → its peft model
    return [load_learner(ref, cfg, device, i, with_ref, shared) for i, ref in enumerate(cfg.agents)]


def load_learner(ref, cfg: TrainConfig, device, index: int, with_ref: bool, shared=None) -> Agent:
    """An agent to train: its model, reference model (KL), tokenizer, optimizer and sampling generator.
    ``shared``: the peft models of the run's shared bases loaded so far (this agent's adapter joins its)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    start = ref.path if adapters.is_adapter(ref.path) else None  # a starting adapter over its base
    base = str(adapters.base_path(ref.path))
    tok = AutoTokenizer.from_pretrained(ref.path if not start or _has_tokenizer(start) else base)
    lora, peft_model, name = cfg.agent_adapter(index), None, "default"
    what = f"agent {ref.name!r}: adapter.lora"
    if ref.shared_base is not None and ref.shared_base in (shared or {}):  # loaded: one adapter more
        peft_model, name = shared[ref.shared_base], f"agent{index}"
        adapters.add(peft_model, lora, name, base)
        model, with_ref = adapters.inner(peft_model), False
    else:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).to(device)
        if lora is not None:  # the base frozen and held once; the KL reference is the adapter switched off
            if ref.shared_base is not None:  # named, not "default": peft saves "default" with all the others
                name = f"agent{index}"
            peft_model = adapters.attach(model, lora, base, what=what, name=name)
            model, with_ref = adapters.inner(peft_model), False
            if ref.shared_base is not None:
                shared[ref.shared_base] = peft_model
            _setup(model, cfg, peft=True)
        else:
            _setup(model, cfg, peft=False)
    if start:
        adapters.load_weights(peft_model, start, name)
    ref_model = None
    if with_ref:
        ref_model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).to(device).eval()
        ref_model.requires_grad_(False)
    if peft_model is not None:
        params = adapters.adapter_parameters(peft_model, name)
    else:
        params = adapters.trainable_parameters(model)
    # fused: one kernel for all parameters instead of a loop over them (2.5× faster step on a CPU)
    opt = torch.optim.AdamW(
        params, lr=ref.lr or cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=True
    )
    gen = torch.Generator(device=device).manual_seed(cfg.seed * 1000 + index)
    stops = stop_token_ids(tok, model)
    if not stops:
        raise ValueError(f"agent {ref.name!r}: {ref.path} has no stop id (no eos_token or generation_config)")
    pad = pad_token_id(tok, stops)
    return Agent(ref.name, ref.path, model, ref_model, tok, opt, gen, stops, pad, peft_model, name).activate()


def _setup(model, cfg: TrainConfig, peft: bool) -> None:
    """Train mode, the tied embedding's sparse gradient (full fine-tuning) and gradient checkpointing: once
    per model, however many adapters it carries."""
    model.train()
    if not peft:
        sparse_tied_embedding_grads(model)  # no second dense [V, H] gradient for a tied embedding
    if cfg.gradient_checkpointing:  # only the update's plain forward runs in train mode (see eval_mode)
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5.2x; the old name warns
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _has_tokenizer(path) -> bool:
    return (Path(path) / "tokenizer_config.json").is_file()


@contextlib.contextmanager
def eval_mode(model):
    """The model in eval mode for a no-grad pass over cached prompts: with gradient checkpointing, Hugging
    Face turns the KV cache off in train mode. Same values (the agents have no dropout)."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)
