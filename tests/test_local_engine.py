"""End-to-end tests of the local engine: every method trains for real on tiny agents (CPU, seconds each)."""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import math

import pytest
import torch
from toy_runs import (
    TEST_DEVICE,
    assert_events_match_logs,
    assert_wandb_matches_logs,
    metrics_without_timing,
    toy_train_config,
    train_killed_at,
)

from hacpo.algo import cross_bounds, get_method
from hacpo.checkpoints import write_checkpoint_manifest
from hacpo.config import load_train_config
from hacpo.engines.local import LocalTrainer, train
from hacpo.runio import MetricsLog, RunRecord

# |s − 1| for ratios that are 1 in exact arithmetic (π_old = π_θ before the first update): fp32 CPU kernels
# reproduce the sampler's sums; on CUDA π_old is a trainer forward whose shapes (prefix groups, batch sizes)
# differ from the update's, so reductions round differently
RATIO_TOL = 1e-5 if TEST_DEVICE == "cpu" else 1e-3
_cfg = toy_train_config


SINGLE = ["grpo", "gspo", "gspo_x2", "gspo_updates_x2"]
JOINT = [  # (method, explicit overrides): a variant is a knob, never a name
    ("naive", {}),
    ("naive", {"naive_cross_ratio": "source"}),
    ("hacpo", {}),
    ("hacpo_no_adv", {}),
    ("hacpo_no_omega", {}),
    ("hacpo_no_stepwise", {}),
    ("hacpo_no_clip", {}),
    ("hacpo", {"alpha": 3.0}),
]


@pytest.mark.parametrize("method", SINGLE)
def test_single_agent_methods_train(tmp_path, toy_data, small_agent, method):
    cfg = _cfg(tmp_path, [("a", small_agent)], method, data=toy_data)
    run = train(cfg)
    assert run.status == "complete" and run.step == 2
    rows = MetricsLog(tmp_path / method / "metrics.jsonl").read()
    assert [r["step"] for r in rows] == [0, 1]
    m = get_method(method)
    expected_updates = m.updates_per_step(4 * 4 * m.rollout_multiplier, 8)
    assert all(r["a/updates"] == expected_updates for r in rows)
    assert all(0.0 <= r["a/reward"] <= 1.0 for r in rows)
    assert "a/s_homo_mean" in rows[0] and "a/kl" in rows[0] and "a/own_clip_frac" in rows[0]
    ckpt = tmp_path / method / "checkpoints" / "a" / "step-2"
    assert (ckpt / "config.json").exists() and (ckpt / "trainer_state.pt").exists()
    val = MetricsLog(tmp_path / method / "validation.jsonl").read()
    assert [v["step"] for v in val] == [0, 2]
    prof = json.loads((tmp_path / method / "profile.json").read_text())
    assert prof["phase_s"]["update"] > 0 and prof["tokens_per_s"] > 0


def _weights_changed(before: str, after: str) -> bool:
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(before).state_dict()
    b = AutoModelForCausalLM.from_pretrained(after).state_dict()
    return any(not torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("method", "knobs"), JOINT, ids=[m + "".join(f"-{k}={v}" for k, v in kn.items()) for m, kn in JOINT]
)
def test_joint_methods_train_across_tokenizers(tmp_path, toy_data, small_agent, other_agent, method, knobs):
    """Llama/char + Qwen3/word: cross rows are decoded and re-tokenised; both agents learn."""
    cfg = _cfg(tmp_path, [("llama", small_agent), ("qwen", other_agent)], method, data=toy_data, **knobs)
    train(cfg)
    rows = MetricsLog(tmp_path / method / "metrics.jsonl").read()
    for r in rows:
        for name in ("llama", "qwen"):
            assert r[f"{name}/updates"] == 4  # 2G rows per prompt, 32 rows / 8 = 4 (spec §6)
            assert r[f"{name}/own_rows"] == 4.0  # mixed order: 16 own of 32 rows over 4 mini-batches
            assert f"{name}/s_hete_mean" in r  # this agent's own cross rows, not any agent's
        assert len(r["omega"]) == 2
    for name in ("llama", "qwen"):
        path = small_agent if name == "llama" else other_agent
        assert _weights_changed(str(path), str(tmp_path / method / "checkpoints" / name / "step-2"))


