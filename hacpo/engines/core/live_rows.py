"""The loss with the backward restricted to rows that have a gradient: engine scheduling around
:func:`hacpo.algo.policy_loss`, which it calls once, exactly (docs/design.md, "Dead rows").

Rows whose loss has no gradient at the current weights (:func:`hacpo.algo.rows_with_gradient`) need no forward
with gradient and no backward: HACPO's cross rows whose clamp is flat, and rows whose advantage is 0 that no
KL term reads. A no-grad pass over the rows that may be such (the *probe*) tells which; the others run with
gradient. The loss then sees every row's current log-probs, the probed ones as constants, so its value,
gradient and metrics equal the full batch's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from hacpo.algo import LossSpec, MiniBatch, losses, rows_with_gradient
from hacpo.algo.losses import Metrics
from hacpo.algo.ratios import seq_mean_logp, sequence_log_ratio

LogProbs = Callable[[torch.Tensor | None, bool], torch.Tensor]  # (rows or None for all, detach) → [R', T]


def policy_loss_live_rows(
    batch: MiniBatch, spec: LossSpec, m: int, logprobs: LogProbs, skip_dead_rows: bool = True
) -> tuple[torch.Tensor | None, Metrics]:
    """:func:`~hacpo.algo.policy_loss` with the backward restricted to rows that have a gradient (exact).

    ``batch.logp`` is not read (it may be None) and ``batch`` is not changed; ``logprobs(rows, detach)``
    returns the learner's current token log-probs of those rows (all rows for ``None``), so an engine decides
    how to run its model. GRPO (its token-mean normaliser) and ``skip_dead_rows=False`` run the loss on
    every row with gradient. The loss is None when no row has a gradient: the caller then steps its optimizer
    on zero gradients (not on missing ones, which AdamW would skip), exactly as the full batch would.
    """
    own = batch.own_rows()
    kl_reads = own if (spec.kl_beta > 0 and batch.ref_logp is not None) else torch.zeros_like(own)
    probe = (batch.adv == 0) & ~kl_reads  # no gradient whatever the weights
    if spec.kind == "hacpo" and spec.cross_clip != "none":
        probe = probe | ~own
    # the rows to probe, and whether there are any, from one device sync (their count sizes the probe)
    probe_rows = torch.nonzero(probe).flatten() if skip_dead_rows and spec.kind != "grpo" else probe[:0]
    if not len(probe_rows):
        return losses.policy_loss(dataclasses.replace(batch, logp=logprobs(None, False)), spec, m)
    with torch.no_grad():
        logp_probe = logprobs(probe_rows, True)
    mean_probe = seq_mean_logp(logp_probe, batch.mask[probe_rows])
    s = torch.ones_like(batch.adv)
    log_s = sequence_log_ratio(mean_probe, batch.old_mean_logp[probe_rows], spec.log_ratio_guard)
    s[probe_rows] = log_s.exp().to(s.dtype)
    live = rows_with_gradient(batch, spec, m, s) | ~probe
    live_rows = torch.nonzero(live).flatten()
    logp = torch.zeros_like(batch.mask, dtype=logp_probe.dtype)
    logp[probe_rows] = logp_probe
    if len(live_rows):  # the live rows' log-probs with gradient, in place of their probed values
        logp = logp.index_put((live_rows,), logprobs(live_rows, False).to(logp.dtype))
    loss, metrics = losses.policy_loss(dataclasses.replace(batch, logp=logp), spec, m)
    metrics["backward_rows_frac"] = len(live_rows) / len(live)
    return (loss if len(live_rows) else None), metrics
