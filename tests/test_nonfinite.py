"""A diverging run looks diverged: a non-finite update is skipped and counted, never applied; a run of them
stops the run before its next checkpoint, naming the step, the agent and the checkpoint to resume from; no
checkpoint on disk holds NaN; metrics and the live views keep a NaN visible."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from toy_runs import toy_train_config

from hacpo.algo import MiniBatch, NonFiniteLogProbs, get_method, policy_loss
from hacpo.engines.core.metrics import aggregate, update_record
from hacpo.engines.core.nonfinite import (
    SKIPPED,
    Diverged,
    NonFiniteWeights,
    SkipGuard,
    may_step,
    nonfinite_weights,
)
from hacpo.engines.core.trackers import NONFINITE_VALUES, scalars
from hacpo.runio import MetricsLog, RunRecord, read_jsonl

# ----------------------------------------------------------------------------- the engine-agnostic pieces


def test_a_step_runs_only_on_a_finite_loss_and_gradient_norm():
    assert may_step(0.5, 3.0) and may_step(None, 1e30) and may_step()
    for bad in (math.nan, math.inf, -math.inf):
        assert not may_step(bad, 1.0) and not may_step(0.5, bad)
    assert not may_step(torch.tensor(math.nan), 1.0)  # a 0-d tensor, as an engine may hand it


def test_aggregate_keeps_a_nan_visible_and_sums_the_skips():
    ok = {"update": 0, "loss": 1.0, "grad_norm": 2.0, "s_hete_min": 0.5, SKIPPED: 0.0}
    bad = {"update": 1, "loss": math.nan, "grad_norm": math.inf, "s_hete_min": math.nan, SKIPPED: 1.0}
    for order in ([ok, bad], [bad, ok]):  # min() and max() of NaN depend on order: not here
        step = aggregate([*order, {**bad, "update": 2}])
        assert math.isnan(step["loss"]) and math.isnan(step["s_hete_min"])
        assert step["grad_norm"] == math.inf and step[SKIPPED] == 2.0 and step["updates"] == 3.0
    assert aggregate([ok])[SKIPPED] == 0.0


def test_views_keep_non_finite_values_and_count_them():
    row = {"step": 4, "big/grad_norm": math.nan, "big/loss": math.inf, "big/reward": 0.5, "omega": [[1.0]]}
    got = scalars(row)
    assert math.isnan(got["big/grad_norm"]) and got["big/loss"] == math.inf and got["big/reward"] == 0.5
    assert got[NONFINITE_VALUES] == 2.0
    assert NONFINITE_VALUES not in scalars({"step": 1, "big/reward": 0.5})


def test_update_rows_say_which_update_was_skipped():
    spec = get_method("hacpo").loss_spec()
    assert update_record(3, "big", {"update": 1, "rows": 8, "own_rows": 8, SKIPPED: 1.0}, spec)["skipped"]
    assert not update_record(3, "big", {"update": 0, "rows": 8, "own_rows": 8}, spec)["skipped"]


def _rows(step, agent, skipped):
    return [{"step": step, "agent": agent, "update": m, "skipped": s} for m, s in enumerate(skipped)]


def test_the_guard_stops_at_k_consecutive_skips_of_one_agent():
    guard = SkipGuard(3, where=lambda s: f"ckpt/<agent>/step-{s}")
    guard.resumed(0)
    guard.observe(0, _rows(0, "big", [False, True, True]) + _rows(0, "small", [True]))
    guard.saved(1)
    guard.observe(1, _rows(1, "small", [True, False]))  # small's run of skips broken: no stop
    with pytest.raises(Diverged) as err:
        guard.observe(1, _rows(1, "big", [True, False]))
    text = str(err.value)
    for part in (
        "step 1",
        "'big'",
        "the first at step 0, update 1",
        "step-2 checkpoint",
        "ckpt/<agent>/step-1",
    ):
        assert part in text, text
    with pytest.raises(Diverged, match="No checkpoint was written yet"):
        SkipGuard(1).observe(0, _rows(0, "big", [True]))
    guard = SkipGuard(2)
    guard.observe(0, _rows(0, "big", [True]))
    guard.resumed(4)  # a resumed run starts its count afresh
    guard.observe(4, _rows(4, "big", [True]))


def test_non_finite_weights_are_named():
    model = torch.nn.Linear(3, 2)
    assert nonfinite_weights(model.named_parameters()) == []
    with torch.no_grad():
        model.bias[1] = math.nan
    assert nonfinite_weights(model.named_parameters()) == ["bias"]
    error = SkipGuard(3).weights(5, NonFiniteWeights("big", ["bias"]))
    assert "big's weights hold NaN/inf (bias)" in str(error)
    assert "the step-5 checkpoint was not written" in str(error)


def test_the_loss_names_the_learners_own_non_finite_log_probs():
    """Bad input (adv, old log-probs, ω) is a ValueError naming it; the learner's own log-probs, non-finite on
    a response token, are NonFiniteLogProbs (an update to skip); padding is not read."""
    spec = get_method("hacpo").loss_spec()
    mask = torch.tensor([[True, True, False], [True, False, False]])
    logp = torch.tensor([[-1.0, -2.0, math.nan], [-0.5, math.inf, 0.0]])  # NaN/inf on padding only
    batch = dict(mask=mask, adv=torch.tensor([1.0, -1.0]), old_mean_logp=torch.tensor([-1.5, -0.5]))
    policy_loss(MiniBatch(logp=logp, **batch), spec, 0)
    logp[0, 1] = math.nan
    with pytest.raises(NonFiniteLogProbs, match=r"logp \(the learner's current log-probs\) contains 1"):
        policy_loss(MiniBatch(logp=logp, **batch), spec, 0)
    bad_input = {**batch, "old_mean_logp": torch.tensor([math.nan, -0.5])}
    with pytest.raises(ValueError, match="old_mean_logp contains 1") as err:
        policy_loss(MiniBatch(logp=logp, **bad_input), spec, 0)
    assert not isinstance(err.value, NonFiniteLogProbs)


# ----------------------------------------------------------------------------- the toy pair, diverging


def _all_checkpoints_finite(out: Path) -> list[Path]:
    from safetensors.torch import load_file

    found = sorted(out.glob("checkpoints/*/step-*/model.safetensors"))
    for path in found:
        weights = load_file(path)
        assert all(bool(torch.isfinite(t).all()) for t in weights.values()), path
    return found


def test_a_diverging_run_skips_counts_and_stops_before_a_checkpoint(
    tmp_path, toy_data, small_agent, other_agent
):
    """The toy pair at lr 10, 6 steps, a checkpoint each step; the big agent's gradients turn NaN from step
    3 on (a hook: deterministic, as a bf16 overflow is not on CPU). Its updates are skipped and counted, the
    run stops at the third in a row with an error naming the step, the agent and the step-3 checkpoint, and
    every checkpoint on disk is finite."""
    import hacpo.engines.local.trainer as tr

    cfg = toy_train_config(
        tmp_path, [("small", small_agent), ("big", other_agent)], "hacpo", data=toy_data,
        steps=6, lr=10.0, checkpoint_every=1, keep_checkpoints=10, minibatch_size=16,
    )  # fmt: skip
    trainer = tr.LocalTrainer(cfg)
    big = trainer.agents[1]
    real_update = trainer._update

    def poisoned(k, rows, problems, step):
        if k == 1 and step >= 3:  # every gradient of big's turns NaN
            hooks = [
                p.register_hook(lambda g: g * math.nan) for p in big.model.parameters() if p.requires_grad
            ]
            try:
                return real_update(k, rows, problems, step)
            finally:
                for h in hooks:
                    h.remove()
        return real_update(k, rows, problems, step)

    trainer._update = poisoned
    with pytest.raises(Diverged) as err:
        trainer.train()
    text = str(err.value)
    assert "training diverged at step 4: agent 'big' had 4 optimizer updates in a row" in text, text
    assert "the first at step 3, update 0" in text and "before the step-5 checkpoint" in text, text
    assert f"step 4 ({Path(cfg.out_dir) / 'checkpoints' / '<agent>' / 'step-4'})" in text, text
    record = RunRecord.read(cfg.out_dir)  # stopped, resumable: not `running` to `hacpo status`
    assert (record.status, record.step) == ("failed", 4)

    rows = MetricsLog(Path(cfg.out_dir) / "metrics.jsonl").read()
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]  # the stopping step's row too: its skips
    assert [r["big/nonfinite/skipped"] for r in rows] == [0.0, 0.0, 0.0, 2.0, 2.0]
    assert [r["small/nonfinite/skipped"] for r in rows] == [0.0] * 5
    assert math.isnan(rows[3]["big/grad_norm"]) and math.isfinite(rows[2]["big/grad_norm"])
    skipped = [
        (u["step"], u["update"]) for u in read_jsonl(Path(cfg.out_dir) / "updates.jsonl") if u["skipped"]
    ]
    assert skipped == [(3, 0), (3, 1), (4, 0), (4, 1)]
    found = _all_checkpoints_finite(Path(cfg.out_dir))
    assert {p.parent.name for p in found} == {f"step-{s}" for s in range(1, 5)}  # none at step 5


def test_weights_gone_non_finite_are_never_checkpointed(tmp_path, toy_data, small_agent, other_agent):
    """Whatever made them so, weights holding NaN stop the run before any agent's checkpoint is written."""
    import hacpo.engines.local.trainer as tr

    cfg = toy_train_config(
        tmp_path, [("small", small_agent), ("big", other_agent)], "hacpo", data=toy_data,
        steps=3, checkpoint_every=1, minibatch_size=16,
    )  # fmt: skip
    trainer = tr.LocalTrainer(cfg)
    real_step = trainer.train_step

    def corrupting(step):
        result = real_step(step)
        if step == 1:
            with torch.no_grad():
                next(trainer.agents[1].model.parameters()).view(-1)[0] = math.inf
        return result

    trainer.train_step = corrupting
    with pytest.raises(Diverged, match=r"diverged by step 2: big's weights hold NaN/inf \(") as err:
        trainer.train()
    assert "the step-2 checkpoint was not written" in str(err.value)
    assert "The last finite checkpoint is step 1" in str(err.value)
    found = _all_checkpoints_finite(Path(cfg.out_dir))
    assert {p.parent.name for p in found} == {"step-1"}  # neither agent's step-2 checkpoint