@pytest.mark.parametrize("method", ["xgrpo", "xgrpo_capability", "sgt"])
def test_sharing_rules_train(tmp_path, toy_data, small_agent, other_agent, method, monkeypatch):
    """XGRPO and SGT on Llama/char + Qwen3/word: GSPO's row count per learner (16 rows → 2 updates); XGRPO's
    rows are its own, SGT's peer rows are rescued successes with the rescue advantage; both agents learn."""
    import hacpo.algo.losses as losses

    seen = []
    real = losses.policy_loss

    def spy(batch, spec, m=0):
        if batch.n_total is None:
            seen.append((batch.is_own.cpu().clone(), batch.adv.cpu().clone(), spec.kind))
        return real(batch, spec, m)

    monkeypatch.setattr(losses, "policy_loss", spy)
    cfg = _cfg(tmp_path, [("llama", small_agent), ("qwen", other_agent)], method, data=toy_data)
    train(cfg)
    for r in MetricsLog(tmp_path / method / "metrics.jsonl").read():
        for name in ("llama", "qwen"):
            assert r[f"{name}/updates"] == 2 and r[f"{name}/rows"] == 8.0
    assert {kind for *_, kind in seen} == {"sgt" if method == "sgt" else "gspo"}
    cross = torch.cat([~own for own, *_ in seen])
    adv = torch.cat([a for _, a, _ in seen])
    if method == "sgt":
        # rescued successes, with the rescue advantage (10 of the 64 rows seen, seeded, on the test CPU)
        assert bool(cross.any()) and bool((adv[cross] == 1.0).all())
    else:
        assert not bool(cross.any())  # XGRPO: the peers' rewards move the baseline, their rows stay out
    for name in ("llama", "qwen"):
        path = small_agent if name == "llama" else other_agent
        assert _weights_changed(str(path), str(tmp_path / method / "checkpoints" / name / "step-2"))


def test_hacpo_cross_rows_carry_omega_and_stepwise_bounds(
    tmp_path, toy_data, small_agent, other_agent, monkeypatch
):
    """Spy on the algo loss: every cross row gets ω^(j,k) of the step; update m gets lo = 0.8 + m·0.025."""
    import hacpo.algo.losses as losses

    seen = []
    real = losses.policy_loss

    def spy(batch, spec, m=0):
        loss, metrics = real(batch, spec, m)
        if batch.n_total is None:  # the full mini-batch (not the backward-only subset of live rows)
            seen.append((m, batch.is_own.clone(), batch.omega.clone(), spec, metrics))
        return loss, metrics

    monkeypatch.setattr(losses, "policy_loss", spy)
    cfg = _cfg(tmp_path, [("llama", small_agent), ("qwen", other_agent)], "hacpo", data=toy_data, steps=1)
    trainer = LocalTrainer(cfg)
    row = trainer.train_step(0).row
    omega = torch.tensor(row["omega"], dtype=torch.float64)
    assert [s[0] for s in seen] == [0, 1, 2, 3, 0, 1, 2, 3]  # m resets per learner and step
    for i, (m, own, w, spec, metrics) in enumerate(seen):
        k = 0 if i < 4 else 1
        own, w = own.cpu(), w.cpu()  # the spy saw the batch on the run's device
        assert torch.all(w[own] == 1.0)
        assert torch.allclose(w[~own], omega[1 - k, k].expand_as(w[~own]))  # ω^(j,k)
        lo, hi = cross_bounds(spec, m)
        assert lo == pytest.approx(0.8 + 0.025 * m) and hi == 1.0
        if m == 0:  # before the learner's first update its own ratio is 1 (old = sampling log-probs on CPU)
            assert metrics["s_homo_min"] == pytest.approx(1.0, abs=RATIO_TOL)
            assert metrics["s_homo_max"] == pytest.approx(1.0, abs=RATIO_TOL)
    for name in ("llama", "qwen"):
        assert row[f"{name}/cross_lo"] == pytest.approx(0.8 + 0.025 * 1.5)  # mean over m = 0..3
        assert row[f"{name}/s_homo_mean"] == pytest.approx(1.0, abs=2e-2)
        # A different model reads the other's text with its own probabilities: the ratio is finite and not
        # the identical-agents 1 (T6). Its side of 1 depends on the agents (it differs between CPUs, whose
        # kernels give slightly different warm-ups), so it is not asserted.
        lo, mean, hi = (row[f"{name}/s_hete_{s}"] for s in ("min", "mean", "max"))
        assert 0.0 < lo <= mean <= hi < float("inf") and abs(mean - 1.0) > 1e-3


def test_identical_agents_give_unit_cross_ratio(tmp_path, toy_data, small_agent):
    """T6 end to end: learner == generator (same weights and tokenizer), first update → s_hete = 1."""
    cfg = _cfg(
        tmp_path,
        [("a", small_agent), ("b", small_agent)],
        "hacpo",
        data=toy_data,
        steps=1,
        minibatch_size=32,
        kl_beta=0.0,
    )
    row = LocalTrainer(cfg).train_step(0).row
    assert row["a/updates"] == 1
    assert row["a/s_hete_mean"] == pytest.approx(1.0, abs=RATIO_TOL)
    assert row["a/s_hete_min"] == pytest.approx(1.0, abs=RATIO_TOL)
    assert row["a/s_homo_mean"] == pytest.approx(1.0, abs=RATIO_TOL)


