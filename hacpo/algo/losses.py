"""Policy losses: GRPO, GSPO, Naive, HACPO (spec §2, §3.3–3.6) and SGT's rescue term, plus k3 KL (§3.6).

One entry point, :func:`policy_loss`, takes a :class:`MiniBatch` and a :class:`LossSpec` (built from the
method registry) and returns ``(loss, metrics)``. Advantages, ω and old log-probs are constants; the maths
here is batched over rows with no Python loop over samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from ._checks import check_all_finite, check_rows, check_same_shape
from .ratios import (
    LOG_RATIO_GUARD,
    gspo_token_ratio,
    masked_mean,
    token_ratio,
)

LossKind = Literal["grpo", "gspo", "naive", "hacpo", "sgt"]
LOSS_KINDS: tuple[str, ...] = get_args(LossKind)
CrossClip = Literal["stepwise", "static", "none"]


@dataclass(frozen=True)
class LossSpec:
    """Every knob of the per-mini-batch loss. Defaults are the paper's (§7)."""

    kind: LossKind = "hacpo"
    eps_low: float = 3e-4  # GSPO self clip (GRPO uses 0.2 / 0.28)
    eps_high: float = 4e-4
    cross_clip_low: float = 0.8  # the lower bound 1−δ itself, never δ (§3.5 naming trap)
    delta_step: float = 0.025
    cross_clip: CrossClip = "stepwise"  # "static": δ_step = 0; "none": c = s (ablations, §8)
    alpha: float = 1.0  # exponential IS exponent α ≥ 0 (§3.4)
    omega_in_loss: bool = True  # False: ω^(j,k) := 1 in the cross term (HACPO − ω, §8)
    kl_beta: float = 1e-3
    log_ratio_guard: float = LOG_RATIO_GUARD

    def __post_init__(self):
        if self.kind not in LOSS_KINDS:
            raise ValueError(f"unknown loss kind {self.kind!r}; choose one of {', '.join(LOSS_KINDS)}")
        if self.cross_clip not in ("stepwise", "static", "none"):
            raise ValueError(f"unknown cross_clip {self.cross_clip!r}; choose stepwise, static or none")
        check_cross_clip_low(self.cross_clip_low)
        for name in ("alpha", "delta_step", "kl_beta", "eps_low", "eps_high"):
            check_non_negative(getattr(self, name), name)


# The one check of each HACPO hyper-parameter: LossSpec runs them, and the run and workflow configs use them
# as field validators (hacpo.config), so every config error names its key.
def check_cross_clip_low(v: float) -> float:
    """1−δ, the cross clip's lower bound (§3.5): in [0.5, 1]. δ itself (e.g. 0.2) is the classic mistake."""
    if not 0.5 <= v <= 1.0:
        raise ValueError(
            f"cross_clip_low={v} is the lower clip bound 1−δ, in [0.5, 1] (paper: 0.8 or 0.9); "
            "if you meant δ=0.2, write cross_clip_low: 0.8"
        )
    return v


def check_non_negative(v: float, name: str = "value") -> float:
    """α (§3.4), δ_step (§3.5), the KL β and the clip ε are ≥ 0."""
    if not v >= 0:
        raise ValueError(f"{name}={v} must be ≥ 0")
    return v


@dataclass
class MiniBatch:
    """One learner's mini-batch, rows = own + cross sequences in the learner's tokenisation.

    ``logp``      [R, T] current learner token log-probs (requires grad)
    ``mask``      [R, T] response-token mask
    ``adv``       [R]    learner's advantages A^(k) (constants)
    ``old_mean_logp`` [R] ratio denominator: own rows → learner's pre-update mean log-prob; cross rows →
                          generating agent's pre-update mean log-prob over *its* tokenisation (§3.4)
    ``is_own``    [R] bool; ``omega`` [R] ω^(j,k) for cross rows (ignored on own rows)
    ``old_logp``  [R, T] token-level old log-probs (GRPO only); ``ref_logp`` [R, T] reference (KL, own rows)
    """

    logp: torch.Tensor
    mask: torch.Tensor
    adv: torch.Tensor
    old_mean_logp: torch.Tensor
    is_own: torch.Tensor | None = None
    omega: torch.Tensor | None = None
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    n_total: float | None = None  # N_m when this batch is a part of the mini-batch (dead rows, micro-batches)
    # own response tokens of the whole mini-batch, when this batch is part of it: the KL term is then this
    # part's share Σ k3 / own_tokens, and the parts sum to the mini-batch's token mean (micro-batching)
    own_tokens: float | None = None

    def validate(self) -> None:
        if self.logp.dim() != 2:
            raise ValueError(f"logp must be [rows, tokens], got {tuple(self.logp.shape)}")
        check_same_shape(logp=self.logp, mask=self.mask)
        r = self.logp.shape[0]
        if r == 0:
            raise ValueError("mini-batch is empty; it needs at least one row")
        check_rows(r, adv=self.adv, old_mean_logp=self.old_mean_logp)
        for name in ("is_own", "omega"):
            if getattr(self, name) is not None:
                check_rows(r, **{name: getattr(self, name)})
        for name in ("old_logp", "ref_logp"):
            if getattr(self, name) is not None:
                check_same_shape(logp=self.logp, **{name: getattr(self, name)})
        # the learner's own log-probs last: bad input is named first; padding may hold anything
        logp = torch.where(self.mask.bool(), self.logp.detach(), 0.0)
        check_all_finite(adv=self.adv, old_mean_logp=self.old_mean_logp, omega=self.omega, logp=logp)

    def own_rows(self) -> torch.Tensor:
        if self.is_own is None:
            return torch.ones(self.adv.shape[0], dtype=torch.bool, device=self.adv.device)
        return self.is_own.bool()


