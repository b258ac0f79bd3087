"""The HACPO loss on OpenRLHF micro-batches, normalised per optimizer step across accumulation and DP.

hacpo.algo's mini-batch loss (§3.6) is ``L_m = (1/N_m)·Σ_i l_i + β·KL_own`` over one optimizer step's rows,
KL = token mean of k3 over the own rows' tokens. OpenRLHF runs that step as ``gas`` micro-batches on each
of ``dp`` ranks; DeepSpeed scales every micro-batch loss by 1/gas and averages gradients over ranks. So
each micro-batch contributes ``Σ_mb l_i / (N/(dp·gas)) + β·Σ_mb own k3 / (T_own/(dp·gas))`` with N and
T_own counted over the whole step on every rank (:class:`StepNorm`): the gradient is then exactly
hacpo.algo's on the full step, whatever the micro-batch split (``tests/openrlhf/test_joint.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from hacpo.algo import LossSpec, MiniBatch, policy_loss

from .rows import ADV, IS_SELF, OLD_MEAN_LOGP, OMEGA, info_column


@dataclass(frozen=True)
class StepNorm:
    """One optimizer step's loss normalisers, pre-divided by dp·gas (see the module docstring)."""

    rows: float  # N_m / (dp·gas): every row of the step, own and cross, empty ones included
    own_tokens: float  # own response tokens of the step / (dp·gas)
    m: int  # the step's index within this ppo_train (drives the stepwise lower bound lo_m)
    scale: float = 1.0  # dp·gas: a micro-batch loss over this is its share of the step's


def step_norm(
    micro_batches: Sequence,
    m: int,
    dp_size: int = 1,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> StepNorm:
    """Normalisers of one optimizer step from its ``gas`` micro-batches on this rank (summed over ranks
    by ``all_reduce`` when data-parallel)."""
    gas = len(micro_batches)
    counts = torch.zeros(2, dtype=torch.float64)
    for exp in micro_batches:
        own = info_column(exp, IS_SELF).bool()
        counts[0] += exp.action_mask.shape[0]
        counts[1] += float(exp.action_mask[own].sum())
    if all_reduce is not None:
        counts = all_reduce(counts)
    scale = dp_size * gas
    return StepNorm(rows=float(counts[0]) / scale, own_tokens=float(counts[1]) / scale, m=m, scale=scale)


def microbatch_loss(
    logp: torch.Tensor,
    exp,
    spec: LossSpec,
    norm: StepNorm,
) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the step loss (module docstring), and hacpo.algo's metrics for its rows
    (``loss``, ``pg_loss``, ``kl``: its share of the step's, as the local engine's micro-batches report them).

    ``logp``: the learner's current action log-probs ``[B, A]`` (OpenRLHF's ``Actor`` output); ``exp``: the
    micro-batch with the ``info`` fields of :mod:`.rows`. The loss is :func:`hacpo.algo.policy_loss` itself
    (own rows GSPO, cross rows the HACPO term with lo_m or Naive's, k3 KL on own rows) with the step's row
    and own-token counts as normalisers (``n_total``, ``own_tokens``).
    """
    mask = exp.action_mask.bool()
    own = info_column(exp, IS_SELF).to(logp.device).bool()
    batch = MiniBatch(
        logp=logp,
        mask=mask,
        adv=info_column(exp, ADV).to(logp.device, torch.float32),
        old_mean_logp=info_column(exp, OLD_MEAN_LOGP).to(logp.device, torch.float32),
        is_own=own,
        omega=info_column(exp, OMEGA).to(logp.device),
        ref_logp=None if exp.base_action_log_probs is None else exp.base_action_log_probs.to(logp.dtype),
        n_total=norm.rows,
        own_tokens=norm.own_tokens,
    )
    loss, metrics = policy_loss(batch, spec, norm.m)
    for key in ("loss", "pg_loss", "kl"):  # this micro-batch's share of the step's (they add up to it)
        if key in metrics:
            metrics[key] /= norm.scale
    return loss, metrics