def test_a_sampling_temperature_trains_the_tempered_policy(tmp_path, toy_data, small_agent):
    """At temperature T every log-prob the trainer computes is of softmax(z / T), the distribution the
    sampler drew from: with the sampler's own log-probs as π_old, the first update's ratios are 1 (they are
    not with untempered training passes), for own and cross rows alike."""
    cfg = _cfg(
        tmp_path, [("a", small_agent), ("b", small_agent)], "hacpo", data=toy_data, steps=1,
        minibatch_size=32, kl_beta=0.0, temperature=0.5, old_logp="sampler",
    )  # fmt: skip
    row = LocalTrainer(cfg).train_step(0).row
    assert row["a/updates"] == 1
    for key in ("s_homo_min", "s_homo_max", "s_hete_min", "s_hete_max"):
        assert row[f"a/{key}"] == pytest.approx(1.0, abs=RATIO_TOL), key
    # the step's summed advantages, own and cross rows (the weak-partner logs of issue 44)
    assert {"a/own_adv_sum", "a/cross_adv_sum", "b/own_adv_sum"} <= set(row)


def test_gspo_own_advantages_sum_to_zero_per_step(tmp_path, toy_data, small_agent):
    """GSPO's group-normalised advantages sum to 0 over a group, so a step's own_adv_sum, summed over its
    updates (two mini-batches here), is 0."""
    cfg = _cfg(tmp_path, [("a", small_agent)], "gspo", data=toy_data, steps=1, minibatch_size=8, kl_beta=0.0)
    result = LocalTrainer(cfg).train_step(0)
    assert result.row["a/updates"] == 2
    assert result.row["a/own_adv_sum"] == pytest.approx(0.0, abs=1e-4)
    assert "a/cross_adv_sum" in result.row and result.row["a/cross_adv_sum"] == 0.0