def stepwise_lower_bound(m: int, cross_clip_low: float = 0.8, delta_step: float = 0.025) -> float:
    """lo_m = min(1, (1−δ) + m·δ_step), m = optimizer updates already done in this step (§3.5, T11)."""
    if m < 0:
        raise ValueError(f"update index m must be ≥ 0, got {m}")
    return min(1.0, cross_clip_low + m * delta_step)


def cross_bounds(spec: LossSpec, m: int) -> tuple[float, float]:
    """Clip interval for cross ratios at update m: stepwise, static (δ_step = 0) or none (±inf)."""
    if spec.cross_clip == "none":
        return float("-inf"), float("inf")
    step = spec.delta_step if spec.cross_clip == "stepwise" else 0.0
    return stepwise_lower_bound(m, spec.cross_clip_low, step), 1.0


def ppo_clipped(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """Where the PPO-style clip is active, i.e. the surrogate max(−A·r, −A·clip(r)) has zero gradient:
    A > 0 above 1+ε_h, A < 0 below 1−ε_l (§2.1 token ratios, §2.2 sequence ratios). ``adv`` broadcasts."""
    return ((adv > 0) & (ratio > 1 + eps_high)) | ((adv < 0) & (ratio < 1 - eps_low))


def cross_in_bounds(s: torch.Tensor, spec: LossSpec, m: int) -> torch.Tensor:
    """Cross ratios inside [lo_m, hi]: where the clamp c = clamp(s, lo_m, hi) passes a gradient (§3.5)."""
    lo, hi = cross_bounds(spec, m)
    return (s >= lo) & (s <= hi)


def k3_kl_tokens(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Low-variance k3 estimator per token, r = log π_ref − log π_θ, k3 = e^r − r − 1 (§3.6)."""
    r = (ref_logp - logp).clamp(-20.0, 20.0)
    return torch.exp(r) - r - 1.0


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k3 KL (:func:`k3_kl_tokens`), token mean over ``mask`` (§3.6)."""
    return masked_mean(k3_kl_tokens(logp, ref_logp), mask)


def clipped_surrogate(ratio, adv, eps_low, eps_high) -> torch.Tensor:
    """PPO's clipped surrogate per token, max(−A·r, −A·clip(r, 1−ε_l, 1+ε_h)) (§2.1); ``adv`` broadcasts."""
    return torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high))


def gspo_row_loss(s_tok, adv, eps_low, eps_high) -> torch.Tensor:
    """PPO-clipped GSPO surrogate per token, max(−A·s, −A·clip(s, 1−ε_l, 1+ε_h)) (§2.2, §3.6 own row)."""
    return clipped_surrogate(s_tok, adv[:, None], eps_low, eps_high)


def hacpo_cross_row_loss(s_tok, adv, omega, lo, hi, alpha) -> torch.Tensor:
    """Cross term −ω·A·c·sg(c)^α with c = clamp(s, lo, hi), a hard clamp (§3.5–3.6).

    Inside the bounds ∇ = −ω·sg(s)^(α+1)·A·∇ mean log π (T3); outside, c is constant and ∇ = 0.
    """
    c = s_tok.clamp(lo, hi)
    return -(omega * adv)[:, None] * c * c.detach().pow(alpha)


def rescue_row_loss(logp, adv) -> torch.Tensor:
    """SGT's rescue term per token, −A·log π_θ(y′_t): its row mean has the gradient −A·∇ mean_t log π, the
    score direction toward a peer's verified success, with no importance ratio (docs/algorithm.md, SGT)."""
    return -adv[:, None] * logp


