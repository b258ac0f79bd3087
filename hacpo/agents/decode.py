"""One-token decoding steps for the sampling loop of :func:`hacpo.agents.lm.generate`.

Decoding a tiny model on a CPU is dominated by per-call overhead, not arithmetic: a 3-layer, 335k-parameter
model does ≈ 1 ms of matmuls per step for 128 rows, while a Hugging Face forward call with a growing
``DynamicCache`` costs ≈ 3 ms (module dispatch, mask building, a ``torch.cat`` of every layer's cache per
step). :class:`KVDecoder` runs the same Llama / Qwen3 decoder maths straight on the model's own parameters,
with preallocated key/value buffers and the q/k/v and gate/up projections fused into one matmul each.
:class:`HFDecoder` calls the model's ``forward`` and serves every other architecture.

Both start from :class:`~hacpo.agents.lm.EncodedPrompts` (the prompt prefill always runs through the model's
own ``forward``, so the cached keys are Hugging Face's) and agree with each other to float rounding
(``tests/test_lm.py``). Only no-grad decoding uses them; training log-probs always run the model's forward.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from hacpo.agents.lm import EncodedPrompts


def cache_kwarg(model) -> str:
    """Newer transformers 5.x call ``past_key_values`` ``cache``; older 5.x releases know only the former."""
    return _cache_kwarg_of(type(model))


@functools.cache
def _cache_kwarg_of(cls) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


class HFDecoder:
    """Decoding steps through ``model.forward`` and a ``DynamicCache`` (any causal LM)."""

    def __init__(self, model, prompts: EncodedPrompts, rows: torch.Tensor, max_new_tokens: int):
        self.model = model
        self.cache = {cache_kwarg(model): prompts.cache_for(rows)}
        self.attn = prompts.mask[rows].long() if prompts.mask is not None else None

    def step(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, V]`` after feeding ``tok`` ``[B]`` at positions ``pos`` ``[B]``."""
        if self.attn is not None:
            self.attn = torch.cat([self.attn, torch.ones_like(self.attn[:, :1])], dim=1)
        out = self.model(
            input_ids=tok[:, None],
            attention_mask=self.attn,
            position_ids=pos[:, None] if self.attn is not None else None,
            use_cache=True,
            **self.cache,
        )
        return out.logits[:, -1, :]