@pytest.mark.parametrize("val_every", [0, 2])  # 2: the resume step is also a validation step
def test_resume_after_kill_matches_uninterrupted(
    tmp_path, toy_data, small_agent, other_agent, monkeypatch, val_every
):
    agents = [("llama", small_agent), ("qwen", other_agent)]
    wandb = {"wandb": {"project": "hacpo-tests", "mode": "offline"}}  # W&B's offline files: no network
    kw = dict(data=toy_data, steps=4, checkpoint_every=2, val_every=val_every, val_size=20, logging=wandb)
    ref = _cfg(tmp_path / "ref", agents, "hacpo", **kw)
    train(ref)

    cfg = _cfg(tmp_path / "killed", agents, "hacpo", **kw)
    train_killed_at(cfg, 3, monkeypatch)
    assert RunRecord.read(tmp_path / "killed/hacpo").status == "running"
    train(cfg)

    a = metrics_without_timing(tmp_path / "ref/hacpo")
    b = metrics_without_timing(tmp_path / "killed/hacpo")
    if TEST_DEVICE == "cpu":
        assert a == b  # bitwise: same machine, same thread count
    else:  # CUDA: atomics in embedding backward and split-K matmuls do not reproduce bitwise; 1e-4 relative
        assert [r.keys() for r in a] == [r.keys() for r in b]
        for ra, rb in zip(a, b, strict=True):
            for key, value in ra.items():
                assert rb[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    va = MetricsLog(tmp_path / "ref/hacpo/validation.jsonl").read()
    vb = MetricsLog(tmp_path / "killed/hacpo/validation.jsonl").read()
    assert [v["step"] for v in va] == ([0, 0, 2, 2, 4, 4] if val_every else [0, 0, 4, 4])
    assert va == vb
    ua = MetricsLog(tmp_path / "ref/hacpo/updates.jsonl").read()
    ub = MetricsLog(tmp_path / "killed/hacpo/updates.jsonl").read()
    assert [(u["step"], u["agent"]) for u in ub] == [(u["step"], u["agent"]) for u in ua]  # no dups, no gaps
    if TEST_DEVICE == "cpu":
        assert ua == ub
    for run in ("ref", "killed"):  # the live curves: each step once, equal to the logs (issue 31)
        assert_events_match_logs(tmp_path / run / "hacpo")
        assert_wandb_matches_logs(tmp_path / run / "hacpo")


def test_resume_on_another_device_type_is_refused(tmp_path, toy_data, small_agent, monkeypatch):
    """A run checkpointed on one device type does not resume on another (the sampler's random stream and
    bitwise resume belong to one): a clear error naming the device to use, before any step runs."""
    import hacpo.engines.local.trainer as tr

    cfg = _cfg(tmp_path, [("a", small_agent)], "gspo", data=toy_data, steps=3, checkpoint_every=1)
    train_killed_at(cfg, 1, monkeypatch)
    state_file = tmp_path / "gspo" / "checkpoints" / "a" / "step-1" / "trainer_state.pt"
    state = torch.load(state_file, weights_only=False)
    assert state["device_type"] == torch.device(TEST_DEVICE).type
    other = "cuda" if TEST_DEVICE == "cpu" else "cpu"
    torch.save({**state, "device_type": other}, state_file)
    write_checkpoint_manifest(state_file.parent)  # as a run trained there would have written it
    monkeypatch.setattr(tr.LocalTrainer, "train_step", lambda self, step: pytest.fail("trained"))
    with pytest.raises(ValueError, match=rf"was trained on {other} .* resume it with `device: {other}`"):
        train(cfg)


def test_completed_run_is_not_retrained(tmp_path, toy_data, small_agent):
    cfg = _cfg(tmp_path, [("a", small_agent)], "gspo", data=toy_data, steps=1)
    train(cfg)
    mtime = (tmp_path / "gspo" / "metrics.jsonl").stat().st_mtime_ns
    assert train(cfg).complete
    assert (tmp_path / "gspo" / "metrics.jsonl").stat().st_mtime_ns == mtime


def test_a_completed_run_can_keep_its_final_weights_only(tmp_path, toy_data, small_agent, other_agent):
    """final_checkpoint: weights (a runtime option): once complete, every agent keeps only the final step's
    weights, intact against its rewritten manifest and loadable; the run is not retrained and its identity
    is the full run's. A many-run target (config/real-claims.yaml) fits a disk with it."""
    from transformers import AutoModelForCausalLM

    from hacpo.checkpoints import checkpoint_problem

    agents = [("a", small_agent), ("b", other_agent)]
    kw = dict(data=toy_data, steps=4, checkpoint_every=2, keep_checkpoints=2)
    full = LocalTrainer(_cfg(tmp_path / "full", agents, "hacpo", **kw))
    slim_cfg = _cfg(tmp_path / "slim", agents, "hacpo", final_checkpoint="weights", **kw)
    slim = LocalTrainer(slim_cfg)
    assert slim.config_hash() == slim_cfg.model_copy(update={"final_checkpoint": "full"}).config_hash()
    full.train(), slim.train()
    for name in ("a", "b"):
        kept = sorted(p.name for p in (tmp_path / "full/hacpo/checkpoints" / name).iterdir())
        assert kept == ["step-2", "step-4"]
        folder = tmp_path / "slim/hacpo/checkpoints" / name
        assert sorted(p.name for p in folder.iterdir()) == ["step-4"]
        assert not (folder / "step-4" / "trainer_state.pt").exists()
        assert checkpoint_problem(folder / "step-4") is None
        AutoModelForCausalLM.from_pretrained(folder / "step-4")
    assert train(slim_cfg).complete  # not retrained: nothing to resume from is needed


def test_changed_config_in_existing_dir_is_refused(tmp_path, toy_data, small_agent):
    train(_cfg(tmp_path, [("a", small_agent)], "gspo", data=toy_data, steps=1))
    with pytest.raises(ValueError, match="different config"):
        train(_cfg(tmp_path, [("a", small_agent)], "gspo", data=toy_data, steps=1, lr=1e-4))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"method": "hacpo_fancy"}, "unknown method"),
        ({"method": "hacpo"}, "needs ≥ 2 agents"),
        ({"cross_clip_low": 0.2}, "1−δ"),
        ({"prompts_per_step": 0}, "prompts_per_step"),
        ({"lr": -1}, "lr"),
        ({"bogus_key": 1}, "bogus_key"),
    ],
)
def test_bad_config_is_rejected_before_any_model_is_built(tmp_path, change, message):
    base = dict(
        method="gspo", agents=[{"name": "a", "path": "/nowhere"}], train_file="x", out_dir=str(tmp_path)
    )
    base.update(change)
    with pytest.raises(ValueError, match=message):
        load_train_config(base)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_missing_files_and_devices_are_named_at_once(tmp_path, device):
    """Every problem, with its fix, in one message, before any model is read."""
    cfg = load_train_config(
        dict(
            method="gspo",
            agents=[{"name": "a", "path": str(tmp_path)}],
            train_file="nope.jsonl",
            out_dir=str(tmp_path),
            device=device,
        )
    )
    no_cuda = device == "cuda" and not torch.cuda.is_available()
    expected = (
        ("device: cuda, but torch sees no CUDA device.*; " if no_cuda else "^")
        + "train_file 'nope.jsonl' does not exist: make it with `hacpo data`.*"
        + "not a Hugging Face model directory.*huggingface-cli download ORG/MODEL --local-dir"
    )
    with pytest.raises(ValueError, match=expected):
        LocalTrainer(cfg)


