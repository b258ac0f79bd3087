"""LoRA adapters on the local engine (issue 42): identity, the adapter-off reference, training only the
adapter,
adapter checkpoints (resume bitwise, weights_only), evaluation and export of an adapter checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from toy_runs import TEST_DEVICE, metrics_without_timing, toy_train_config, train_killed_at

from hacpo.agents import adapters
from hacpo.agents.lm import token_logprobs
from hacpo.checkpoints import write_checkpoint_manifest
from hacpo.config import LoraSpec, load_train_config
from hacpo.engines.local import LocalTrainer, train
from hacpo.hardware import resolve_precision
from hacpo.runio import MetricsLog, RunRecord

LORA = {"lora": {"rank": 4, "alpha": 8}}


def _agents(small_agent, other_agent):
    return [("llama", small_agent), ("qwen", other_agent)]


# ------------------------------------------------------------------------------------------- identity
def test_the_adapter_is_part_of_a_runs_identity_and_threads_are_not(tmp_path, toy_data, small_agent):
    agents = [("llama", small_agent)]
    full = toy_train_config(tmp_path, agents, "gspo", data=toy_data)
    r4 = toy_train_config(tmp_path, agents, "gspo", data=toy_data, adapter=LORA)
    r8 = toy_train_config(tmp_path, agents, "gspo", data=toy_data, adapter={"lora": {"rank": 8, "alpha": 8}})
    r4_threads = toy_train_config(tmp_path, agents, "gspo", data=toy_data, adapter=LORA, threads=2)
    hashes = {c.config_hash() for c in (full, r4, r8)}
    assert len(hashes) == 3  # a rank change retrains
    assert r4_threads.config_hash() == r4.config_hash()  # threads never do
    assert "adapter" not in full.run_spec() and "adapter" not in full.run_spec()["agents"][0]
    # LoRA runs from before the CPU decoder sampled the adapter (it sampled the base) are trained again
    assert r4.run_spec()["agents"][0]["adapter"]["sampler"] == "adapter"


def test_an_agent_overrides_the_runs_adapter(tmp_path, toy_data, small_agent, other_agent):
    """A pair may train one agent with LoRA and one fully: ``adapter: {}`` on the agent."""
    cfg = toy_train_config(tmp_path, _agents(small_agent, other_agent), "hacpo", data=toy_data, adapter=LORA)
    data = cfg.model_dump()
    data["agents"][1]["adapter"] = {}
    mixed = load_train_config(data)
    assert mixed.agent_adapter(0) == LoraSpec(rank=4, alpha=8) and mixed.agent_adapter(1) is None
    assert mixed.config_hash() != cfg.config_hash()


@pytest.mark.parametrize(
    "lora, message",
    [
        ({"rank": 0}, "greater than or equal to 1"),
        ({"rank": 4, "dropout": 1.0}, "less than 1"),
        ({"rank": 4, "target_modules": []}, None),
        ({"rank": 4, "rnak": 2}, "Extra inputs"),
    ],
)
def test_bad_lora_options_are_named(tmp_path, toy_data, small_agent, lora, message):
    if message is None:  # an empty list of targets: peft's own error, named with the key and the fix
        cfg = toy_train_config(
            tmp_path, [("llama", small_agent)], "gspo", data=toy_data, adapter={"lora": lora}
        )
        with pytest.raises(ValueError, match="target_modules"):
            LocalTrainer(cfg)
        return
    with pytest.raises(ValueError, match=message):
        toy_train_config(tmp_path, [("llama", small_agent)], "gspo", data=toy_data, adapter={"lora": lora})


def test_unknown_target_modules_name_the_models_linear_layers(tmp_path, toy_data, small_agent):
    lora = {"lora": {"rank": 2, "target_modules": ["c_attn"]}}
    cfg = toy_train_config(tmp_path, [("llama", small_agent)], "gspo", data=toy_data, adapter=lora)
    with pytest.raises(ValueError, match=r"target_modules.*q_proj"):
        LocalTrainer(cfg)


# ------------------------------------------------------------------------------------------- the maths
def test_the_adapter_off_reference_equals_the_base_models_logprobs(tmp_path, toy_data, small_agent):
    """kl_beta > 0 loads no second model: the reference is the base with the adapter off, equal to the base
    model's own log-probs after the adapter has moved."""
    from transformers import AutoModelForCausalLM

    cfg = toy_train_config(
        tmp_path, [("llama", small_agent)], "gspo", data=toy_data, adapter=LORA, kl_beta=0.1
    )
    trainer = LocalTrainer(cfg)
    agent = trainer.agents[0]
    assert agent.ref is None and agent.peft is not None
    trainer.train_step(0)
    ids = torch.randint(3, 20, (3, 12), device=trainer.device)
    with torch.no_grad():
        with agent.reference() as ref:
            off = token_logprobs(ref, ids, 4)
        on = token_logprobs(agent.model, ids, 4)
        base = AutoModelForCausalLM.from_pretrained(small_agent, dtype=torch.float32).to(trainer.device)
        expect = token_logprobs(base.eval(), ids, 4)
    torch.testing.assert_close(off, expect, rtol=0, atol=1e-6)
    assert not torch.allclose(on, expect, atol=1e-4)  # the adapter trained, and is back on after the block


