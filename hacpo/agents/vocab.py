"""The chosen tokens' log-probs without full-vocabulary logits for a whole batch.

A causal LM's forward ends in ``logits = lm_head(hidden)``: ``[rows, tokens, V]``. With a real vocabulary
(Gemma-3: V = 262,144; Qwen3: 151,936) that tensor, its ``log_softmax`` copy and its gradient are the largest
activations of an RL step: 16 rows × 100 tokens × 262,144 × 4 B = 1.7 GB each, for 1,600 numbers the loss
reads. :class:`OutputHead` applies the model's own vocabulary projection to the backbone's hidden states in
slices of rows (:func:`chunk_rows`), keeps one log-prob per row, and recomputes a slice's logits in the
backward pass (the fused linear + cross-entropy of Liger-Kernel and Apple's Cut Cross-Entropy, in plain
torch). Peak memory is one slice's logits, whatever V and the batch.

Values equal ``log_softmax(model(...).logits).gather(target)`` row by row; gradients equal autograd's to
float rounding (the slices' weight gradients are summed). Only heads whose maths is known are rebuilt
(:meth:`OutputHead.of`); any other model keeps the full forward.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Logits (floats) one slice may hold: 16 M = 64 MB in fp32; 64 rows of Gemma-3's 262,144, every row of a toy
# model. A pass whose logits fit in one slice runs the model's own forward (:func:`head_for`).
# HACPO_LOGITS_BUDGET overrides it (benchmarks/bench_vocab.py: a huge budget gives the full-logits baseline).
LOGITS_BUDGET = int(os.environ.get("HACPO_LOGITS_BUDGET", 1 << 24))

# Architectures whose causal-LM forward is exactly ``lm_head(hidden)`` (no bias), optionally followed by
# ``cap · tanh(logits / cap)`` with ``config.final_logit_softcapping``; tests/test_vocab.py holds each
# to the model's own logits.
HEADS = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")


def chunk_rows(vocab: int, budget: int) -> int:
    """Rows per slice so that one slice's logits ``[rows, vocab]`` hold at most ``budget`` floats."""
    return max(1, budget // max(1, vocab))


@dataclass(frozen=True)
class OutputHead:
    """A model's vocabulary projection, applied by hand to hidden states ``[..., H]``."""

    backbone: torch.nn.Module  # the decoder stack: input ids → last hidden states
    weight: torch.Tensor  # [V, H], the model's own parameter (tied embeddings included)
    softcap: float | None
    budget: int  # floats of logits per slice

    @staticmethod
    def of(model, budget: int | None = None) -> OutputHead | None:
        """The head of a supported architecture (:data:`HEADS`), else None. A peft wrapper is looked
        through (its ``.model`` is the causal LM, not the backbone): the head and backbone are its inner
        model's, LoRA layers in place, so the active adapter still applies."""
        peft = sys.modules.get("peft")  # a wrapper exists only where peft was imported
        if peft is not None and isinstance(model, peft.PeftModel):
            model = model.base_model.model
        cfg = getattr(model, "config", None)
        lm_head = getattr(model, "lm_head", None)
        if cfg is None or cfg.model_type not in HEADS or not hasattr(model, "model"):
            return None
        if not isinstance(lm_head, torch.nn.Linear) or lm_head.bias is not None:
            return None
        softcap = getattr(cfg, "final_logit_softcapping", None)
        return OutputHead(model.model, lm_head.weight, softcap, LOGITS_BUDGET if budget is None else budget)

    @property
    def vocab(self) -> int:
        return self.weight.shape[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full logits of a few positions (e.g. the one that starts generation), as the model makes them."""
        return _capped(F.linear(hidden, self.weight), self.softcap)

    def token_logprobs(
        self, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
    ) -> torch.Tensor:
        """``log_softmax(logits(hidden) / temperature).gather(targets)`` in float32 (hidden ``[..., H]``)."""
        dev = hidden.device.type
        dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else self.weight.dtype
        flat = _TokenLogprobs.apply(
            hidden.reshape(-1, hidden.shape[-1]),
            self.weight,
            targets.reshape(-1),
            self.softcap,
            chunk_rows(self.vocab, self.budget),
            dtype,
            float(temperature),
        )
        return flat.view(targets.shape)


def head_for(model, tokens: int) -> OutputHead | None:
    """The head to apply by hand when a pass over ``tokens`` positions would make more than
    :data:`LOGITS_BUDGET` logits; None (run the model's own forward) when they fit, or when the architecture
    is not in :data:`HEADS`."""
    head = OutputHead.of(model)
    if head is None or tokens * head.vocab <= head.budget:
        return None
    return head


class _TokenLogprobs(torch.autograd.Function):
    """Log-probs of ``targets`` under ``softcap(h W^T)``, a slice of rows at a time (module docstring).

    Runs with autocast off and casts by hand to ``dtype`` (the autocast dtype, or the weights'), so the
    matmuls round as the model's own ``lm_head`` would under the same autocast; W is cast once per pass,
    not per slice. Saves only ``hidden``, the weight and the targets for the backward. A slice holds at
    most two ``[rows, V]`` float32 buffers at a time (its logits and their softmax, updated in place).
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, softcap, rows, dtype, temperature=1.0):
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)
            out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
            for s in range(0, hidden.shape[0], rows):
                z = _capped(F.linear(hidden[s : s + rows].to(dtype), w).float(), softcap)
                if temperature != 1.0:
                    z.div_(temperature)
                out[s : s + rows] = torch.log_softmax(z, dim=-1).gather(-1, targets[s : s + rows, None])[:, 0]
        ctx.save_for_backward(hidden, weight, targets)
        ctx.softcap, ctx.rows, ctx.dtype, ctx.temperature = softcap, rows, dtype, temperature
        return out

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, targets = ctx.saved_tensors
        softcap, rows, dtype, t = ctx.softcap, ctx.rows, ctx.dtype, ctx.temperature
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w, into_grad = None, False
        if ctx.needs_input_grad[1]:
            into_grad = _INTO_GRAD.on and _dense_fp32(weight.grad)
            grad_w = weight.grad if into_grad else torch.zeros_like(weight, dtype=torch.float32)
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)
            for s in range(0, hidden.shape[0], rows):
                h = hidden[s : s + rows].to(dtype)
                g, tgt = grad[s : s + rows, None] / t, targets[s : s + rows, None]
                z = _capped(F.linear(h, w).float(), softcap)
                # d logp[tgt] / dz = (onehot(tgt) − softmax(z / t)) / t, as autograd's log_softmax backward
                dz = torch.softmax(z if t == 1.0 else z / t, dim=-1).mul_(-g)
                dz.scatter_add_(-1, tgt, g)
                if softcap is not None:  # d/dx cap·tanh(x / cap) = 1 − tanh² = 1 − (z / cap)²
                    dz.mul_(z.div_(softcap).square_().neg_().add_(1))
                del z
                dz = dz.to(dtype)
                if grad_h is not None:
                    grad_h[s : s + rows] = (dz @ w).to(hidden.dtype)
                if grad_w is None:
                    continue
                if dz.dtype == grad_w.dtype:  # accumulate in place: no second [V, H] temporary
                    grad_w.addmm_(dz.t(), h)
                else:  # bf16: the product rounds to bf16 first, as autocast's own lm_head backward does
                    grad_w.add_(dz.t() @ h)
        if into_grad or grad_w is None:  # into_grad: already in weight.grad, nothing for autograd to add
            return grad_h, None, None, None, None, None, None
        return grad_h, grad_w.to(weight.dtype), None, None, None, None, None


class _IntoGrad(threading.local):
    on = False


_INTO_GRAD = _IntoGrad()


def _dense_fp32(grad: torch.Tensor | None) -> bool:
    return grad is not None and grad.dtype == torch.float32 and grad.layout == torch.strided


@contextlib.contextmanager
def head_grads_into_param():
    """During ``loss.backward()`` inside this block, a head's weight gradient is summed straight into the
    weight's existing ``.grad`` (a later micro-batch of a gradient accumulation) instead of into a new
    ``[V, H]`` buffer that autograd then adds: one vocabulary-sized fp32 buffer less at the peak (671 MB for
    Gemma-3-270M). Same sum. Only for ``.backward()``: ``torch.autograd.grad`` inside the block would miss the
    head's share, so nothing but the trainer's update enters it."""
    was, _INTO_GRAD.on = _INTO_GRAD.on, True
    try:
        yield
    finally:
        _INTO_GRAD.on = was


def _capped(z: torch.Tensor, softcap: float | None) -> torch.Tensor:
    return z if softcap is None else torch.tanh(z / softcap) * softcap


def sparse_tied_embedding_grads(model, min_floats: int | None = None) -> bool:
    """Let a tied input embedding send its gradient as a sparse tensor (the rows of the tokens it saw).

    With tied embeddings one ``[V, H]`` weight gets two gradients: the head's (dense: every row of the
    softmax) and the embedding lookup's, which autograd also makes dense by default: another ``V × H`` floats
    (Gemma-3-270M: 671 MB in fp32) to add into the first. Both reach the weight's one gradient buffer, so the
    dense head gradient absorbs the sparse one in place and ``.grad`` stays dense (clipping and fused AdamW
    need that). Untied models keep dense gradients: a sparse one alone would become ``.grad``. Same values,
    summed in another order: only for embeddings of at least :data:`LOGITS_BUDGET` floats (every real
    vocabulary), so the toy agents' runs stay bitwise as before. Returns True when it applied."""
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    if not isinstance(embed, torch.nn.Embedding) or head is None or head.weight is not embed.weight:
        return False
    if embed.weight.numel() < (LOGITS_BUDGET if min_floats is None else min_floats):
        return False
    embed.sparse = True
    return True
