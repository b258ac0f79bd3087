"""Sharing rules (hacpo.algo.sharing; docs/algorithm.md, "Sharing rules"): XGRPO's joint baseline on own rows,
SGT's rescue set, and their reductions to GSPO; gradients against closed forms on random logits.

Hand values: a learner's G = 4 rewards [1, 0, 0, 0] beside a peer's [1, 1, 1, 0] → joint mean 0.5, joint
unbiased σ = sqrt(8·0.25/7) = 0.5345225; own-group mean 0.25, σ 0.5.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from loss_cases import closed_form_grad, logp_of, old_mean_for, random_rows, t

from hacpo.algo import (
    LossSpec,
    MiniBatch,
    get_method,
    group_advantages,
    learner_rows,
    policy_loss,
    rescue_set,
    rows_with_gradient,
)

EPS = 1e-6
SIGMA_JOINT = math.sqrt(2.0 / 7.0)  # unbiased std of [1,0,0,0,1,1,1,0]


def two_agents(learner_rewards, peer_rewards):
    """Flat rows of one prompt: the learner (source 0) then the peer (source 1)."""
    r = torch.tensor([*learner_rewards, *peer_rewards], dtype=torch.float64)
    g = len(learner_rewards)
    return r, torch.zeros(2 * g, dtype=torch.long), torch.tensor([0] * g + [1] * g)


# ------------------------------------------------------------------------------------------------ XGRPO
def test_xgrpo_trains_on_own_rows_with_the_joint_baseline():
    r, pid, src = two_agents([1, 0, 0, 0], [1, 1, 1, 0])
    got = get_method("xgrpo").learner_rows(r, pid, src, 2, 0, torch.ones(2))
    assert got.keep.tolist() == [True] * 4 + [False] * 4  # the peer's rows only move the baseline
    expected = (torch.tensor([1.0, 0, 0, 0], dtype=torch.float64) - 0.5) / (SIGMA_JOINT + EPS)
    torch.testing.assert_close(got.adv[:4], expected)  # [0.935, −0.935, −0.935, −0.935]
    # GSPO's own group would give [1.5, −.5, −.5, −.5]: a strong peer pushes the learner's failures further
    gspo = t([0.75, -0.25, -0.25, -0.25]) / (0.5 + EPS)
    torch.testing.assert_close(group_advantages(r[:4].view(1, 4))[0], gspo)


def test_xgrpo_capability_uses_hacpos_baseline_and_its_special_cases():
    r, pid, src = two_agents([1, 0, 0, 0], [1, 1, 1, 0])
    cap = get_method("xgrpo_capability")
    # ω^(k,j) = P̂_k/P̂_j = 0.5: μ = (1 + 0.5·3)/8 = 0.3125 (§3.2 step 1)
    got = cap.learner_rows(r, pid, src, 2, 0, t([1.0, 0.5]))
    torch.testing.assert_close(got.adv[:4], (t([1.0, 0, 0, 0]) - 0.3125) / (SIGMA_JOINT + EPS))
    # case B: ω = 4 → μ = (1 + 12)/8 > 1 → the learner's own mean 0.25
    got = cap.learner_rows(r, pid, src, 2, 0, t([1.0, 4.0]))
    torch.testing.assert_close(got.adv[:4], (t([1.0, 0, 0, 0]) - 0.25) / (SIGMA_JOINT + EPS))
    # case A: all 8 rewards equal → A ≡ 0 whatever ω
    r1, _, _ = two_agents([1, 1, 1, 1], [1, 1, 1, 1])
    assert cap.learner_rows(r1, pid, src, 2, 0, t([1.0, 4.0])).adv.abs().max() == 0
    # equal capabilities (ω = 1): the capability baseline is the plain joint mean, i.e. XGRPO's
    plain = get_method("xgrpo").learner_rows(r, pid, src, 2, 0, torch.ones(2))
    torch.testing.assert_close(cap.learner_rows(r, pid, src, 2, 0, torch.ones(2)).adv, plain.adv)


@pytest.mark.parametrize("name", ["xgrpo", "xgrpo_capability", "sgt"])
def test_without_peers_every_sharing_rule_is_gspo(name):
    """No peer rows (n = 1): advantages, kept rows and the loss are GSPO's exactly."""
    g = torch.Generator().manual_seed(0)
    r = torch.randint(0, 2, (24,), generator=g).double()
    pid = torch.arange(24) // 4
    got = get_method(name).learner_rows(r, pid, torch.zeros(24, dtype=torch.long), 1, 0, torch.ones(1))
    gspo = get_method("gspo").learner_rows(r, pid, torch.zeros(24, dtype=torch.long), 1, 0)
    torch.testing.assert_close(got.adv, gspo.adv)
    torch.testing.assert_close(got.adv, group_advantages(r.view(6, 4)).reshape(-1))
    assert bool(got.keep.all())


