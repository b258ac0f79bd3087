"""Method registry (spec §2, §6, §8): knobs per method, update-count arithmetic, loss_spec."""

from __future__ import annotations

import pytest

from hacpo.algo import METHODS, cross_bounds, get_method, method_names

PAPER_NAMES = [
    "grpo",
    "gspo",
    "gspo_x2",
    "gspo_updates_x2",
    "naive",
    "hacpo",
    "hacpo_no_adv",
    "hacpo_no_omega",
    "hacpo_no_stepwise",
    "hacpo_no_clip",
]


def test_all_paper_methods_registered():
    for name in PAPER_NAMES:
        assert name in method_names()
        assert name in METHODS
        assert get_method(name).name == name


@pytest.mark.parametrize(
    "name, knobs",
    [
        ("grpo", dict(loss="grpo", joint=False, rollout_multiplier=1, epochs=1, minibatch_divisor=1)),
        ("gspo", dict(loss="gspo", joint=False, rollout_multiplier=1, epochs=1, minibatch_divisor=1)),
        ("gspo_x2", dict(loss="gspo", joint=False, rollout_multiplier=2, epochs=1, minibatch_divisor=1)),
        (
            "gspo_updates_x2",
            dict(loss="gspo", joint=False, rollout_multiplier=1, epochs=2, minibatch_divisor=1),
        ),
        ("naive", dict(loss="naive", joint=True, baseline="joint_mean", naive_cross_ratio="self_old")),
        (
            "hacpo",
            dict(
                loss="hacpo",
                joint=True,
                baseline="capability",
                omega_in_loss=True,
                cross_clip="stepwise",
                epochs=1,
                rollout_multiplier=1,
            ),
        ),
        # §8: HACPO − Adv = plain joint mean in the baseline, everything else kept
        (
            "hacpo_no_adv",
            dict(loss="hacpo", joint=True, baseline="joint_mean", omega_in_loss=True, cross_clip="stepwise"),
        ),
        ("hacpo_no_adv_own", dict(loss="hacpo", joint=True, baseline="own_mean", omega_in_loss=True)),
        # §8: HACPO − ω = ω := 1 in the loss, ω kept in the baseline
        (
            "hacpo_no_omega",
            dict(loss="hacpo", baseline="capability", omega_in_loss=False, cross_clip="stepwise"),
        ),
        (
            "hacpo_no_stepwise",
            dict(loss="hacpo", baseline="capability", omega_in_loss=True, cross_clip="static"),
        ),
        ("hacpo_no_clip", dict(loss="hacpo", baseline="capability", omega_in_loss=True, cross_clip="none")),
    ],
)
def test_method_knobs(name, knobs):
    m = get_method(name)
    assert m.name == name
    for key, value in knobs.items():
        assert getattr(m, key) == value, key


@pytest.mark.parametrize(
    "name, rows, minibatch, expected",
    [
        # §6: 128 prompts × 8 = 1024 rows, mini-batch 512 → 2 updates
        ("grpo", 128 * 8, 512, 2),
        ("gspo", 128 * 8, 512, 2),
        # GSPO×2: 128 × 16 = 2048 rows, 32 prompts × 16 = 512 → 4
        ("gspo_x2", 128 * 16, 512, 4),
        # GSPO updates ×2 (a): 2 epochs × 1024/512 = 4
        ("gspo_updates_x2", 128 * 8, 512, 4),
        # Naive, HACPO and ablations: 1024 own + 1024 cross = 2048 rows / 512 → 4
        ("naive", 2048, 512, 4),
        ("hacpo", 2048, 512, 4),
        ("hacpo_no_adv", 2048, 512, 4),
        ("hacpo_no_omega", 2048, 512, 4),
        ("hacpo_no_stepwise", 2048, 512, 4),
        ("hacpo_no_clip", 2048, 512, 4),
        # a last incomplete mini-batch still counts as an update: ceil(1000/512) = 2; ceil(1025/512) = 3
        ("gspo", 1000, 512, 2),
        ("gspo", 1025, 512, 3),
        ("gspo_updates_x2", 1025, 512, 6),
    ],
)
def test_updates_per_step(name, rows, minibatch, expected):
    assert get_method(name).updates_per_step(rows, minibatch) == expected


