"""Does each agent's vLLM engine hold its DeepSpeed actor's weights after a weight sync?

``python -m hacpo.engines.openrlhf.launch [--cpu] hacpo.engines.openrlhf.joint.driver JOINT --sync-check OUT``
(what :func:`hacpo.engines.openrlhf.runner.sync_check` runs inside the job's Ray cluster; ``JOINT``: the run's
``joint.json``). For every agent of the run, on its real OpenRLHF stack (:func:`.driver.build_parts`):

1. vLLM samples the first prompts; the actor scores the same tokens: ``loaded``, the gap between vLLM's
   log-probs and the actor's (:func:`.rows.engine_gap`) with both holding the weights read from disk;
2. one real update of the actor (HACPO's trainer at lr :data:`CHECK_LR`, rewards replaced by 0/1
   alternating in each group so that every advantage is ±1 and the policy moves), then the updated actor
   scores the samples of step 1 again, against the log-probs vLLM gave them *before* any sync: ``stale``,
   the gap a sync that moved nothing would leave (what vLLM would sample again with its old weights, on the
   same tokens, without a third sampling pass);
3. the weight sync (``broadcast_to_vllm``), vLLM samples again: ``synced``.

The sync holds when ``synced`` is rounding (``synced.mean`` within ``tolerance`` of ``loaded.mean``) while
``stale`` is well above it: the check can tell a sync that did not happen, or missed a tensor shared by
every token (a tied embedding, a kind of attention layer), from one that did.

``openrlhf: {sync_check: true}`` runs it at the end of a joint run, on the run's own stacks, after the
final model is saved (:class:`.driver.HacpoController`): the check's update changes the actors, never
the saved weights.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hacpo.agents.prompting import prompt_text
from hacpo.config import TrainConfig
from hacpo.data.synthetic import as_problem

from . import rows as R
from .controller import assign_prompt_ids

# The synced gap may exceed the loaded one by this much (nats, mean over response tokens): bf16 actors
# against vLLM's fp32 engines differ by rounding alone, about 1e-2 (docs/openrlhf.md, "Weight sync").
TOLERANCE = 0.03
STALE_FACTOR = 3.0  # an update must move the log-probs ≥ 3× the synced gap for the check to mean anything
CHECK_LR = 2e-4  # the check's one update, whatever the run's lr: large enough to move the log-probs
# ... for a LoRA agent, 10× (Schulman et al. 2025: LoRA's best lr is about 10× full fine-tuning's): a rank-r
# update moves the log-probs less than a full one at the same lr
LORA_LR_FACTOR = 10.0


def _sample_and_score(stack, texts, labels, n: int, seed: int):
    rows = stack.generate(texts, labels, n, seed=seed)
    pids = assign_prompt_ids(rows, texts, n)
    return rows, stack.score(rows), pids


def check_agent(stack, k: int, n_agents: int, problems, cfg: TrainConfig, seed: int = 0) -> dict:
    """The three gaps of one agent (module docstring) and whether the sync held."""
    problems = [as_problem(p) for p in problems]
    texts = [prompt_text(stack.tokenizer, p, cfg.prompt_style) for p in problems]
    labels = [p.answer for p in problems]
    n = cfg.group_size
    samples, scored, pids = _sample_and_score(stack, texts, labels, n, seed)
    loaded = R.engine_gap(scored)
    for i, row in enumerate(scored):  # ±1 advantages in every group: an update that moves the policy
        row.rewards = torch.full_like(row.rewards, float(i % 2), dtype=torch.float32)
    R.mark_own(scored, k, pids)
    R.assign_advantages(scored, k, n_agents, torch.ones(n_agents, n_agents), cfg.resolved_method())
    stack.set_lr(CHECK_LR * (LORA_LR_FACTOR if cfg.agent_adapter(k) is not None else 1.0))
    updates = stack.train(scored, 0)
    stale = R.engine_gap(stack.score(samples))
    stack.sync()
    synced = R.engine_gap(_sample_and_score(stack, texts, labels, n, seed + 1)[1])
    if not (loaded and stale and synced):
        raise RuntimeError(f"agent {stack.name}: vLLM returned no log-probs with its samples")
    key = "engine_logp_gap_mean"
    holds = synced[key] <= loaded[key] + TOLERANCE and stale[key] >= STALE_FACTOR * synced[key]
    grad_norm = max((u.get("grad_norm") or 0.0 for u in updates), default=0.0)  # the update moved the actor
    return {
        "loaded": loaded, "stale": stale, "synced": synced, "holds": holds, "updates": len(updates),
        "grad_norm": grad_norm, "tolerance": TOLERANCE, "stale_factor": STALE_FACTOR,
    }  # fmt: skip


def check_stacks(stacks, cfg: TrainConfig, out: str | Path) -> dict:
    """Every agent's check (:func:`check_agent`) on the run's first prompts, written to ``out``."""
    from hacpo.engines.core.schedule import read_problems
    from hacpo.runio import atomic_write_json

    problems = read_problems(cfg.train_file)[: cfg.prompts_per_step]
    report = {s.name: check_agent(s, k, len(stacks), problems, cfg) for k, s in enumerate(stacks)}
    atomic_write_json(out, report)
    return report
