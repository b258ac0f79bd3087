"""Where the local update makes the host wait for the GPU, counted on a CPU (tests/host_syncs.py).

docs/design.md ("Host syncs") lists the syncs that remain in one micro-batch and why each stays; the test
here holds the update to that list.
"""

from __future__ import annotations

import contextlib
import types

import pytest
import torch
from host_syncs import HostSyncs
from virtual_device import DEVICE

from hacpo.algo import LossSpec
from hacpo.engines.local.rows import Rows
from hacpo.engines.local.update import UpdateMixin


def test_the_counter_sees_each_wait_for_the_device_and_nothing_else():
    host = torch.tensor([1.0, 0.0, 2.0])
    with HostSyncs() as hs:
        x = host.to(DEVICE)  # blocking copy
        y = torch.arange(3.0).to(DEVICE, non_blocking=True)  # staged, no wait
        z = (x * y + 1).exp().sum(0, keepdim=True)  # launches only
        x[x > 0]  # boolean index: the output's size is on the device
        torch.nonzero(x)
        x.unique()
        float(z)
        x.tolist()
        x.cpu()
        host[host > 0].tolist()  # host work: no wait
        int(host.sum())
    ops = [s.op for s in hs.syncs]
    assert ops == [
        "blocking copy to the device", "index", "nonzero", "_unique2", "_local_scalar_dense", "tolist",
        "copy to host",
    ], hs.report()  # fmt: skip
    assert {s.file for s in hs.syncs} == {"test_host_syncs.py"}, hs.report()


class _Update(UpdateMixin):
    """The local trainer's update, on the virtual device, without a run around it."""

    def __init__(self, spec: LossSpec, **cfg) -> None:
        self.device, self.spec = DEVICE, spec
        self.cfg = types.SimpleNamespace(gradient_checkpointing=False, skip_dead_rows=True, **cfg)

    def autocast(self):
        return contextlib.nullcontext()


def _rows(n: int = 8, width: int = 6, vocab: int = 20) -> Rows:
    """A learner's rows on the host: two prompts, own and cross rows alternating, some with A = 0."""
    g = torch.Generator().manual_seed(0)
    mask = torch.arange(width)[None] < torch.randint(2, width + 1, (n,), generator=g)[:, None]
    own = torch.arange(n) % 2 == 0
    logp = -3 * torch.rand(n, width, generator=g)
    return Rows(
        prompt_index=torch.arange(n) // 4, response=torch.randint(3, vocab, (n, width), generator=g),
        mask=mask, is_own=own, agent=(~own).long(), old_mean_logp=torch.full((n,), -3.0),
        adv=torch.tensor([1.0, -1.0, 0.0, 0.5, -0.5, 1.0, 0.0, -1.0]), omega=torch.ones(n),
        old_logp=logp * own[:, None], ref_logp=(logp - 0.1) * own[:, None],
    )  # fmt: skip


# The syncs left in one micro-batch of the local update (docs/design.md, "Host syncs"), by place
MICRO_BATCH_SYNCS = {
    ("live_rows.py", "policy_loss_live_rows", "nonzero"): 2,  # the rows to probe, then the live rows
    ("_checks.py", "check_all_finite", "tolist"): 1,  # the mini-batch's inputs are finite
    ("losses.py", "policy_loss", "tolist"): 1,  # whether it has own rows and cross rows
}


# Transformers' SDPA mask builder reads a padding mask on the host, to tell whether it may skip the mask
# (masking_utils._ignore_causal_mask_sdpa): twice in the prefix encoding, when some prompt is left-padded
TRANSFORMERS_PADDED = {("lm.py", "_forward", "_local_scalar_dense"): 2}


@pytest.mark.parametrize("checkpointing", [False, True], ids=["shared prefixes", "gradient checkpointing"])
@pytest.mark.parametrize("padded", [False, True], ids=["same-length prompts", "left-padded prompts"])
@pytest.mark.parametrize("kind", ["hacpo", "naive"])
def test_one_micro_batch_of_the_local_update_waits_for_the_device_four_times(kind, padded, checkpointing):
    """HACPO's probe has rows (cross rows whose clamp may be flat); naive's finds none here (its rows with
    A = 0 are own rows, which the KL term reads), so the loss runs once on every row. With gradient
    checkpointing each pass over chosen rows (the probe, the live rows) copies their indices to the host."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=20, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64,
    ))  # fmt: skip
    learner = types.SimpleNamespace(model=model)
    rows, update = _rows(), _Update(LossSpec(kind=kind))
    update.cfg.gradient_checkpointing = checkpointing
    p_ids, p_mask = torch.randint(3, 20, (2, 4)), torch.ones(2, 4, dtype=torch.bool)
    p_mask[0, 0] = not padded
    with HostSyncs() as hs:
        model.to(DEVICE)
        hs.syncs.clear()
        loss, _ = update._part_loss(learner, rows, torch.arange(8), p_ids, p_mask, 1, None)
        loss.backward()
    expected = MICRO_BATCH_SYNCS | (TRANSFORMERS_PADDED if padded else {})
    if kind == "naive":  # the probe finds no rows: no second search
        expected[("live_rows.py", "policy_loss_live_rows", "nonzero")] = 1
    if checkpointing:  # a plain forward per pass, each with its prompts' padding mask (transformers' 2)
        chosen = 2 if kind == "hacpo" else 0  # passes over chosen rows: the probe's and the live rows'
        expected = {**expected, ("update.py", "logprobs", "copy to host"): chosen}
        expected[("lm.py", "_forward", "_local_scalar_dense")] = 2 * max(chosen, 1) if padded else 0
    assert hs.counts() == {k: n for k, n in expected.items() if n}, hs.report()
    assert not hs.violations, hs.report()
