"""The joint step (issue 11) end to end on CPU: three warmed-up toy agents (two share the character tokenizer,
one has the word tokenizer), each behind an agent stack made of OpenRLHF's own pieces — its ``Actor`` for
log-probs, ``_process_response_into_experience`` for rows, our reward file for rewards, ``HacpoActorTrainer``
for updates (DeepSpeed's accumulation contract played by a plain optimizer). Generation is Hugging Face
sampling instead of vLLM, the one part that needs a GPU.

Checks: the step's order (every agent generates, then every agent scores, before any update; updates one
learner after the other; weights synced last), prompt-id grouping from the rows' own prompt texts, metrics
under the local engine's keys, a second step with ω from the capability window, and real learning signal
(non-zero advantages, parameters that move).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("openrlhf", reason="needs openrlhf==0.11.2: bash scripts/setup_openrlhf_cpu.sh")
sys.path.insert(0, str(Path(__file__).parent))
import gpu_only_modules  # noqa: E402

gpu_only_modules.install()

from openrlhf.models import Actor  # noqa: E402
from openrlhf.trainer.ppo_utils.experience import (  # noqa: E402
    Experience,
    remove_padding_in_sequences,
    split_experience_batch,
)
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from hacpo.algo import get_method  # noqa: E402
from hacpo.data.synthetic import read_jsonl  # noqa: E402
from hacpo.engines.openrlhf.joint.actor import HacpoActorTrainer  # noqa: E402
from hacpo.engines.openrlhf.joint.controller import JointStep, assign_prompt_ids  # noqa: E402
from hacpo.engines.openrlhf.reward_func import reward_func  # noqa: E402

G, B, MAX_NEW, MAX_LEN = 4, 6, 16, 64


class PlainStrategy:
    """DeepSpeed as the trainer uses it: loss/gas per backward, clip + step every gas micro-batches."""

    ring_attn_group = None

    def __init__(self, gas: int, optimizer):
        self.accumulated_gradient, self.optimizer, self.micro = gas, optimizer, 0

    def backward(self, loss, model, optimizer):
        (loss / self.accumulated_gradient).backward()

    def optimizer_step(self, optimizer, model, scheduler, name="actor"):
        self.micro += 1
        if self.micro % self.accumulated_gradient == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def get_grad_norm(self, model):
        return None


class CpuStack:
    """An agent stack from OpenRLHF's pieces on CPU (see the module docstring); records the calls it gets."""

    def __init__(self, name: str, path: Path, calls: list, spec, seed: int, gas: int = 2, micro: int = 4):
        self.name, self.calls, self.seed = name, calls, seed
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.actor = Actor(str(path), attn_implementation="sdpa", param_dtype="bf16").float().train()
        self.ref = Actor(str(path), attn_implementation="sdpa", param_dtype="bf16").float().eval()
        optimizer = torch.optim.AdamW(self.actor.parameters(), lr=1e-3)
        trainer = HacpoActorTrainer.__new__(HacpoActorTrainer)  # OpenRLHF's __init__ needs torch.distributed
        trainer.args = SimpleNamespace(train=SimpleNamespace(dynamic_batch_enable=False))
        trainer.strategy, trainer.actor, trainer.actor_optim = (
            PlainStrategy(gas, optimizer),
            self.actor,
            optimizer,
        )
        trainer.actor_scheduler = SimpleNamespace(get_last_lr=lambda: [1e-3])
        trainer.micro_train_batch_size, trainer.max_epochs = micro, 1
        trainer.replay_buffer = SimpleNamespace(items=[])
        trainer.configure(spec, "mixed", seed)
        self.trainer = trainer

    def generate(self, prompts, labels, n):
        self.calls.append(("generate", self.name))
        tok, rows = self.tokenizer, []
        gen = torch.Generator().manual_seed(self.seed)
        for prompt, label in reversed(list(zip(prompts, labels, strict=True))):  # arrival order is not ours
            ids = tok(prompt, add_special_tokens=False)["input_ids"]
            torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
            with torch.no_grad():
                out = self.actor.model.generate(
                    torch.tensor([ids] * n), attention_mask=torch.ones(n, len(ids), dtype=torch.long),
                    do_sample=True, max_new_tokens=MAX_NEW, eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.pad_token_id, top_p=1.0, temperature=1.0,
                )  # fmt: skip
            for seq in out.tolist():
                resp = seq[len(ids) :]
                if tok.eos_token_id in resp:
                    resp = resp[: resp.index(tok.eos_token_id) + 1]
                query = tok.decode(ids + resp, skip_special_tokens=False)
                reward = reward_func([query], [prompt], [label])
                response = {
                    "observation_tokens": ids + resp, "action_ranges": [(len(ids), len(ids) + len(resp))],
                    "reward": float(reward["rewards"][0]), "scores": float(reward["scores"][0]),
                    "extra_logs": reward["extra_logs"], "rollout_log_probs": None,
                    "truncated": tok.eos_token_id not in resp, "prompt": prompt, "label": label,
                }  # fmt: skip
                rows.append(
                    SamplesGenerator._process_response_into_experience(None, response, max_len=MAX_LEN)
                )
        return rows

    def score(self, rows):
        self.calls.append(("score", self.name))
        batch = Experience.concat_experiences(rows, self.tokenizer.pad_token_id)
        with torch.no_grad():
            batch.action_log_probs = self.actor(batch.sequences, batch.action_mask, batch.attention_mask)
            batch.base_action_log_probs = self.ref(batch.sequences, batch.action_mask, batch.attention_mask)
        batch.info["kl"] = torch.zeros(len(rows))
        return remove_padding_in_sequences(split_experience_batch(batch))

    def train(self, rows):
        self.calls.append(("train", self.name))
        self.trainer.replay_buffer.items = rows
        try:
            return self.trainer.ppo_train()
        finally:
            self.trainer.replay_buffer.items = []

    def sync(self):
        self.calls.append(("sync", self.name))


