"""Group advantages (spec §2.1) and capability-aware joint advantages (§3.2, §8);
properties T1, T2, T5, T8, T9.

Every expected number is computed by hand from the spec; the arithmetic is in the comments.
"""

from __future__ import annotations

import math

import pytest
import torch

from hacpo.algo import (
    capability_baseline,
    group_advantages,
    group_by_prompt,
    joint_advantages,
    row_advantages,
)

F64 = torch.float64
EPS = 1e-6


def t(x):
    return torch.tensor(x, dtype=F64)


def close(actual, expected, tol=1e-9):
    torch.testing.assert_close(
        actual, t(expected) if not torch.is_tensor(expected) else expected, rtol=tol, atol=tol
    )


# ------------------------------------------------------------------------------------------------------------
# §2.1 GRPO / GSPO group advantage: A = (R − mean) / (std_unbiased + 1e-6)
# ------------------------------------------------------------------------------------------------------------


def test_group_advantages_unbiased_std_hand_computed():
    # row 0: [1,0,0,0] → mean .25; deviations [.75,−.25,−.25,−.25]; Σd² = .5625 + 3·.0625 = .75;
    #        unbiased var = .75/3 = .25 → std .5 → A = [.75, −.25, −.25, −.25] / (.5 + 1e-6)
    # row 1: [1,1,0,0] → mean .5; d = ±.5; Σd² = 1; var = 1/3 → std √(1/3) → A = ±.5 / (√(1/3) + 1e-6)
    a = group_advantages(t([[1.0, 0, 0, 0], [1, 1, 0, 0]]))
    s1 = math.sqrt(1 / 3) + EPS
    close(
        a,
        [
            [0.75 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001],
            [0.5 / s1, 0.5 / s1, -0.5 / s1, -0.5 / s1],
        ],
    )
    # numerically: .75/.500001 = 1.4999970000060, not 1.5 (eps is in the denominator)
    assert a[0, 0].item() == pytest.approx(1.499997000006, abs=1e-10)


def test_group_advantages_two_responses_uses_n_minus_1():
    # [1,0]: mean .5, Σd² = .5, unbiased var = .5/1 = .5 → std .70710678 (the biased std would be .5 → A = ±1)
    a = group_advantages(t([[1.0, 0.0]]))
    s = math.sqrt(0.5) + EPS
    close(a, [[0.5 / s, -0.5 / s]])
    assert abs(a[0, 0].item() - 1.0) > 0.2


def test_group_advantages_nonbinary_rewards():
    # [2, 0, 1]: mean 1; d = [1, −1, 0]; Σd² = 2; var = 2/2 = 1 → std 1 → A = [1, −1, 0]/(1 + 1e-6)
    close(group_advantages(t([[2.0, 0.0, 1.0]])), [[1 / 1.000001, -1 / 1.000001, 0.0]])


@pytest.mark.parametrize("value", [0.0, 1.0, 0.5])
def test_group_advantages_all_equal_is_zero(value):
    a = group_advantages(torch.full((3, 8), value, dtype=F64))
    assert torch.equal(a, torch.zeros(3, 8, dtype=F64))


def test_group_advantages_single_response_is_zero():
    # one response: R − mean = 0 and the spread is 0 → A = 0 (never NaN from std of one element)
    a = group_advantages(t([[1.0], [0.0]]))
    assert torch.equal(a, torch.zeros(2, 1, dtype=F64))


def test_group_advantages_accepts_int_rewards():
    a = group_advantages(torch.tensor([[1, 0, 0, 0]]))
    assert torch.is_floating_point(a)
    assert a[0, 1].item() == pytest.approx(-0.25 / 0.500001, rel=1e-5)