def test_variant_knobs_are_explicit_and_checked():
    # §2.4 reading (b): half-size mini-batches, one epoch: 1024 / 256 = 4 updates
    half = get_method("gspo_updates_x2").variant(gspo_updates_x2_mode="half_minibatch")
    assert (half.epochs, half.minibatch_divisor, half.updates_per_step(128 * 8, 512)) == (1, 2, 4)
    assert get_method("gspo_updates_x2").variant(gspo_updates_x2_mode=None) == get_method("gspo_updates_x2")
    assert get_method("naive").naive_cross_ratio == "self_old"  # the default; the variant sets the other
    assert get_method("naive").variant(naive_cross_ratio="source").naive_cross_ratio == "source"
    with pytest.raises(ValueError, match="applies to naive only, not 'hacpo'"):
        get_method("hacpo").variant(naive_cross_ratio="self_old")
    with pytest.raises(ValueError, match="choose one of"):
        get_method("naive").variant(naive_cross_ratio="learner")
    with pytest.raises(ValueError, match="unknown variant knob"):
        get_method("naive").variant(cross_ratio="self_old")
    assert get_method("hacpo").reads("alpha") and not get_method("naive").reads("alpha")
    assert get_method("naive").reads("naive_cross_ratio")
    assert not get_method("gspo").reads("naive_cross_ratio")


def test_gspo_x2_rows_follow_rollout_multiplier():
    # GSPO×2 trains on multiplier × G = 16 own rollouts per prompt: 128 · 8 · 2 = 2048 rows → 4 updates
    m = get_method("gspo_x2")
    assert m.updates_per_step(128 * 8 * m.rollout_multiplier, 512) == 4


def test_loss_spec_clip_eps():
    g = get_method("grpo").loss_spec()
    assert (g.kind, g.eps_low, g.eps_high) == ("grpo", 0.2, 0.28)
    for name in ("gspo", "gspo_x2", "gspo_updates_x2", "naive", "hacpo", "hacpo_no_clip"):
        s = get_method(name).loss_spec()
        assert s.kind == get_method(name).loss
        assert (s.eps_low, s.eps_high) == (3e-4, 4e-4)


def test_loss_spec_alpha_is_the_runs():
    # no method fixes α: the run's α (the pair's, Table 4, or an α-ablation override) is used
    assert get_method("hacpo").loss_spec(alpha=3.0).alpha == 3.0
    assert get_method("hacpo").loss_spec().alpha == 1.0
    assert get_method("hacpo_no_omega").loss_spec(alpha=0.0).alpha == 0.0
    with pytest.raises(ValueError, match="alpha=-1.0 must be ≥ 0"):
        get_method("hacpo").loss_spec(alpha=-1.0)


def test_loss_spec_carries_pair_and_ablation_knobs():
    s = get_method("hacpo").loss_spec(cross_clip_low=0.9, delta_step=0.01, kl_beta=2e-3)
    assert (s.cross_clip_low, s.delta_step, s.kl_beta, s.cross_clip, s.omega_in_loss) == (
        0.9,
        0.01,
        2e-3,
        "stepwise",
        True,
    )
    assert cross_bounds(s, 3) == pytest.approx((0.93, 1.0))
    assert get_method("hacpo_no_omega").loss_spec().omega_in_loss is False
    ns = get_method("hacpo_no_stepwise").loss_spec(cross_clip_low=0.8, delta_step=0.025)
    assert cross_bounds(ns, 3) == pytest.approx((0.8, 1.0))
    nc = get_method("hacpo_no_clip").loss_spec()
    assert cross_bounds(nc, 0) == (float("-inf"), float("inf"))
    with pytest.raises(ValueError, match="1−δ"):
        get_method("hacpo").loss_spec(cross_clip_low=0.2)


def test_to_dict_records_knobs():
    d = get_method("gspo_updates_x2").to_dict()
    assert d["name"] == "gspo_updates_x2" and d["epochs"] == 2 and d["minibatch_divisor"] == 1
    assert get_method("naive").to_dict()["naive_cross_ratio"] == "self_old"


def test_bad_method_names():
    # a name never encodes a value: hacpo_alpha3 is not a method (α is the run's `alpha: 3`)
    for bad in ("hapco", "HACPO", "hacpo_alpha3", "naive_self_old", "gspo2", ""):
        with pytest.raises(ValueError, match="unknown method"):
            get_method(bad)
