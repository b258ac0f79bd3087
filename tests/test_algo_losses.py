"""Ratios and losses: GRPO (§2.1), GSPO (§2.2), Naive (§2.5), HACPO cross term (§3.3–3.6), k3 KL (§3.6),
stepwise bounds (§3.5), rows_with_gradient; properties T3, T4, T5, T6, T10, T11.

Expected values are computed by hand from the spec (arithmetic in the comments); gradients are checked against
the spec's closed forms, e.g. ∇l = −ω·s^(α+1)·A·∇ mean_t log π / N_m, evaluated by autograd on the plain
expression Σ_i coef_i · mean_t log π_i with the hand-derived constant coef_i.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from loss_cases import F64, closed_form_grad, logp_of, mask_of, old_mean_for, random_rows, t

from hacpo.algo import (
    LossSpec,
    MiniBatch,
    cross_bounds,
    gspo_token_ratio,
    hacpo_cross_row_loss,
    k3_kl,
    metric_floats,
    policy_loss,
    rows_with_gradient,
    seq_mean_logp,
    sequence_log_ratio,
    stepwise_lower_bound,
    token_ratio,
)

GSPO = LossSpec(kind="gspo", eps_low=3e-4, eps_high=4e-4, kl_beta=0.0)
GRPO = LossSpec(kind="grpo", eps_low=0.2, eps_high=0.28, kl_beta=0.0)
HACPO = LossSpec(kind="hacpo", cross_clip_low=0.8, delta_step=0.025, alpha=1.0, kl_beta=0.0)


# ------------------------------------------------------------------------------------------------------------
# ratios (§2.1, §2.2, §3.4)
# ------------------------------------------------------------------------------------------------------------


def test_gspo_sequence_ratio_is_length_normalised():
    # row 0: tokens [−1, −2, −3] → mean −2; old −2.1 → s = e^{0.1} = 1.1051709
    # row 1: tokens [−.5, −1.5, (pad 99)] → mean −1; old −.9 → s = e^{−0.1} = .9048374
    # (the unnormalised sum ratio of row 0 would be e^{0.3})
    logp = t([[-1.0, -2.0, -3.0], [-0.5, -1.5, 99.0]], requires_grad=True)
    mask = mask_of([3, 2], 3)
    s_tok, s = gspo_token_ratio(logp, mask, t([-2.1, -0.9]))
    torch.testing.assert_close(s, t([math.exp(0.1), math.exp(-0.1)]))
    torch.testing.assert_close(s_tok, s[:, None].expand(2, 3))  # every token carries the sequence ratio
    assert not s.requires_grad
    torch.testing.assert_close(seq_mean_logp(logp, mask), t([-2.0, -1.0]))
    # token gradient: ∇ mean_t s_tok = s·∇ mean_t log π → d/dlogp_t = s / |y|
    (s_tok * mask).sum(1).div(mask.sum(1)).sum().backward()
    torch.testing.assert_close(
        logp.grad, t([[math.exp(0.1) / 3] * 3, [math.exp(-0.1) / 2, math.exp(-0.1) / 2, 0.0]])
    )


def test_log_ratio_guard_symmetric_10():
    torch.testing.assert_close(
        sequence_log_ratio(t([0.0, 0.0, 0.0]), t([-15.0, 15.0, 0.5])), t([10.0, -10.0, -0.5])
    )
    torch.testing.assert_close(
        token_ratio(t([[0.0, 0.0]]), t([[-30.0, math.log(2.0)]])), t([[math.exp(10.0), 0.5]])
    )


# ------------------------------------------------------------------------------------------------------------
# §2.1 GRPO: token ratio, clip .2/.28, token-mean over the mini-batch
# ------------------------------------------------------------------------------------------------------------


def grpo_case():
    # row 0, A = +1, 3 tokens, r = [1.1, 1.5, .7]; row 1, A = −2, 2 tokens + 1 pad, r = [.5, 1.4]
    old = t([[math.log(0.5)] * 3, [math.log(0.5), math.log(0.5), 0.0]])
    ratios = t([[1.1, 1.5, 0.7], [0.5, 1.4, 1.0]])
    logp = (old + ratios.log()).detach()
    logp[1, 2] = 5.0  # padding: ratio e^5, must be ignored
    logp.requires_grad_()
    return MiniBatch(
        logp=logp, mask=mask_of([3, 2], 3), adv=t([1.0, -2.0]), old_mean_logp=t([0.0, 0.0]), old_logp=old
    )


def test_grpo_token_mean_loss_hand_computed():
    # token losses −min(r·A, clip(r, .8, 1.28)·A):
    #   row 0 (A = 1): r 1.1 → −1.1; r 1.5 → clip 1.28 → −1.28; r .7 → min(.7, .8) = .7 → −.7
    #   row 1 (A = −2): r .5 → min(−1, −1.6) = −1.6 → 1.6; r 1.4 → min(−2.8, −2.56) = −2.8 → 2.8
    # token-mean over the 5 response tokens: (−1.1 − 1.28 − .7 + 1.6 + 2.8)/5 = 1.32/5 = .264
    # (seq-mean-token-mean would be (−3.08/3 + 4.4/2)/2 = .58667)
    batch = grpo_case()
    loss, metrics = policy_loss(batch, GRPO)
    assert loss.item() == pytest.approx(0.264, abs=1e-12)
    # clipped on the favoured side: (A>0, r>1.28) row0 r=1.5 and (A<0, r<.8) row1 r=.5 → 2/5
    assert metrics["own_clip_frac"] == pytest.approx(0.4)
    # gradient d/dlogp_t = −A·r_t/5 where unclipped, 0 where clipped:
    #   row 0: −1.1/5 = −.22, 0, −.7/5 = −.14; row 1: 0, 2.8/5 = .56, pad 0
    loss.backward()
    torch.testing.assert_close(batch.logp.grad, t([[-0.22, 0.0, -0.14], [0.0, 0.56, 0.0]]))


def test_grpo_needs_token_old_logp():
    b = grpo_case()
    b.old_logp = None
    with pytest.raises(ValueError, match="old_logp"):
        policy_loss(b, GRPO)


# ------------------------------------------------------------------------------------------------------------
# §2.2 GSPO: value (seq-mean-token-mean) and gradient (T4)
# ------------------------------------------------------------------------------------------------------------


def test_gspo_loss_value_hand_computed():
    # rows of lengths 1, 2, 3, 2, 1; bounds [1 − 3e-4, 1 + 4e-4] = [.9997, 1.0004]
    #   r0 A=+1, s=e^{.0002} inside           → l = −s
    #   r1 A=+2, s=e^{.001} > 1.0004 favoured → l = −2·1.0004 = −2.0008
    #   r2 A=−1, s=e^{−.001} < .9997 favoured → l = +.9997
    #   r3 A=−1, s=e^{.001} (not favoured)    → l = +e^{.001}
    #   r4 A=+1, s=e^{−.001} (not favoured)   → l = −e^{−.001}
    # L = Σ l / 5 (seq-mean, each row's tokens carry the same value)
    #   = (−1.00020002 − 2.0008 + .9997 + 1.00100050 − .99900050)/5 = −1.99930002/5 = −.39986000
    lengths = [1, 2, 3, 2, 1]
    log_s = [0.0002, 0.001, -0.001, 0.001, -0.001]
    mask = mask_of(lengths, 3)
    logp = t([[-1.0, 0, 0], [-1.0, -2.0, 0], [-0.5, -1.0, -1.5], [-2.0, -4.0, 0], [-3.0, 0, 0]])
    logp = logp.masked_fill(~mask, 7.0).requires_grad_()
    means = [-1.0, -1.5, -1.0, -3.0, -3.0]
    old = t([m - ls for m, ls in zip(means, log_s, strict=True)])
    batch = MiniBatch(logp=logp, mask=mask, adv=t([1.0, 2.0, -1.0, -1.0, 1.0]), old_mean_logp=old)
    loss, metrics = policy_loss(batch, GSPO)
    e = math.exp
    expected = (-e(0.0002) - 2.0008 + 0.9997 + e(0.001) - e(-0.001)) / 5
    assert expected == pytest.approx(-0.39986000, abs=1e-8)
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert metrics["own_clip_frac"] == pytest.approx(2 / 5)
    assert metrics["s_homo_max"] == pytest.approx(e(0.001))
    assert metrics["s_homo_min"] == pytest.approx(e(-0.001))
    assert "kl" not in metrics and "s_hete_mean" not in metrics


def test_t4_gspo_gradient_closed_form():
    # T4: inside the clip, ∇l_i = −A_i·s_i·∇ mean log π / N; zero when clipped on the side favoured by A
    rows = [  # (A, s, gradient?)
        (1.0, 1.0002, True),  # inside
        (-1.0, 0.9998, True),  # inside
        (1.0, 1.001, False),  # A>0, s>1+ε_high → clipped
        (-1.0, 0.999, False),  # A<0, s<1−ε_low → clipped
        (1.0, 0.999, True),  # A>0, s<1−ε_low: the unclipped term is the min
        (-1.5, 1.001, True),  # A<0, s>1+ε_high: the unclipped term is the min
        (0.0, 1.0, False),  # A = 0
    ]
    logits, tokens, mask = random_rows([3, 5, 2, 4, 1, 6, 3], seed=1)
    logp = logp_of(logits, tokens)
    adv = t([r[0] for r in rows])
    s = t([r[1] for r in rows])
    batch = MiniBatch(logp=logp, mask=mask, adv=adv, old_mean_logp=old_mean_for(logp, mask, s.tolist()))
    loss, _ = policy_loss(batch, GSPO)
    (grad,) = torch.autograd.grad(loss, logits)
    live = t([float(r[2]) for r in rows])
    coef = -adv * s * live / len(rows)
    torch.testing.assert_close(grad, closed_form_grad(logits, tokens, mask, coef), rtol=1e-9, atol=1e-12)
    assert grad[2].abs().max() == 0 and grad[3].abs().max() == 0 and grad[6].abs().max() == 0


def test_log_ratio_guard_stops_the_gradient_beyond_it():
    # §10 (corrected 2026-12-04): one own 2-token row with log s = 11 and A = −1 passes no gradient, as in
    # both references; clamping only sg(log s) would pass −A·e^10·∇ mean log π ≈ 1.1e4 × through GSPO's min.
    # The same row at log s = 9.9 passes −A·e^9.9/1 (its closed form, N = 1); a cross row with no clip too.
    logits, tokens, mask = random_rows([2], seed=3)
    for log_s, live in [(11.0, False), (-11.0, False), (9.9, True)]:
        for spec, own in [(GSPO, True), (replace(HACPO, cross_clip="none"), False)]:
            logp = logp_of(logits, tokens)
            old = old_mean_for(logp, mask, [math.exp(log_s)])
            own_row = torch.tensor([own])
            batch = MiniBatch(logp, mask, adv=t([-1.0]), old_mean_logp=old, is_own=own_row, omega=t([1.0]))
            loss, metrics = policy_loss(batch, spec)
            (grad,) = torch.autograd.grad(loss, logits)
            s = math.exp(max(-10.0, min(10.0, log_s)))
            assert metrics["s_homo_max" if own else "s_hete_max"] == pytest.approx(s)  # the value is clamped
            coef = t([s * (s if not own else 1.0) if live else 0.0])  # −A·s (own) / −A·s^(α+1) (cross, α=1)
            expected = closed_form_grad(logits, tokens, mask, coef)
            torch.testing.assert_close(grad, expected, rtol=1e-9, atol=0.0)


def test_gspo_rejects_cross_rows():
    b = MiniBatch(
        logp=t([[-1.0]]),
        mask=mask_of([1], 1),
        adv=t([1.0]),
        old_mean_logp=t([-1.0]),
        is_own=torch.tensor([False]),
    )
    for kind in ("gspo", "grpo"):
        with pytest.raises(ValueError, match="own rows only"):
            policy_loss(b, LossSpec(kind=kind))


# ------------------------------------------------------------------------------------------------------------
# §3.4–3.6 HACPO cross term (T3), identical agents (T6), down-weight only (T10)
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 1.0, 3.0])
@pytest.mark.parametrize("m", [0, 2])
def test_t3_cross_gradient_closed_form(alpha, m):
    # lo_m = .8 + m·.025: .8 (m=0) or .85 (m=2); hi = 1
    lo = 0.8 + m * 0.025
    rows = [  # (own?, A, ω, s)
        (False, 1.3, 2.0, 0.9),  # inside
        (False, -0.7, 0.5, 0.95),  # inside
        (False, 0.4, 1.5, 0.86),  # inside for both m
        (False, 1.0, 1.5, 0.84),  # inside at m=0, below lo at m=2
        (False, 1.0, 1.5, 0.7),  # below lo → constant
        (False, -2.0, 1.0, 1.1),  # above 1 → constant
        (False, 1.0, 3.0, 1.05),  # above 1 → constant, even with A>0
        (False, -1.0, 0.2, 0.75),  # below lo with A<0 → constant
        (True, 0.5, 9.0, 1.0001),  # own row, GSPO inside (ω ignored)
    ]
    n = len(rows)
    logits, tokens, mask = random_rows([2, 4, 3, 5, 1, 3, 2, 4, 3], seed=2)
    logp = logp_of(logits, tokens)
    own = torch.tensor([r[0] for r in rows])
    adv, w, s = (t([r[i] for r in rows]) for i in (1, 2, 3))
    batch = MiniBatch(
        logp=logp, mask=mask, adv=adv, old_mean_logp=old_mean_for(logp, mask, s.tolist()), is_own=own, omega=w
    )
    spec = LossSpec(kind="hacpo", alpha=alpha, kl_beta=0.0)
    loss, metrics = policy_loss(batch, spec, m=m)
    # value: own l = −A·s; cross l = −ω·A·c^(1+α), c = clamp(s, lo, 1)
    c = s.clamp(lo, 1.0)
    l_hand = torch.where(own, -adv * s, -w * adv * c ** (1 + alpha))
    assert loss.item() == pytest.approx(l_hand.sum().item() / n, abs=1e-12)
    # gradient: cross ∇l = −ω·s^(α+1)·A·∇ mean log π / N inside [lo, 1], 0 outside; own ∇l = −A·s·∇ mean /N
    inside = (s >= lo) & (s <= 1.0)
    coef = (
        torch.where(own, -adv * s, torch.where(inside, -w * s ** (alpha + 1) * adv, torch.zeros_like(s))) / n
    )
    (grad,) = torch.autograd.grad(loss, logits)
    torch.testing.assert_close(grad, closed_form_grad(logits, tokens, mask, coef), rtol=1e-9, atol=1e-12)
    for i in range(n):
        if not own[i] and not inside[i]:
            assert grad[i].abs().max().item() == 0.0
    assert metrics["cross_in_bounds_frac"] == pytest.approx(inside[~own].double().mean().item())
    assert metrics["cross_lo"] == pytest.approx(lo)


def test_t6_identical_agents_ratio_exactly_one():
    # learner == generator, no update: the denominator is the same mean log-prob → s = 1 exactly
    for dtype in (torch.float32, F64):
        logits, tokens, mask = random_rows([3, 7, 1, 5], seed=3)
        logits = logits.detach().to(dtype).requires_grad_()
        logp = logp_of(logits, tokens)
        old = seq_mean_logp(logp.detach(), mask)
        _, s = gspo_token_ratio(logp, mask, old)
        assert torch.equal(s, torch.ones(4, dtype=dtype))
        own = torch.tensor([True, True, False, False])
        adv = torch.tensor([0.5, -0.5, 1.0, -2.0], dtype=dtype)
        w = torch.tensor([1.0, 1.0, 2.0, 0.5], dtype=dtype)
        batch = MiniBatch(logp=logp, mask=mask, adv=adv, old_mean_logp=old, is_own=own, omega=w)
        loss, metrics = policy_loss(batch, HACPO)
        assert metrics["s_hete_min"] == 1.0 and metrics["s_hete_max"] == 1.0
        assert metrics["s_homo_min"] == 1.0 and metrics["s_homo_max"] == 1.0
        assert metrics["cross_in_bounds_frac"] == 1.0
        # value: (−.5 + .5 − 2·1·1 − .5·(−2)·1)/4 = −1/4; s = 1 is inside [lo, 1], so the gradient flows
        assert loss.item() == pytest.approx(-0.25, abs=1e-6)
        (grad,) = torch.autograd.grad(loss, logits)
        coef = torch.tensor([-0.5, 0.5, -2.0, 1.0], dtype=dtype) / 4
        torch.testing.assert_close(grad, closed_form_grad(logits, tokens, mask, coef))


@settings(max_examples=300, deadline=None)
@given(
    s=st.floats(min_value=1e-3, max_value=50.0),
    alpha=st.floats(min_value=0.0, max_value=4.0),
    m=st.integers(min_value=0, max_value=12),
    low=st.sampled_from([0.8, 0.9]),
    step=st.sampled_from([0.0, 0.01, 0.025]),
)
def test_t10_cross_weight_at_most_one(s, alpha, m, low, step):
    # T10: c·sg(c)^α ≤ 1 for every cross row (with A = −1, ω = 1 the row loss equals that weight)
    lo = stepwise_lower_bound(m, low, step)
    s_tok = t([[s, s]])
    val = hacpo_cross_row_loss(s_tok, t([-1.0]), t([1.0]), lo, 1.0, alpha)
    assert bool((val <= 1.0 + 1e-12).all())
    c = min(max(s, lo), 1.0)
    assert val[0, 0].item() == pytest.approx(c ** (1 + alpha), rel=1e-9)


def test_t5_hacpo_reduces_to_gspo_without_cross_rows():
    # T5: own rows only (and ω ≡ 1) → HACPO loss == GSPO loss, value and gradient, with KL on
    logits, tokens, mask = random_rows([4, 2, 5, 3, 1, 6], seed=4)
    logp = logp_of(logits, tokens)
    adv = t([1.0, -0.5, 0.0, 2.0, -1.0, 0.7])
    s = [1.0001, 0.9999, 1.0, 1.001, 0.999, 0.9]
    ref = logp.detach() + 0.1 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(9), dtype=F64)
    common = dict(logp=logp, mask=mask, adv=adv, old_mean_logp=old_mean_for(logp, mask, s), ref_logp=ref)
    b_gspo = MiniBatch(**common)
    b_hacpo = MiniBatch(**common, is_own=torch.ones(6, dtype=torch.bool), omega=torch.ones(6, dtype=F64))
    l1, m1 = policy_loss(b_gspo, LossSpec(kind="gspo", kl_beta=1e-3))
    for m in (0, 3):
        l2, m2 = policy_loss(b_hacpo, LossSpec(kind="hacpo", kl_beta=1e-3, alpha=3.0), m=m)
        assert l2.item() == pytest.approx(l1.item(), abs=1e-14)
        (g1,) = torch.autograd.grad(l1, logits, retain_graph=True)
        (g2,) = torch.autograd.grad(l2, logits, retain_graph=True)
        torch.testing.assert_close(g1, g2, rtol=0, atol=1e-15)
        assert m2["kl"] == pytest.approx(m1["kl"])


# ------------------------------------------------------------------------------------------------------------
# §3.6 combined HACPO mini-batch: 2 own + 2 cross, values, metrics and ablations
# ------------------------------------------------------------------------------------------------------------


def combined_batch(with_ref=True):
    # own0: tokens [−1, −2] (mean −1.5), A = +1, s = 1;  own1: [−.5], A = −.5, s = 1
    # cross0: [−1, −3, −2] (mean −2), A = +2, ω = 2, s = .9;
    # cross1: [−.25, −.75] (mean −.5), A = −1, ω = .5, s = .7
    # own rows get ω = 7 to show that ω is ignored there
    logp = t([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0], [-1.0, -3.0, -2.0], [-0.25, -0.75, 0.0]])
    mask = mask_of([2, 1, 3, 2], 3)
    logp = logp.masked_fill(~mask, -9.0).requires_grad_()
    old = t([-1.5, -0.5, -2.0 - math.log(0.9), -0.5 - math.log(0.7)])
    # KL reference: own0 token 0 r = ref − logp = +1, all other own tokens r = 0; cross rows anything
    ref = t([[0.0, -2.0, 0.0], [-0.5, 0.0, 0.0], [3.0, 3.0, 3.0], [-5.0, 2.0, 0.0]]) if with_ref else None
    return MiniBatch(
        logp=logp,
        mask=mask,
        adv=t([1.0, -0.5, 2.0, -1.0]),
        old_mean_logp=old,
        is_own=torch.tensor([True, True, False, False]),
        omega=t([7.0, 7.0, 2.0, 0.5]),
        ref_logp=ref,
    )


def test_combined_hacpo_value_and_metrics():
    # l: own0 −1·1 = −1; own1 +.5·1 = .5; cross0 c = .9 → −2·2·.9·.9 = −3.24; cross1 s = .7 < .8 → c = .8 →
    #    −.5·(−1)·.8·.8 = .32;  Σ = −3.42 → pg = −3.42/4 = −.855
    # KL (k3, own tokens only): own0 t0 r = 1 → e − 1 − 1 = .718281828; the other two own tokens 0
    #    → token mean .718281828/3 = .239427276; L = −.855 + .001·.239427276 = −.854760572724
    batch = combined_batch()
    loss, m = policy_loss(batch, LossSpec(kind="hacpo", alpha=1.0, kl_beta=1e-3), m=0)
    kl = (math.e - 2.0) / 3
    assert m["pg_loss"] == pytest.approx(-0.855, abs=1e-12)
    assert m["kl"] == pytest.approx(kl, abs=1e-12)
    assert loss.item() == pytest.approx(-0.855 + 1e-3 * kl, abs=1e-12)
    assert loss.item() == pytest.approx(-0.854760572724, abs=1e-11)
    assert m["s_homo_mean"] == pytest.approx(1.0) and m["s_homo_min"] == pytest.approx(1.0)
    assert m["s_homo_max"] == pytest.approx(1.0)
    assert m["s_hete_mean"] == pytest.approx(0.8) and m["s_hete_min"] == pytest.approx(0.7)
    assert m["s_hete_max"] == pytest.approx(0.9)
    assert m["cross_in_bounds_frac"] == pytest.approx(0.5)
    assert m["own_clip_frac"] == 0.0
    assert m["omega_mean"] == pytest.approx(1.25)  # (2 + .5)/2, cross rows only
    assert m["adv_mean"] == pytest.approx(0.375)  # (1 − .5 + 2 − 1)/4
    assert m["cross_lo"] == pytest.approx(0.8)


def test_combined_hacpo_gradient():
    # β = 0: d/dlogp_t = coef_i/|y_i| with coef = ∂l_i/∂(mean logp_i)/4:
    #   own0 −A·s = −1 → −.25/2 = −.125 per token; own1 +.5 → .125/1; cross0 −ω·A·s^2 = −2·2·.81 = −3.24 →
    #   −.81/3 = −.27 per token; cross1 clipped → 0
    batch = combined_batch()
    loss, _ = policy_loss(batch, LossSpec(kind="hacpo", alpha=1.0, kl_beta=0.0))
    loss.backward()
    torch.testing.assert_close(
        batch.logp.grad, t([[-0.125, -0.125, 0], [0.125, 0, 0], [-0.27] * 3, [0, 0, 0]])
    )


@pytest.mark.parametrize(
    "spec, m, expected",
    [
        # ω^(j,k) := 1: cross0 −1·2·.81 = −1.62; cross1 −1·(−1)·.64 = .64 → (−1 + .5 − 1.62 + .64)/4 = −.37
        (LossSpec(kind="hacpo", omega_in_loss=False, kl_beta=0.0), 0, -0.37),
        # c = s: cross1 −.5·(−1)·.7·.7 = .245 → (−1 + .5 − 3.24 + .245)/4 = −.87375
        (LossSpec(kind="hacpo", cross_clip="none", kl_beta=0.0), 0, -0.87375),
        # α = 0: cross0 −2·2·.9 = −3.6; cross1 .5·.8 = .4 → (−1 + .5 − 3.6 + .4)/4 = −.925
        (LossSpec(kind="hacpo", alpha=0.0, kl_beta=0.0), 0, -0.925),
        # α = 3: cross0 −4·.9^4 = −2.6244; cross1 .5·.8^4 = .2048 → (−1 + .5 − 2.6244 + .2048)/4 = −.7299
        (LossSpec(kind="hacpo", alpha=3.0, kl_beta=0.0), 0, -0.7299),
        # m = 2, lo = .85: cross1 c = .85 → .5·.7225 = .36125 → (−1 + .5 − 3.24 + .36125)/4 = −.8446875
        (LossSpec(kind="hacpo", kl_beta=0.0), 2, -0.8446875),
        # m = 5, lo = .925: both cross clipped up to .925: −4·.855625 = −3.4225; .5·.855625 = .4278125
        #   → (−1 + .5 − 3.4225 + .4278125)/4 = −.873671875
        (LossSpec(kind="hacpo", kl_beta=0.0), 5, -0.873671875),
        # static (no stepwise) at m = 3: lo stays .8 → same as m = 0: −.855
        (LossSpec(kind="hacpo", cross_clip="static", kl_beta=0.0), 3, -0.855),
        # δ_step = .01 at m = 3: lo = .83 → cross1 .5·.83² = .34445 → (−1 + .5 − 3.24 + .34445)/4 = −.8488875
        (LossSpec(kind="hacpo", delta_step=0.01, kl_beta=0.0), 3, -0.8488875),
        # Naive: GSPO clip on all rows, no ω/α: cross0 A=2, s=.9 (< .9997, not favoured) → −1.8;
        #   cross1 A=−1, s=.7 (favoured) → +.9997 → (−1 + .5 − 1.8 + .9997)/4 = −.325075
        (LossSpec(kind="naive", kl_beta=0.0), 0, -0.325075),
        (LossSpec(kind="naive", kl_beta=0.0), 3, -0.325075),
    ],
)
def test_combined_ablation_values(spec, m, expected):
    loss, _ = policy_loss(combined_batch(), spec, m=m)
    assert loss.item() == pytest.approx(expected, abs=1e-12)


def test_no_omega_ablation_gradient_and_naive_gradient():
    # HACPO − ω: cross0 coef −1·2·.81/4 = −.405 → −.135 per token (3 tokens)
    b = combined_batch()
    loss, _ = policy_loss(b, LossSpec(kind="hacpo", omega_in_loss=False, kl_beta=0.0))
    loss.backward()
    torch.testing.assert_close(b.logp.grad[2], t([-0.135] * 3))
    # Naive: cross0 coef −A·s/4 = −2·.9/4 = −.45 → −.15 per token; cross1 clipped (favoured) → 0
    b = combined_batch()
    loss, m = policy_loss(b, LossSpec(kind="naive", kl_beta=0.0))
    loss.backward()
    torch.testing.assert_close(b.logp.grad[2:], t([[-0.15] * 3, [0.0] * 3]))
    assert m["cross_clip_frac"] == pytest.approx(0.5)
    # no-clip: cross1 now has gradient −ω·A·s²/4 = −.5·(−1)·.49/4 = .06125 → /2 tokens = .030625
    b = combined_batch()
    loss, _ = policy_loss(b, LossSpec(kind="hacpo", cross_clip="none", kl_beta=0.0))
    loss.backward()
    torch.testing.assert_close(b.logp.grad[3], t([0.030625, 0.030625, 0.0]))


def test_n_total_divides_by_global_count():
    # N_m = 8 (e.g. other micro-batches elsewhere): pg = −3.42/8 = −.4275
    b = combined_batch(with_ref=False)
    b.n_total = 8
    loss, _ = policy_loss(b, LossSpec(kind="hacpo", kl_beta=1e-3))
    assert loss.item() == pytest.approx(-0.4275, abs=1e-12)


def test_micro_batch_parts_sum_to_the_mini_batch_loss_and_gradient():
    """Rows {own0, cross0} and {own1, cross1} as two parts with the mini-batch's N_m = 4 and own-token
    count 3: the parts' losses and gradients add up to the whole mini-batch's (micro-batching)."""
    spec = LossSpec(kind="hacpo", kl_beta=0.5)  # a large β so the KL's normaliser matters
    whole = combined_batch()
    loss, _ = policy_loss(whole, spec, m=1)
    loss.backward()
    total = torch.zeros(())
    grad = torch.zeros_like(whole.logp)
    for rows in ([0, 2], [1, 3]):
        part = combined_batch()
        logp = part.logp.detach()[rows].clone().requires_grad_()
        sub = MiniBatch(
            logp=logp, mask=part.mask[rows], adv=part.adv[rows], old_mean_logp=part.old_mean_logp[rows],
            is_own=part.is_own[rows], omega=part.omega[rows], ref_logp=part.ref_logp[rows],
            n_total=4, own_tokens=3.0,
        )  # fmt: skip
        part_loss, _ = policy_loss(sub, spec, m=1)
        part_loss.backward()
        total = total + part_loss.detach()
        grad[rows] = logp.grad
    assert total.item() == pytest.approx(loss.item(), abs=1e-12)
    torch.testing.assert_close(grad, whole.logp.grad)


# ------------------------------------------------------------------------------------------------------------
# §3.6 k3 KL over own rows only
# ------------------------------------------------------------------------------------------------------------


def test_k3_kl_hand_computed():
    # own row a: logp [−1, −2], ref [−1.5, −1] → r = [−.5, 1]
    #   → k3 = e^{−.5} + .5 − 1 = .10653066, e − 2 = .71828183
    # own row b: logp [−.3], ref [−.3] → 0 → token mean (.10653066 + .71828183 + 0)/3 = .27493750
    logp = t([[-1.0, -2.0], [-0.3, 0.0]])
    ref = t([[-1.5, -1.0], [-0.3, 50.0]])
    mask = mask_of([2, 1], 2)
    expected = (math.exp(-0.5) - 0.5 + math.e - 2.0) / 3
    assert expected == pytest.approx(0.2749375, abs=1e-7)
    assert k3_kl(logp, ref, mask).item() == pytest.approx(expected, abs=1e-12)


def test_kl_own_rows_only_in_policy_loss():
    # same two own rows + one cross row; changing the cross row's ref_logp leaves the loss unchanged
    logp = t([[-1.0, -2.0], [-0.3, 0.0], [-1.0, -1.0]], requires_grad=True)
    mask = mask_of([2, 1, 2], 2)
    kw = dict(
        logp=logp,
        mask=mask,
        adv=t([0.0, 0.0, 0.0]),
        old_mean_logp=t([-1.5, -0.3, -1.0]),
        is_own=torch.tensor([True, True, False]),
        omega=t([1.0, 1.0, 1.0]),
    )
    spec = LossSpec(kind="hacpo", kl_beta=0.5)
    expected_kl = (math.exp(-0.5) - 0.5 + math.e - 2.0) / 3
    losses = []
    for cross_ref in ([-1.0, -1.0], [3.0, -7.0]):
        ref = t([[-1.5, -1.0], [-0.3, 0.0], cross_ref])
        loss, metrics = policy_loss(MiniBatch(**kw, ref_logp=ref), spec)
        assert metrics["kl"] == pytest.approx(expected_kl, abs=1e-12)
        losses.append(loss.item())
    # A ≡ 0 → pg = 0; L = .5·KL
    assert losses[0] == losses[1] == pytest.approx(0.5 * expected_kl, abs=1e-12)


def test_no_kl_without_own_rows():
    b = combined_batch()
    sub = MiniBatch(
        logp=b.logp[2:],
        mask=b.mask[2:],
        adv=b.adv[2:],
        old_mean_logp=b.old_mean_logp[2:],
        is_own=b.is_own[2:],
        omega=b.omega[2:],
        ref_logp=b.ref_logp[2:],
    )
    loss, m = policy_loss(sub, LossSpec(kind="hacpo", kl_beta=1e-3))
    assert "kl" not in m and "own_clip_frac" not in m and "s_homo_mean" not in m
    # (−3.24 + .32)/2 = −1.46
    assert loss.item() == pytest.approx(-1.46, abs=1e-12)
    assert m["loss"] == m["pg_loss"]


# ------------------------------------------------------------------------------------------------------------
# §3.5 stepwise bounds (T11), naming trap
# ------------------------------------------------------------------------------------------------------------


def test_stepwise_lower_bound_values():
    assert [stepwise_lower_bound(m, 0.8, 0.025) for m in range(4)] == pytest.approx([0.8, 0.825, 0.85, 0.875])
    assert [stepwise_lower_bound(m, 0.8, 0.01) for m in range(4)] == pytest.approx([0.80, 0.81, 0.82, 0.83])
    assert [stepwise_lower_bound(m, 0.9, 0.01) for m in range(4)] == pytest.approx([0.90, 0.91, 0.92, 0.93])
    # cap at 1.0: .8 + 8·.025 = 1.0; .8 + 10·.025 = 1.05 → 1.0
    assert stepwise_lower_bound(8, 0.8, 0.025) == pytest.approx(1.0)
    assert stepwise_lower_bound(10, 0.8, 0.025) == 1.0
    assert stepwise_lower_bound(100, 0.8, 0.01) == 1.0
    with pytest.raises(ValueError, match="m"):
        stepwise_lower_bound(-1)


@settings(max_examples=100, deadline=None)
@given(
    low=st.floats(min_value=0.5, max_value=1.0),
    step=st.floats(min_value=0.0, max_value=0.2),
    m=st.integers(min_value=0, max_value=50),
)
def test_t11_schedule_monotone_and_capped(low, step, m):
    assert stepwise_lower_bound(0, low, step) == pytest.approx(low)
    assert stepwise_lower_bound(m, low, step) <= stepwise_lower_bound(m + 1, low, step) <= 1.0


def test_cross_bounds_modes():
    assert cross_bounds(LossSpec(cross_clip="stepwise"), 2) == pytest.approx((0.85, 1.0))
    assert cross_bounds(LossSpec(cross_clip="stepwise", delta_step=0.01), 3) == pytest.approx((0.83, 1.0))
    for m in range(5):
        assert cross_bounds(LossSpec(cross_clip="static"), m) == pytest.approx((0.8, 1.0))
        assert cross_bounds(LossSpec(cross_clip="static", cross_clip_low=0.9), m) == pytest.approx((0.9, 1.0))
        assert cross_bounds(LossSpec(cross_clip="none"), m) == (float("-inf"), float("inf"))


def test_lossspec_rejects_delta_instead_of_lower_bound():
    with pytest.raises(ValueError, match="1−δ"):
        LossSpec(cross_clip_low=0.2)
    with pytest.raises(ValueError, match="1−δ"):
        LossSpec(cross_clip_low=0.1)
    assert LossSpec(cross_clip_low=0.9).cross_clip_low == 0.9


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(kind="ppo"), "unknown loss kind"),
        (dict(cross_clip="soft"), "unknown cross_clip"),
        (dict(alpha=-1.0), "≥ 0"),
        (dict(delta_step=-0.01), "≥ 0"),
        (dict(kl_beta=-1e-3), "≥ 0"),
        (dict(eps_low=-0.1), "≥ 0"),
        (dict(cross_clip_low=1.2), "1−δ"),
    ],
)
def test_lossspec_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        LossSpec(**kw)


# ------------------------------------------------------------------------------------------------------------
# rows_with_gradient: dropping dead rows (with n_total = N_m) gives identical gradients
# ------------------------------------------------------------------------------------------------------------

RWG_ROWS = [  # (own?, A, s, live for hacpo m=0 without KL, live for naive without KL)
    (True, 1.0, 1.0001, True, True),  # own inside
    (True, 1.0, 1.01, False, False),  # own clipped (A>0, s high)
    (True, 0.0, 1.0, False, False),  # A = 0
    (True, -1.0, 0.99, False, False),  # own clipped (A<0, s low)
    (False, 1.0, 0.9, True, True),  # cross inside; naive: A>0, s low → unclipped
    (False, -1.0, 0.7, False, False),  # below lo; naive: clipped
    (False, 1.0, 1.2, False, False),  # above 1; naive: clipped
    (False, 0.0, 0.9, False, False),  # A = 0
    (False, -1.0, 1.2, False, True),  # above 1; naive: A<0 s high → unclipped
    (False, 1.0, 0.5, False, True),  # below lo; naive: A>0 s low → unclipped
]


@pytest.mark.parametrize("kind", ["hacpo", "naive"])
@pytest.mark.parametrize("beta", [0.0, 1e-3])
def test_rows_with_gradient_drop_is_exact(kind, beta):
    n = len(RWG_ROWS)
    logits, tokens, mask = random_rows([3, 2, 4, 1, 5, 2, 3, 4, 2, 3], seed=7)
    own = torch.tensor([r[0] for r in RWG_ROWS])
    adv = t([r[1] for r in RWG_ROWS])
    s_target = [r[2] for r in RWG_ROWS]
    w = t([1.0, 1, 1, 1, 2.0, 0.5, 1.5, 1, 0.3, 4.0])
    spec = LossSpec(kind=kind, kl_beta=beta, alpha=1.0)
    old = old_mean_for(logp_of(logits, tokens), mask, s_target)
    ref = (logp_of(logits, tokens) - 0.2).detach()

    full = MiniBatch(
        logp=logp_of(logits, tokens), mask=mask, adv=adv, old_mean_logp=old, is_own=own, omega=w, ref_logp=ref
    )
    live = rows_with_gradient(full, spec, 0, t(s_target))
    expected = torch.tensor([r[3] if kind == "hacpo" else r[4] for r in RWG_ROWS])
    if beta > 0:
        expected = expected | own  # KL keeps every own row
    assert live.tolist() == expected.tolist()

    loss_full, _ = policy_loss(full, spec)
    (g_full,) = torch.autograd.grad(loss_full, logits)

    logits2 = logits.detach().clone().requires_grad_()
    lp2 = logp_of(logits2[live], tokens[live])
    sub = MiniBatch(
        logp=lp2,
        mask=mask[live],
        adv=adv[live],
        old_mean_logp=old[live],
        is_own=own[live],
        omega=w[live],
        ref_logp=ref[live],
        n_total=n,
    )
    loss_sub, _ = policy_loss(sub, spec)
    (g_sub,) = torch.autograd.grad(loss_sub, logits2)
    torch.testing.assert_close(g_sub, g_full, rtol=1e-12, atol=1e-15)


def test_rows_with_gradient_stepwise_and_grpo():
    # at m = 2 (lo = .85) a cross row with s = .84 is dead, at m = 0 it is live; GRPO keeps every row
    b = MiniBatch(
        logp=t([[-1.0], [-1.0]]),
        mask=mask_of([1, 1], 1),
        adv=t([1.0, 1.0]),
        old_mean_logp=t([-1.0, -1.0]),
        is_own=torch.tensor([False, False]),
    )
    s = t([0.84, 0.9])
    assert rows_with_gradient(b, HACPO, 0, s).tolist() == [True, True]
    assert rows_with_gradient(b, HACPO, 2, s).tolist() == [False, True]
    assert rows_with_gradient(b, LossSpec(kind="hacpo", cross_clip="none"), 2, s).tolist() == [True, True]
    g = MiniBatch(
        logp=t([[-1.0], [-1.0]]),
        mask=mask_of([1, 1], 1),
        adv=t([0.0, 1.0]),
        old_mean_logp=t([-1.0, -1.0]),
        old_logp=t([[-1.0], [-1.0]]),
    )
    assert rows_with_gradient(g, GRPO, 0, t([5.0, 5.0])).tolist() == [True, True]


# ------------------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------------------


def _ok(**over):
    kw = dict(
        logp=t([[-1.0, -2.0], [-0.5, 0.0]]),
        mask=mask_of([2, 1], 2),
        adv=t([1.0, -1.0]),
        old_mean_logp=t([-1.5, -0.5]),
    )
    kw.update(over)
    return MiniBatch(**kw)


@pytest.mark.parametrize(
    "over, match",
    [
        (dict(mask=mask_of([2, 1, 1], 2)), "shape mismatch"),  # logp vs mask rows
        (dict(mask=mask_of([2, 1], 3)), "shape mismatch"),  # logp vs mask tokens
        (dict(adv=t([1.0, -1.0, 0.0])), "rows"),
        (dict(adv=t(1.0)), "rows"),
        (dict(old_mean_logp=t([-1.0])), "rows"),
        (dict(is_own=torch.tensor([True])), "rows"),
        (dict(omega=t([1.0, 1.0, 1.0])), "rows"),
        (dict(ref_logp=t([[0.0, 0.0]])), "shape mismatch"),
        (dict(old_logp=t([[0.0], [0.0]])), "shape mismatch"),
        (dict(adv=t([float("nan"), 1.0])), "non-finite"),
        (dict(old_mean_logp=t([float("inf"), 1.0])), "non-finite"),
        (dict(logp=t([-1.0, -2.0]), mask=torch.tensor([True, True])), "rows, tokens"),
        (
            dict(
                logp=torch.zeros(0, 2, dtype=F64),
                mask=torch.zeros(0, 2, dtype=torch.bool),
                adv=t([]),
                old_mean_logp=t([]),
            ),
            "empty",
        ),
    ],
)
def test_minibatch_bad_input(over, match):
    with pytest.raises(ValueError, match=match):
        policy_loss(_ok(**over), HACPO)


@pytest.mark.parametrize("kind", ["gspo", "naive", "hacpo"])
@pytest.mark.parametrize("beta", [0.0, 1e-3])
def test_live_rows_skip_zero_advantage_rows_exactly_when_no_kl_reads_them(kind, beta):
    """A row with A = 0 has no gradient unless the KL term reads it (own rows, β > 0): with β = 0 it gets
    only a no-grad pass (for the metrics), and loss, gradient and metrics equal the full batch's."""
    from hacpo.engines.core.live_rows import policy_loss_live_rows

    lengths = [3, 2, 4, 1, 5, 2]
    logits, tokens, mask = random_rows(lengths, seed=3)
    own = torch.tensor([True, True, True, True, kind == "gspo", kind == "gspo"])
    adv = t([0.0, 1.0, 0.0, -1.0, 0.0, 1.0])
    old = old_mean_for(logp_of(logits, tokens), mask, [1.0, 1.0001, 1.0, 0.9999, 0.9, 0.95])
    ref = (logp_of(logits, tokens) - 0.2).detach()
    spec = LossSpec(kind=kind, kl_beta=beta, alpha=1.0, eps_low=3e-4, eps_high=4e-4)

    def batch(logp=None):
        return MiniBatch(logp=logp, mask=mask, adv=adv, old_mean_logp=old, is_own=own, omega=t([1.0] * 6),
                         ref_logp=ref, n_total=len(lengths))  # fmt: skip

    loss_full, metrics_full = policy_loss(batch(logp_of(logits, tokens)), spec)
    (g_full,) = torch.autograd.grad(loss_full, logits)

    logits2 = logits.detach().clone().requires_grad_()
    with_grad = []

    def logprobs(rows, detach):
        sel = torch.arange(len(lengths)) if rows is None else rows
        if not detach:
            with_grad.extend(sel.tolist())
        return logp_of(logits2[sel], tokens[sel])

    loss, metrics = policy_loss_live_rows(batch(), spec, 0, logprobs)
    (g,) = torch.autograd.grad(loss, logits2)
    torch.testing.assert_close(g, g_full, rtol=1e-12, atol=1e-15)
    metrics.pop("backward_rows_frac", None)
    metrics, metrics_full = metric_floats([metrics, metrics_full])  # the loss's metrics are tensors
    assert metrics == pytest.approx(metrics_full)
    zero_own = [i for i in (0, 2, 4) if own[i]] if beta > 0 else []  # the KL term reads own rows
    assert not ({0, 2, 4} - set(zero_own)) & set(with_grad)


