"""Sampling loop and log-prob primitives: exactness against a plain full forward."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from hacpo.agents.decode import HFDecoder, KVDecoder
from hacpo.agents.lm import (
    SharedPrefixes,
    encode_prompts,
    generate,
    response_mask,
    token_budget_chunks,
    token_logprobs,
    token_logprobs_shared_prompt,
)


def _model(kind: str, kv_heads: int = 4):
    torch.manual_seed(0)
    common = dict(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        intermediate_size=64,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**common))
    if kind == "gpt2":  # an architecture KVDecoder does not implement: sampling falls back to HFDecoder
        cfg = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=40, bos_token_id=1, eos_token_id=2)
        return GPT2LMHeadModel(cfg)
    return Qwen3ForCausalLM(Qwen3Config(head_dim=8, **common))


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gpt2"])
@pytest.mark.parametrize("padded", [False, True])
def test_sampling_logprobs_equal_a_full_forward(kind, padded):
    model = _model(kind).eval()
    ids = torch.randint(3, 40, (8, 6))
    mask = torch.ones_like(ids, dtype=torch.bool)
    if padded:
        mask[:3, :2] = False
        ids[:3, :2] = 0
    out = generate(
        model, ids, 7, eos_id=2, pad_id=0, prompt_mask=mask, generator=torch.Generator().manual_seed(1)
    )
    full = torch.cat([ids, out.tokens], dim=1)
    with torch.no_grad():
        lp = token_logprobs(model, full, 6, attention_mask=torch.cat([mask, out.mask], dim=1))
    assert torch.allclose(lp * out.mask, out.logp, atol=1e-5)
    assert torch.equal(out.mask, response_mask(out.tokens, 2))


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gpt2"])
@pytest.mark.parametrize("frozen", [False, True])
def test_prompt_encoding_of_a_frozen_model_never_copies_its_head_per_prompt(kind, frozen):
    """The prefill keeps the last position's logits only. A model that needs no grad (served for evaluation;
    a LoRA base) once took torch's bmm path there, the [V, H] head copied per prompt (8.3 GB for 128
    SmolLM2 prompts): the head is one mm, whatever the parameters' ``requires_grad``."""
    from torch.profiler import ProfilerActivity, profile

    model = _model(kind).eval().requires_grad_(not frozen)
    ids = torch.randint(3, 40, (8, 6))
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        prompts = encode_prompts(model, ids)
    vocab = model.config.vocab_size
    batched = [e.input_shapes for e in prof.events() if e.name == "aten::bmm"]
    assert not [s for s in batched if any(len(x) == 3 and vocab in x[1:] for x in s)], batched
    with torch.no_grad():
        last = model(input_ids=ids).logits[:, -1]
    torch.testing.assert_close(prompts.first_logits, last, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind,kv_heads", [("llama", 4), ("llama", 2), ("qwen3", 4), ("qwen3", 1)])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_decoder_steps_equal_the_models_forward(kind, kv_heads, padded, dtype):
    """The direct decoder (Llama/Qwen3, incl. grouped-query attention) gives the model's own logits, in fp32
    and with bf16 weights (evaluation's ``precision: bf16``: norms and softmax in fp32, as Hugging Face's)."""
    model = _model(kind, kv_heads).eval().to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 0.02  # bf16: a few ulps (2^-8) of these logits (|x| < 1)
    assert KVDecoder.supports(model)
    prompts = torch.randint(3, 40, (3, 5))
    pmask = torch.ones_like(prompts, dtype=torch.bool)
    if padded:
        pmask[1, :3] = False
    rows = torch.tensor([0, 1, 1, 2, 0])
    with torch.no_grad():
        enc = encode_prompts(model, prompts, prompt_mask=pmask if padded else None)
        fast, slow = KVDecoder(model, enc, rows, 6), HFDecoder(model, enc, rows, 6)
        pos = (pmask.long().cumsum(-1)[:, -1])[rows]
        for t in range(6):
            tok = torch.randint(3, 40, (5,))
            a, b = fast.step(tok, pos + t), slow.step(tok, pos + t)
            assert a.dtype == b.dtype == dtype
            assert torch.allclose(a.float(), b.float(), atol=tol), (t, (a - b).abs().max())


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_kv_decoder_under_autocast_casts_its_weights_once_and_changes_no_bit(kind):
    """Training generates from fp32 master weights under bf16 autocast: the decoder casts its (fused) weights
    once instead of autocast re-casting them at every step. Same rounding, so the same logits to the bit as
    a decoder whose fp32 weights autocast casts at each step, and HF's forward under autocast to bf16 ulps."""
    model = _model(kind, 2).eval()
    prompts = torch.randint(3, 40, (3, 5))
    rows = torch.tensor([0, 1, 1, 2, 0])
    pos = torch.full((5,), 5)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        enc = encode_prompts(model, prompts)
        once, hf = KVDecoder(model, enc, rows, 4), HFDecoder(model, enc, rows, 4)
        with torch.autocast("cpu", enabled=False):
            per_step = KVDecoder(model, enc, rows, 4)  # built outside autocast: fp32 weights
        assert once.layers[0]["qkv"].dtype == once.lm_head.dtype == torch.bfloat16
        assert per_step.layers[0]["qkv"].dtype == torch.float32
        for t in range(4):
            tok = torch.randint(3, 40, (5,))
            a, b, c = once.step(tok, pos + t), per_step.step(tok, pos + t), hf.step(tok, pos + t)
            assert torch.equal(a, b), t
            assert torch.allclose(a.float(), c.float(), atol=0.02), (t, (a - c).abs().max())


def test_kv_decoder_declines_architectures_it_does_not_implement():
    model = _model("llama")
    model.config.attention_bias = True
    assert not KVDecoder.supports(model)
    assert not KVDecoder.supports(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40)))


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("padded", [False, True])
def test_shared_prompt_forward_equals_plain_forward_with_gradients(kind, padded):
    model = _model(kind)
    prompts = torch.randint(3, 40, (3, 6))
    pmask = torch.ones_like(prompts, dtype=torch.bool)
    if padded:
        pmask[0, :2] = False
    index = torch.tensor([0, 0, 1, 2, 2, 2, 1])
    resp = torch.randint(3, 40, (7, 5))
    full_mask = torch.cat([pmask[index], torch.ones_like(resp, dtype=torch.bool)], dim=1)
    a = token_logprobs(
        model, torch.cat([prompts[index], resp], dim=1), 6, attention_mask=full_mask if padded else None
    )
    ga = torch.autograd.grad(a.sum(), list(model.parameters()))
    b = token_logprobs_shared_prompt(model, prompts, index, resp, prompt_mask=pmask if padded else None)
    gb = torch.autograd.grad(b.sum(), list(model.parameters()))
    assert torch.allclose(a, b, atol=1e-5)
    for x, y in zip(ga, gb, strict=True):
        assert torch.allclose(x, y, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("max_tokens", [1, 7, 30, 10_000])
@pytest.mark.parametrize("ragged", [False, True])
def test_no_grad_log_probs_in_token_budgeted_chunks_equal_one_pass(max_tokens, ragged):
    """``max_tokens`` runs the rows in chunks (the full-vocabulary logits of a 4,096-token rollout would not
    fit a GPU at once); rows are independent, so the values are those of one pass."""
    model = _model("qwen3", 2).eval()
    prompts = torch.randint(3, 40, (3, 6))
    pmask = rmask = None
    if ragged:  # left-padded prompts, right-padded answers of mixed lengths
        pmask = torch.ones_like(prompts, dtype=torch.bool)
        pmask[1, :2] = False
        rmask = torch.arange(7) < torch.tensor([7, 1, 4, 7, 2, 5, 3, 6])[:, None]
    index = torch.tensor([0, 0, 1, 2, 2, 2, 1, 0])
    resp = torch.randint(3, 40, (8, 7))
    with torch.no_grad():
        args, masks = (model, prompts, index, resp), {"prompt_mask": pmask, "response_mask": rmask}
        whole, chunked = (
            token_logprobs_shared_prompt(*args, **masks),
            token_logprobs_shared_prompt(*args, **masks, max_tokens=max_tokens),
        )
    keep = torch.ones_like(resp, dtype=torch.bool) if rmask is None else rmask
    torch.testing.assert_close(chunked * keep, whole * keep, atol=1e-6, rtol=1e-6)


def test_no_grad_passes_make_no_more_logits_than_the_budget():
    """Every forward of a budgeted pass runs, and makes logits for, at most ``max_tokens`` positions, counted
    as padded: the shared-prefix encoding too. Here answers repeat each other at length (a collapsed policy)
    and lengths are mixed (one long answer among short ones), the two ways a pass can outgrow its rows'
    real tokens: prefixes padded to the longest shared one, responses padded to the longest."""
    model = _model("llama").eval()
    prompts = torch.randint(3, 40, (4, 5))
    index = torch.arange(4).repeat_interleave(4)
    resp = torch.randint(3, 40, (4, 30))[index]  # each prompt's 4 answers: the same 30 tokens
    resp[::4, 20:] = torch.randint(3, 40, (4, 10))  # ... apart from the last 10 of one of them
    lengths = torch.full((16,), 3)
    lengths[:8] = 30
    lengths[0] = 12
    rmask = torch.arange(30) < lengths[:, None]
    seen = []

    def count(_module, args, kwargs, out):
        ids = kwargs.get("input_ids", args[0] if args else None)
        seen.append((ids.numel(), out.logits.shape[0] * out.logits.shape[1]))

    hook = model.register_forward_hook(count, with_kwargs=True)
    budget = 5 * (5 + 30)
    with torch.no_grad():
        whole = token_logprobs_shared_prompt(model, prompts, index, resp, response_mask=rmask)
        unbounded, seen[:] = max(max(pair) for pair in seen), []
        chunked = token_logprobs_shared_prompt(
            model, prompts, index, resp, response_mask=rmask, max_tokens=budget
        )
    hook.remove()
    assert unbounded > budget  # this batch does outgrow the budget in one pass
    assert max(max(pair) for pair in seen) <= budget, seen
    torch.testing.assert_close(chunked * rmask, whole * rmask, atol=1e-6, rtol=1e-6)


def test_token_budget_chunks_pack_longest_first_and_keep_prompts_adjacent():
    lengths = torch.tensor([3, 10, 3, 7, 10, 1])
    group = torch.tensor([1, 0, 0, 1, 1, 0])
    chunks = token_budget_chunks(lengths, 24, prompt_len=2, group=group)
    assert [c.tolist() for c in chunks] == [[1, 4], [3, 2], [0, 5]]  # widths 12, 9, 5: 2 rows each fit
    for chunk in chunks:
        assert len(chunk) * (2 + int(lengths[chunk].max())) <= 24
    alone = token_budget_chunks(lengths, 5, prompt_len=2)  # every row is over the budget: one a chunk
    assert [c.tolist() for c in alone] == [[1], [4], [3], [0], [2], [5]]
    assert [c.tolist() for c in token_budget_chunks(lengths, None)] == [[0, 1, 2, 3, 4, 5]]


def test_greedy_is_deterministic_and_bad_arguments_fail():
    model = _model("llama").eval()
    ids = torch.randint(3, 40, (4, 5))
    a = generate(model, ids, 6, eos_id=2, pad_id=0, greedy=True)
    b = generate(model, ids, 6, eos_id=2, pad_id=0, greedy=True)
    assert torch.equal(a.tokens, b.tokens)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, ids, 0, eos_id=2, pad_id=0)
    with pytest.raises(ValueError, match="temperature"):
        generate(model, ids, 3, eos_id=2, pad_id=0, temperature=0.0)