@pytest.mark.parametrize(
    "rewards, match",
    [
        (torch.zeros(2, 0), "empty"),
        (torch.zeros(0, 4), "empty"),
        (torch.tensor([[1.0, float("nan"), 0.0, 0.0]]), "non-finite"),
        (torch.tensor([[1.0, float("inf"), 0.0, 0.0]]), "non-finite"),
        (torch.zeros(4), "prompts"),
        (torch.zeros(1, 2, 4), "prompts"),
    ],
)
def test_group_advantages_bad_input(rewards, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(rewards)


# ------------------------------------------------------------------------------------------------------------
# §3.2 capability-aware joint advantage, n = 2, G = 4
# ------------------------------------------------------------------------------------------------------------

# joint group of case 1: own (agent 0) [1,0,0,0], other (agent 1) [1,1,0,0]
CASE1 = [[[1.0, 0, 0, 0], [1, 1, 0, 0]]]
# σ over the 8 raw rewards [1,0,0,0,1,1,0,0]: mean 3/8;
# Σd² = 3·(5/8)² + 5·(3/8)² = 75/64 + 45/64 = 120/64 = 1.875;
# unbiased var = 1.875/7 = .267857142857 → σ = .517549169...
SIG1 = math.sqrt(1.875 / 7) + EPS


def test_joint_advantage_capability_baseline_learner0():
    # learner 0, ω^(0,1) = 2: μ = (Σown + ω·Σother)/2G = (1 + 2·2)/8 = 5/8 = .625
    # A(R=1) = (1 − .625)/(σ+ε) = .375/(σ+ε); A(R=0) = −.625/(σ+ε); cross rewards enter unweighted
    a = joint_advantages(t(CASE1), learner=0, omega_learner_over=t([1.0, 2.0]))
    hi, lo = 0.375 / SIG1, -0.625 / SIG1
    close(a, [[[hi, lo, lo, lo], [hi, hi, lo, lo]]])
    # numerically .375/.5175501695 = .724567...
    assert a[0, 0, 0].item() == pytest.approx(0.375 / 0.51755017, rel=1e-6)


def test_joint_advantage_capability_baseline_learner1_differs():
    # learner 1 (own = agent 1 [1,1,0,0]), ω^(1,0) = 1/2: μ = (2 + .5·1)/8 = 2.5/8 = .3125
    # A(R=1) = .6875/(σ+ε), A(R=0) = −.3125/(σ+ε); same rewards, different advantages than learner 0 (§3.2.6)
    a1 = joint_advantages(t(CASE1), learner=1, omega_learner_over=t([0.5, 1.0]))
    hi, lo = 0.6875 / SIG1, -0.3125 / SIG1
    close(a1, [[[hi, lo, lo, lo], [hi, hi, lo, lo]]])
    a0 = joint_advantages(t(CASE1), learner=0, omega_learner_over=t([1.0, 2.0]))
    assert not torch.allclose(a0, a1)


def test_joint_advantage_weaker_learner_lowers_baseline():
    # learner 0 with ω^(0,1) = .5 (weaker): μ = (1 + .5·2)/8 = .25 → A(1) = .75/(σ+ε), A(0) = −.25/(σ+ε)
    a = joint_advantages(t(CASE1), learner=0, omega_learner_over=t([1.0, 0.5]))
    hi, lo = 0.75 / SIG1, -0.25 / SIG1
    close(a, [[[hi, lo, lo, lo], [hi, hi, lo, lo]]])


def test_joint_advantage_joint_mean_and_own_mean_baselines():
    # joint_mean (HACPO − Adv, Naive): μ = 3/8 whatever ω → A(1) = .625/(σ+ε), A(0) = −.375/(σ+ε)
    for w in (None, t([1.0, 2.0]), t([1.0, 0.1])):
        a = joint_advantages(t(CASE1), learner=0, omega_learner_over=w, baseline="joint_mean")
        hi, lo = 0.625 / SIG1, -0.375 / SIG1
        close(a, [[[hi, lo, lo, lo], [hi, hi, lo, lo]]])
    # own_mean: μ = own mean = 1/4 → A(1) = .75/(σ+ε), A(0) = −.25/(σ+ε); σ still over all 2G
    a = joint_advantages(t(CASE1), learner=0, baseline="own_mean")
    hi, lo = 0.75 / SIG1, -0.25 / SIG1
    close(a, [[[hi, lo, lo, lo], [hi, hi, lo, lo]]])
    # own_mean for learner 1: own [1,1,0,0] mean .5 → A = ±.5/(σ+ε)
    a = joint_advantages(t(CASE1), learner=1, baseline="own_mean")
    hi, lo = 0.5 / SIG1, -0.5 / SIG1
    close(a, [[[hi, lo, lo, lo], [hi, hi, lo, lo]]])


@pytest.mark.parametrize("w", [0.1, 0.5, 1.0, 2.0, 10.0])
@pytest.mark.parametrize("value", [0.0, 1.0])
@pytest.mark.parametrize("baseline", ["capability", "joint_mean", "own_mean"])
def test_special_case_a_all_equal_gives_zero(w, value, baseline):
    # all 2G rewards equal → μ = plain mean → A ≡ 0. Without the special case, all-correct with ω = .5 gives
    # μ = (4 + .5·4)/8 = .75 and A = .25/(0 + 1e-6) = 250000.
    r = torch.full((1, 2, 4), value, dtype=F64)
    for learner in (0, 1):
        om = torch.ones(2, dtype=F64)
        om[1 - learner] = w
        a = joint_advantages(r, learner=learner, omega_learner_over=om, baseline=baseline)
        assert torch.equal(a, torch.zeros_like(a))


def test_special_case_b_mu_above_one_falls_back_to_own_mean():
    # own [1,1,1,1], other [1,1,1,0], ω = 2: μ = (4 + 2·3)/8 = 10/8 = 1.25 > 1 → μ = own mean = 1
    # σ over [1]*7 + [0]: mean 7/8, Σd² = 7·(1/8)² + (7/8)² = 56/64 = .875, var = .875/7 = .125 → σ = √.125
    # A: every reward 1 → 0; the single 0 → −1/(√.125 + ε) = −2.82841...
    a = joint_advantages(t([[[1.0, 1, 1, 1], [1, 1, 1, 0]]]), learner=0, omega_learner_over=t([1.0, 2.0]))
    s = math.sqrt(0.125) + EPS
    close(a, [[[0.0, 0, 0, 0], [0, 0, 0, -1 / s]]])
    assert a[0, 1, 3].item() == pytest.approx(-2.828419, rel=1e-6)


def test_special_case_b_own_mean_not_one():
    # own [1,1,1,0], other [1,1,1,1], ω = 2: μ = (3 + 2·4)/8 = 11/8 > 1 → μ = own mean = .75
    # σ as above (7 ones, 1 zero) = √.125 → A(1) = .25/(σ+ε), A(0) = −.75/(σ+ε)
    a = joint_advantages(t([[[1.0, 1, 1, 0], [1, 1, 1, 1]]]), learner=0, omega_learner_over=t([1.0, 2.0]))
    s = math.sqrt(0.125) + EPS
    hi, lo = 0.25 / s, -0.75 / s
    close(a, [[[hi, hi, hi, lo], [hi, hi, hi, hi]]])


def test_special_case_b_not_triggered_at_exactly_one():
    # own [1,1,0,0], other [1,1,1,1], ω = 1.5: μ = (2 + 1.5·4)/8 = 8/8 = 1.0, not > 1 → μ stays 1
    # (the own mean .5 would give A(1) > 0). σ over 6 ones, 2 zeros: mean .75, Σd² = 6·.0625 + 2·.5625 = 1.5,
    # var = 1.5/7 → A(1) = 0, A(0) = −1/(σ+ε)
    a = joint_advantages(t([[[1.0, 1, 0, 0], [1, 1, 1, 1]]]), learner=0, omega_learner_over=t([1.0, 1.5]))
    s = math.sqrt(1.5 / 7) + EPS
    close(a, [[[0.0, 0, -1 / s, -1 / s], [0, 0, 0, 0]]])


def test_special_case_b_never_for_joint_mean():
    # HACPO − Adv: μ = plain mean 7/8 (≤ 1 always) for own [1,1,1,1], other [1,1,1,0], ω = 2
    # A(1) = (1/8)/(√.125+ε), A(0) = (−7/8)/(√.125+ε)
    a = joint_advantages(
        t([[[1.0, 1, 1, 1], [1, 1, 1, 0]]]),
        learner=0,
        omega_learner_over=t([1.0, 2.0]),
        baseline="joint_mean",
    )
    s = math.sqrt(0.125) + EPS
    hi, lo = 0.125 / s, -0.875 / s
    close(a, [[[hi, hi, hi, hi], [hi, hi, hi, lo]]])


def test_multiple_prompts_are_independent():
    # prompt 0 = CASE1 (μ = .625), prompt 1 = all-correct (zeros), prompt 2 = special case B example
    r = t([CASE1[0], [[1.0, 1, 1, 1], [1, 1, 1, 1]], [[1.0, 1, 1, 1], [1, 1, 1, 0]]])
    a = joint_advantages(r, learner=0, omega_learner_over=t([1.0, 2.0]))
    hi, lo = 0.375 / SIG1, -0.625 / SIG1
    s = math.sqrt(0.125) + EPS
    close(a, [[[hi, lo, lo, lo], [hi, hi, lo, lo]], [[0.0] * 4, [0.0] * 4], [[0.0] * 4, [0, 0, 0, -1 / s]]])


def test_joint_advantages_n3():
    # agents: 0 [1,0], 1 [1,1], 2 [1,0]; learner 0, ω^(0,1) = .5, ω^(0,2) = 2
    # μ = (1 + .5·2 + 2·1)/6 = 4/6 = 2/3
    # σ over [1,0,1,1,1,0]: mean 2/3; Σd² = 4·(1/3)² + 2·(2/3)² = 4/9 + 8/9 = 4/3; var = (4/3)/5 = 4/15
    # A(1) = (1/3)/(σ+ε), A(0) = (−2/3)/(σ+ε)
    r = t([[[1.0, 0], [1, 1], [1, 0]]])
    a = joint_advantages(r, learner=0, omega_learner_over=t([1.0, 0.5, 2.0]))
    s = math.sqrt(4 / 15) + EPS
    hi, lo = (1 / 3) / s, (-2 / 3) / s
    close(a, [[[hi, lo], [hi, hi], [hi, lo]]])
    # learner 2 (own [1,0]) with ω^(2,0) = .5, ω^(2,1) = .25: μ = (1 + .5·1 + .25·2)/6 = 2/6 = 1/3
    a2 = joint_advantages(r, learner=2, omega_learner_over=t([0.5, 0.25, 1.0]))
    hi, lo = (2 / 3) / s, (-1 / 3) / s
    close(a2, [[[hi, lo], [hi, hi], [hi, lo]]])


def test_joint_advantages_n3_special_case_b():
    # agents: 0 [1,1], 1 [1,0], 2 [1,1]; learner 0, ω = 3 on agent 1:
    #   μ = (2 + 3·1 + 1·2)/6 = 7/6 > 1 → own mean 1
    # σ over [1,1,1,0,1,1]: mean 5/6, Σd² = 5/36 + 25/36 = 30/36, var = (5/6)/5 = 1/6
    #   → A(1) = 0, A(0) = −1/(σ+ε)
    r = t([[[1.0, 1], [1, 0], [1, 1]]])
    a = joint_advantages(r, learner=0, omega_learner_over=t([1.0, 3.0, 1.0]))
    s = math.sqrt(1 / 6) + EPS
    close(a, [[[0.0, 0], [0, -1 / s], [0, 0]]])


def test_capability_baseline_raw_values_and_self_entry_ignored():
    # raw μ without special cases: all-correct with ω = 2 → (4 + 2·4)/8 = 1.5 (special case B would change it)
    mu = capability_baseline(t([[[1.0, 1, 1, 1], [1, 1, 1, 1]], CASE1[0]]), 0, t([1.0, 2.0]))
    assert mu.shape == (2, 1, 1)
    close(mu.flatten(), [1.5, 0.625])
    # the learner's own entry of ω is taken as 1 whatever is passed there
    mu2 = capability_baseline(t(CASE1), 0, t([7.0, 2.0]))
    close(mu2.flatten(), [0.625])


def test_t8_baseline_direction_identity():
    # T8: μ^(k) − mean(joint) = (ω − 1)·ΣR_j/(2G); ≥ 0 when ω > 1, ≤ 0 when ω < 1
    g = torch.Generator().manual_seed(3)
    r = torch.randint(0, 2, (200, 2, 4), generator=g).to(F64)
    for w in (0.1, 0.5, 1.0, 1.7, 10.0):
        mu = capability_baseline(r, 0, t([1.0, w])).flatten()
        diff = mu - r.reshape(200, 8).mean(1)
        expected = (w - 1.0) * r[:, 1].sum(1) / 8
        close(diff, expected, tol=1e-12)
        if w > 1:
            assert bool((diff >= 0).all())
        if w < 1:
            assert bool((diff <= 0).all())
    # hand case: CASE1, ω = 2: μ = .625, joint mean .375, diff .25 = (2 − 1)·2/8
    assert capability_baseline(t(CASE1), 0, t([1.0, 2.0])).item() - 0.375 == pytest.approx(0.25)


def test_t5_single_agent_joint_equals_group_advantages():
    # T5: n = 1 (no cross rows), ω ≡ 1 → HACPO advantages == group-normalised GRPO/GSPO advantages over G
    g = torch.Generator().manual_seed(0)
    r = torch.randint(0, 2, (64, 8), generator=g).to(F64)
    r[0] = 1.0  # an all-correct group
    r[1] = 0.0
    expected = group_advantages(r)
    for baseline in ("capability", "joint_mean", "own_mean"):
        a = joint_advantages(r[:, None, :], learner=0, omega_learner_over=t([1.0]), baseline=baseline)
        torch.testing.assert_close(a[:, 0, :], expected, rtol=1e-12, atol=1e-12)


def test_t1_t2_monte_carlo_unbiased_baseline():
    # T1: Bernoulli p_k = .3 (own), p_j = .6 (other), G = 8, ideal ω = p_k/p_j = .5, 2·10^5 groups.
    # E[μ] = (8·.3 + .5·8·.6)/16 = (2.4 + 2.4)/16 = .3 = p_k. Var[μ] = (8·.21 + .25·8·.24)/256 = 2.16/256
    # → sd ≈ .0919, SE ≈ 2.1e-4 for 2·10^5 groups.
    n_groups, g_size, pk, pj = 200_000, 8, 0.3, 0.6
    gen = torch.Generator().manual_seed(1234)
    own = (torch.rand(n_groups, g_size, generator=gen, dtype=F64) < pk).to(F64)
    other = (torch.rand(n_groups, g_size, generator=gen, dtype=F64) < pj).to(F64)
    r = torch.stack([own, other], dim=1)
    mu = capability_baseline(r, 0, t([1.0, pk / pj])).flatten()
    se = mu.std().item() / math.sqrt(n_groups)
    assert abs(mu.mean().item() - pk) < 3 * se
    assert se < 3e-4  # the test has power: 3 SE ≈ 6e-4
    # the plain joint mean is biased towards (p_k + p_j)/2 = .45: far outside 3 SE
    assert abs(r.reshape(n_groups, -1).mean().item() - pk) > 100 * se
    # T2: un-normalised own advantage R_own − μ has mean 0
    adv = (own - mu[:, None]).flatten()
    se2 = adv.std().item() / math.sqrt(adv.numel())
    assert abs(adv.mean().item()) < 3 * se2


# ------------------------------------------------------------------------------------------------------------
# §3.2.7 grouping by prompt id
# ------------------------------------------------------------------------------------------------------------


def test_group_by_prompt_shuffled_rows():
    # prompt 7: agent 0 rows {0, 4}, agent 1 rows {2, 6}; prompt 3: agent 0 rows {3, 5}, agent 1 rows {1, 7}
    pid = torch.tensor([7, 3, 7, 3, 7, 3, 7, 3])
    aid = torch.tensor([0, 1, 1, 0, 0, 0, 1, 1])
    index, uniq = group_by_prompt(pid, aid, n_agents=2)
    assert uniq.tolist() == [3, 7]
    assert tuple(index.shape) == (2, 2, 2)
    assert sorted(index.flatten().tolist()) == list(range(8))
    assert pid[index].tolist() == [[[3, 3], [3, 3]], [[7, 7], [7, 7]]]
    assert aid[index].tolist() == [[[0, 0], [1, 1]], [[0, 0], [1, 1]]]
    assert set(index[1, 1].tolist()) == {2, 6}
    assert set(index[1, 0].tolist()) == {0, 4}
    assert set(index[0, 1].tolist()) == {1, 7}


def test_group_by_prompt_feeds_joint_advantages():
    # rows shuffled at random; regrouped advantages match those of the ordered groups
    gen = torch.Generator().manual_seed(5)
    p_, n_, g_ = 5, 2, 4
    r = torch.randint(0, 2, (p_, n_, g_), generator=gen).to(F64)
    pid = torch.arange(p_)[:, None, None].expand(p_, n_, g_).flatten() * 10 + 100
    aid = torch.arange(n_)[None, :, None].expand(p_, n_, g_).flatten()
    perm = torch.randperm(p_ * n_ * g_, generator=gen)
    flat_r, flat_p, flat_a = r.flatten()[perm], pid[perm], aid[perm]
    index, uniq = group_by_prompt(flat_p, flat_a, n_agents=2)
    assert uniq.tolist() == [100, 110, 120, 130, 140]
    grouped = flat_r[index]
    torch.testing.assert_close(grouped.sort(-1).values, r.sort(-1).values)
    w = t([1.0, 2.0])
    a_grouped = joint_advantages(grouped, 0, w)
    a_ordered = joint_advantages(r, 0, w)
    torch.testing.assert_close(a_grouped.sort(-1).values, a_ordered.sort(-1).values)


@pytest.mark.parametrize(
    "pid, aid",
    [
        ([1, 1, 1, 1], [0, 0, 0, 1]),  # prompt 1: 3 rows of agent 0, 1 of agent 1
        ([1, 1, 2, 2, 2, 2], [0, 1, 0, 1, 0, 1]),  # prompt 1 has 1 per agent, prompt 2 has 2
        ([1, 1, 2, 2], [0, 0, 1, 1]),  # prompt 1 has no agent-1 row
    ],
)
def test_group_by_prompt_unequal_counts_raise(pid, aid):
    with pytest.raises(ValueError, match="same, non-zero number"):
        group_by_prompt(torch.tensor(pid), torch.tensor(aid), n_agents=2)


def test_group_by_prompt_bad_input():
    with pytest.raises(ValueError, match="agent ids"):
        group_by_prompt(torch.tensor([1, 1]), torch.tensor([0, 2]), n_agents=2)
    with pytest.raises(ValueError, match="equal length"):
        group_by_prompt(torch.tensor([1, 1, 1]), torch.tensor([0, 1]), n_agents=2)
    with pytest.raises(ValueError, match="empty"):
        group_by_prompt(torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long), n_agents=2)