def test_only_the_adapter_trains_and_the_base_is_held_once(tmp_path, toy_data, small_agent, other_agent):
    cfg = toy_train_config(
        tmp_path, _agents(small_agent, other_agent), "hacpo", data=toy_data, adapter=LORA, kl_beta=1e-3
    )
    trainer = LocalTrainer(cfg)
    frozen = [{n: p.detach().clone() for n, p in a.model.named_parameters() if not p.requires_grad}
              for a in trainer.agents]  # fmt: skip
    lora = [{n: p.detach().clone() for n, p in a.model.named_parameters() if p.requires_grad}
            for a in trainer.agents]  # fmt: skip
    for names in lora:
        assert names and all("lora_" in n for n in names)
    trainer.train_step(0)
    for agent, base, ad in zip(trainer.agents, frozen, lora, strict=True):
        now = dict(agent.model.named_parameters())
        assert all(torch.equal(now[n], t) for n, t in base.items())  # the base never moves
        assert any(not torch.equal(now[n], t) for n, t in ad.items())  # the adapter does
        assert agent.ref is None
        assert len(agent.opt.param_groups[0]["params"]) == len(ad)  # AdamW holds the adapter's state only


# ------------------------------------------------------------------------------------------- checkpoints
def test_adapter_checkpoints_resume_bitwise_and_load_weights_only(
    tmp_path, toy_data, small_agent, other_agent, monkeypatch
):
    agents = _agents(small_agent, other_agent)
    kw = dict(
        data=toy_data, steps=4, checkpoint_every=2, val_every=2, val_size=20, adapter=LORA, kl_beta=1e-3
    )
    ref = toy_train_config(tmp_path / "ref", agents, "hacpo", **kw)
    train(ref)
    ckpt = tmp_path / "ref/hacpo/checkpoints/llama/step-4"
    names = {p.name for p in ckpt.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "trainer_state.pt"} <= names
    assert "model.safetensors" not in names
    state = torch.load(ckpt / "trainer_state.pt", weights_only=True)  # no pickled code: safe to load
    assert state["step"] == 4
    sizes = {p.name: p.stat().st_size for p in ckpt.iterdir()}
    assert sizes["adapter_model.safetensors"] < 200_000  # the adapter only, not the model

    cfg = toy_train_config(tmp_path / "killed", agents, "hacpo", **kw)
    train_killed_at(cfg, 3, monkeypatch)
    train(cfg)


    a = metrics_without_timing(tmp_path / "ref/hacpo")
    b = metrics_without_timing(tmp_path / "killed/hacpo")
    if TEST_DEVICE == "cpu":
        assert a == b
    va = MetricsLog(tmp_path / "ref/hacpo/validation.jsonl").read()
    assert va == MetricsLog(tmp_path / "killed/hacpo/validation.jsonl").read()
    record = RunRecord.read(tmp_path / "ref/hacpo")
    assert record.details["adapters"]["llama"]["rank"] == 4