def test_paper_prompt_wording_with_variable_length_prompts(tmp_path, small_agent, other_agent):
    """Word problems in the paper's wording: prompts differ in length (left padding through generation,
    the shared-prompt forward and the update) and cross rows are re-tokenised between tokenizers."""
    from hacpo.data.synthetic import make_splits, write_jsonl

    splits = make_splits(["word"], seed=0, n_test=8, n_dev=4, n_train=64)
    write_jsonl(tmp_path / "train.jsonl", splits["train"])
    write_jsonl(tmp_path / "test.jsonl", splits["test"])
    cfg = _cfg(
        tmp_path,
        [("llama", small_agent), ("qwen", other_agent)],
        "hacpo",
        data=tmp_path,
        steps=1,
        prompt_style="paper",
        max_new_tokens=24,
        val_size=8,
    )
    trainer = LocalTrainer(cfg)
    ids, mask = trainer.agents[0].prompt_ids(trainer.problems[:4], "paper", "cpu")
    assert not bool(mask.all())  # genuinely left-padded
    text = trainer.agents[0].tok.decode(ids[0][mask[0]])
    assert "Let's think step by step and output the final answer within \\boxed{}." in text
    row = trainer.train_step(0).row
    for name in ("llama", "qwen"):
        assert row[f"{name}/updates"] == 4
        assert row[f"{name}/s_homo_mean"] == pytest.approx(1.0, abs=2e-2)
        # Untrained on this text, either agent may find the other's answer more or less likely than its
        # generator did; what must hold is a finite ratio and a valid in-bounds fraction.
        assert 0.0 < row[f"{name}/s_hete_min"] <= row[f"{name}/s_hete_mean"] <= row[f"{name}/s_hete_max"]
        assert 0.0 <= row[f"{name}/cross_in_bounds_frac"] <= 1.0


# self_first: mini-batches of cross rows only; agent_order: mini-batches of one generating agent
@pytest.mark.parametrize("order", ["mixed", "self_first", "agent_order"])
def test_skipping_dead_rows_is_exact(tmp_path, toy_data, small_agent, other_agent, order):
    """Leaving zero-gradient cross rows out of the backward changes neither the update nor the metrics."""
    from transformers import AutoModelForCausalLM

    agents = [("llama", small_agent), ("qwen", other_agent)]
    runs = {}
    for skip in (True, False):
        cfg = _cfg(
            tmp_path / str(skip),
            agents,
            "hacpo",
            data=toy_data,
            steps=2,
            skip_dead_rows=skip,
            minibatch_order=order,
        )
        train(cfg)
        runs[skip] = MetricsLog(tmp_path / str(skip) / "hacpo" / "metrics.jsonl").read()
    a, b = runs[True], runs[False]
    assert any(r["llama/backward_rows_frac"] < 1.0 for r in a)  # rows were really skipped
    for ra, rb in zip(a, b, strict=True):
        for key, vb in rb.items():
            if key.startswith(("time/", "mem/")) or not isinstance(vb, float):
                continue
            assert ra[key] == pytest.approx(vb, rel=1e-4, abs=1e-5), key
    for name in ("llama", "qwen"):
        wa = AutoModelForCausalLM.from_pretrained(
            tmp_path / "True/hacpo/checkpoints" / name / "step-2"
        ).state_dict()
        wb = AutoModelForCausalLM.from_pretrained(
            tmp_path / "False/hacpo/checkpoints" / name / "step-2"
        ).state_dict()
        for k in wa:
            assert torch.allclose(wa[k], wb[k], atol=1e-6), k