@pytest.mark.parametrize("padded", [False, True])
def test_shared_prefill_generation_is_identical(padded):
    model = _model("qwen3").eval()
    prompts = torch.randint(3, 40, (3, 6))
    pmask = torch.ones_like(prompts, dtype=torch.bool)
    if padded:
        pmask[1, :3] = False
        prompts[1, :3] = 0
    index = torch.arange(3).repeat_interleave(4)
    a = generate(
        model,
        prompts[index],
        6,
        eos_id=2,
        pad_id=0,
        prompt_mask=pmask[index],
        generator=torch.Generator().manual_seed(5),
    )
    b = generate(
        model,
        prompts,
        6,
        eos_id=2,
        pad_id=0,
        prompt_mask=pmask,
        prompt_index=index,
        generator=torch.Generator().manual_seed(5),
    )
    assert torch.equal(a.tokens, b.tokens)
    assert torch.allclose(a.logp, b.logp, atol=1e-5)


def test_sampler_draws_the_given_distribution_and_never_a_zero_entry():
    from hacpo.agents.lm import _sample

    probs = torch.tensor([[0.0, 0.1, 0.0, 0.6, 0.3, 0.0]]).repeat(100_000, 1) * 3.0  # unnormalised is fine
    draws = _sample(probs, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=6).double() / len(draws)
    assert freq[[0, 2, 5]].sum() == 0
    assert torch.allclose(freq[[1, 3, 4]], torch.tensor([0.1, 0.6, 0.3], dtype=torch.float64), atol=0.006)
    again = _sample(probs[:10], torch.Generator().manual_seed(0))
    assert torch.equal(again, draws[:10])  # deterministic in the generator


