"""Tensor placement on a second device, checked on a CPU-only machine (tests/virtual_device.py).

Every tensor that training, generation, the shared-prefix encoder, evaluation and warm-up create must live
on the run's device: a GPU run fails at the first op that mixes a host tensor with device tensors. Here the
run's device is a virtual one (``cpu:0``), and :class:`VirtualDevice` records each op that CUDA would refuse.
The CUDA run itself is ``HACPO_TEST_DEVICE=cuda`` (docs/guide/gpus.md, "One GPU").
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from toy_runs import toy_train_config
from virtual_device import DEVICE, VirtualDevice


# ------------------------------------------------------------------------ the checker itself
def test_the_checker_sees_what_cuda_refuses():
    emb = torch.nn.Embedding(10, 4)
    with VirtualDevice() as vd:
        emb.to(DEVICE)
        host_ids = torch.tensor([[1, 2, 3]])
        emb(host_ids)  # the "index is on cpu" (index_select)
        x = torch.ones(3, 4, device=DEVICE)
        x * torch.arange(4)  # a factory without device=
        torch.cat([x, torch.zeros(1, 4)])
        torch.zeros(3)[torch.tensor([0, 1], device=DEVICE)]  # host tensor, device indices
        x.numpy()
        torch.rand(3, device=DEVICE, generator=torch.Generator().manual_seed(0))  # a host generator
        torch.multinomial(x[0], 2, generator=torch.Generator())
    ops = [v.op for v in vd.violations]
    assert ops == ["embedding", "mul", "cat", "__getitem__", "numpy", "rand", "multinomial"], vd.report()
    assert all("test_device_placement.py" in v.where for v in vd.violations)


def test_the_checker_accepts_what_cuda_accepts():
    lin = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(lin.parameters(), lr=0.1)
    with VirtualDevice() as vd:
        lin.to(DEVICE)
        x = torch.randn(3, 4).to(DEVICE)
        y = lin(x) * 2.0 + torch.tensor(1.0)  # a 0-dim host tensor is a scalar to CUDA
        y = y + torch.ones(3, 2, device=x.device)  # device=t.device of a device tensor
        y = y[torch.tensor([0, 2])]  # device tensor, host indices
        F.cross_entropy(y, torch.tensor([0, 1]).to(DEVICE)).backward()
        torch.nn.utils.clip_grad_norm_(lin.parameters(), 1.0)
        opt.step()
        torch.rand(3, device=DEVICE, generator=torch.Generator(device=DEVICE))
        torch.randperm(3, generator=torch.Generator())  # host draws with a host generator
        buf = torch.zeros(3, 2, device=DEVICE)
        buf[0] = torch.ones(2)  # a write of host values into a device tensor
        y.detach().cpu().numpy()
        assert vd.on_device(buf) and not vd.on_device(y.cpu()) and x.device == DEVICE
    assert not vd.violations, vd.report()


def test_the_checker_changes_nothing_it_watches(small_agent, other_agent):
    """Loading under the checker gives the same weights and buffers (Hugging Face materialises buffers off the
    meta device by asking each tensor's ``.device``; the checker must report meta tensors as meta)."""
    from transformers import AutoModelForCausalLM

    for path in (small_agent, other_agent):
        plain = AutoModelForCausalLM.from_pretrained(path)
        with VirtualDevice() as vd:
            watched = AutoModelForCausalLM.from_pretrained(path).to(DEVICE)
        a = {**dict(plain.named_parameters()), **dict(plain.named_buffers())}
        b = {**dict(watched.named_parameters()), **dict(watched.named_buffers())}
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), path
        assert all(vd.on_device(t) for t in b.values()) and not vd.violations


# ------------------------------------------------------------------------ the project on the virtual device
def _train_cfg(tmp_path, agents, toy_data, method, **kw):
    cfg = toy_train_config(
        tmp_path, agents, method, data=toy_data, prompts_per_step=2, val_size=8, val_every=1,
        checkpoint_every=1, seed=0, device="cpu", **kw,
    )  # fmt: skip
    return cfg.model_copy(update={"device": str(DEVICE)})  # past the config's cpu|cuda|auto: a test device


TRAIN_CASES = {
    "hacpo, two tokenizers": ("hacpo", True, {}),
    "gspo": ("gspo", False, {}),
    "naive": ("naive", True, {"naive_cross_ratio": "self_old"}),
    "hacpo, bf16, micro-batches, checkpointing, π_old by forward": (
        "hacpo",
        True,
        dict(precision="bf16", micro_batch_tokens=40, gradient_checkpointing=True, old_logp="forward"),
    ),
}


@pytest.mark.parametrize("case", TRAIN_CASES)
def test_training_places_every_tensor_on_the_run_device(tmp_path, toy_data, small_agent, other_agent, case):
    from hacpo.engines.local import train

    method, joint, knobs = TRAIN_CASES[case]
    agents = [("a", small_agent), ("b", other_agent)] if joint else [("a", small_agent)]
    cfg = _train_cfg(tmp_path, agents, toy_data, method, **knobs)
    with VirtualDevice(strict=bool(os.environ.get("HACPO_VD_STRICT"))) as vd:
        run = train(cfg)
    assert run.status == "complete"
    assert not vd.violations, "ops CUDA would refuse:\n" + vd.report()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_evaluation_places_every_tensor_on_the_run_device(small_agent, toy_data, precision):
    from hacpo.data.synthetic import read_jsonl
    from hacpo.eval import Sampling
    from hacpo.eval.local import LocalGenerator

    rows = read_jsonl(toy_data / "test.jsonl")[:6]
    with VirtualDevice() as vd:
        gen = LocalGenerator(str(small_agent), device=str(DEVICE), batch_tokens=60, precision=precision)
        dtype = next(gen.model.parameters()).dtype
        assert dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)
        for greedy, k in ((True, 1), (False, 3)):
            sampling = Sampling(greedy=greedy, k=k, temperature=1.0, top_p=0.9, max_new_tokens=14)
            out = gen.generate(rows, sampling)
            assert len(out) == 6 and all(len(r) == k for r in out)
    assert not vd.violations, "ops CUDA would refuse:\n" + vd.report()


def test_warmup_places_every_tensor_on_the_run_device(tmp_path, toy_data):
    from hacpo.agents.models import AgentArch
    from hacpo.agents.warmup import WarmupSpec, build_agent
    from hacpo.data.synthetic import read_jsonl

    splits = {s: read_jsonl(toy_data / f"{s}.jsonl", as_problems=True)[:64] for s in ("train", "dev")}
    spec = WarmupSpec(arch=AgentArch(hidden=32, layers=1), max_steps=4, eval_every=2, n_dev=8, seed=0)
    with VirtualDevice() as vd:
        info = build_agent(spec, tmp_path / "agent", splits, device=str(DEVICE))
    assert info["steps"] == 4
    assert not vd.violations, "ops CUDA would refuse:\n" + vd.report()
