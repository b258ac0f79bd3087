"""An agent of the local engine: its model (with its frozen reference and LoRA adapter), tokenizer,
optimizer and sampling stream, loaded from a checkpoint directory."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

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
    prompt_cache: dict = field(default_factory=dict)

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


def load_learner(ref, cfg: TrainConfig, device, index: int, with_ref: bool) -> Agent:
    """An agent to train: its model, reference model (KL), tokenizer, optimizer and sampling generator."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    tok = AutoTokenizer.from_pretrained(ref.path)
    model = AutoModelForCausalLM.from_pretrained(ref.path, dtype=torch.float32).to(device)
    lora, peft_model = cfg.agent_adapter(index), None
    if lora is not None:  # the base frozen and held once; the KL reference is the adapter switched off
        peft_model = adapters.attach(model, lora, ref.path, what=f"agent {ref.name!r}: adapter.lora")
        model, with_ref = adapters.inner(peft_model), False
    model.train()
    if peft_model is None:
        sparse_tied_embedding_grads(model)  # no second dense [V, H] gradient for a tied embedding
    if cfg.gradient_checkpointing:  # only the update's plain forward runs in train mode (see eval_mode)
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5.2x; the old name warns
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    ref_model = None
    if with_ref:
        ref_model = AutoModelForCausalLM.from_pretrained(ref.path, dtype=torch.float32).to(device).eval()
        ref_model.requires_grad_(False)
    # fused: one kernel for all parameters instead of a loop over them (2.5× faster step on a CPU)
    opt = torch.optim.AdamW(
        adapters.trainable_parameters(model),
        lr=cfg.lr,
        betas=cfg.betas,
        weight_decay=cfg.weight_decay,
        fused=True,
    )
    gen = torch.Generator(device=device).manual_seed(cfg.seed * 1000 + index)
    stops = stop_token_ids(tok, model)
    if not stops:
        raise ValueError(f"agent {ref.name!r}: {ref.path} has no stop id (no eos_token or generation_config)")
    pad = pad_token_id(tok, stops)
    return Agent(ref.name, ref.path, model, ref_model, tok, opt, gen, stops, pad, peft_model)


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
