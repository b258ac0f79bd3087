"""A diverging run stops loudly, for both engines: a non-finite update never reaches the weights, is counted,
and a run of them stops the run before it writes a checkpoint.

- :func:`may_step`: whether an update's optimizer step may run (its loss and gradient norm finite); an engine
  that may not step skips it (gradients dropped, no optimizer step) and logs ``nonfinite/skipped`` = 1 for
  that update (``<agent>/nonfinite/skipped`` in ``metrics.jsonl``: the step's count);
- :class:`SkipGuard` (the run loop's): ``nonfinite_max_skips`` consecutive skipped updates of one agent stop
  the run with :class:`Diverged`, naming the step, the agent and the newest checkpoint to resume from;
- :func:`nonfinite_weights`: the parameters an engine checks before it writes a checkpoint, so no checkpoint
  on disk holds NaN/inf (:class:`NonFiniteWeights`, turned into :class:`Diverged` by the loop).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

from hacpo.runio import RunStopped, Update

SKIPPED = "nonfinite/skipped"  # an update's metric: 1.0 when its optimizer step was skipped, else 0.0
NONFINITE_LOGP = "nonfinite/logp"  # 1.0 on an update skipped because the learner's log-probs were not finite
COUNTS = (SKIPPED, NONFINITE_LOGP)  # a step's value is its updates' sum
FIX = (
    "lower `lr` (or `grad_clip`), or train in `precision: fp32`; a changed config needs a new out_dir, whose "
    "agents may start from these checkpoints"
)


class Diverged(RunStopped):
    """The run diverged: its updates kept producing non-finite losses or gradients, or its weights did."""


class NonFiniteWeights(RuntimeError):
    """An agent's parameters hold NaN/inf where a checkpoint was about to be written."""

    def __init__(self, agent: str, names: list[str]):
        self.agent, self.names = agent, names
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        super().__init__(f"{agent}'s weights hold NaN/inf ({shown})")


def may_step(loss: float | None = None, grad_norm: float | None = None) -> bool:
    """Whether an update's optimizer step may run: its loss and gradient norm are finite (a value the engine
    does not know, None, is no objection). A NaN or inf here would write NaN into the weights (AdamW's
    moments included), so the engine skips the step instead."""
    return all(v is None or math.isfinite(float(v)) for v in (loss, grad_norm))


def nonfinite_weights(named: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the parameters holding NaN/inf (one device sync for all of them)."""
    named = [(n, p) for n, p in named if p.numel()]
    if not named:
        return []
    ok = torch.stack([torch.isfinite(p.detach()).all() for _, p in named]).tolist()
    return [n for (n, _), good in zip(named, ok, strict=True) if not good]


class SkipGuard:
    """Counts each agent's consecutive skipped updates (``updates.jsonl`` rows whose ``skipped`` is true) and
    stops the run at ``limit`` of them; knows the newest checkpoint written (or resumed from).

    ``where(step)`` describes the step-``step`` checkpoint for the message (its folder)."""

    def __init__(self, limit: int, where: Callable[[int], str] | None = None):
        self.limit = limit
        self.where = where or (lambda step: f"step {step}")
        self.checkpoint: int | None = None  # the newest checkpoint step written or resumed from
        self._streak: dict[str, list[tuple[int, int]]] = {}  # agent → its current run of skipped (step, m)

    def resumed(self, start: int) -> None:
        self.checkpoint = start or None
        self._streak.clear()

    def saved(self, step: int) -> None:
        self.checkpoint = step

    def observe(self, step: int, updates: list[dict]) -> None:
        """Step ``step``'s update rows, in order: raises :class:`Diverged` once an agent's run of skipped
        updates reaches ``limit`` (the step's rows all counted first)."""
        hit: dict[str, list[tuple[int, int]]] = {}  # agent → its run of skips that reached the limit
        for row in updates:
            agent = row[Update.AGENT]
            if row.get(Update.SKIPPED):
                streak = self._streak.setdefault(agent, [])
                streak.append((int(row[Update.STEP]), int(row[Update.UPDATE])))
                if len(streak) >= self.limit:
                    hit.setdefault(agent, streak)
            else:
                self._streak.pop(agent, None)
        for agent, streak in hit.items():  # the first agent to reach it
            first = streak[0]
            raise Diverged(
                f"training diverged at step {step}: agent {agent!r} had {len(streak)} optimizer updates in a "
                f"row with a non-finite loss or gradient norm (NaN/inf), all skipped (the first at step "
                f"{first[0]}, update {first[1]}; nonfinite_max_skips: {self.limit}). Stopped before the "
                f"step-{step + 1} checkpoint, its weights still finite. {self.resume_hint()}"
            )

    def weights(self, step: int, error: NonFiniteWeights) -> Diverged:
        """The stop for weights found non-finite before the step-``step`` checkpoint."""
        return Diverged(
            f"training diverged by step {step}: {error}; the step-{step} checkpoint was not written. "
            f"{self.resume_hint()}"
        )

    def resume_hint(self) -> str:
        if self.checkpoint is None:
            return f"No checkpoint was written yet: start again with a fix: {FIX}."
        last = self.checkpoint
        return (
            f"The last finite checkpoint is step {last} ({self.where(last)}): a rerun of "
            f"this config resumes there (and, resumes being exact, diverges again the same way); to go on "
            f"from it, {FIX}."
        )