@pytest.mark.parametrize("order", ["agent_order", "mixed", "self_first"])
def test_updates_jsonl_shows_each_orders_rows_per_update(tmp_path, toy_data, small_agent, other_agent, order):
    """Issue 25's check: 2 agents, 4 prompts × 4 samples each, mini-batches of 8 rows: 32 rows per learner,
    4 updates. agent_order: own rows 8, 8, 0, 0 for the first agent and 0, 0, 8, 8 for the second, every step,
    lo_m 0.8 … 0.875; self_first: 8, 8, 0, 0 for both; mixed: own and cross rows together."""
    agents = [("llama", small_agent), ("qwen", other_agent)]
    kw = dict(prompts_per_step=4, group_size=4, minibatch_size=8, minibatch_order=order)
    cfg = _cfg(tmp_path, agents, "hacpo", data=toy_data, steps=2, **kw)
    train(cfg)
    updates = MetricsLog(tmp_path / "hacpo" / "updates.jsonl").read()
    assert [(u["step"], u["agent"], u["update"]) for u in updates] == [
        (s, a, m) for s in range(2) for a in ("llama", "qwen") for m in range(4)
    ]
    assert all(u["own_rows"] + u["cross_rows"] == 8 for u in updates)
    assert [u["cross_lo"] for u in updates[:4]] == [0.8, 0.825, 0.85, 0.875]
    own = {(u["step"], u["agent"]): [] for u in updates}
    for u in updates:
        own[u["step"], u["agent"]].append(u["own_rows"])
        assert u["kl_term"] == (u["own_rows"] > 0)  # no own row, no KL term
        assert (u["cross_in_bounds_frac"] is None) == (u["cross_rows"] == 0)
    first, second = {"agent_order": ([8, 8, 0, 0], [0, 0, 8, 8]), "self_first": ([8, 8, 0, 0],) * 2}.get(
        order, (None, None)
    )
    for (_step, agent), rows in own.items():
        if order == "mixed":
            assert sum(rows) == 16
        else:
            assert rows == (first if agent == "llama" else second)
    if order == "mixed":
        assert any(0 < u["own_rows"] < 8 for u in updates)  # a mixed mini-batch


def test_agent_order_gives_every_learner_the_rows_by_generating_agent_then_prompt(
    tmp_path, toy_data, small_agent, other_agent
):
    """minibatch_order: agent_order (the authors' released code, spec §10): agent 0's rows, then agent 1's,
    each by prompt, for both learners; so learner 0 meets its own rows first and learner 1 its cross rows."""
    agents = [("llama", small_agent), ("qwen", other_agent)]
    cfg = _cfg(tmp_path, agents, "hacpo", data=toy_data, steps=1, minibatch_order="agent_order")
    trainer = LocalTrainer(cfg)
    problems = trainer.problems[: cfg.prompts_per_step]
    rolls = [trainer.rollout(k, 0, problems, cfg.group_size) for k in range(2)]
    omegas = trainer.tracker.omegas()
    for k in range(2):
        rows = trainer.learner_rows(k, rolls, omegas, problems)
        order = trainer._order(rows, k, step=0)
        keys = list(zip(rows.agent[order].tolist(), rows.prompt_index[order].tolist(), strict=True))
        assert keys == sorted(keys) and len(set(rows.agent.tolist())) == 2
        first = rows.is_own[order][: cfg.minibatch_size]
        assert bool(first.all()) == (k == 0) and bool((~first).all()) == (k == 1)


def test_method_variants_resolve_from_config(tmp_path):
    base = dict(agents=[{"name": "a", "path": "x"}, {"name": "b", "path": "y"}], train_file="t", out_dir="o")
    cfg = load_train_config(dict(base, method="naive", naive_cross_ratio="self_old"))
    assert cfg.resolved_method().naive_cross_ratio == "self_old"
    default = load_train_config(dict(base, method="naive"))  # spec §2.5's default reading, named in the run
    assert default.naive_cross_ratio == default.resolved_method().naive_cross_ratio == "self_old"
    source = load_train_config(dict(base, method="naive", naive_cross_ratio="source"))
    assert source.resolved_method().naive_cross_ratio == "source"
    assert source.config_hash() != default.config_hash()  # two computations, two identities
    one = dict(
        base, agents=base["agents"][:1], method="gspo_updates_x2", gspo_updates_x2_mode="half_minibatch"
    )
    assert load_train_config(one).resolved_method().minibatch_divisor == 2
    hacpo = load_train_config(dict(base, method="hacpo", alpha=3.0, delta_step=0.01))
    assert (hacpo.loss_spec().alpha, hacpo.loss_spec().delta_step, hacpo.loss_spec().cross_clip_low) == (
        3.0,
        0.01,
        0.8,
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"method": "naive", "alpha": 3.0}, "method 'naive' does not read alpha"),
        ({"method": "gspo", "agents": [{"name": "a", "path": "x"}], "delta_step": 0.01}, "does not read"),
        ({"method": "hacpo", "naive_cross_ratio": "self_old"}, "does not read naive_cross_ratio"),
        ({"method": "hacpo", "alpha": -1.0}, "alpha=-1.0 must be ≥ 0"),
        ({"method": "hacpo", "rescue_advantage": 2.0}, "rescue_advantage applies to SGT only"),
        ({"method": "sgt", "rescue_advantage": 0.0}, "greater than 0"),
        ({"method": "hacpo_alpha3"}, "unknown method"),
    ],
)
def test_knobs_a_method_does_not_read_are_refused(change, message):
    base = dict(agents=[{"name": "a", "path": "x"}, {"name": "b", "path": "y"}], train_file="t", out_dir="o")
    with pytest.raises(ValueError, match=message):
        load_train_config(dict(base, **change))


