"""The joint step (issue 11) end to end on CPU: three warmed-up toy agents (two share the character tokenizer,
one has the word tokenizer), each behind an agent stack made of OpenRLHF's own pieces (cpu_stack.py: its
``Actor``, rows, our reward file, ``HacpoActorTrainer``; Hugging Face sampling stands in for vLLM).

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

from cpu_stack import MAX_LEN, MAX_NEW, CpuStack  # noqa: E402

from hacpo.algo import get_method  # noqa: E402
from hacpo.data.synthetic import read_jsonl  # noqa: E402
from hacpo.engines.openrlhf.joint.controller import JointStep, assign_prompt_ids  # noqa: E402

G, B = 4, 6


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


# ---------------------------------------------------------------------------------------- with Ray
def test_joint_step_with_ray_actors(small_agent, other_agent, problems):
    """The controller in a Ray actor driving three agent stacks in three other Ray actors (real Ray on this
    machine): rows, advantages and metrics cross Ray's object store; the step order holds."""
    ray = pytest.importorskip("ray")
    here = Path(__file__).parent
    env = {"env_vars": {"PYTHONPATH": f"{here}:{here.parents[1]}", "HACPO_REWARD_WORKERS": "1"}}
    ray.init(num_cpus=4, include_dashboard=False, runtime_env=env, log_to_driver=False)
    try:
        from cpu_stack import CpuStack as Stack
        from cpu_stack import StepRunner

        spec = get_method("naive").loss_spec()
        paths = [small_agent, other_agent, small_agent]
        names = ["llama_char", "qwen3_word", "llama_char_b"]
        remote = ray.remote(num_cpus=1)(Stack)
        handles = [
            remote.remote(n, p, [], spec, seed=k) for k, (n, p) in enumerate(zip(names, paths, strict=True))
        ]
        runner = ray.remote(num_cpus=0)(StepRunner).remote(
            handles, names, [str(p) for p in paths], "naive", G
        )
        row = ray.get(runner.run.remote(0, problems[:B]))
        for n in names:
            assert (
                f"{n}/s_hete_mean" in row and f"{n}/cross_clip_frac" in row and 0 <= row[f"{n}/reward"] <= 1
            )
        timeline = sorted(t for h in handles for t in ray.get(h.get_timeline.remote()))
        order = [(call, name) for _, call, name in timeline]
        assert order == [(c, n) for c in ("generate", "score", "train", "sync") for n in names]
    finally:
        ray.shutdown()