def test_a_checkpoint_state_that_would_run_code_is_refused(tmp_path, toy_data, small_agent, monkeypatch):
    """trainer_state.pt loads with weights_only=True: a run directory copied from elsewhere whose state
    pickles a callable fails to resume, and the callable never runs."""
    cfg = toy_train_config(
        tmp_path, [("llama", small_agent)], "gspo", data=toy_data, steps=3, checkpoint_every=1, adapter=LORA
    )
    train_killed_at(cfg, 2, monkeypatch)
    state = tmp_path / "gspo/checkpoints/llama/step-2/trainer_state.pt"
    marker = tmp_path / "code-ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    torch.save({"step": 2, "payload": Payload()}, state)
    write_checkpoint_manifest(state.parent)  # a crafted directory comes with a manifest that matches
    with pytest.raises(Exception, match="[Ww]eights.only"):
        train(cfg)
    assert not marker.exists()


# ------------------------------------------------------------------------------------------- eval, export
def test_an_adapter_checkpoint_evaluates_and_exports_merged(tmp_path, toy_data, small_agent):
    from transformers import AutoModelForCausalLM

    cfg = toy_train_config(tmp_path, [("llama", small_agent)], "gspo", data=toy_data, adapter=LORA, steps=2)
    trainer = LocalTrainer(cfg)
    trainer.train()
    ckpt = tmp_path / "gspo/checkpoints/llama/step-2"
    assert adapters.is_adapter(ckpt)
    ids = torch.randint(3, 20, (2, 10))
    with torch.no_grad():
        live = token_logprobs(trainer.agents[0].model.eval().cpu(), ids, 3)

    out = tmp_path / "merged"
    hacpo = [sys.executable, "-m", "hacpo.cli"]
    done = subprocess.run([*hacpo, "export", "--checkpoint", str(ckpt), "--out", str(out), "--merge"],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (out / "config.json").is_file() and (out / "generation_config.json").is_file()
    assert not adapters.is_adapter(out)
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(token_logprobs(merged, ids, 3), live, rtol=0, atol=1e-5)
    # served in bf16 as a plain load of the export is: the weights cast, RoPE's buffers kept in float32
    served = adapters.load_causal_lm(ckpt, torch.bfloat16)
    plain = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    got = {**dict(served.named_parameters()), **dict(served.named_buffers())}
    want = {**dict(plain.named_parameters()), **dict(plain.named_buffers())}
    assert got.keys() == want.keys() and served.config.dtype == plain.config.dtype
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    again = subprocess.run([*hacpo, "export", "--checkpoint", str(ckpt), "--out", str(out), "--merge"],
                           capture_output=True, text=True)  # fmt: skip
    assert again.returncode != 0 and "exists" in again.stderr

    bench = tmp_path / "bench.jsonl"
    bench.write_text((toy_data / "test.jsonl").read_text().splitlines()[0] + "\n")
    for checkpoint in (ckpt, out):  # the adapter and its merged export answer alike
        res = subprocess.run(
            [*hacpo, "eval", "--checkpoint", str(checkpoint), "--benchmark", str(bench),
             "--out", str(tmp_path / "eval" / checkpoint.name), "--device", "cpu"],
            capture_output=True, text=True,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
    a = (tmp_path / "eval/step-2/bench.samples.jsonl").read_text()
    b = (tmp_path / "eval/merged/bench.samples.jsonl").read_text()
    assert json.loads(a)["response"] == json.loads(b)["response"]


def test_an_adapter_whose_base_moved_names_the_fix(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "gone")}))
    with pytest.raises(ValueError, match="--base"):
        adapters.base_of(ckpt)


def test_a_moved_results_folder_finds_its_adapters_base_at_the_same_place(tmp_path, capsys):
    """peft records a base by its absolute path; a results folder moved (or pooled from another machine)
    finds the base where it lies beside the adapter in the moved folder, and says so."""
    import shutil

    old = tmp_path / "old" / "results"
    (old / "models" / "base").mkdir(parents=True)
    (old / "models" / "base" / "config.json").write_text("{}")
    (old / "models" / "w").mkdir()
    record = {"base_model_name_or_path": str(old / "models" / "base")}
    (old / "models" / "w" / adapters.ADAPTER_CONFIG).write_text(json.dumps(record))
    new = tmp_path / "new" / "results"
    shutil.copytree(old, new)
    shutil.rmtree(tmp_path / "old")
    assert adapters.base_of(new / "models" / "w") == new / "models" / "base"
    said = f"its base {old / 'models' / 'base'} is not here; using {new / 'models' / 'base'}"
    assert said in capsys.readouterr().err
    shutil.rmtree(new / "models" / "base")  # nowhere: the error names the fix
    with pytest.raises(ValueError, match="--base"):
        adapters.base_of(new / "models" / "w")