def test_an_update_is_skipped_whichever_part_or_rank_found_it():
    """OpenRLHF's ranks (and micro-batches) each report their share of an update: one rank's non-finite
    log-probs mark the whole update (DeepSpeed's all-reduced check skips it on every rank)."""
    from hacpo.engines.core.metrics import merge_parts
    from hacpo.engines.core.nonfinite import NONFINITE_LOGP

    merged = merge_parts(
        [(4.0, {"rows": 4.0, NONFINITE_LOGP: 0.0}), (4.0, {"rows": 4.0, NONFINITE_LOGP: 1.0})]
    )
    assert merged[NONFINITE_LOGP] == 1.0 and merged["rows"] == 8.0


def test_non_finite_log_probs_skip_the_update_not_the_run(tmp_path, toy_data, small_agent, other_agent):
    """The learner's own forward overflowing (its log-probs NaN in the loss) skips that update, counted as
    such (``nonfinite/logp``); with room for the skips (``nonfinite_max_skips``) the run goes on, the skipping
    agent's weights as they were."""
    import hacpo.engines.local.trainer as tr

    cfg = toy_train_config(
        tmp_path, [("small", small_agent), ("big", other_agent)], "hacpo", data=toy_data,
        steps=3, minibatch_size=16, nonfinite_max_skips=10,
    )  # fmt: skip
    trainer = tr.LocalTrainer(cfg)
    big = trainer.agents[1].model
    real_update = trainer._update
    kept = {}

    def overflowing(k, rows, problems, step):
        if k != 1 or step < 1:
            return real_update(k, rows, problems, step)
        kept.setdefault("weights", [p.detach().clone() for p in big.parameters()])
        head = big.get_output_embeddings().register_forward_hook(lambda mod, args, out: out * math.nan)
        try:
            return real_update(k, rows, problems, step)
        finally:
            head.remove()

    trainer._update = overflowing
    trainer.train()
    rows = MetricsLog(Path(cfg.out_dir) / "metrics.jsonl").read()
    assert [r["big/nonfinite/logp"] for r in rows] == [0.0, 2.0, 2.0]
    assert [r["big/nonfinite/skipped"] for r in rows] == [0.0, 2.0, 2.0]
    assert [r["small/nonfinite/skipped"] for r in rows] == [0.0, 0.0, 0.0]
    assert math.isnan(rows[1]["big/loss"]) and math.isfinite(rows[1]["small/loss"])
    assert all(torch.equal(a, b) for a, b in zip(kept["weights"], big.parameters(), strict=True))