def test_live_rows_call_the_loss_once_change_nothing_and_need_no_is_own(monkeypatch):
    """The live-row loss is engine scheduling around one call of the loss: it neither writes into its batch
    nor needs ``is_own`` (a single-agent batch leaves it None)."""
    from hacpo.algo import losses
    from hacpo.engines.core import live_rows

    lengths = [3, 2, 4]
    logits, tokens, mask = random_rows(lengths, seed=5)
    batch = MiniBatch(logp=None, mask=mask, adv=t([0.0, 1.0, -1.0]), old_mean_logp=t([-1.0, -1.0, -1.0]))
    calls = []
    monkeypatch.setattr(losses, "policy_loss", lambda *a, **k: calls.append(1) or policy_loss(*a, **k))
    loss, metrics = live_rows.policy_loss_live_rows(
        batch, LossSpec(kind="gspo"), 0, lambda rows, detach: logp_of(logits[rows], tokens[rows])
    )
    assert calls == [1] and batch.logp is None and loss is not None
    assert metrics["backward_rows_frac"] == pytest.approx(2 / 3)  # the row with A = 0 has no gradient


# The loss's own two waits for the device: validate's finiteness check and whether there are own and cross
# rows (its branches and metric keys depend on them). Everything else, the KL term included, stays on it.
LOSS_SYNCS = {("_checks.py", "check_all_finite", "tolist"): 1, ("losses.py", "policy_loss", "tolist"): 1}


