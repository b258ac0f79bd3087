"""Tiny local agents: tokenizers, models, re-tokenisation, supervised warm-up."""

from __future__ import annotations

import json

import pytest
import torch

from hacpo.agents.lm import generate
from hacpo.agents.models import AgentArch, build_model, param_count
from hacpo.agents.prompting import exact_boxed_match, greedy_accuracy, greedy_responses, prompt_ids
from hacpo.agents.retokenize import (
    cross_tokens,
    response_text,
    retokenize,
    same_tokenizer,
    source_logp_mask,
    source_token_count,
)
from hacpo.agents.sft import answer_ids, sft_batch, sft_loss
from hacpo.agents.tokenizers import KINDS, build_tokenizer, tokenizer_fingerprint
from hacpo.agents.warmup import WarmupSpec, build_agent, build_agent_from_args, load_agent
from hacpo.data.synthetic import FAMILIES, STYLES, Problem, make_splits, solution_text, user_message

ADD = Problem(id="add2-t", problem="12+34", answer="46", family="add2", difficulty=1, work="12+34=46")
SMALL = AgentArch("llama", hidden=32, layers=1, heads=2, intermediate=64, max_positions=256)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models run fastest (and most reproducibly) on one thread; restore the caller's setting."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def toks():
    return {k: build_tokenizer(k) for k in KINDS}


@pytest.fixture(scope="module")
def sample():
    s = make_splits(list(FAMILIES), seed=3, n_test=6, n_dev=0, n_train=0)
    return s["test"]


def _texts(problems):
    out = []
    for p in problems:
        for st in STYLES:
            out += [user_message(p, st), solution_text(p, st)]
    return out


# ---------------------------------------------------------------------------------------------------------
# Tokenizers


@pytest.mark.parametrize("kind", KINDS)
def test_tokenizer_roundtrip_and_reload(kind, toks, sample, tmp_path):
    from transformers import AutoTokenizer

    tok = toks[kind]
    texts = _texts(sample)
    for x in texts:
        assert tok.decode(tok(x, add_special_tokens=False)["input_ids"]) == x
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert (
        again(texts, add_special_tokens=False)["input_ids"]
        == tok(texts, add_special_tokens=False)["input_ids"]
    )
    assert again.chat_template == tok.chat_template
    assert (again.eos_token_id, again.pad_token_id, again.bos_token_id) == (
        tok.eos_token_id,
        tok.pad_token_id,
        tok.bos_token_id,
    )
    assert tokenizer_fingerprint(again) == tokenizer_fingerprint(tok)
    # no special tokens are added implicitly
    assert tok("12", add_special_tokens=True)["input_ids"] == tok("12", add_special_tokens=False)["input_ids"]


def test_chat_templates(toks):
    msgs = [{"role": "user", "content": user_message(ADD, "compact")}]
    char, word = toks["char"], toks["word"]
    assert char.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == "<s>Q:12+34=A:"
    assert (
        word.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        == "<|user|>12+34=<|assistant|>"
    )
    ids = prompt_ids(char, ADD, "compact")
    assert ids[0] == char.bos_token_id and ids.count(char.bos_token_id) == 1 and len(ids) == 11
    ids = prompt_ids(word, ADD, "paper")
    assert (
        word.convert_ids_to_tokens(ids)[0] == "<|user|>"
        and word.convert_ids_to_tokens(ids)[-1] == "<|assistant|>"
    )
    assert (char.eos_token, char.pad_token, char.bos_token) == ("</s>", "<pad>", "<s>")
    assert (word.eos_token, word.pad_token, word.bos_token) == ("<|endoftext|>", "<|pad|>", None)


def test_word_tokenizer_pieces(toks):
    word = toks["word"]
    pieces = word.convert_ids_to_tokens(
        word("Tom has 12 apples. \\boxed{46}", add_special_tokens=False)["input_ids"]
    )
    assert pieces == ["Tom", " ", "has", " ", "1", "2", " ", "apples", ".", " ", "\\boxed{", "4", "6", "}"]
    phrase = word(user_message(ADD, "paper"), add_special_tokens=False)["input_ids"]
    assert (
        len(phrase) < len(toks["char"](user_message(ADD, "paper"), add_special_tokens=False)["input_ids"]) / 2
    )
    assert word.decode(word("a  b\n€", add_special_tokens=False)["input_ids"]) == "a  b\n<|unk|>"


