"""One training step of any method, written once (spec §5); an engine supplies the agents' work through
:class:`StepEngine` (the local engine's tensors, or OpenRLHF's vLLM engines and DeepSpeed actors):

1. every agent samples G answers (× the method's rollout multiplier) for the same prompts, scored 0/1;
2. the capability window takes every agent's accuracy: p̂ and this step's ω (§3.1);
3. what must come before any update (OpenRLHF: every agent's old and reference log-probs on its own rows);
4. each learner's rows: its own, plus (joint methods) every other agent's in its token space, with
   capability-aware advantages;
5. the learners' updates one after another, then the new weights to the generation engines.

The step's ``metrics.jsonl`` row is built here only, under the names of :class:`hacpo.runio.Metric`, and
its ``updates.jsonl`` rows (:class:`hacpo.runio.Update`), one per learner's optimizer update.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from hacpo.algo import CapabilityTracker, LossSpec
from hacpo.engines.phases import Phases
from hacpo.runio import Metric

from .metrics import aggregate, update_record


@dataclass
class AgentRollouts:
    """One agent's samples of one step: what the step reads of them, and the engine's own rows."""

    rewards: torch.Tensor  # [N] 0/1, N = prompts × samples
    response_tokens: torch.Tensor  # [N] generated tokens per sample
    rows: object  # the engine's representation (local: tensors; OpenRLHF: Experience rows)


class StepEngine(Protocol):
    """What :func:`train_step` needs of an engine; agents are indices in the run's agent order."""

    def rollout(self, k: int, step: int, problems: Sequence, g: int) -> AgentRollouts:
        """Agent k's ``g`` samples per problem, scored (stages 1; the engine times its own phases)."""

    def before_updates(self, rolls: list[AgentRollouts]) -> None:
        """Whatever must see every agent's rollouts before any update (stage 3)."""

    def learner_rows(self, k: int, rolls: list[AgentRollouts], omegas: torch.Tensor, problems: Sequence):
        """Learner k's rows with their advantages (stage 4)."""

    def update(self, k: int, rows, step: int, problems: Sequence) -> list[dict[str, float]]:
        """Learner k's updates on ``rows`` (stage 5): each update's loss metrics (over all its parts:
        :func:`~.metrics.merge_parts`), with ``update`` = m, in order."""

    def sync(self) -> None:
        """The updated weights to the generation engines (a no-op where they are the same weights)."""

    def step_extras(self) -> dict[str, float]:
        """Engine-only fields of the row (e.g. the local engine's peak memory)."""


@dataclass
class StepResult:
    """What a step leaves in the run's logs: its ``metrics.jsonl`` row and ``updates.jsonl`` rows."""

    row: dict
    updates: list[dict]


def train_step(
    engine: StepEngine,
    agents: Sequence[str],
    step: int,
    problems: Sequence,
    *,
    samples: int,
    tracker: CapabilityTracker,
    phase: Phases,
    spec: LossSpec,
) -> StepResult:
    """Stages 1–5 for one step under the run's loss ``spec``; the step's log rows."""
    t0 = time.perf_counter()
    before = phase.snapshot()
    rolls = [engine.rollout(k, step, problems, samples) for k in range(len(agents))]
    p_hat = tracker.update([r.rewards for r in rolls])
    omegas = tracker.omegas()
    engine.before_updates(rolls)
    row: dict = {Metric.STEP: step}
    for k, name in enumerate(agents):
        row[Metric.of(name, Metric.REWARD)] = float(rolls[k].rewards.float().mean())
        row[Metric.of(name, Metric.P_HAT)] = float(p_hat[k])
        row[Metric.of(name, Metric.RESPONSE_TOKENS)] = float(rolls[k].response_tokens.float().mean())
    if len(agents) > 1:
        row[Metric.OMEGA] = omegas.tolist()
    with phase("retokenize"):
        rows = [engine.learner_rows(k, rolls, omegas, problems) for k in range(len(agents))]
    updates = []
    for k, name in enumerate(agents):
        with phase("update"):
            logs = engine.update(k, rows[k], step, problems)
        row.update({Metric.of(name, key): float(v) for key, v in aggregate(logs).items()})
        updates += [update_record(step, name, log, spec) for log in logs]
    with phase("sync"):
        engine.sync()
    spent = phase.since(before)
    row[Metric.STEP_S] = time.perf_counter() - t0
    generated = sum(float(r.response_tokens.float().sum()) for r in rolls)
    row[Metric.TOKENS_PER_S] = generated / max(spent.get("generate", 0.0), 1e-9)
    row.update(engine.step_extras())
    row.update({Metric.phase(name): t for name, t in spent.items()})
    return StepResult(row, updates)