@pytest.mark.parametrize("part", [False, True], ids=["mini-batch", "micro-batch share"])
def test_the_loss_syncs_with_the_host_twice_whatever_its_metrics(part):
    """A read of a device value on the host (``item``, ``bool``, ``tolist``) or an op whose output shape
    depends on values (a boolean index, ``nonzero``) makes the host wait for a GPU (tests/host_syncs.py).
    The loss, forward and backward, makes two and returns its metrics as tensors; ``metric_floats`` then
    brings them over in one copy."""
    from host_syncs import HostSyncs

    lengths = [3, 2, 4, 1]
    logits, tokens, mask = random_rows(lengths, seed=7)
    batch = MiniBatch(logp=logp_of(logits, tokens), mask=mask, adv=t([1.0, -1.0, 0.5, -0.5]),
                      old_mean_logp=t([-1.0] * 4), is_own=torch.tensor([True, True, False, False]),
                      omega=t([1.0] * 4), ref_logp=logp_of(logits, tokens).detach() - 0.1,
                      n_total=6.0 if part else None, own_tokens=7.0 if part else None)  # fmt: skip
    for kind in ("hacpo", "naive", "sgt"):
        fresh = replace(batch, logp=logp_of(logits, tokens))
        with HostSyncs(everything_on_device=True) as hs:
            loss, metrics = policy_loss(fresh, LossSpec(kind=kind, kl_beta=1e-3), 1)
            loss.backward()
        assert hs.counts() == LOSS_SYNCS, (kind, hs.report())
        assert all(isinstance(v, torch.Tensor) for k, v in metrics.items() if k not in ("rows", "cross_lo"))
        with HostSyncs(everything_on_device=True) as hs:
            (floats,) = metric_floats([metrics])
        assert [s.op for s in hs.syncs] == ["copy to host"], hs.report()
        assert all(isinstance(v, float) for v in floats.values()) and floats["own_rows"] == 2.0
        assert list(floats) == list(metrics)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("seed", range(8))
