"""Several agents on one base model (local engine): each a LoRA adapter of its own on one copy of the base.
Sharing the base changes memory, not maths: the same step as separate copies, bitwise; resume, checkpoints,
evaluation and export per agent; the config keys and their errors."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import pytest
import torch
import yaml
from toy_runs import metrics_without_timing, toy_train_config, train_killed_at

from hacpo.agents import adapters
from hacpo.agents.lm import generate, token_logprobs
from hacpo.config import LoraSpec, load_train_config
from hacpo.engines.local import LocalTrainer, train
from hacpo.runio import MetricsLog

LORA = {"lora": {"rank": 4, "alpha": 8}}


def _config(tmp_path, base, *, shared: bool, extra=(), **kw):
    """HACPO on two agents of ``base`` (ranks 4 and 2, their own learning rates), on one copy or two; then
    ``extra`` agents (name, path, entry) on models of their own."""
    agents = [
        {"name": "a", "path": str(base), "adapter": LORA},
        {"name": "b", "path": str(base), "adapter": {"lora": {"rank": 2, "alpha": 4}}, "lr": 1e-4},
    ]
    if shared:
        agents = [{**a, "shared_base": "toy"} for a in agents]
    agents += [{"name": n, "path": str(p), **entry} for n, p, entry in extra]
    cfg = toy_train_config(tmp_path, [("a", base), ("b", base)], "hacpo", data=kw.pop("data"), **kw)
    return load_train_config({**cfg.model_dump(), "agents": agents})


def _adapter_weights(trainer) -> list[torch.Tensor]:
    return [torch.cat([p.detach().reshape(-1) for p in a.trained()]).clone() for a in trainer.agents]


# ------------------------------------------------------------------------------------------- the maths
def test_two_agents_on_one_base_step_as_two_separate_models(tmp_path, toy_data, small_agent):
    """One HACPO step (KL on, its reference the base with every adapter off): each adapter after the step,
    and every logged value, equal those of the same agents loaded as two models from the same weights."""
    kw = dict(data=toy_data, steps=1, kl_beta=1e-2, prompts_per_step=2)
    apart = LocalTrainer(_config(tmp_path / "apart", small_agent, shared=False, **kw))
    shared = LocalTrainer(_config(tmp_path / "shared", small_agent, shared=True, **kw))
    assert apart.agents[0].model is not apart.agents[1].model
    one, two = shared.agents
    assert one.model is two.model and one.ref is None and two.ref is None  # one base copy, no reference copy
    base = [n for n, p in one.model.named_parameters() if "lora_" not in n]
    assert base and not any(p.requires_grad for n, p in one.model.named_parameters() if n in base)
    mine, theirs = ({id(p) for p in a.trained()} for a in (one, two))
    assert mine and theirs and not mine & theirs  # each optimizer holds its own adapter only
    assert two.opt.param_groups[0]["lr"] == 1e-4 and one.opt.param_groups[0]["lr"] == one.opt.defaults["lr"]
    for x, y in zip(_adapter_weights(apart), _adapter_weights(shared), strict=True):
        assert torch.equal(x, y)  # the same initialisation: the same draws in the same order

    row_apart, row_shared = apart.train_step(0).row, shared.train_step(0).row
    for x, y, a in zip(_adapter_weights(apart), _adapter_weights(shared), apart.agents, strict=True):
        torch.testing.assert_close(y, x, rtol=0, atol=1e-7, msg=a.name)
    timing = ("time/", "mem/")
    assert {k: v for k, v in row_shared.items() if not k.startswith(timing)} == {
        k: v for k, v in row_apart.items() if not k.startswith(timing)
    }
    assert row_shared["a/kl"] != 0 or row_shared["b/kl"] != 0  # the reference took part


def test_the_sampler_reads_the_active_adapter(small_agent):
    """The CPU decoder applies the weights a forward applies: the active adapter's ΔW on the base (off: the
    base alone). The sampler's log-probs equal the forward's."""
    from transformers import AutoModelForCausalLM

    peft = adapters.attach(AutoModelForCausalLM.from_pretrained(small_agent), LoraSpec(rank=4), small_agent,
                           name="x")  # fmt: skip
    adapters.add(peft, LoraSpec(rank=2), "y", small_agent)
    torch.manual_seed(0)
    for n, p in peft.named_parameters():
        if "lora_B" in n:
            p.data.normal_(0, 0.3)
    model = adapters.inner(peft).eval()
    prompts = torch.randint(3, 20, (3, 5))
    for name in ("x", "y", None):
        if name is not None:
            adapters.activate(peft, name)
        with torch.no_grad(), peft.disable_adapter() if name is None else contextlib.nullcontext():
            gen = torch.Generator().manual_seed(1)
            out = generate(model, prompts, 6, eos_id={1}, pad_id=0, generator=gen)
            lp = token_logprobs(model, torch.cat([prompts, out.tokens], 1), 5)
        torch.testing.assert_close(out.logp * out.mask, lp * out.mask, rtol=0, atol=1e-4, msg=str(name))


# ------------------------------------------------------------------------------------------- runs
def test_a_shared_base_run_resumes_bitwise(tmp_path, toy_data, small_agent, monkeypatch):
    """Two adapters on one base, killed before step 1 and resumed: the run ends as the uninterrupted one
    (metrics, validation, each agent's adapter and optimizer state through its checkpoint)."""
    kw = dict(data=toy_data, steps=2, checkpoint_every=1, val_every=2, val_size=8, kl_beta=1e-3)
    kw |= dict(prompts_per_step=2)
    ref = _config(tmp_path / "ref", small_agent, shared=True, **kw)
    killed = _config(tmp_path / "killed", small_agent, shared=True, **kw)
    train(ref)
    train_killed_at(killed, 1, monkeypatch)
    train(killed)
    a, b = tmp_path / "ref/hacpo", tmp_path / "killed/hacpo"
    assert metrics_without_timing(a) == metrics_without_timing(b)
    assert MetricsLog(a / "validation.jsonl").read() == MetricsLog(b / "validation.jsonl").read()
    for agent in ("a", "b"):
        x = (a / f"checkpoints/{agent}/step-2/adapter_model.safetensors").read_bytes()
        assert x == (b / f"checkpoints/{agent}/step-2/adapter_model.safetensors").read_bytes(), agent


def test_each_agents_checkpoint_evaluates_exports_and_starts_a_run(
    tmp_path, toy_data, small_agent, other_agent
):
    """Two adapters on one base beside an agent on a model of its own (another architecture, every weight
    trained). An agent's checkpoint is its adapter alone (flat, as any adapter checkpoint): served merged it
    computes what the agent computed live; ``hacpo export --merge`` writes it; a run's agent may start from
    it."""
    cfg = _config(tmp_path, small_agent, shared=True, data=toy_data, steps=1, prompts_per_step=2,
                  extra=[("c", other_agent, {})])  # fmt: skip
    trainer = LocalTrainer(cfg)
    trainer.train()
    assert trainer.agents[2].peft is None and trainer.agents[2].model is not trainer.agents[0].model
    ids = torch.randint(3, 20, (2, 9))
    for agent in trainer.agents[:2]:
        ckpt = tmp_path / f"hacpo/checkpoints/{agent.name}/step-1"
        assert adapters.is_adapter(ckpt) and not (ckpt / agent.adapter).exists()
        with torch.no_grad():
            live = token_logprobs(agent.activate().model.eval(), ids, 3)
            served = token_logprobs(adapters.load_causal_lm(ckpt).eval(), ids, 3)
        torch.testing.assert_close(served, live, rtol=0, atol=1e-5, msg=agent.name)
    out = adapters.export_merged(tmp_path / "hacpo/checkpoints/b/step-1", tmp_path / "b-merged")
    assert (out / "config.json").is_file() and not adapters.is_adapter(out)

    data = cfg.model_dump()
    data["out_dir"] = str(tmp_path / "again")
    data["agents"][1]["path"] = str(tmp_path / "hacpo/checkpoints/b/step-1")  # b's adapter, on the same base
    again = LocalTrainer(load_train_config(data))
    assert again.agents[0].model is again.agents[1].model
    assert torch.equal(_adapter_weights(again)[1], _adapter_weights(trainer)[1])
    data["agents"][1]["adapter"] = LORA  # b's adapter is rank 2, alpha 4: refused before any model loads
    refused = r"agents\.1 \('b'\): adapter\.lora: the starting adapter .*step-1 was trained with rank 2, "
    with pytest.raises(ValueError, match=refused + "alpha 4, the run declares rank 4, alpha 8; declare the"):
        LocalTrainer(load_train_config(data))


# ------------------------------------------------------------------------------------------- config
def test_shared_base_config_errors_name_the_key_and_the_fix(tmp_path, toy_data, small_agent, other_agent):
    cfg = _config(tmp_path, small_agent, shared=True, data=toy_data)
    data = cfg.model_dump()
    full = copy.deepcopy(data)
    full["agents"][1]["adapter"] = {}  # every weight of b trains: no base to share
    with pytest.raises(ValueError, match=r"agents\.1 \('b'\): shared_base 'toy' needs a LoRA adapter.*rank"):
        load_train_config(full)
    other = copy.deepcopy(data)
    other["agents"][1]["path"] = str(other_agent)
    with pytest.raises(ValueError, match=r"shared_base 'toy': its agents must have one base model.*`path`"):
        LocalTrainer(load_train_config(other))  # before any model loads
    assert cfg.config_hash() == _config(tmp_path, small_agent, shared=False, data=toy_data).config_hash()
    from hacpo.engine_options import OpenRLHFOptions
    from hacpo.engines.openrlhf import train as openrlhf_train

    local_only = r"agents\.0\.shared_base, agents\.1\.shared_base, agents\.1\.lr: the local engine's"
    with pytest.raises(ValueError, match=local_only):
        openrlhf_train(cfg, OpenRLHFOptions())  # from Python too, not only `hacpo train --engine openrlhf`


def test_a_workflow_pair_shares_a_base_by_one_model_entry():
    """`shared_base: MODEL` in place of a model's source: its joint runs hold one base with that model, its
    single-agent runs train an adapter on that model's weights; errors name the key."""
    from hacpo.pipeline import Pipeline

    root = Path(__file__).resolve().parents[1]
    cfg = yaml.safe_load((root / "config/real.yaml").read_text())
    cfg["training"]["adapter"] = {"lora": {"rank": 8}}
    cfg["models"]["gemma3"] = {"shared_base": "smollm2", "lr": 2e-5}
    p = Pipeline(cfg, base_dir=str(root))
    joint = load_train_config(p.train_config(next(r for r in p.runs if r.kind == "joint")))
    assert [a.shared_base for a in joint.agents] == ["smollm2", "smollm2"]
    assert joint.agents[0].path == joint.agents[1].path and joint.agents[1].lr == 2e-5
    single = next(r for r in p.runs if r.kind == "single" and r.group == "gemma3")
    alone = load_train_config(p.train_config(single))
    assert alone.agents[0].shared_base is None and alone.agents[0].path == joint.agents[0].path

    bad = copy.deepcopy(cfg)
    bad["training"].pop("adapter")
    with pytest.raises(ValueError, match=r"models\.gemma3\.shared_base: .*LoRA adapter"):
        Pipeline(bad, base_dir=str(root))
    bad = copy.deepcopy(cfg)
    bad["models"]["gemma3"]["shared_base"] = "qwen"
    with pytest.raises(ValueError, match=r"models\.gemma3\.shared_base: 'qwen' is not a model"):
        Pipeline(bad, base_dir=str(root))