def _stats(prefix: str, x: torch.Tensor, where: torch.Tensor) -> dict[str, torch.Tensor]:
    """Mean, min and max of ``x`` over the rows ``where`` (at least one), as tensors: no host sync."""
    x = x.detach().double()
    n = where.sum()
    return {
        f"{prefix}_mean": torch.where(where, x, 0.0).sum() / n,
        f"{prefix}_min": torch.where(where, x, torch.inf).min(),
        f"{prefix}_max": torch.where(where, x, -torch.inf).max(),
    }


def _share(flags: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """The fraction of rows ``where`` that ``flags`` marks (a tensor: no host sync)."""
    return (flags & where).sum().double() / where.sum()


Metrics = dict[str, "torch.Tensor | float"]


def metric_floats(metrics: list[Metrics]) -> list[dict[str, float]]:
    """Loss metrics as Python floats, every tensor of every dict moved to the host in one transfer: an
    engine calls it once per step (on a GPU each ``float(tensor)`` would be a device sync)."""
    keys = [(i, k) for i, d in enumerate(metrics) for k, v in d.items() if isinstance(v, torch.Tensor)]
    out = [{k: float(v) for k, v in d.items() if not isinstance(v, torch.Tensor)} for d in metrics]
    by_device: dict[torch.device, list[tuple[int, str]]] = {}
    for i, k in keys:  # stacked where they are, so each device's values come over in one copy
        by_device.setdefault(metrics[i][k].device, []).append((i, k))
    for at in by_device.values():
        values = torch.stack([metrics[i][k].detach().double() for i, k in at]).cpu().tolist()
        for (i, k), v in zip(at, values, strict=True):
            out[i][k] = v
    return [{k: d[k] for k in m} for d, m in zip(out, metrics, strict=True)]  # the metrics' own key order


def policy_loss(batch: MiniBatch, spec: LossSpec, m: int = 0) -> tuple[torch.Tensor, Metrics]:
    """Per-learner, per-mini-batch loss L_m = (1/N_m)·Σ_i l_i + β·KL_own (§3.6), for every loss kind.

    - ``grpo``: token ratio, clip 0.2/0.28 from ``spec``, token-mean over the mini-batch (§2.1).
    - ``gspo``: GSPO-token, seq-mean-token-mean (§2.2).
    - ``naive``: the GSPO surrogate on *all* rows; cross rows use the ratio against ``old_mean_logp``
      (the learner's own pre-update log-prob of the borrowed answer by default, ``naive_cross_ratio:
      self_old``, or the source's with ``source``); advantages are the plain joint normalisation; no ω,
      no α, no asymmetric or stepwise clip (§2.5, the spec's "most plausible" definition — chosen because
      it keeps exactly HACPO's rollout/update budget and changes only the four mechanisms).
    - ``hacpo``: own rows GSPO; cross rows −ω·A·c·sg(c)^α with c = clamp(s, lo_m, 1) (§3.6).
    - ``sgt``: own rows GSPO; cross rows are SGT's rescue set, −A·mean_t log π (:func:`rescue_row_loss`).
    KL (k3) is averaged over own rows only; a mini-batch with no own row has no KL term. A part of a
    mini-batch (``n_total``, ``own_tokens`` set: micro-batches) returns its share of both terms.

    Metrics: ``s_homo_*``/``s_hete_*`` (mean/min/max of sequence ratios), clip fractions, ω, mean advantage,
    the advantages summed over own and over cross rows (``*_sum``: a step sums them over its updates). They
    are 0-d tensors (``rows`` and ``cross_lo`` plain floats), so the loss makes two host syncs, not one per
    number: an engine turns a step's metrics into floats at once with :func:`metric_floats`.
    """
    batch.validate()
    own = batch.own_rows()
    cross = ~own
    has_own, has_cross = torch.stack([own.any(), cross.any()]).tolist()  # with validate's, the only syncs
    if spec.kind in ("grpo", "gspo") and has_cross:
        raise ValueError(f"loss kind {spec.kind!r} is single-agent: the mini-batch must hold own rows only")
    n_rows = batch.logp.shape[0]
    adv = batch.adv.detach().double()
    metrics: Metrics = {
        "rows": float(n_rows),
        "own_rows": own.sum().double(),
        "adv_mean": adv.mean(),
        # summed over the step's rows (its updates' sum): what own rows and cross rows pull in all
        "own_adv_sum": torch.where(own, adv, 0.0).sum(),
        "cross_adv_sum": torch.where(cross, adv, 0.0).sum(),
    }

    if spec.kind == "grpo":
        if batch.old_logp is None:
            raise ValueError("GRPO needs token-level old_logp")
        r = token_ratio(batch.logp, batch.old_logp, spec.log_ratio_guard)
        a = batch.adv[:, None]
        tok = clipped_surrogate(r, a, spec.eps_low, spec.eps_high)
        pg = masked_mean(tok, batch.mask)  # token-mean over the mini-batch
        clipped = ppo_clipped(r, a, spec.eps_low, spec.eps_high)
        metrics["own_clip_frac"] = masked_mean(clipped.double(), batch.mask)
        metrics.update(_stats("s_homo", masked_mean(r.detach(), batch.mask, dim=1), own))
    else:
        s_tok, s = gspo_token_ratio(batch.logp, batch.mask, batch.old_mean_logp, spec.log_ratio_guard)
        tok = gspo_row_loss(s_tok, batch.adv, spec.eps_low, spec.eps_high)
        a = batch.adv
        own_clipped = ppo_clipped(s, a, spec.eps_low, spec.eps_high)
        if spec.kind == "hacpo" and has_cross:
            if spec.omega_in_loss and batch.omega is None:
                raise ValueError(
                    "HACPO cross rows need omega (ω^(j,k) per row); pass omega or use omega_in_loss=False"
                )
            lo, hi = cross_bounds(spec, m)
            w = batch.omega if spec.omega_in_loss else torch.ones_like(a)
            tok_cross = hacpo_cross_row_loss(s_tok, a, w.to(s_tok.dtype), lo, hi, spec.alpha)
            tok = torch.where(cross[:, None], tok_cross, tok)
            inside = cross_in_bounds(s, spec, m)
            metrics.update(
                cross_lo=lo if lo != float("-inf") else 0.0,
                cross_in_bounds_frac=_share(inside, cross),
                cross_below_frac=_share(s < lo, cross),
                cross_above_frac=_share(s > hi, cross),
            )
            if batch.omega is not None:
                metrics["omega_mean"] = _stats("omega", batch.omega, cross)["omega_mean"]
        elif spec.kind == "sgt" and has_cross:
            tok = torch.where(cross[:, None], rescue_row_loss(batch.logp, a.to(batch.logp.dtype)), tok)
            metrics["rescue_rows"] = cross.sum().double()
        elif has_cross:  # naive: the GSPO clip on cross rows too
            metrics["cross_clip_frac"] = _share(own_clipped, cross)
        row = masked_mean(tok, batch.mask, dim=1)
        pg = row.sum() / (
            batch.n_total or n_rows
        )  # seq-mean over N_m = own + cross rows, equal weight (§3.6)
        if has_own:
            metrics["own_clip_frac"] = _share(own_clipped, own)
            metrics.update(_stats("s_homo", s, own))
        if has_cross:
            metrics.update(_stats("s_hete", s, cross))

    loss = pg
    if spec.kl_beta > 0 and batch.ref_logp is not None and has_own:
        own_mask = batch.mask * own[:, None]  # own rows by arithmetic: a boolean index is a device sync
        if batch.own_tokens is None:
            kl = k3_kl(batch.logp, batch.ref_logp, own_mask)
        else:  # this part's share of the mini-batch's token mean
            k3 = k3_kl_tokens(batch.logp, batch.ref_logp)
            kl = (k3 * own_mask).sum() / batch.own_tokens
        loss = loss + spec.kl_beta * kl
        metrics["kl"] = kl.detach().double()
    metrics["pg_loss"] = pg.detach().double()
    metrics["loss"] = loss.detach().double()
    return loss, metrics


def rows_with_gradient(batch: MiniBatch, spec: LossSpec, m: int, s: torch.Tensor) -> torch.Tensor:
    """Rows whose loss has a non-zero gradient given the current sequence ratios ``s`` ([R], from a no-grad
    forward with the *current* weights). Dropping the other rows from the backward is exact, provided the
    loss keeps dividing by the full N_m. Own rows always keep a gradient while the KL term is on."""
    own = batch.own_rows()
    if spec.kind == "grpo":  # token-mean normaliser: keep every row
        return torch.ones_like(own)
    a = batch.adv
    live = (a != 0) & ~ppo_clipped(s, a, spec.eps_low, spec.eps_high)
    if spec.kind == "hacpo":
        live = torch.where(own, live, (a != 0) & cross_in_bounds(s, spec, m))
    elif spec.kind == "sgt":  # a rescue row has no ratio and no clip
        live = torch.where(own, live, a != 0)
    if spec.kl_beta > 0 and batch.ref_logp is not None:
        live = live | own
    return live
