"""Importance ratios: GRPO token ratio, GSPO sequence ratio, HACPO cross-agent ratio (spec §2.1, §2.2, §3.4).

All inputs are per-token tensors ``[R, T]`` (rows × response tokens) with a ``mask`` of response tokens.
"""

from __future__ import annotations

import torch

LOG_RATIO_GUARD = 10.0  # §3.4 numerical guard, symmetric ±10 (§10)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over masked entries (over all entries if ``dim`` is None). Empty rows give 0."""
    m = mask.to(x.dtype)
    if dim is None:
        return (x * m).sum() / m.sum().clamp(min=1.0)
    return (x * m).sum(dim) / m.sum(dim).clamp(min=1.0)


def seq_mean_logp(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``mean_logp_X(y)``: per-row mean token log-prob over the row's response tokens (§1). ``[R]``."""
    return masked_mean(logp, mask, dim=1)


def sequence_log_ratio(new_mean_logp: torch.Tensor, old_mean_logp: torch.Tensor, guard=LOG_RATIO_GUARD):
    """log s = mean_logp_new − mean_logp_old, clamped to ±guard (§2.2 length-normalised ratio; §3.4 guard).

    For a cross row this is Eq. (§3.4): learner's current mean log-prob over its own tokenisation y′ minus
    the generating agent's pre-update mean log-prob over y. Each side is normalised in its own tokenisation,
    so the caller passes ``old_mean_logp`` already reduced (``[R]``).
    """
    return (new_mean_logp - old_mean_logp).clamp(-guard, guard)


def gspo_token_ratio(logp, mask, old_mean_logp, guard=LOG_RATIO_GUARD) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO-token ratio (§2.2 "token-level implementation").

    Each token gets ``exp(log π_θ(y_t) − sg(log π_θ(y_t)) + sg(log s_i))``: its value is the sequence ratio
    s_i and its gradient is s_i·∇log π_θ(y_t), so the token mean reproduces ∇s_i = s_i·∇ mean_t log π_θ.
    Returns ``(s_tok [R, T], s_seq [R])``; ``s_seq`` is detached.

    The guard (§10) holds the value at e^±guard *and* stops the row's gradient there, as both reference codes
    do: clamping only sg(log s) would let a row with log s = 11 and A < 0 pass e^10 times its gradient
    through GSPO's min (a policy blowing up is exactly when the guard matters).
    """
    raw = (seq_mean_logp(logp, mask) - old_mean_logp).detach()
    log_s = raw.clamp(-guard, guard)
    live = (raw.abs() <= guard).to(logp.dtype)[:, None]  # beyond the guard: a constant, no gradient
    s_tok = torch.exp((logp - logp.detach()) * live + log_s[:, None])
    return s_tok, log_s.exp()


def token_ratio(logp: torch.Tensor, old_logp: torch.Tensor, guard=LOG_RATIO_GUARD) -> torch.Tensor:
    """GRPO token ratio r_t = π_θ(y_t)/π_old(y_t) (§2.1), with the same ±guard on the log-ratio."""
    return torch.exp((logp - old_logp).clamp(-guard, guard))