@pytest.fixture(scope="module")
def problems(toy_data):
    return read_jsonl(toy_data / "train.jsonl", as_problems=True)[: 2 * B]


def _stacks(small_agent, other_agent, calls, spec):
    return [
        CpuStack("llama_char", small_agent, calls, spec, seed=1),
        CpuStack("qwen3_word", other_agent, calls, spec, seed=2),
        CpuStack("llama_char_b", small_agent, calls, spec, seed=3),
    ]


def test_joint_step_order_metrics_and_learning(small_agent, other_agent, problems):
    calls: list = []
    method = get_method("hacpo")
    spec = method.loss_spec()
    stacks = _stacks(small_agent, other_agent, calls, spec)
    before = [torch.cat([p.detach().reshape(-1).clone() for p in s.actor.parameters()]) for s in stacks]
    step = JointStep(
        stacks, method, group_size=G, max_new_tokens=MAX_NEW, max_len=MAX_LEN, prompt_style="compact"
    )
    row = step.run(0, problems[:B])
    names = [s.name for s in stacks]
    assert calls == [(c, n) for c in ("generate", "score", "train", "sync") for n in names]
    for n in names:
        assert 0.0 <= row[f"{n}/reward"] <= 1.0 and row[f"{n}/p_hat"] == pytest.approx(
            max(row[f"{n}/reward"], 1e-8)
        )
        for key in (
            "s_homo_mean",
            "s_hete_mean",
            "cross_in_bounds_frac",
            "omega_mean",
            "kl",
            "own_clip_frac",
        ):
            assert f"{n}/{key}" in row, key
        assert row[f"{n}/update"] == 8  # 6 prompts × 4 × 3 agents = 72 rows, 8 per optimizer step: m = 0..8
    assert any(row[f"{n}/reward"] > 0 for n in names), "warmed-up agents should solve some add2 problems"
    assert len(row["omega"]) == 3 and row["omega"][0][0] == 1.0
    for key in ("generate", "logprobs", "retokenize", "update", "sync"):
        assert row[f"time/{key}_s"] >= 0
    json.dumps(row)  # metrics.jsonl-ready
    after = [torch.cat([p.detach().reshape(-1) for p in s.actor.parameters()]) for s in stacks]
    assert all(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
    calls.clear()
    row2 = step.run(1, problems[B : 2 * B])
    assert row2["step"] == 1 and step.tracker.steps_seen == 2
    p_hat = [row2[f"{n}/p_hat"] for n in names]
    assert row2["omega"][0][1] == pytest.approx(min(max(p_hat[0] / p_hat[1], 0.1), 10.0))


def test_prompt_ids_from_prompt_texts():
    rows = [SimpleNamespace(prompts=[t]) for t in ["b", "a", "b", "a", "c", "c", "c", "c"]]
    # "c" appears twice in the batch (pids 2 and 3): its rows are shared out two each, in arrival order
    assert assign_prompt_ids(rows, ["a", "b", "c", "c"], 2) == [1, 0, 1, 0, 2, 2, 3, 3]
    with pytest.raises(ValueError, match="fewer than 2 samples"):
        assign_prompt_ids(rows[:-1], ["a", "b", "c", "c"], 2)
    with pytest.raises(ValueError, match="not in this step's batch"):
        assign_prompt_ids(rows + [SimpleNamespace(prompts=["z"])], ["a", "b", "c", "c"], 2)
    with pytest.raises(ValueError, match="more than 2 samples"):
        assign_prompt_ids(rows + [SimpleNamespace(prompts=["a"])], ["a", "b", "c", "c"], 2)


def test_joint_method_needs_two_agents(small_agent):
    stack = CpuStack("solo", small_agent, [], get_method("hacpo").loss_spec(), seed=0)
    with pytest.raises(ValueError, match="at least 2 agents"):
        JointStep([stack], get_method("hacpo"), group_size=G, max_new_tokens=MAX_NEW, max_len=MAX_LEN)
