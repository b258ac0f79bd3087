"""Hand-made rows for the loss tests (test_algo_losses.py, test_algo_sharing.py): random logits and tokens,
and the closed-form gradients that autograd is compared with, written apart from the code under test."""

from __future__ import annotations

import torch

F64 = torch.float64


def t(x, **kw):
    return torch.tensor(x, dtype=F64, **kw)


def mask_of(lengths, width):
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


def hand_mean(logp, mask):
    """Per-row mean over response tokens, written out here independently of the code under test."""
    m = mask.to(logp.dtype)
    return (logp * m).sum(1) / m.sum(1)


def random_rows(lengths, seed=0, vocab=6):
    """Leaf logits [R, T, V] with random tokens; T = max length + 1 so every row has padding."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths) + 1
    logits = torch.randn(len(lengths), width, vocab, generator=g, dtype=F64).requires_grad_()
    tokens = torch.randint(vocab, (len(lengths), width), generator=g)
    return logits, tokens, mask_of(lengths, width)


def logp_of(logits, tokens):
    return torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)


def closed_form_grad(logits, tokens, mask, coef):
    """∇ of Σ_i coef_i · mean_t log π(y_i,t) with respect to the logits (coef constant)."""
    lp = logp_of(logits, tokens)
    (g,) = torch.autograd.grad((coef * hand_mean(lp, mask)).sum(), logits)
    return g


def old_mean_for(logp, mask, s_target):
    """Denominator that makes the sequence ratio exp(mean logp − old) equal s_target."""
    return (hand_mean(logp.detach(), mask) - torch.log(t(s_target))).detach()