def test_fingerprints(toks):
    fa, fb = tokenizer_fingerprint(toks["char"]), tokenizer_fingerprint(toks["word"])
    assert fa == tokenizer_fingerprint(build_tokenizer("char")) and fa != fb
    other = build_tokenizer("char")
    other.chat_template = "{{ messages[0]['content'] }}"
    assert tokenizer_fingerprint(other) == fa
    assert same_tokenizer(other, toks["char"]) and not same_tokenizer(toks["char"], toks["word"])


# ---------------------------------------------------------------------------------------------------------
# Models


@pytest.mark.parametrize("arch,kind", [("llama", "char"), ("qwen3", "word")])
def test_model_save_reload_identical_logits(arch, kind, toks, tmp_path):
    from transformers import AutoModelForCausalLM

    tok = toks[kind]
    a = AgentArch(arch, hidden=32, layers=2, heads=2, intermediate=64, max_positions=64)
    m = build_model(a, tok, seed=7)
    assert type(m).__name__ == {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]
    assert m.config.vocab_size == len(tok) and m.config.tie_word_embeddings
    assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
    assert m.config._attn_implementation == "sdpa"
    assert (m.config.eos_token_id, m.generation_config.eos_token_id) == (tok.eos_token_id, tok.eos_token_id)
    assert (m.config.pad_token_id, m.config.bos_token_id) == (tok.pad_token_id, tok.bos_token_id)
    same = build_model(a, tok, seed=7)
    other = build_model(a, tok, seed=8)
    sd, sd2, sd3 = m.state_dict(), same.state_dict(), other.state_dict()
    assert all(torch.equal(sd[k], sd2[k]) for k in sd)
    assert not all(torch.equal(sd[k], sd3[k]) for k in sd)
    m.save_pretrained(tmp_path)
    r = AutoModelForCausalLM.from_pretrained(tmp_path)
    x = torch.tensor([prompt_ids(tok, ADD, "compact") + answer_ids(tok, ADD, "compact")])
    m.eval()
    with torch.no_grad():
        assert torch.equal(m(x).logits, r.eval()(x).logits)
    assert param_count(r) == param_count(m)


# ---------------------------------------------------------------------------------------------------------
# Re-tokenisation


def _rows(tok, texts, width):
    """Responses as a generator returns them: content ids + EOS, then padding to ``width``."""
    out = []
    for t in texts:
        ids = tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        out.append(ids + [tok.pad_token_id] * (width - len(ids)))
    return torch.tensor(out)


def test_retokenize_char_word_char(toks, sample):
    char, word = toks["char"], toks["word"]
    texts = [solution_text(p, st) for p in sample for st in STYLES]
    rows = _rows(char, texts, width=80)
    got = [response_text(char, r) for r in rows]
    assert got == texts  # EOS and padding stripped
    w = retokenize(got, word, max_len=4096)
    assert all(ids and ids[-1] != word.eos_token_id for ids in w)  # no learner EOS appended
    back_text = [response_text(word, ids) for ids in w]
    assert back_text == texts
    c = retokenize(back_text, char, max_len=4096)
    assert c == [r[: source_token_count(r, char.eos_token_id)].tolist() for r in rows]
    assert all(len(a) < len(b) for a, b in zip(w, c, strict=True))  # \boxed{ is one word token
    assert retokenize(texts, word, max_len=3) == [ids[:3] for ids in w]

    ct = cross_tokens(char, word, rows, max_len=4096)
    assert not ct.reused and ct.ids == w and ct.texts == texts
    assert ct.source_len == [len(x) for x in c] and ct.learner_len == [len(x) for x in w]


