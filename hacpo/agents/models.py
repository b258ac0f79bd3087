"""Randomly initialised tiny causal LMs (Llama or Qwen3 architecture) sized for CPU toy runs."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

ARCHS = ("llama", "qwen3")


@dataclass(frozen=True)
class AgentArch:
    arch: str = "llama"  # "llama" | "qwen3"
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    intermediate: int = 256
    max_positions: int = 256  # RoPE: no parameters depend on it; paper-style char prompts need ≈ 200

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"unknown arch {self.arch!r}; use one of {ARCHS}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if min(self.hidden, self.layers, self.heads, self.intermediate, self.max_positions) < 1:
            raise ValueError(f"all sizes must be ≥ 1: {self}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> AgentArch:
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"unknown AgentArch keys {sorted(unknown)}; known: {list(cls.__dataclass_fields__)}"
            )
        return cls(**d)


def model_config(arch: AgentArch, tokenizer):
    """The transformers config: SDPA attention, tied embeddings, vocab and special ids from ``tokenizer``."""
    from transformers import LlamaConfig, Qwen3Config

    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=arch.hidden,
        num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads,
        num_key_value_heads=arch.heads,
        intermediate_size=arch.intermediate,
        max_position_embeddings=arch.max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",
    )
    if arch.arch == "llama":
        return LlamaConfig(**common)
    # Qwen3 defaults head_dim to 128 regardless of hidden size; tie it to hidden / heads like Llama.
    return Qwen3Config(head_dim=arch.hidden // arch.heads, use_sliding_window=False, **common)


def build_model(arch: AgentArch, tokenizer, seed: int):
    """A fresh ``LlamaForCausalLM`` / ``Qwen3ForCausalLM`` (float32, train mode), deterministic in ``seed``.

    The global torch RNG is left untouched (initialisation runs inside ``fork_rng``).
    """
    from transformers import GenerationConfig, LlamaForCausalLM, Qwen3ForCausalLM

    config = model_config(arch, tokenizer)
    cls = LlamaForCausalLM if arch.arch == "llama" else Qwen3ForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model.float().train()


def param_count(model) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