# ------------------------------------------------------------------------------------------- precision
@pytest.mark.parametrize(
    "flags, expect",
    [({"avx512f", "avx512_bf16"}, "bf16"), ({"avx512f", "amx_bf16"}, "bf16"), ({"avx512f", "avx2"}, "fp32"),
     (set(), "fp32")],
)  # fmt: skip
def test_precision_auto_is_bf16_only_where_the_cpu_computes_it(flags, expect):
    assert resolve_precision("auto", "cpu", frozenset(flags)) == expect
    assert resolve_precision("fp32", "cpu", frozenset(flags)) == "fp32"
    assert resolve_precision("bf16", "cpu", frozenset()) == "bf16"


def test_precision_auto_is_recorded_and_kept_on_resume(tmp_path, toy_data, small_agent, monkeypatch):
    import hacpo.engines.local.trainer as tr

    cfg = toy_train_config(tmp_path, [("llama", small_agent)], "gspo", data=toy_data, precision="auto",
                           steps=2, checkpoint_every=1)  # fmt: skip
    monkeypatch.setattr(tr, "resolve_precision", lambda requested, device: "fp32")
    train_killed_at(cfg, 1, monkeypatch)
    assert RunRecord.read(tmp_path / "gspo").details["precision"] == "fp32"
    monkeypatch.setattr(tr, "resolve_precision", lambda requested, device: "bf16")  # another machine
    assert LocalTrainer(cfg).precision == "fp32"  # the run keeps its first choice


# ------------------------------------------------------------------------------------------- memory knobs
@pytest.mark.parametrize(
    "knob",
    [{"micro_batch_tokens": 40}, {"gradient_checkpointing": True}, {"slices": True}],
    ids=["micro_batches", "checkpointing", "vocabulary_slices"],
)
def test_memory_knobs_keep_a_lora_updates_maths(
    tmp_path, toy_data, small_agent, other_agent, monkeypatch, knob
):
    """Micro-batches, gradient checkpointing and the vocabulary head in slices work through the adapter's
    layers: after one HACPO step (KL on) every adapter weight matches the plain run's to fp32 summation
    order."""
    import hacpo.agents.vocab as vocab

    agents = _agents(small_agent, other_agent)
    kw = dict(data=toy_data, steps=1, adapter=LORA, kl_beta=1e-2)
    base = toy_train_config(tmp_path / "a", agents, "hacpo", **kw)
    settings = {k: v for k, v in knob.items() if k != "slices"}
    other = toy_train_config(tmp_path / "b", agents, "hacpo", **kw, **settings)

    def one_step(cfg):
        trainer = LocalTrainer(cfg)
        row = trainer.train_step(0).row
        return row, [torch.cat([p.detach().reshape(-1) for p in adapters.trainable_parameters(a.model)])
                     for a in trainer.agents]  # fmt: skip

    row_a, weights_a = one_step(base)
    if "slices" in knob:  # a budget of 64 logits: every pass applies the head by hand, a few rows a slice
        monkeypatch.setattr(vocab, "LOGITS_BUDGET", 64)
    row_b, weights_b = one_step(other)
    for a, b in zip(weights_a, weights_b, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for key in ("llama/reward", "qwen/reward", "llama/kl", "qwen/loss", "llama/s_hete_mean"):
        assert row_b[key] == pytest.approx(row_a[key], abs=1e-5), key


def test_lora_trains_under_bf16_autocast(tmp_path, toy_data, small_agent, other_agent):
    cfg = toy_train_config(tmp_path, _agents(small_agent, other_agent), "hacpo", data=toy_data, steps=1,
                           adapter=LORA, kl_beta=1e-3, precision="bf16")  # fmt: skip
    trainer = LocalTrainer(cfg)
    before = [torch.cat([p.detach().reshape(-1).clone() for p in adapters.trainable_parameters(a.model)])
              for a in trainer.agents]  # fmt: skip
    row = trainer.train_step(0).row
    for a, b in zip(trainer.agents, before, strict=True):
        after = torch.cat([p.detach().reshape(-1) for p in adapters.trainable_parameters(a.model)])
        assert after.dtype == torch.float32 and not torch.equal(after, b)
    assert all(v == v for k, v in row.items() if isinstance(v, float)), row  # no NaN