def test_allocator_tuning_is_idempotent_and_harmless():
    from hacpo.hardware import keep_freed_memory

    first = keep_freed_memory()
    assert keep_freed_memory() == first  # cached: one mallopt per process
    assert isinstance(first, bool)
    x = torch.randn(1024, 1024)  # 4 MiB: above glibc's default mmap threshold, now served from the heap
    assert torch.isfinite(x @ x).all()


def _shared_prefix_batch(padded: bool):
    """Rows of 3 prompts whose responses share prefixes of different lengths, with ragged lengths."""
    prompts = torch.randint(3, 40, (3, 6))
    pmask = torch.ones_like(prompts, dtype=torch.bool)
    if padded:
        pmask[1, :3] = False
    index = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    resp = torch.randint(3, 40, (9, 8))
    resp[:3, :5] = torch.tensor([5, 6, 7, 8, 9])  # group 0 shares 5 tokens (more for two rows)
    resp[1, 5] = resp[0, 5]
    resp[3:5, :2] = torch.tensor([11, 12])  # group 1 shares 2
    resp[5:9, :4] = torch.tensor([13, 14, 15, 16])  # group 2 shares 4, but one row has only 3 tokens
    rmask = torch.ones_like(resp, dtype=torch.bool)
    rmask[0, 6:] = False
    rmask[6, 3:] = False  # shorter than the group's common prefix: the shared part stops at 2 tokens
    rmask[8, 7:] = False
    resp[~rmask] = 0
    return prompts, pmask, index, resp, rmask


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("padded", [False, True])
def test_shared_response_prefixes_give_the_plain_forward_and_its_gradient(kind, padded):
    model = _model(kind)
    prompts, pmask, index, resp, rmask = _shared_prefix_batch(padded)
    full_mask = torch.cat([pmask[index], rmask], dim=1)
    a = token_logprobs(model, torch.cat([prompts[index], resp], dim=1), 6, attention_mask=full_mask) * rmask
    ga = torch.autograd.grad(a.sum(), list(model.parameters()))
    shared = SharedPrefixes(
        model, prompts, index, resp, prompt_mask=pmask if padded else None, response_mask=rmask
    )
    assert int(shared.shared.max()) > 0  # some response tokens really are shared
    b = shared.logprobs() * rmask
    gb = torch.autograd.grad(b.sum(), list(model.parameters()))
    assert torch.allclose(a, b, atol=1e-5)
    for x, y in zip(ga, gb, strict=True):
        assert torch.allclose(x, y, atol=1e-4, rtol=1e-4)