def test_xgrpo_loss_and_gradient_are_gspos_on_its_advantages():
    """XGRPO's update is GSPO's loss on its own rows: −A·s·∇ mean log π / N inside the clip (T4)."""
    logits, tokens, mask = random_rows([3, 2, 4, 1], seed=5)
    logp = logp_of(logits, tokens)
    r, pid, src = two_agents([1, 0, 0, 0], [1, 1, 1, 0])
    m = get_method("xgrpo")
    got = m.learner_rows(r, pid, src, 2, 0, torch.ones(2))
    adv = got.adv[got.keep]
    s = t([1.0001, 0.9999, 1.0002, 1.0])
    batch = MiniBatch(logp=logp, mask=mask, adv=adv, old_mean_logp=old_mean_for(logp, mask, s.tolist()))
    loss, _ = policy_loss(batch, m.loss_spec(kl_beta=0.0))
    (grad,) = torch.autograd.grad(loss, logits)
    expected = closed_form_grad(logits, tokens, mask, -adv * s / 4)
    torch.testing.assert_close(grad, expected, rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------------------------------------ SGT
def test_sgt_rescues_peers_successes_on_the_prompts_the_learner_failed():
    # prompt 0: the learner failed all 4, the peer succeeded twice → rescue those 2, replacing 2 failures
    # prompt 1: the learner succeeded once → no rescue (its own group has signal); prompt 2: both failed
    r = t([0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0])
    pid = torch.tensor([0] * 4 + [1] * 4 + [2] * 4 + [0] * 4 + [1] * 4 + [2] * 4)
    src = torch.tensor([0] * 12 + [1] * 12)
    rescue, replaced = rescue_set(r, pid, src, 2, 0)
    assert torch.nonzero(rescue).flatten().tolist() == [12, 14]  # the peer's two successes on prompt 0
    assert torch.nonzero(replaced).flatten().tolist() == [0, 1]  # the first two failed own rows there
    got = get_method("sgt").learner_rows(r, pid, src, 2, 0)
    assert int(got.keep.sum()) == 12  # GSPO's rows: each rescue takes a failed own row's slot
    assert got.keep[12] and got.keep[14] and not got.keep[0] and not got.keep[1]
    assert got.adv[12] == 1.0 and got.adv[14] == 1.0  # rescue_advantage
    # own rows keep GSPO's own-group advantages: prompt 1 [0,1,0,0], prompts 0 and 2 all-equal → 0
    torch.testing.assert_close(got.adv[4:8], t([-0.25, 0.75, -0.25, -0.25]) / (0.5 + EPS))
    assert got.adv[:4].abs().max() == 0 and got.adv[8:12].abs().max() == 0
    # the knob: a rescued success's advantage
    assert replace(get_method("sgt"), rescue_advantage=2.5).learner_rows(r, pid, src, 2, 0).adv[12] == 2.5


def test_sgt_caps_the_rescue_set_at_g_and_takes_peers_in_agent_order():
    # three agents, G = 2, one prompt; the learner (source 1) failed; sources 0 and 2 succeeded twice each
    r = t([1, 1, 0, 0, 1, 1])
    pid = torch.zeros(6, dtype=torch.long)
    src = torch.tensor([0, 0, 1, 1, 2, 2])
    rescue, replaced = rescue_set(r, pid, src, 3, 1)
    assert torch.nonzero(rescue).flatten().tolist() == [0, 1]  # G = 2 slots, source 0 first
    assert torch.nonzero(replaced).flatten().tolist() == [2, 3]


@settings(max_examples=200, deadline=None)
@given(
    p=st.integers(1, 5), n=st.integers(2, 4), g=st.integers(1, 5), learner_seed=st.integers(0, 10**6),
    data=st.data(),
)  # fmt: skip
def test_rescue_set_holds_only_verified_successes_of_failed_prompts(p, n, g, learner_seed, data):
    rewards = data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=p * n * g, max_size=p * n * g))
    r = t(rewards)
    grid = torch.arange(p * n * g)
    perm = torch.randperm(p * n * g, generator=torch.Generator().manual_seed(learner_seed))  # any row order
    pid, src = (grid // (n * g))[perm], ((grid // g) % n)[perm]
    learner = learner_seed % n
    rescue, replaced = rescue_set(r, pid, src, n, learner)
    own = src == learner
    for q in range(p):
        here = pid == q
        failed = not bool((r[here & own] >= 1).any())
        peer_wins = int((here & ~own & (r >= 1)).sum())
        expected = min(g, peer_wins) if failed else 0
        assert int((rescue & here).sum()) == expected == int((replaced & here).sum())
    assert not bool((rescue & (own | (r < 1))).any())  # peers' verified successes only
    assert not bool((replaced & (~own | (r >= 1))).any())  # only the learner's failed rows make room
    got = get_method("sgt").learner_rows(r, pid, src, n, learner)
    assert int(got.keep.sum()) == p * g  # the update keeps GSPO's row count


def test_sgt_without_a_rescue_set_is_gspo():
    """The learner succeeded somewhere on every prompt, or no peer succeeded where it failed: GSPO exactly
    (rows, advantages, and the loss with its gradient)."""
    r = t([1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0])  # prompt 1: both failed
    pid = torch.tensor([0] * 4 + [1] * 4 + [0] * 4 + [1] * 4)
    src = torch.tensor([0] * 8 + [1] * 8)
    got = get_method("sgt").learner_rows(r, pid, src, 2, 0)
    assert got.keep.tolist() == [True] * 8 + [False] * 8
    gspo = get_method("gspo").learner_rows(r[:8], pid[:8], torch.zeros(8, dtype=torch.long), 1, 0)
    torch.testing.assert_close(got.adv[:8], gspo.adv)
    logits, tokens, mask = random_rows([2, 3, 1, 4, 2, 2, 3, 1], seed=2)
    old = old_mean_for(logp_of(logits, tokens), mask, [1.0001] * 8)
    losses = []
    for spec in (get_method("sgt").loss_spec(kl_beta=0.0), get_method("gspo").loss_spec(kl_beta=0.0)):
        batch = MiniBatch(logp=logp_of(logits, tokens), mask=mask, adv=gspo.adv, old_mean_logp=old,
                          is_own=torch.ones(8, dtype=torch.bool), omega=torch.ones(8))  # fmt: skip
        loss, _ = policy_loss(batch, spec)
        losses.append((loss, torch.autograd.grad(loss, logits)[0]))
    torch.testing.assert_close(losses[0][0], losses[1][0])
    torch.testing.assert_close(losses[0][1], losses[1][1])


def test_sgt_gradient_closed_form_on_random_logits():
    """Own rows: −A·s·∇ mean log π / N inside GSPO's clip, 0 clipped on A's side; rescue rows: −A·∇ mean log π
    / N whatever their ratio (no importance weight, no clip); N counts both."""
    logits, tokens, mask = random_rows([3, 5, 2, 4, 1, 6], seed=7)
    logp = logp_of(logits, tokens)
    own = torch.tensor([True, True, True, False, False, False])
    adv = t([1.0, -1.0, 1.0, 1.0, 2.5, 1.0])
    s = t([1.0002, 0.9998, 1.001, 0.3, 1.7, 1e-6])  # row 2 clipped (A > 0, s > 1 + ε); rescue ratios far off
    batch = MiniBatch(logp=logp, mask=mask, adv=adv, old_mean_logp=old_mean_for(logp, mask, s.tolist()),
                      is_own=own, omega=torch.ones(6))  # fmt: skip
    spec = get_method("sgt").loss_spec(kl_beta=0.0)
    loss, metrics = policy_loss(batch, spec)
    (grad,) = torch.autograd.grad(loss, logits)
    coef = torch.where(own, -adv * s * t([1.0, 1.0, 0.0, 1, 1, 1]), -adv) / 6
    torch.testing.assert_close(grad, closed_form_grad(logits, tokens, mask, coef), rtol=1e-9, atol=1e-12)
    assert metrics["rescue_rows"] == 3.0 and metrics["own_rows"] == 3.0
    # rows_with_gradient: rescue rows live whenever A ≠ 0, the clipped own row dead
    live = rows_with_gradient(batch, spec, 0, s)
    assert live.tolist() == [True, True, False, True, True, True]


def test_sgt_knob_is_read_by_sgt_only():
    assert get_method("sgt").reads("rescue_advantage")
    for name in ("hacpo", "xgrpo", "gspo", "naive"):
        assert not get_method(name).reads("rescue_advantage")
    with pytest.raises(ValueError, match="unknown loss kind"):
        LossSpec(kind="prp")


def test_rows_per_learner():
    assert get_method("hacpo").rows_per_learner(64, 2) == 128 == get_method("naive").rows_per_learner(64, 2)
    for name in ("xgrpo", "xgrpo_capability", "sgt", "gspo"):
        assert get_method(name).rows_per_learner(64, 3) == 64
    assert [get_method(m).cross_rows for m in ("xgrpo", "sgt", "hacpo", "gspo")] == [False, True, True, False]


def test_unknown_sharing_rule_and_missing_baseline_are_named():
    r, pid, src = two_agents([1, 0], [0, 1])
    with pytest.raises(ValueError, match="unknown sharing rule 'pool'"):
        learner_rows(r, pid, src, 2, 0, sharing="pool", baseline="joint_mean")
    with pytest.raises(ValueError, match="needs a joint `baseline`"):
        learner_rows(r, pid, src, 2, 0, sharing="baseline")