# ------------------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------------------


def test_joint_advantages_bad_input():
    r = t(CASE1)
    w = t([1.0, 2.0])
    with pytest.raises(ValueError, match="out of range"):
        joint_advantages(r, learner=2, omega_learner_over=w)
    with pytest.raises(ValueError, match="out of range"):
        joint_advantages(r, learner=-1, omega_learner_over=w)
    with pytest.raises(ValueError, match="unknown baseline"):
        joint_advantages(r, learner=0, omega_learner_over=w, baseline="mean")
    with pytest.raises(ValueError, match="omega"):
        joint_advantages(r, learner=0, omega_learner_over=None)
    with pytest.raises(ValueError, match="shape"):
        joint_advantages(r, learner=0, omega_learner_over=t([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="non-finite"):
        joint_advantages(r, learner=0, omega_learner_over=t([1.0, float("nan")]))
    bad = r.clone()
    bad[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        joint_advantages(bad, learner=0, omega_learner_over=w)
    with pytest.raises(ValueError, match="empty"):
        joint_advantages(torch.zeros(1, 2, 0), learner=0, omega_learner_over=w)
    with pytest.raises(ValueError, match="empty"):
        joint_advantages(torch.zeros(0, 2, 4), learner=0, omega_learner_over=w)
    with pytest.raises(ValueError, match="agents"):
        joint_advantages(torch.zeros(2, 8), learner=0, omega_learner_over=w)


def test_row_advantages_on_shuffled_flat_rows():
    """Flat rows in any order: each row gets the advantage of its place in its (prompt, agent) group, for
    joint baselines and for a single agent's group normalisation."""
    gen = torch.Generator().manual_seed(7)
    p_, n_, g_ = 4, 3, 4
    r = torch.randint(0, 2, (p_, n_, g_), generator=gen).to(F64)
    pid = torch.arange(p_)[:, None, None].expand(p_, n_, g_).flatten()
    aid = torch.arange(n_)[None, :, None].expand(p_, n_, g_).flatten()
    perm = torch.randperm(p_ * n_ * g_, generator=gen)
    w = t([1.0, 2.0, 0.5])
    for baseline in ("capability", "joint_mean", "own_mean"):
        want = joint_advantages(r, 1, w, baseline).flatten()[perm]
        got = row_advantages(r.flatten()[perm], pid[perm], aid[perm], n_, 1, w, baseline)
        torch.testing.assert_close(got, want)
    own = r[:, :1]
    rows = torch.randperm(p_ * g_, generator=gen)
    single = row_advantages(own.flatten()[rows], (torch.arange(p_ * g_) // g_)[rows], torch.zeros(p_ * g_), 1)
    torch.testing.assert_close(single, group_advantages(own[:, 0]).flatten()[rows])
    with pytest.raises(ValueError, match="single-agent"):
        row_advantages(r.flatten(), pid, aid, n_)