def test_the_kl_term_by_mask_arithmetic_equals_the_boolean_index_of_own_rows(dtype, seed):
    """The KL term reads own rows by multiplying with their mask, not by indexing them out (a device sync
    each). Its gradient is the same bit for bit; its value differs only by the summation order of the
    reduction over more (zero) entries: a float32 ulp or two."""
    g = torch.Generator().manual_seed(seed)
    rows, width = int(torch.randint(2, 24, (1,), generator=g)), int(torch.randint(1, 200, (1,), generator=g))
    logp = (-5 * torch.rand(rows, width, generator=g)).to(dtype).requires_grad_()
    ref = (logp + 0.3 * torch.randn(rows, width, generator=g)).detach().to(dtype)
    mask = torch.rand(rows, width, generator=g) < 0.8
    own = (torch.rand(rows, generator=g) < 0.5) | (torch.arange(rows) == 0)
    cross = ~own
    old_mean = torch.full((rows,), -2.0, dtype=dtype)
    spec = LossSpec(kind="hacpo", kl_beta=1.0, omega_in_loss=False)
    for own_tokens in (None, 11.0):
        batch = MiniBatch(logp=logp, mask=mask, adv=torch.zeros(rows, dtype=dtype), old_mean_logp=old_mean,
                          is_own=own, ref_logp=ref, own_tokens=own_tokens)  # fmt: skip
        _, metrics = policy_loss(batch, spec)
        (grad,) = torch.autograd.grad(metrics["loss"].to(dtype) * 0 + _kl(batch, spec), logp)
        if own_tokens is None:  # the formula as it was: the own rows indexed out
            old = k3_kl(logp[own], ref[own], mask[own])
        else:
            r = (ref[own] - logp[own]).clamp(-20.0, 20.0)
            old = ((torch.exp(r) - r - 1.0) * mask[own]).sum() / own_tokens
        (old_grad,) = torch.autograd.grad(old, logp)
        assert torch.equal(grad, old_grad)
        tol = {torch.float64: 1e-14, torch.float32: 1e-6, torch.bfloat16: 1e-2}[dtype]
        torch.testing.assert_close(metrics["kl"], old.detach().double(), rtol=tol, atol=0)
        assert cross.any() or torch.equal(metrics["kl"], old.detach().double())


def _kl(batch: MiniBatch, spec: LossSpec) -> torch.Tensor:
    """The loss's KL term alone: its loss less the same loss with the KL off."""
    with_kl, _ = policy_loss(batch, spec)
    without, _ = policy_loss(batch, replace(spec, kl_beta=0.0))
    return (with_kl - without) / spec.kl_beta
