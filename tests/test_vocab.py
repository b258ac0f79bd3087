"""Chosen-token log-probs in vocabulary slices (hacpo.agents.vocab) against the model's own full logits."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from hacpo.agents import vocab
from hacpo.agents.lm import (
    SharedPrefixes,
    generate,
    policy_temperature,
    token_logprobs,
    token_logprobs_shared_prompt,
)
from hacpo.agents.vocab import OutputHead, head_for

V = 300  # a vocabulary that a small budget cuts into many slices


def _model(kind: str):
    torch.manual_seed(0)
    common = dict(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**common))
    if kind == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(head_dim=8, **common))
    # Gemma-3: sliding-window and global layers, tied embeddings; "gemma3_cap" adds a final logit soft-cap
    cap = 3.0 if kind == "gemma3_cap" else None
    layers = ["sliding_attention", "full_attention"]
    cfg = Gemma3TextConfig(head_dim=16, sliding_window=4, query_pre_attn_scalar=16,
                           final_logit_softcapping=cap,
                           layer_types=layers, **common)  # fmt: skip
    return Gemma3ForCausalLM(cfg)


def _full(model, ids, start):
    logits = model(input_ids=ids).logits[:, start - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, start:, None])[..., 0]


def _grads(model, loss):
    model.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_the_sliced_head_looks_through_peft_and_keeps_the_active_adapter(monkeypatch):
    """A LoRA model as peft wraps it (a warm-up's, OpenRLHF's actor's): the head and backbone are the inner
    model's, not the wrapper's ``.model`` (the whole causal LM), and its log-probs are the adapted model's."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(_model("llama"), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:  # B ≠ 0: the adapter changes the function, so a path without it would differ
            torch.nn.init.normal_(p, std=0.5)
    peft_model.eval()
    ids = torch.randint(0, V, (2, 9))
    ref = _full(peft_model, ids, 4)
    with peft_model.disable_adapter():
        assert not torch.allclose(_full(peft_model, ids, 4), ref, atol=1e-3)
    monkeypatch.setattr(vocab, "LOGITS_BUDGET", 2 * V)
    head = head_for(peft_model, ids.numel())
    assert head is not None and head.backbone is peft_model.base_model.model.model
    torch.testing.assert_close(token_logprobs(peft_model, ids, 4), ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gemma3", "gemma3_cap"])
def test_sliced_head_equals_the_models_logits_values_and_gradients(kind, monkeypatch):
    model = _model(kind).eval()
    ids = torch.randint(0, V, (3, 9))
    weights = torch.rand(3, 5)  # a loss that weighs each token differently
    ref = _full(model, ids, 4)
    ref_grads = _grads(model, (ref * weights).sum())
    monkeypatch.setattr(vocab, "LOGITS_BUDGET", 2 * V)  # 2 rows a slice: 8 slices for 15 tokens
    head = head_for(model, ids.numel())
    assert head is not None and vocab.chunk_rows(head.vocab, head.budget) == 2
    got = token_logprobs(model, ids, 4)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)
    for name, g in _grads(model, (got * weights).sum()).items():
        torch.testing.assert_close(g, ref_grads[name], atol=1e-5, rtol=1e-4)  # summed in other orders


@pytest.mark.parametrize("budget", [None, 2 * V], ids=["full_logits", "sliced_head"])
@pytest.mark.parametrize("kind", ["llama", "gemma3_cap"])
def test_policy_temperature_gives_the_tempered_softmax_values_and_gradients(kind, budget, monkeypatch):
    """Inside policy_temperature(T) every pass is log softmax(z / T): values and gradients equal autograd's
    on the model's own logits divided by T, on both paths (the model's logits, the head in slices)."""
    model = _model(kind).eval()
    ids = torch.randint(0, V, (3, 9))
    weights = torch.rand(3, 5)
    t = 0.6
    logits = model(input_ids=ids).logits[:, 3:-1].float() / t
    ref = torch.log_softmax(logits, -1).gather(-1, ids[:, 4:, None])[..., 0]
    ref_grads = _grads(model, (ref * weights).sum())
    if budget:
        monkeypatch.setattr(vocab, "LOGITS_BUDGET", budget)
    with policy_temperature(t):
        got = token_logprobs(model, ids, 4)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    for name, g in _grads(model, (got * weights).sum()).items():
        torch.testing.assert_close(g, ref_grads[name], atol=1e-5, rtol=1e-4)
    plain = token_logprobs(model, ids, 4)  # outside the context: the untempered policy again
    assert (plain - got).abs().max() > 1e-2


def test_the_sampler_and_the_tempered_passes_agree_on_the_sampled_tokens():
    """π_old from a trainer pass under policy_temperature(T) equals the log-probs the sampler drew with at
    temperature T (fp32, CPU): the GSPO ratio of a fresh rollout is 1, as at T = 1."""
    model = _model("llama").eval()
    prompts = torch.randint(1, V, (2, 5))
    gen = torch.Generator().manual_seed(0)
    out = generate(model, prompts, 6, eos_id=0, pad_id=0, temperature=0.7, generator=gen)
    with torch.no_grad(), policy_temperature(0.7):
        lp = token_logprobs(model, torch.cat([prompts, out.tokens], 1), prompts.shape[1])
    torch.testing.assert_close(lp * out.mask, out.logp * out.mask, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        with policy_temperature(0.0):
            pass


def test_small_passes_keep_the_models_own_forward_and_unknown_heads_are_left_alone():
    model = _model("llama")
    assert head_for(model, vocab.LOGITS_BUDGET // V) is None  # fits: the model's own forward, bit for bit
    assert head_for(model, vocab.LOGITS_BUDGET // V + 1) is not None
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=V))
    assert OutputHead.of(gpt2) is None  # not in HEADS: full logits, never a guessed head


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_shared_prefix_passes_in_slices_equal_the_full_vocabulary_passes(kind, monkeypatch):
    """SharedPrefixes (the update, with grad) and the chunked no-grad pass (π_old, reference, cross rows)."""
    model = _model(kind).eval()
    torch.manual_seed(1)
    prompts = torch.randint(0, V, (2, 5))
    p_mask = torch.ones_like(prompts, dtype=torch.bool)
    p_mask[1, :2] = False
    index = torch.tensor([0, 0, 1, 1, 1])
    resp = torch.randint(0, V, (5, 6))
    resp[1, :3] = resp[0, :3]  # a shared response prefix
    r_mask = torch.ones_like(resp, dtype=torch.bool)
    r_mask[2, 4:] = False

    def run():
        shared = SharedPrefixes(model, prompts, index, resp, prompt_mask=p_mask, response_mask=r_mask)
        lp = shared.logprobs() * r_mask
        grads = _grads(model, lp.sum())
        with torch.no_grad():
            nograd = token_logprobs_shared_prompt(
                model, prompts, index, resp, prompt_mask=p_mask, response_mask=r_mask, max_tokens=12
            )
        return lp.detach(), grads, nograd * r_mask, shared.encoded.head

    ref, ref_grads, ref_nograd, head = run()
    assert head is None
    monkeypatch.setattr(vocab, "LOGITS_BUDGET", 3 * V)
    got, grads, nograd, head = run()
    assert head is not None
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(nograd, ref_nograd, atol=1e-6, rtol=0)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], atol=1e-5, rtol=1e-4)  # summed in other orders