# ------------------------------------------------------------------------ real model sizes (issue 12)
def _one_step_weights(cfg) -> tuple[dict, list[torch.Tensor]]:
    trainer = LocalTrainer(cfg)
    row = trainer.train_step(0).row
    return row, [torch.cat([p.detach().reshape(-1) for p in a.model.parameters()]) for a in trainer.agents]


@pytest.mark.parametrize("knob", [{"micro_batch_tokens": 40}, {"gradient_checkpointing": True}])
def test_memory_knobs_keep_the_maths(tmp_path, small_agent, other_agent, toy_data, knob):
    """Micro-batching by token budget (gradients accumulated to the mini-batch's, normalised by its N_m and
    own-token count) and gradient checkpointing (a plain forward per row in the update) change memory, not
    the update: after one HACPO step every weight matches the default run (fp32 summation order aside), the
    metrics agree, and the run keeps its identity (resumable either way)."""
    agents = [("llama", small_agent), ("qwen", other_agent)]
    base = _cfg(tmp_path / "a", agents, "hacpo", data=toy_data, steps=1)
    other = _cfg(tmp_path / "b", agents, "hacpo", data=toy_data, steps=1, **knob)
    assert base.config_hash() == other.model_copy(update={"out_dir": base.out_dir}).config_hash()
    if "gradient_checkpointing" in knob:
        model = LocalTrainer(other).agents[0].model
        assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing
    row_a, weights_a = _one_step_weights(base)
    row_b, weights_b = _one_step_weights(other)
    for a, b in zip(weights_a, weights_b, strict=True):
        assert not torch.equal(a, b) or "gradient_checkpointing" in knob  # summation order differs, a bit
        # Adam divides each step by √v, so an element whose gradient is near 0 can move by a fraction of lr
        # (3e-5) under another fp32 summation order (2.7e-6 seen with transformers 5.24); a wrong weighting
        # of the micro-batches moves many by more, and the loss metric below catches a wrong scale
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for key in (
        "llama/reward",
        "qwen/reward",
        "llama/s_homo_mean",
        "qwen/s_hete_mean",
        "llama/kl",
        "qwen/loss",
    ):
        assert row_b[key] == pytest.approx(row_a[key], abs=1e-5), key


def test_micro_batches_respect_the_token_budget(tmp_path, small_agent, other_agent, toy_data):
    cfg = _cfg(tmp_path, [("llama", small_agent), ("qwen", other_agent)], "hacpo", data=toy_data,
               steps=1, micro_batch_tokens=40)  # fmt: skip
    trainer = LocalTrainer(cfg)
    rows = trainer._rows_for(0, [trainer._rollout(a, trainer.problems[:4], 4) for a in trainer.agents],
                             torch.ones(2, 2, dtype=torch.float64))  # fmt: skip
    p_ids, _ = trainer.agents[0].prompt_ids(trainer.problems[:4], "compact", "cpu")
    idx = torch.randperm(len(rows.adv))
    parts = trainer._micro_batches(idx, rows, p_ids)
    assert sorted(torch.cat(parts).tolist()) == sorted(idx.tolist()) and len(parts) > 1  # every row, once
    lengths = [rows.mask[part].sum(1) for part in parts]
    for part, length in zip(parts, lengths, strict=True):  # as the forward runs them: padded
        assert len(part) * (p_ids.shape[1] + int(length.max())) <= 40 or len(part) == 1
    assert all(int(a.min()) >= int(b.max()) for a, b in itertools.pairwise(lengths))  # longest first


class _PhaseNames:
    """The trainer's :class:`~hacpo.engines.phases.Phases`, also telling which phase is running."""

    def __init__(self, inner):
        self.inner, self.name = inner, None

    @contextlib.contextmanager
    def __call__(self, name):
        self.name = name
        with self.inner(name):
            yield
        self.name = None

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