def test_retokenize_sampled_generations(toks):
    """Responses sampled from an untrained model (arbitrary characters) survive char → word → char."""
    char, word = toks["char"], toks["word"]
    model = build_model(SMALL, char, seed=0).eval()
    prompt = torch.tensor([prompt_ids(char, ADD, "compact")] * 16)
    gen = generate(
        model,
        prompt,
        12,
        eos_id=char.eos_token_id,
        pad_id=char.pad_token_id,
        generator=torch.Generator().manual_seed(0),
    )
    texts = [response_text(char, r) for r in gen.tokens]
    assert all("</s>" not in t for t in texts)
    back = [response_text(word, ids) for ids in retokenize(texts, word, max_len=64)]
    assert back == texts
    n = [source_token_count(r, char.eos_token_id) for r in gen.tokens]
    m = source_logp_mask(gen.tokens, char.eos_token_id)
    assert m.sum(-1).tolist() == n
    assert (gen.mask.sum(-1) - m.sum(-1)).tolist() == [
        int(char.eos_token_id in r.tolist()) for r in gen.tokens
    ]
    assert torch.equal(source_logp_mask(gen.tokens, char.eos_token_id, "keep_text"), gen.mask)


def test_cross_eos_modes_and_identical_tokenizers(toks):
    char, word = toks["char"], toks["word"]
    rows = _rows(char, ["\\boxed{46}"], width=14)
    assert response_text(char, rows[0], "keep_text") == "\\boxed{46}</s>"
    assert source_token_count(rows[0], char.eos_token_id, "keep_text") == 11
    assert source_token_count(rows[0], char.eos_token_id, "strip") == 10
    kt = cross_tokens(char, word, rows, max_len=64, cross_eos="keep_text")
    assert kt.texts == ["\\boxed{46}</s>"] and kt.source_len == [11]
    twin = build_tokenizer("char")
    twin.chat_template = "{{ messages[0]['content'] }}"
    same = cross_tokens(char, twin, rows, max_len=64)
    assert same.reused and same.ids == [rows[0, :11].tolist()] and same.source_len == [11]
    # same_tokenizer: reencode (the released code): decoded with the EOS as text and re-encoded; the ids
    # round-trip here, so they equal the reused ones, EOS included
    again = cross_tokens(char, twin, rows, max_len=64, cross_eos="keep_text", reuse_same=False)
    assert not again.reused and again.texts == ["\\boxed{46}</s>"]
    assert again.ids == same.ids and again.source_len == same.source_len
    with pytest.raises(ValueError, match="cross_eos"):
        response_text(char, rows[0], "drop")


def test_every_stop_id_of_the_model_ends_a_response(toks, tmp_path):
    """vLLM stops at each id of ``generation_config.eos_token_id`` (Qwen3: ``<|im_end|>`` and
    ``<|endoftext|>``), not only at the tokenizer's EOS: a response that ends in another stop id loses it
    from the exchanged text and from the source's mean, as the tokenizer's EOS is lost."""
    import json

    from hacpo.agents.retokenize import stop_token_ids

    char, word = toks["char"], toks["word"]
    other = char.convert_tokens_to_ids("<unk>")  # a second stop id of this "model"
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [char.eos_token_id, other]}))
    stops = stop_token_ids(char, tmp_path)
    assert stops == {char.eos_token_id, other}
    assert stop_token_ids(char, tmp_path / "none") == {char.eos_token_id}
    ids = char("\\boxed{46}", add_special_tokens=False)["input_ids"]
    row = ids + [other, char.pad_token_id, char.pad_token_id]
    assert response_text(char, row, stops=stops) == "\\boxed{46}"
    assert "<unk>" in response_text(char, row)  # the tokenizer's EOS alone misses it
    assert source_token_count(row, stops, "strip") == len(ids)
    crossed = cross_tokens(char, word, [row], max_len=64, source_stops=stops)
    assert crossed.texts == ["\\boxed{46}"] and crossed.source_len == [len(ids)]
    twin = build_tokenizer("char")
    same = cross_tokens(char, twin, [row], max_len=64, source_stops=stops)
    assert same.reused and same.ids == [ids + [other]]


# ---------------------------------------------------------------------------------------------------------
# Warm-up


