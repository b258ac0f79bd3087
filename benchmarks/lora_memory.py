"""GPU memory of a HACPO run's fixed part by arithmetic: full fine-tuning against LoRA adapters.

    python benchmarks/lora_memory.py [--rank 8] [--out docs/lora_memory.md]

Each model is built on torch's meta device from its public architecture values (no weights, no download),
a LoRA adapter attached by peft as hacpo attaches it (every linear of the blocks), and the parameters
counted exactly. The fixed part per agent:

- full fine-tuning (the local engine: fp32 master weights): weights + gradients + AdamW's two states
  (4 B each) + a reference copy when ``kl_beta > 0`` (4 B): 20 B per parameter;
- LoRA: the frozen base once (4 B per parameter in fp32, 2 B in bf16 as OpenRLHF's ``param_dtype: bf16``
  holds it) + the adapter's weights, gradients and AdamW states (16 B per adapter parameter); the reference
  is the base with the adapter off, no copy.

Transients (the KV cache while generating, the update's activations) come on top and are the same for both;
the KV cache of ``rows × tokens`` is given for each model (bf16: 2 B × 2 (K, V) × layers × KV heads × head
dim).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class Arch:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int = 151_936
    tied: bool = True


# The public config.json values of the Qwen3 base models (config/one-gpu.yaml's pair; the paper's 4B + 8B)
QWEN3 = {
    "Qwen3-0.6B-Base": Arch("Qwen3-0.6B-Base", 1024, 28, 16, 8, 128, 3072),
    "Qwen3-1.7B-Base": Arch("Qwen3-1.7B-Base", 2048, 28, 16, 8, 128, 6144),
    "Qwen3-4B-Base": Arch("Qwen3-4B-Base", 2560, 36, 32, 8, 128, 9728),
    "Qwen3-8B-Base": Arch("Qwen3-8B-Base", 4096, 36, 32, 8, 128, 12288, tied=False),
}
PAIRS = {
    "config/one-gpu.yaml (Qwen3-0.6B + 1.7B)": ("Qwen3-0.6B-Base", "Qwen3-1.7B-Base"),
    "the paper's Qwen3-4B-Base + 8B-Base": ("Qwen3-4B-Base", "Qwen3-8B-Base"),
}


def counts(arch: Arch, rank: int) -> tuple[int, int]:
    """(model parameters, LoRA parameters at ``rank``), counted on the meta device (transformers, peft)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from hacpo.agents import adapters
    from hacpo.config import LoraSpec

    config = Qwen3Config(
        hidden_size=arch.hidden, num_hidden_layers=arch.layers, num_attention_heads=arch.heads,
        num_key_value_heads=arch.kv_heads, head_dim=arch.head_dim, intermediate_size=arch.intermediate,
        vocab_size=arch.vocab, tie_word_embeddings=arch.tied,
    )  # fmt: skip
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
        total = sum(p.numel() for p in model.parameters())
        peft_model = adapters.attach(model, LoraSpec(rank=rank), ".")
        lora = sum(p.numel() for p in adapters.trainable_parameters(peft_model))
    return total, lora


def kv_cache_gb(arch: Arch, rows: int, tokens: int) -> float:
    return 2 * 2 * arch.layers * arch.kv_heads * arch.head_dim * rows * tokens / GB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--rows", type=int, default=64, help="rows generated at once (8 prompts × G 8)")
    ap.add_argument("--tokens", type=int, default=4096, help="prompt + response tokens per row")
    ap.add_argument("--out", help="also write the table (Markdown) here")
    args = ap.parse_args()
    lines = [
        f"| pair | parameters | LoRA r{args.rank} parameters | full FT fixed (fp32, with reference) | "
        "LoRA fixed, fp32 base | LoRA fixed, bf16 base | KV cache, larger model |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, names in PAIRS.items():
        params = [counts(QWEN3[n], args.rank) for n in names]
        p = sum(c[0] for c in params)
        lora = sum(c[1] for c in params)
        full = 20 * p / GB
        fp32 = (4 * p + 16 * lora) / GB
        bf16 = (2 * p + 16 * lora) / GB
        kv = max(kv_cache_gb(QWEN3[n], args.rows, args.tokens) for n in names)
        lines.append(
            f"| {label} | {p / 1e9:.2f} B | {lora / 1e6:.1f} M | {full:.0f} GB | {fp32:.1f} GB "
            f"| {bf16:.1f} GB "
            f"| {kv:.1f} GB ({args.rows} × {args.tokens}) |"
        )
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