@pytest.mark.parametrize(
    "knobs",
    [{}, {"gradient_checkpointing": True}, {"method": "naive", "naive_cross_ratio": "self_old"}],
    ids=["shared-prefixes", "checkpointing", "naive-self-old"],
)
def test_every_forward_after_generation_stays_within_the_token_budget(
    tmp_path, small_agent, other_agent, toy_data, knobs
):
    """What ``micro_batch_tokens`` promises a GPU: no forward of the log-prob passes or of the update runs,
    or makes full-vocabulary logits for, more than that many positions, padding included (a forward of one
    row aside: it cannot be cut)."""
    budget = 90
    agents = [("llama", small_agent), ("qwen", other_agent)]
    knobs = {"method": "hacpo", "old_logp": "forward", **knobs}  # π_old by forward: a pass of its own
    cfg = _cfg(tmp_path, agents, data=toy_data, steps=1, micro_batch_tokens=budget, **knobs)
    trainer = LocalTrainer(cfg)
    trainer.phase = _PhaseNames(trainer.phase)
    seen = collections.defaultdict(list)

    def count(_module, args, kwargs, out):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if trainer.phase.name != "generate" and ids is not None:
            seen[trainer.phase.name].append(
                (ids.shape[0], max(ids.numel(), out.logits.shape[0] * out.logits.shape[1]))
            )

    for agent in trainer.agents:
        for model in (agent.model, agent.ref):
            if model is not None:
                model.register_forward_hook(count, with_kwargs=True)
    trainer.train_step(0)
    assert {"logprobs", "update"} <= set(seen), set(seen)
    over = [(phase, rows, n) for phase, runs in seen.items() for rows, n in runs if n > budget and rows > 1]
    assert not over, over
    assert max(n for runs in seen.values() for _, n in runs) > budget // 2  # the budget is what binds


def test_bf16_precision_trains_and_is_part_of_the_identity(tmp_path, small_agent, other_agent, toy_data):
    """precision: bf16 — autocast around every forward, fp32 master weights: a step trains (finite metrics,
    weights still fp32 and moved), and a bf16 run never resumes an fp32 one (different identity)."""
    agents = [("llama", small_agent), ("qwen", other_agent)]
    fp32 = _cfg(tmp_path / "a", agents, "hacpo", data=toy_data, steps=1)
    bf16 = _cfg(tmp_path / "b", agents, "hacpo", data=toy_data, steps=1, precision="bf16")
    assert fp32.config_hash() != bf16.model_copy(update={"out_dir": fp32.out_dir}).config_hash()
    trainer = LocalTrainer(bf16)
    before = [
        torch.cat([p.detach().reshape(-1).clone() for p in a.model.parameters()]) for a in trainer.agents
    ]
    row = trainer.train_step(0).row
    for a, b in zip(trainer.agents, before, strict=True):
        after = torch.cat([p.detach().reshape(-1) for p in a.model.parameters()])
        assert after.dtype == torch.float32 and not torch.equal(after, b)
    assert all(math.isfinite(v) for k, v in row.items() if isinstance(v, float)), row


def test_identity_of_runs_from_before_the_precision_option(tmp_path, small_agent, toy_data):
    """fp32 runs keep the hash they had before precision / micro-batching / checkpointing existed."""
    import hashlib
    import json

    cfg = _cfg(tmp_path, [("llama", small_agent)], "gspo", data=toy_data)
    new = {"precision", "gradient_checkpointing", "micro_batch_tokens", "generation_batch_tokens", "fidelity"}
    new |= {"same_tokenizer", "reward"}  # issue 25: at their defaults a run keeps its identity
    runtime = {"progress", "threads", "scorer_workers", "device", "openrlhf", "logging"}  # logging: issue 31
    runtime |= {"reward_timeout_s", "reward_retry_budget_s"}  # issues 37 and 43
    runtime |= {"final_checkpoint"}  # issue 44
    runtime |= {"nonfinite_max_skips"}  # when a diverging run stops: never what a finished one computed
    new |= {"adapter"}  # issue 42: full fine-tuning, on the run and on each agent
    new |= {"rescue_advantage"}  # issue 45: SGT's knob, None for every other method
    old = cfg.model_dump(exclude={*runtime, *new, "agents"})
    old["agents"] = [{"name": a.name, "path": a.path} for a in cfg.agents]
    assert cfg.config_hash() == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]


def test_a_prompt_is_cached_by_its_problem_not_its_id_alone(small_agent):
    """Two files may reuse an id for another problem (a train and a validation split written by hand): the
    agent's prompt cache must render each problem's own text, not the first one seen under that id."""
    from transformers import AutoTokenizer

    from hacpo.engines.local.agent import Agent

    tok = AutoTokenizer.from_pretrained(small_agent)
    agent = Agent("a", str(small_agent), None, None, tok, None, None, frozenset(), pad_id=0)
    first, second = (
        {"id": "p1", "problem": "1 + 1", "answer": "2"},
        {"id": "p1", "problem": "7 + 5", "answer": "12"},
    )
    a, _ = agent.prompt_ids([first], "compact", "cpu")
    b, _ = agent.prompt_ids([second], "compact", "cpu")
    assert "7 + 5" in tok.decode(b[0]) and not torch.equal(a, b)
