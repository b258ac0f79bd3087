"""The joint driver's log-prob passes on OpenRLHF actors with the head in slices
(:mod:`hacpo.engines.openrlhf.joint.logprobs`) equal OpenRLHF's own ``Actor.forward``: values and gradients,
on a Llama with its own head (also under a peft-wrapped LoRA adapter) and on a Gemma-3 with tied embeddings,
a final soft-cap and sliding-window and global layers (tiny random models; the budget forced down so that
every pass slices)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from real_stack import on_this_machine, require  # noqa: E402

require("openrlhf")
on_this_machine()

from hacpo.engines.openrlhf.joint.logprobs import action_log_probs, sliced_head  # noqa: E402


def _model(arch: str):
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig

    torch.manual_seed(0)
    common = dict(vocab_size=301, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)  # fmt: skip
    if arch == "llama":
        cfg = LlamaConfig(**common, tie_word_embeddings=False)
    else:
        cfg = Gemma3TextConfig(
            **common, head_dim=16, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
            final_logit_softcapping=5.0, tie_word_embeddings=True,
        )  # fmt: skip
    cfg._attn_implementation = "eager"
    return AutoModelForCausalLM.from_config(cfg).float()


def _batch():
    """Two left-padded rows (OpenRLHF's layout), actions on the last 5 positions, one shorter."""
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(3, 301, (2, 12), generator=g)
    attention = torch.ones(2, 12, dtype=torch.long)
    attention[1, :3] = 0
    seq[1, :3] = 0
    action = torch.zeros(2, 11, dtype=torch.long)
    action[0, 6:] = 1
    action[1, 6:9] = 1
    return seq, action, attention


def _lora(model):
    """peft's wrapper, as OpenRLHF's ``Actor`` puts it around a LoRA model, B ≠ 0 so the adapter counts."""
    from peft import LoraConfig, get_peft_model

    wrapped = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    for name, p in wrapped.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    return wrapped


@pytest.mark.parametrize("arch", ["llama", "gemma3", "llama-lora"])
def test_sliced_log_probs_equal_openrlhfs_actor_forward(arch):
    from openrlhf.models.actor import Actor

    model = _model(arch.removesuffix("-lora"))
    actor = Actor(_lora(model) if arch.endswith("-lora") else model)
    actor.packing_samples = False  # Actor(model) leaves it unset; from_pretrained sets False
    seq, action, attention = _batch()
    head = sliced_head(actor, seq.numel(), zero_stage=2, budget=301 * 3)  # three rows of logits per slice
    assert head is not None and head.softcap == (5.0 if arch == "gemma3" else None)
    assert sliced_head(actor, seq.numel(), zero_stage=3, budget=1) is None  # ZeRO-3: OpenRLHF's forward
    assert sliced_head(actor, seq.numel(), budget=10**9) is None  # fits: OpenRLHF's forward

    ours = action_log_probs(head, seq, action, attention)
    ours.sum().backward()
    trained = [(n, p) for n, p in actor.named_parameters() if p.requires_grad]  # LoRA: the adapter only
    ours_grads = {n: p.grad.clone() for n, p in trained}
    actor.zero_grad()
    theirs = actor(seq, action, attention_mask=attention)
    theirs.sum().backward()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    assert (ours[action == 0] == 0).all()
    for name, p in trained:
        torch.testing.assert_close(ours_grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_policy_actors_scoring_pass_slices_text_rows(capsys):
    """``HacpoPolicyActor.forward`` (``make_experience``'s pass) takes the sliced path for text rows, which
    OpenRLHF sends with ``mm_train_inputs_list`` = one None per row, and returns OpenRLHF's values."""
    from types import SimpleNamespace

    from openrlhf.models.actor import Actor

    from hacpo.engines.openrlhf.joint import actor as joint_actor
    from hacpo.engines.openrlhf.joint.actor import HacpoPolicyActor

    actor = Actor(_model("gemma3"))
    actor.packing_samples = False
    seq, action, attention = _batch()
    me = SimpleNamespace(actor=actor, strategy=SimpleNamespace(stage=2, ring_attn_group=None))
    joint_actor._ANNOUNCED.discard("scoring")
    with pytest.MonkeyPatch.context() as mp:  # every pass slices: a budget below one row of logits
        import hacpo.engines.openrlhf.joint.logprobs as lp

        mp.setattr(lp, "LOGITS_BUDGET", 100)
        ours = HacpoPolicyActor.forward(me, seq, action, attention, None, [None, None])
    assert "by the head in slices" in capsys.readouterr().out
    with torch.no_grad():
        torch.testing.assert_close(ours, actor(seq, action, attention_mask=attention), rtol=0, atol=1e-5)