@pytest.mark.parametrize("kind,arch", [("char", "llama"), ("word", "qwen3")])
def test_left_padded_batches_match_single_rows(kind, arch, toks):
    """Mixed prompt lengths (left padding + attention mask) give the same losses and greedy texts."""
    tok = toks[kind]
    problems = make_splits(["add2", "word", "frac"], seed=0, n_test=3, n_dev=0, n_train=0)["test"]
    model = build_model(AgentArch(arch, 32, 2, 2, 64), tok, seed=0)
    b = sft_batch(
        [prompt_ids(tok, p, "paper") for p in problems],
        [answer_ids(tok, p, "paper") for p in problems],
        tok.pad_token_id,
    )
    assert b["attention_mask"] is not None
    together = sft_loss(model, tok, problems, "paper")
    n = [len(answer_ids(tok, p, "paper")) for p in problems]
    alone = sum(sft_loss(model, tok, [p], "paper") * k for p, k in zip(problems, n, strict=True)) / sum(n)
    assert together == pytest.approx(alone, rel=1e-5)
    texts = greedy_responses(model, tok, problems, "paper", 8)
    assert texts == [greedy_responses(model, tok, [p], "paper", 8)[0] for p in problems]


def test_exact_boxed_match_reads_the_last_box_like_the_reward():
    texts = ["x \\boxed{1} y \\boxed{ 46 }.", "\\boxed{46", "none", "\\fbox{46}", "\\boxed{046}"]
    assert exact_boxed_match(texts, ["46"] * 5) == [1.0, 0.0, 0.0, 1.0, 0.0]  # exact: 046 is not 46


@pytest.fixture(scope="module")
def add2():
    return make_splits(["add2"], seed=0, n_test=200, n_dev=200, n_train=None)


def test_warmup_lowers_loss_and_caches(tmp_path, add2):
    spec = WarmupSpec(arch=AgentArch(), max_steps=60, eval_every=30, n_dev=64, seed=1)
    out = tmp_path / "agent"
    meta = build_agent(spec, out, add2)
    assert not meta["cached"] and meta["steps"] == 60 and not meta["reached_target"]
    assert [c["step"] for c in meta["dev_curve"]] == [0, 30, 60]
    tok = build_tokenizer("char")
    dev = add2["dev"][:64]
    before = sft_loss(build_model(spec.arch, tok, spec.seed), tok, dev, "compact")
    model, tok2, stored = load_agent(out)
    after = sft_loss(model, tok2, dev, "compact")
    assert after < before
    assert meta["dev_curve"][0]["dev_loss"] == pytest.approx(before, rel=1e-5)
    assert meta["dev_curve"][-1]["dev_loss"] == pytest.approx(after, rel=1e-5)
    assert stored["fingerprint"] == tokenizer_fingerprint(tok)
    assert stored["n_params"] == param_count(model)
    acc = greedy_accuracy(model, tok2, dev, "compact", meta["max_new_tokens"], judge=exact_boxed_match)
    assert acc == pytest.approx(meta["dev_acc"])
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left

    mtime = (out / "agent.json").stat().st_mtime_ns
    again = build_agent(spec, out, add2)
    assert again["cached"] and again["steps"] == 60
    assert (out / "agent.json").stat().st_mtime_ns == mtime
    assert json.loads((out / "agent.json").read_text())["spec_hash"] == spec.spec_hash()


def test_warmup_deterministic_and_target_stop(tmp_path, add2):
    from safetensors.torch import load_file

    spec = WarmupSpec(
        arch=SMALL, tokenizer="word", max_steps=6, eval_every=3, n_dev=16, seed=5, target_dev_acc=1.0
    )
    a = build_agent(spec, tmp_path / "a", add2)
    b = build_agent(spec, tmp_path / "b", add2)
    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert [c["dev_loss"] for c in a["dev_curve"]] == [c["dev_loss"] for c in b["dev_curve"]]
    assert a["model_class"] == "LlamaForCausalLM"
    # target 0 is reached at the step-0 evaluation: nothing trained
    stop = build_agent(WarmupSpec(arch=SMALL, target_dev_acc=0.0, n_dev=16), tmp_path / "c", add2)
    assert stop["steps"] == 0 and stop["reached_target"]
    # a different spec in the same directory retrains and replaces it
    other = build_agent(
        WarmupSpec(arch=SMALL, tokenizer="word", max_steps=3, eval_every=3, n_dev=16, seed=6),
        tmp_path / "a",
        add2,
    )
    assert not other["cached"] and other["steps"] == 3
    assert WarmupSpec.from_dict(json.loads((tmp_path / "a" / "agent.json").read_text())["spec"]).seed == 6