def test_shared_prefixes_serve_row_subsets_with_and_without_gradient():
    model = _model("llama")
    prompts, pmask, index, resp, rmask = _shared_prefix_batch(True)
    full = (
        token_logprobs_shared_prompt(
            model, prompts, index, resp, prompt_mask=pmask, response_mask=rmask
        ).detach()
        * rmask
    )
    shared = SharedPrefixes(model, prompts, index, resp, prompt_mask=pmask, response_mask=rmask)
    first, rest = torch.tensor([0, 3, 6]), torch.tensor([1, 2, 4, 5, 7, 8])
    with torch.no_grad():
        a = shared.logprobs(first, detach=True)
    b = shared.logprobs(rest)
    assert not a.requires_grad and b.requires_grad
    assert torch.allclose(a * rmask[first], full[first], atol=1e-5)
    assert torch.allclose(b * rmask[rest], full[rest], atol=1e-5)
    b.sum().backward()  # the shared encoding's graph is intact after the detached pass


def test_masks_are_keyword_only_so_their_order_cannot_be_swapped():
    """The shared-prefix forward and its chunked wrapper once took (response_mask, prompt_mask) and
    (prompt_mask, response_mask) positionally: a call in the other's order swapped them without a word."""
    model = _model("llama")
    prompts, pmask, index, resp, rmask = _shared_prefix_batch(True)
    for call in (
        lambda: SharedPrefixes(model, prompts, index, resp, rmask, pmask),
        lambda: token_logprobs_shared_prompt(model, prompts, index, resp, pmask, rmask),
        lambda: token_logprobs(model, torch.cat([prompts[index], resp], 1), 6, None),
        lambda: encode_prompts(model, prompts, pmask),
    ):
        with pytest.raises(TypeError, match="positional argument"):
            call()


