"""The ``fidelity`` preset (issue 25): one switch between the run the authors released and the paper's
description; explicit keys win and are recorded; bad values are refused before any job."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from toy_runs import toy_train_config

from hacpo.config import FIDELITY, describe_fidelity, load_train_config
from hacpo.engines.local import LocalTrainer, train
from hacpo.pipeline.config import ConfigError, load_pipeline_config
from hacpo.runio import MetricsLog, RunRecord

BASE = dict(method="hacpo", agents=[{"name": "a", "path": "x"}, {"name": "b", "path": "y"}], train_file="t")
CHOICES = ("minibatch_order", "cross_eos", "same_tokenizer", "reward")


def _cfg(tmp_path, **keys):
    return load_train_config({**BASE, "out_dir": str(tmp_path), **keys})


def test_each_preset_sets_its_four_choices_and_an_explicit_key_wins(tmp_path):
    paper, released = _cfg(tmp_path), _cfg(tmp_path, fidelity="as_released")
    assert [getattr(paper, k) for k in CHOICES] == ["mixed", "strip", "reuse_ids", "math_verify"]
    assert [getattr(released, k) for k in CHOICES] == ["agent_order", "keep_text", "reencode", "hendrycks"]
    assert paper.preset_overrides() == released.preset_overrides() == {}
    mixed = _cfg(tmp_path, fidelity="as_released", minibatch_order="mixed")  # allowed, and recorded
    assert mixed.minibatch_order == "mixed" and mixed.reward == "hendrycks"
    assert mixed.fidelity_record() == {
        "preset": "as_released", "minibatch_order": "mixed", "cross_eos": "keep_text",
        "same_tokenizer": "reencode", "reward": "hendrycks", "overrides": {"minibatch_order": "mixed"},
    }  # fmt: skip


def test_identity_follows_the_choices_not_the_presets_name(tmp_path):
    released = _cfg(tmp_path, fidelity="as_released")
    spelled_out = _cfg(tmp_path, **FIDELITY["as_released"])
    assert released.config_hash() == spelled_out.config_hash() != _cfg(tmp_path).config_hash()
    paper_choices = _cfg(tmp_path, fidelity="as_released", **FIDELITY["paper"])
    assert paper_choices.config_hash() == _cfg(tmp_path).config_hash()
    for key, value in (("reward", "hendrycks"), ("same_tokenizer", "reencode"), ("cross_eos", "keep_text")):
        assert _cfg(tmp_path, **{key: value}).config_hash() != _cfg(tmp_path).config_hash(), key


def test_an_unknown_preset_or_order_is_refused_with_the_key_and_the_choices(tmp_path):
    with pytest.raises(ValueError, match=r"fidelity: Input should be 'paper' or 'as_released'"):
        _cfg(tmp_path, fidelity="released")
    orders = r"minibatch_order: Input should be 'mixed', 'self_first' or 'agent_order'"
    with pytest.raises(ValueError, match=orders):
        _cfg(tmp_path, minibatch_order="by_agent")
    with open("config/ci.yaml") as f:
        config = yaml.safe_load(f)
    config["training"]["fidelity"] = "released"
    config["methods"] = {"h": {"method": "hacpo", "train": {"minibatch_order": "by_agent"}}}
    with pytest.raises(ConfigError) as err:  # the workflow's check, before any job
        load_pipeline_config(config)
    said = str(err.value)
    assert "training: fidelity: Input should be 'paper' or 'as_released'" in said
    assert "methods.h: minibatch_order: Input should be 'mixed', 'self_first' or 'agent_order'" in said


def test_a_caption_says_the_preset_and_what_was_set_against_it():
    assert describe_fidelity({}) == (
        "paper preset (minibatch_order mixed, cross_eos strip, same_tokenizer reuse_ids, reward math_verify)"
    )
    said = describe_fidelity({"fidelity": "as_released", "minibatch_order": "mixed"})
    assert said.startswith("as_released preset, minibatch_order set against it (minibatch_order mixed, ")
    assert said.endswith("reward hendrycks)")


def test_the_paper_configs_reproduce_the_released_run():
    for name in ("paper", "one-gpu"):
        with open(f"config/{name}.yaml") as f:
            assert yaml.safe_load(f)["training"]["fidelity"] == "as_released", name


def test_as_released_on_the_local_engine(tmp_path, toy_data, small_agent):
    """Two agents with one tokenizer: as released, each response is decoded with its EOS as text and
    re-encoded (the ids round-trip here, so the rows equal the reused ids), scored by exact match, and the
    rows meet the updates by generating agent; run.json records the preset."""
    agents = [("a", small_agent), ("b", small_agent)]
    runs = {}
    for fidelity in ("paper", "as_released"):
        cfg = toy_train_config(tmp_path / fidelity, agents, "hacpo", data=toy_data, fidelity=fidelity)
        trainer = LocalTrainer(cfg)
        assert trainer.same_tok == [[fidelity == "paper"] * 2] * 2
        assert trainer.scorer.reward == cfg.reward
        problems = trainer.problems[: cfg.prompts_per_step]
        rolls = [trainer.rollout(k, 0, problems, cfg.group_size) for k in range(2)]
        runs[fidelity] = trainer.learner_rows(1, rolls, trainer.tracker.omegas(), problems)
    paper, released = runs["paper"], runs["as_released"]
    cross = ~paper.is_own
    width = int(paper.mask.sum(1).max())
    mask = paper.mask[:, :width]
    assert torch.equal(released.mask[:, :width], mask)
    assert torch.equal(released.response[:, :width][mask], paper.response[:, :width][mask])
    # keep_text: the source's mean log-prob includes its EOS, as the reused ids' mean does
    assert torch.allclose(released.old_mean_logp[cross], paper.old_mean_logp[cross])

    cfg = toy_train_config(tmp_path / "run", agents, "hacpo", data=toy_data, steps=1, fidelity="as_released")
    train(cfg)
    details = RunRecord.read(tmp_path / "run" / "hacpo").details["fidelity"]
    assert details["preset"] == "as_released" and details["overrides"] == {}
    updates = MetricsLog(tmp_path / "run" / "hacpo" / "updates.jsonl").read()
    assert [u["own_rows"] for u in updates] == [8, 8, 0, 0, 0, 0, 8, 8]  # agent order, for both learners
    record = json.loads((tmp_path / "run" / "hacpo" / "run.json").read_text())
    assert record["config"]["reward"] == "hendrycks"
