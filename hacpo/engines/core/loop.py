"""The run loop of every joint and local run, written once (the local trainer and the OpenRLHF controller
both drive their steps through it): the step schedule, the validation points, checkpoints, and the logs'
resume contract.

- Validation runs before training (step 0), every ``val_every`` steps and after the last step
  (:meth:`TrainConfig.validation_due`); one ``validation.jsonl`` row per agent: ``step, agent, acc, n``.
- Step ``s``'s ``updates.jsonl`` rows (one per learner's update) and ``metrics.jsonl`` row are appended
  after the validation at ``s + 1`` (the row carries that validation's time, ``time/validate_s``, and the
  step-0 validation's in the first row), then the checkpoint at ``s + 1`` if due.
- So a checkpoint at ``s`` exists only after metrics and update rows ``< s`` and validation rows ``≤ s``: a
  run resumed at ``s`` cuts the logs back to exactly those and re-runs the validation at ``s`` if it is due
  and a kill lost part of it (greedy decoding: no random state is used, so the resumed run stays bitwise).

- After each step's rows, and before its checkpoint, the :class:`~.nonfinite.SkipGuard` stops a diverging
  run: ``nonfinite_max_skips`` skipped (non-finite) updates of one agent in a row, or weights found
  non-finite as a checkpoint is written, raise :class:`~.nonfinite.Diverged` naming the step, the agent and
  the last checkpoint written. Every checkpoint on disk is of finite weights.

Where a run resumes from (the newest step every agent checkpointed) is the engine's to say.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hacpo.config import TrainConfig
from hacpo.runio import Metric, MetricsLog, Validation

from .nonfinite import NonFiniteWeights, SkipGuard
from .step import StepResult
from .trackers import TensorBoardView, WandbView

Validate = Callable[[int], Sequence[float]]  # step → greedy accuracy of every agent, in agent order


@dataclass
class RunLoop:
    """The loop of one run; it owns the run directory's ``metrics.jsonl``, ``updates.jsonl`` and
    ``validation.jsonl``."""

    cfg: TrainConfig
    agents: Sequence[str]
    val_size: int  # validation problems (0: no validation)
    metrics: MetricsLog = field(init=False)
    validation: MetricsLog = field(init=False)
    updates: MetricsLog = field(init=False)
    views: list[TensorBoardView | WandbView] = field(init=False)  # live curves of the metrics, validation
    # describes the step-N checkpoint in a divergence's message (the local engine: its folders)
    checkpoint_of: Callable[[int], str] | None = None
    guard: SkipGuard = field(init=False)  # a run of skipped (non-finite) updates stops the run

    def __post_init__(self) -> None:
        out = Path(self.cfg.out_dir)
        self.metrics = MetricsLog(out / "metrics.jsonl")
        self.validation = MetricsLog(out / "validation.jsonl")
        self.updates = MetricsLog(out / "updates.jsonl")
        logging = self.cfg.logging
        self.views = [TensorBoardView(out)] if logging.tensorboard else []
        if logging.wandb is not None:
            spec = {**self.cfg.run_spec(), "config_hash": self.cfg.config_hash()}
            self.views.append(WandbView(out, logging.wandb, spec))
        self._validate_s = 0.0  # validation time not yet counted in a metrics row
        where = self.checkpoint_of or (lambda step: f"step {step} in {out}")
        self.guard = SkipGuard(self.cfg.nonfinite_max_skips, where)

    def due(self, done: int) -> bool:
        return self.val_size > 0 and self.cfg.validation_due(done)

    def resume(self, start: int, validate: Validate) -> None:
        """Cut the logs back to a run starting at ``start`` (0: a fresh run) and validate at ``start`` where
        that is due and not already complete in the log."""
        self.guard.resumed(start)
        self.metrics.truncate_to(start)
        self.updates.truncate_to(start)
        self.validation.truncate_to(start + 1 if start else 0)
        rows = self.validation.read()
        validated = {r[Validation.AGENT] for r in rows if r.get(Validation.STEP) == start}
        again = self.due(start) and (start == 0 or validated != set(self.agents))
        if again:
            self.validation.truncate_to(start)
        if self.views:  # the curves: exactly the rows the logs keep, each step once
            kept_metrics, kept_validation = self.metrics.read(), self.validation.read()
            for view in self.views:
                view.rebuild(kept_metrics, kept_validation)
        if again:
            try:
                self.validate(start, validate)
            except BaseException:
                self.close(failed=True)  # no W&B run left open behind a failed start
                raise

    def validate(self, step: int, validate: Validate) -> None:
        t0 = time.perf_counter()
        accs = list(validate(step))
        if len(accs) != len(self.agents):
            raise ValueError(f"validation gave {len(accs)} accuracies for agents {list(self.agents)}")
        for agent, acc in zip(self.agents, accs, strict=True):
            self.validation.append(row := Validation.row(step, agent, acc, self.val_size))
            for view in self.views:
                view.validation(row)
        self._validate_s += time.perf_counter() - t0

    def run(
        self,
        start: int,
        train_step: Callable[[int], StepResult],
        validate: Validate,
        save_checkpoint: Callable[[int], None],
        on_row: Callable[[dict], None] | None = None,
    ) -> None:
        """Steps ``start … steps − 1``: each step's row, the validation and checkpoint after it when due."""
        try:
            for step in range(start, self.cfg.steps):
                result = train_step(step)
                row, done = result.row, step + 1
                if self.due(done):
                    self.validate(done, validate)
                row[Metric.VALIDATE_S], self._validate_s = self._validate_s, 0.0
                self.updates.extend(result.updates)  # first: a metrics row implies its update rows
                self.metrics.append(row)
                for view in self.views:
                    view.metrics(row)
                if on_row is not None:
                    on_row(row)
                self.guard.observe(step, result.updates)  # after the row (its skips), before the checkpoint
                if self.cfg.checkpoint_due(done):
                    try:  # an engine checks its weights are finite before it writes any
                        save_checkpoint(done)
                    except NonFiniteWeights as e:
                        raise self.guard.weights(done, e) from e
                    self.guard.saved(done)
        except BaseException:
            self.close(failed=True)
            raise
        self.close()

    def close(self, failed: bool = False) -> None:
        """Flush and close the live views (a W&B run ends as failed when the loop raised)."""
        for view in self.views:
            view.close(failed=failed)