class KVDecoder:
    """Decoding steps for Llama- and Qwen3-architecture models, written against their parameters."""

    @staticmethod
    def supports(model) -> bool:
        """Plain Llama / Qwen3 decoders only: default RoPE, SiLU MLP, no biases, no sliding windows."""
        cfg = getattr(model, "config", None)
        if cfg is None or cfg.model_type not in ("llama", "qwen3"):
            return False
        rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
        if rotary is None or getattr(rotary, "rope_type", None) != "default":
            return False
        if getattr(rotary, "attention_scaling", 1.0) != 1.0 or getattr(cfg, "pretraining_tp", 1) != 1:
            return False
        if cfg.hidden_act != "silu" or any(getattr(cfg, k, False) for k in ("attention_bias", "mlp_bias")):
            return False
        layer_types = getattr(cfg, "layer_types", None) or ["full_attention"]
        sliding = getattr(cfg, "use_sliding_window", False)
        return not sliding and all(t == "full_attention" for t in layer_types)

    def __init__(self, model, prompts: EncodedPrompts, rows: torch.Tensor, max_new_tokens: int):
        cfg, core = model.config, model.model
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = prompts.keys[0].shape[-1]
        self.eps = cfg.rms_norm_eps
        self.qk_norm = cfg.model_type == "qwen3"
        linear = _autocast_weights(model.lm_head.weight.device.type)
        w = _applied_weight
        self.core, self.lm_head = core, linear(w(model.lm_head))
        self.inv_freq = core.rotary_emb.inv_freq.float()
        self.layers = []
        for layer in core.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append(
                dict(
                    ln1=layer.input_layernorm.weight,
                    qkv=linear(w(attn.q_proj), w(attn.k_proj), w(attn.v_proj)),
                    q_norm=attn.q_norm.weight if self.qk_norm else None,
                    k_norm=attn.k_norm.weight if self.qk_norm else None,
                    o=linear(w(attn.o_proj)),
                    ln2=layer.post_attention_layernorm.weight,
                    gate_up=linear(w(mlp.gate_proj), w(mlp.up_proj)),
                    down=linear(w(mlp.down_proj)),
                )
            )
        b, tp = rows.shape[0], prompts.length
        self.length = tp
        self.keys, self.values = [], []
        for k, v in zip(prompts.keys, prompts.values, strict=True):
            kb = k.new_empty(b, k.shape[1], tp + max_new_tokens, k.shape[3])
            vb = torch.empty_like(kb)
            kb[:, :, :tp] = k[rows]
            vb[:, :, :tp] = v[rows]
            self.keys.append(kb)
            self.values.append(vb)
        self.key_ok = None  # [B, 1, 1, Tp + N] real-token mask, only for left-padded prompts
        if prompts.mask is not None:
            ok = torch.ones(b, tp + max_new_tokens, dtype=torch.bool, device=rows.device)
            ok[:, :tp] = prompts.mask[rows]
            self.key_ok = ok[:, None, None, :]

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm in float32, back in ``x``'s dtype (as Hugging Face's; a no-op cast in fp32)."""
        xf = x.float()
        return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    @torch.no_grad()
    def step(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, V]`` after feeding ``tok`` ``[B]`` at positions ``pos`` ``[B]``."""
        b, h, hk, d = tok.shape[0], self.heads, self.kv_heads, self.head_dim
        at = self.length
        self.length += 1
        freqs = pos[:, None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [B, 1, d]
        x = self.core.embed_tokens(tok)  # [B, hidden]
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)  # in the activations' dtype, as HF's rotary
        for layer, kb, vb in zip(self.layers, self.keys, self.values, strict=True):
            qkv = F.linear(self._norm(x, layer["ln1"]), layer["qkv"])
            q, k, v = qkv.view(b, h + 2 * hk, d).split((h, hk, hk), dim=1)
            if self.qk_norm:
                q, k = self._norm(q, layer["q_norm"]), self._norm(k, layer["k_norm"])
            kb[:, :, at] = self._rope(k, cos, sin)
            vb[:, :, at] = v
            q = self._rope(q, cos, sin).view(b, hk, h // hk, d)  # query heads grouped by their kv head
            scores = (q @ kb[:, :, : at + 1].transpose(-1, -2)) * d**-0.5  # [B, hk, groups, L]
            if self.key_ok is not None:
                scores = scores.masked_fill(~self.key_ok[:, :, :, : at + 1], float("-inf"))
            probs = scores.softmax(dim=-1, dtype=torch.float32).to(vb.dtype)  # as HF's eager attention
            out = (probs @ vb[:, :, : at + 1]).reshape(b, h * d)
            x = x + F.linear(out, layer["o"])
            gate, up = F.linear(self._norm(x, layer["ln2"]), layer["gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer["down"])
        return F.linear(self._norm(x, self.core.norm.weight), self.lm_head)


@torch.no_grad()
def _applied_weight(layer: torch.nn.Module) -> torch.Tensor:
    """The weight ``layer``'s forward applies: a LoRA layer's (peft) is its base weight plus the active
    adapters' ΔW = (alpha / rank) · B A, none while adapters are off (the KL reference) or merged in; a
    plain layer's is its ``weight``. Without this the decoder would sample from the base alone."""
    base = getattr(layer, "base_layer", None)
    if base is None:
        return layer.weight
    weight = base.weight
    if layer.disable_adapters or layer.merged:
        return weight
    for name in layer.active_adapters:
        if name in layer.lora_A:
            weight = weight + layer.get_delta_weight(name).to(weight.dtype)
    return weight


def _autocast_weights(device_type: str):
    """``linear(*weights)``: the weights of one matmul (several: fused along the output dimension), cast once
    to the autocast dtype when an autocast is on (training's ``precision: bf16``: fp32 master weights).

    Autocast casts a matmul's fp32 operands at every call and caches only parameters that require grad; the
    fused q/k/v and gate/up weights (a ``torch.cat`` of parameters, made under ``no_grad``) would be re-cast
    at every decoding step: ≈ 5.6 GB of memory traffic a step for Qwen3-1.7B. The cast is the same rounding
    autocast does, so the logits are bitwise those of casting at every step (``tests/test_lm.py``)."""
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None

    def linear(*weights: torch.Tensor) -> torch.Tensor:
        if dtype is not None and weights[0].dtype == torch.float32:
            weights = tuple(w.to(dtype) for w in weights)  # before the cat: no fused fp32 copy
        return weights[0] if len(weights) == 1 else torch.cat(weights)

    return linear


def decoder_for(model, prompts: EncodedPrompts, rows: torch.Tensor, max_new_tokens: int):
    """The fastest decoder that supports ``model``: the direct KV decoder on the CPU, where its speed-up
    was measured (a Hugging Face forward call costs more than the token's matmuls there); Hugging Face's own
    forward elsewhere (on CUDA its kernels and caches are the well-kept path, and the decoder's gain is not
    measured)."""
    on_cpu = next(model.parameters()).device.type == "cpu"
    cls = KVDecoder if on_cpu and KVDecoder.supports(model) else HFDecoder
    return cls(model, prompts, rows, max_new_tokens)