def test_bf16_autocast_rounds_as_the_models_own_head(monkeypatch):
    model = _model("llama").eval()
    ids = torch.randint(0, V, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = _full(model, ids, 3)
        monkeypatch.setattr(vocab, "LOGITS_BUDGET", 4 * V)
        got = token_logprobs(model, ids, 3)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)


def test_a_tied_embeddings_sparse_lookup_gradient_gives_the_same_dense_grad():
    from hacpo.agents.vocab import sparse_tied_embedding_grads

    model = _model("gemma3")
    ids = torch.randint(0, V, (2, 7))
    ref = _grads(model, _full(model, ids, 2).sum())
    assert not sparse_tied_embedding_grads(model)  # a small vocabulary keeps its dense lookup gradient
    assert sparse_tied_embedding_grads(model, min_floats=0)
    got = _grads(model, _full(model, ids, 2).sum())
    emb = model.get_input_embeddings().weight
    assert not emb.grad.is_sparse  # the head's dense gradient absorbed the lookup's sparse one
    for name, g in got.items():
        torch.testing.assert_close(g, ref[name], atol=1e-6, rtol=1e-5)
    cfg = LlamaConfig(vocab_size=V, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32, tie_word_embeddings=False)  # fmt: skip
    untied = LlamaForCausalLM(cfg)
    assert not sparse_tied_embedding_grads(untied, min_floats=0)  # a sparse gradient alone would become .grad


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_later_micro_batches_add_the_head_gradient_into_grad_as_autograd_would(precision, monkeypatch):
    """The trainer's gradient accumulation: the first part creates ``.grad``, later parts add into it in
    place (``head_grads_into_param``); sums equal the full-logits path's, and ``autograd.grad`` outside the
    block still sees the head's share."""
    from hacpo.agents.vocab import head_grads_into_param, sparse_tied_embedding_grads

    model = _model("gemma3").eval()
    sparse_tied_embedding_grads(model, min_floats=0)
    parts = [torch.randint(0, V, (2, 7)) for _ in range(3)]
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")

    def accumulate(logprobs):
        model.zero_grad(set_to_none=True)
        for ids in parts:
            with autocast:
                loss = logprobs(ids).sum()
            with head_grads_into_param():
                loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    ref = accumulate(lambda ids: _full(model, ids, 2))
    monkeypatch.setattr(vocab, "LOGITS_BUDGET", 2 * V)
    got = accumulate(lambda ids: token_logprobs(model, ids, 2))
    tol = dict(atol=1e-5, rtol=1e-4) if precision == "fp32" else dict(atol=2e-2, rtol=2e-2)
    for name, g in got.items():
        torch.testing.assert_close(g, ref[name], **tol)
    weight = model.get_output_embeddings().weight
    assert weight.grad is not None  # outside the block: a functional gradient keeps the head's share
    (g_fn,) = torch.autograd.grad(token_logprobs(model, parts[0], 2).sum(), weight)
    (g_ref,) = torch.autograd.grad(_full(model, parts[0], 2).sum(), weight)
    torch.testing.assert_close(g_fn, g_ref, atol=1e-5, rtol=1e-4)