def _cheapest_cost(prompt_index, response, lengths, prompt_len) -> int:
    """The cost the grouping minimises, searched over every depth with no early stop."""
    rows, costs = response.shape[0], []
    for d in range(int(lengths.max())):
        shared = (lengths - 1).clamp(min=0).clamp(max=d)
        keys = {
            (int(prompt_index[r]), *response[r, : int(shared[r])].tolist(), -1 - int(shared[r]))
            for r in range(rows)
        }
        costs.append(len(keys) * (prompt_len + d) + rows * int((lengths - shared).max()))
    return min(costs)


@pytest.mark.parametrize("seed", range(20))
def test_prefix_grouping_stops_early_at_the_cheapest_depth(seed):
    """The search stops once every row is its own group; the depth it picks is still the cheapest of all."""
    from hacpo.agents.lm import _group_by_prefix

    g = torch.Generator().manual_seed(seed)
    rows, width, prompt_len = 12, 30, 5
    resp = torch.randint(0, 2 + seed % 3, (rows, width), generator=g)  # random rows part early...
    index = torch.randint(0, 3, (rows,), generator=g)
    boxed = torch.rand(rows, generator=g) < 0.6  # ...the others open with their prompt's long common prefix
    opening = torch.randint(5, 9, (3, width), generator=g)
    cut = 4 + seed % 8
    resp[boxed, :cut] = opening[index[boxed], :cut]
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    group, shared = _group_by_prefix(index, resp, lengths, prompt_len)
    groups, depth = int(group.max()) + 1, int(shared.max())
    cost = groups * (prompt_len + depth) + rows * int((lengths - shared[group]).max())
    assert cost == _cheapest_cost(index, resp, lengths, prompt_len)


def test_rows_are_grouped_by_prompt_and_exact_shared_prefix():
    from hacpo.agents.lm import _group_by_prefix

    # 2 prompts × 8 rows answering "\\boxed{4x}" (7 + 3 tokens + EOS) and one junk row without the box
    box = [30, 31, 32, 33, 34, 35, 36]
    rows = [box + [4, d, 37, 2] for d in range(8)] + [box + [5, 1, 37, 2] for _ in range(7)] + [[9] * 11]
    resp = torch.tensor(rows)
    index = torch.tensor([0] * 8 + [1] * 8)
    lengths = torch.full((16,), 11)
    group, shared = _group_by_prefix(index, resp, lengths, prompt_len=6)
    for r in range(16):  # every row really starts with its group's shared prefix, and the group's prompt
        mates = (group == group[r]).nonzero().flatten()
        c = int(shared[group[r]])
        assert (index[mates] == index[r]).all() and (resp[mates, :c] == resp[r, :c]).all()
    assert len(shared) == 3 and int(shared[group[0]]) == 8  # "\\boxed{4" shared by prompt 0's rows
    assert group[15] != group[8]  # the junk row has its own group, and does not cut prompt 1's prefix
    assert int((lengths - shared[group]).max()) <= 3


def test_freed_memory_goes_back_to_the_kernel_after_an_update():
    """hacpo.hardware.return_freed_memory (after each update): what keep_freed_memory kept is released."""
    import subprocess
    import sys

    code = """
import torch
from hacpo.hardware import keep_freed_memory, return_freed_memory
def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
if not (keep_freed_memory() and return_freed_memory()):
    print("no-glibc"); raise SystemExit
blocks = [torch.ones(1 << 20) for _ in range(150)]  # 150 × 4 MiB, kept in the heap once freed
del blocks
kept = rss()
return_freed_memory()
print(kept - rss())
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    out = run.stdout.split()
    if out[-1] == "no-glibc":
        pytest.skip("no glibc allocator here (macOS, musl): nothing to tune")
    assert float(out[-1]) > 400  # MiB handed back of the 600 freed