def test_build_agent_from_args(tmp_path, add2):
    from types import SimpleNamespace

    from hacpo.data.synthetic import write_jsonl

    for name in ("train", "dev"):
        write_jsonl(tmp_path / "data" / f"{name}.jsonl", add2[name][:300])
    specs = tmp_path / "agents.yaml"
    specs.write_text(
        "tiny:\n  arch: {arch: qwen3, hidden: 32, layers: 1, heads: 2, intermediate: 64}\n"
        "  tokenizer: word\n  max_steps: 2\n  eval_every: 2\n  n_dev: 8\n"
    )
    args = SimpleNamespace(
        spec=f"{specs}:tiny", data=str(tmp_path / "data"), out=str(tmp_path / "a"), threads=1
    )
    info = build_agent_from_args(args)
    assert (
        info["steps"] == 2
        and info["params"] == info["n_params"]
        and info["model_class"] == "Qwen3ForCausalLM"
    )
    with pytest.raises(ValueError, match="FILE:NAME"):
        build_agent_from_args(SimpleNamespace(**{**vars(args), "spec": str(specs)}))
    with pytest.raises(ValueError, match="no spec named"):
        build_agent_from_args(SimpleNamespace(**{**vars(args), "spec": f"{specs}:huge"}))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            build_agent_from_args(SimpleNamespace(**{**vars(args), "device": "cuda"}))
    specs.write_text("arch: {arch: llama, hidden: 32}\nlearning_rate: 1.0\n")
    with pytest.raises(ValueError, match="unknown WarmupSpec keys"):
        build_agent_from_args(SimpleNamespace(**{**vars(args), "spec": str(specs)}))


def test_prompts_disable_qwen3_thinking():
    """Qwen3 hybrid models: the paper's prompts run with thinking disabled (enable_thinking=False)."""
    from transformers import PreTrainedTokenizerFast

    from hacpo.agents.prompting import prompt_ids
    from hacpo.agents.tokenizers import build_tokenizer
    from hacpo.data.synthetic import Problem

    tok = build_tokenizer("char")
    assert isinstance(tok, PreTrainedTokenizerFast)
    # Qwen3's template inserts an empty think block when thinking is disabled; mimic that one branch.
    tok.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}"
    )
    ids = prompt_ids(tok, Problem("p", "12+34", "46", "add2", 0), "compact")
    assert tok.decode(ids).endswith("12+34=<think></think>")


def test_generation_batches_from_a_token_budget(small_agent, toy_data):
    """Validation and local evaluation size their generation batches from a token budget (the KV cache of
    prompt + new tokens), never from a fixed row count alone; greedy answers do not depend on the batching."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hacpo.agents.lm import rows_per_batch
    from hacpo.agents.prompting import greedy_responses
    from hacpo.data.synthetic import read_jsonl
    from hacpo.eval import Sampling
    from hacpo.eval.local import LocalGenerator

    assert rows_per_batch(None, 100, 512) == 512
    assert rows_per_batch(1000, 100, 512) == 10 and rows_per_batch(50, 100, 512) == 1
    model = AutoModelForCausalLM.from_pretrained(small_agent).eval()
    tok = AutoTokenizer.from_pretrained(small_agent)
    problems = read_jsonl(toy_data / "test.jsonl", as_problems=True)[:12]
    whole = greedy_responses(model, tok, problems, "compact", 14)
    assert (
        greedy_responses(model, tok, problems, "compact", 14, batch_tokens=60) == whole
    )  # ~2 rows per batch
    gen = LocalGenerator(str(small_agent), device="cpu", batch_tokens=60)
    sampling = Sampling(
        greedy=True, k=1, temperature=1.0, top_p=1.0, max_new_tokens=14, prompt_style="compact", seed=0
    )
    rows = [p.to_dict() for p in problems]
    assert [r[0] for r in gen.generate(rows, sampling)] == whole
