"""Capability estimate P̂ and capability ratio ω (spec §3.1), properties T7 and T12.

Expected numbers are computed by hand; the arithmetic is in the comments.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hacpo.algo import CapabilityTracker, omega, omega_matrix, step_accuracy

F64 = torch.float64


def t(x):
    return torch.tensor(x, dtype=F64)


def test_step_accuracy_is_mean_over_whole_step():
    # two groups of one agent in one step: [1,0,0,0] and [1,1,0,0] → 3 correct of 8 = .375
    # (not one group's .25)
    assert step_accuracy(t([[1.0, 0, 0, 0], [1, 1, 0, 0]])) == pytest.approx(0.375)
    assert step_accuracy(torch.tensor([1, 1, 1, 0])) == pytest.approx(0.75)


@pytest.mark.parametrize("bad, match", [(t([]), "empty"), (t([1.0, float("nan")]), "non-finite")])
def test_step_accuracy_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        step_accuracy(bad)


def test_window_k5_includes_current_step_and_averages_available():
    # agent 0 step accuracies (whole step, 2 groups of 4):
    #   s1 all ones → 1.0; s2 [[1,0,0,0],[1,1,1,0]] → 4/8 = .5; s3 zeros → 0;
    #   s4 [[1,0,0,0],[0,0,0,0]] → 1/8 = .125
    #   s5 [[1,1,1,1],[1,1,0,0]] → 6/8 = .75; s6 [[1,1,0,0],[1,1,0,0]] → .5; s7 all ones → 1.0
    # P̂ (window K = 5, including the current step, average over what is available in the first K−1 steps):
    #   1.0; (1+.5)/2 = .75; 1.5/3 = .5; 1.625/4 = .40625; (1.625+.75)/5 = .475;
    #   [.5, 0, .125, .75, .5] → 1.875/5 = .375; [0, .125, .75, .5, 1] → 2.375/5 = .475
    # agent 1: constant accuracy .5 ([[1,0],[1,0]] … as 2 groups of 2) → P̂ = .5 always
    steps = [
        t([[1.0, 1, 1, 1], [1, 1, 1, 1]]),
        t([[1.0, 0, 0, 0], [1, 1, 1, 0]]),
        t([[0.0, 0, 0, 0], [0, 0, 0, 0]]),
        t([[1.0, 0, 0, 0], [0, 0, 0, 0]]),
        t([[1.0, 1, 1, 1], [1, 1, 0, 0]]),
        t([[1.0, 1, 0, 0], [1, 1, 0, 0]]),
        t([[1.0, 1, 1, 1], [1, 1, 1, 1]]),
    ]
    expected = [1.0, 0.75, 0.5, 0.40625, 0.475, 0.375, 0.475]
    tr = CapabilityTracker(n_agents=2, window=5)
    for r, e in zip(steps, expected, strict=True):
        p = tr.update([r, t([[1.0, 0], [1, 0]])])
        assert p.shape == (2,)
        assert p[0].item() == pytest.approx(e, abs=1e-12)
        assert p[1].item() == pytest.approx(0.5, abs=1e-12)
    # ω after s7: P̂ = [.475, .5] → ω^(0,1) = .95, ω^(1,0) = 1/.95
    w = tr.omegas()
    assert w[0, 1].item() == pytest.approx(0.95)
    assert w[1, 0].item() == pytest.approx(1 / 0.95)
    assert w[0, 0].item() == 1.0 and w[1, 1].item() == 1.0


def test_window_k2():
    # K = 2: accuracies 1, 0, .5 → P̂ = 1, .5, .25
    tr = CapabilityTracker(n_agents=1, window=2)
    got = [tr.update([t(v)])[0].item() for v in ([1.0, 1.0], [0.0, 0.0], [1.0, 0.0])]
    assert got == pytest.approx([1.0, 0.5, 0.25])


def test_floor_for_all_zero_rewards():
    # all-zero rewards → mean 0 → floored at 1e-8; ω against an agent at .5: .5/1e-8 = 5e7 → clamp 10
    tr = CapabilityTracker(n_agents=2)
    p = tr.update([t([0.0, 0, 0, 0]), t([1.0, 0, 1, 0])])
    assert p[0].item() == 1e-8
    assert p[1].item() == 0.5
    w = tr.omegas()
    assert w[1, 0].item() == pytest.approx(10.0)
    assert w[0, 1].item() == pytest.approx(0.1)
    # both zero: 1e-8/1e-8 = 1
    tr2 = CapabilityTracker(n_agents=2)
    tr2.update([t([0.0, 0]), t([0.0, 0])])
    assert torch.equal(tr2.omegas(), torch.ones(2, 2, dtype=F64))


def test_omega_values_and_clamp():
    # ω^(k,j) = P̂_k/P̂_j clamped to [.1, 10]
    assert omega(0.6, 0.3) == pytest.approx(2.0)
    assert omega(0.3, 0.6) == pytest.approx(0.5)
    assert omega(0.9, 0.05) == pytest.approx(10.0)  # 18 → 10
    assert omega(0.05, 0.9) == pytest.approx(0.1)  # .0556 → .1
    assert omega(0.5, 0.05) == pytest.approx(10.0)  # exactly 10, at the bound
    assert omega(0.05, 0.5) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="> 0"):
        omega(0.0, 0.5)
    with pytest.raises(ValueError, match="> 0"):
        omega(0.5, -1.0)


def test_omega_matrix_hand_computed_and_reciprocal():
    # P̂ = [.6, .3, .01]: W[0,1] = 2, W[1,0] = .5, W[0,2] = 60 → 10, W[2,0] = 1/60 → .1,
    # W[1,2] = 30 → 10, W[2,1] = 1/30 → .1, diagonal 1
    w = omega_matrix(t([0.6, 0.3, 0.01]))
    torch.testing.assert_close(w, t([[1.0, 2.0, 10.0], [0.5, 1.0, 10.0], [0.1, 0.1, 1.0]]))
    # T7: W[k,j] (weight on j's rewards in k's baseline) = 1 / W[j,k] (loss factor of j's samples for k)
    torch.testing.assert_close(w * w.T, torch.ones(3, 3, dtype=F64))
    with pytest.raises(ValueError, match="positive"):
        omega_matrix(t([0.5, 0.0]))
    with pytest.raises(ValueError, match="positive"):
        omega_matrix(t([[0.5, 0.5]]))


@settings(max_examples=200, deadline=None)
@given(
    st.floats(min_value=1e-8, max_value=1.0, allow_nan=False),
    st.floats(min_value=1e-8, max_value=1.0, allow_nan=False),
)
def test_t7_reciprocity_after_clamp(pk, pj):
    # T7: clamp(1/x) = 1/clamp(x) on [.1, 10], so ω^(k,j)·ω^(j,k) = 1 also beyond the clamp
    wkj, wjk = omega(pk, pj), omega(pj, pk)
    assert 0.1 <= wkj <= 10.0
    assert wkj * wjk == pytest.approx(1.0, rel=1e-12)
    assert wkj == pytest.approx(min(max(pk / pj, 0.1), 10.0), rel=1e-12)
    w = omega_matrix(t([pk, pj]))
    assert w[0, 1].item() == pytest.approx(wkj, rel=1e-12)
    assert w[1, 0].item() == pytest.approx(wjk, rel=1e-12)


def test_state_dict_round_trip():
    gen = torch.Generator().manual_seed(0)
    steps = [[torch.randint(0, 2, (3, 4), generator=gen).to(F64) for _ in range(2)] for _ in range(9)]
    a = CapabilityTracker(n_agents=2, window=5, warmup_steps=1)
    for s in steps[:7]:
        a.update(s)
    state = a.state_dict()
    b = CapabilityTracker(n_agents=2, window=5, warmup_steps=1)
    b.load_state_dict(state)
    torch.testing.assert_close(b.p_hat(), a.p_hat())
    torch.testing.assert_close(b.omegas(), a.omegas())
    assert b.steps_seen == 7
    for s in steps[7:]:  # the window keeps sliding identically after the restore (maxlen kept)
        torch.testing.assert_close(b.update(s), a.update(s))
        assert all(len(h) == 5 for h in b.history)
    # a plain-python state (e.g. after json) is accepted
    import json

    c = CapabilityTracker(n_agents=2, window=5, warmup_steps=1)
    c.load_state_dict(json.loads(json.dumps(a.state_dict())))
    torch.testing.assert_close(c.p_hat(), a.p_hat())
    with pytest.raises(ValueError, match="window"):
        CapabilityTracker(n_agents=2, window=4).load_state_dict(state)
    with pytest.raises(ValueError, match="agent"):
        CapabilityTracker(n_agents=3, window=5).load_state_dict(state)


def test_warmup_forces_omega_one():
    # W = 2: steps 1 and 2 use ω = 1 although P̂ = [1, .25]; from step 3 on ω is the clamped ratio
    tr = CapabilityTracker(n_agents=2, warmup_steps=2)
    strong, weak = t([1.0, 1, 1, 1]), t([1.0, 0, 0, 0])
    tr.update([strong, weak])
    assert torch.equal(tr.omegas(), torch.ones(2, 2, dtype=F64))
    torch.testing.assert_close(tr.p_hat(), t([1.0, 0.25]))  # P̂ itself is not affected
    tr.update([strong, weak])
    assert torch.equal(tr.omegas(), torch.ones(2, 2, dtype=F64))
    tr.update([strong, weak])
    # P̂ = [1, .25] → ω^(0,1) = 4, ω^(1,0) = .25
    torch.testing.assert_close(tr.omegas(), t([[1.0, 4.0], [0.25, 1.0]]))


def test_no_warmup_by_default():
    tr = CapabilityTracker(n_agents=2)
    tr.update([t([1.0, 1, 1, 1]), t([1.0, 0, 0, 0])])
    torch.testing.assert_close(tr.omegas(), t([[1.0, 4.0], [0.25, 1.0]]))


def test_tracker_bad_input():
    with pytest.raises(ValueError):
        CapabilityTracker(n_agents=0)
    with pytest.raises(ValueError):
        CapabilityTracker(n_agents=2, window=0)
    with pytest.raises(ValueError):
        CapabilityTracker(n_agents=2, warmup_steps=-1)
    tr = CapabilityTracker(n_agents=2)
    with pytest.raises(ValueError, match="before the first update"):
        tr.p_hat()
    with pytest.raises(ValueError, match="2 agents"):
        tr.update([t([1.0])])
    with pytest.raises(ValueError, match="non-finite"):
        tr.update([t([1.0]), t([float("nan")])])


def test_failed_update_leaves_state_unchanged():
    # a step whose second agent's rewards are invalid must not push agent 0's accuracy alone: otherwise the
    # histories go out of step (agent 0 one value ahead) and P̂_0 silently includes a step agent 1 lacks
    tr = CapabilityTracker(n_agents=2)
    tr.update([t([1.0, 0]), t([1.0, 1])])
    before = tr.state_dict()
    with pytest.raises(ValueError, match="non-finite"):
        tr.update([t([0.0, 0]), t([float("nan"), 1])])
    assert tr.state_dict() == before
