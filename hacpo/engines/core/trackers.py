"""Live curves of a run for people watching it (issue 31): TensorBoard scalars written by the run loop
(:class:`~hacpo.engines.core.loop.RunLoop`) beside the logs it owns, for both engines' joint runs and the
local engine's single-agent runs.

The jsonl logs stay the record (tables and figures read them); the event files are a view of them:

- each metrics row's numeric fields under their ``runio`` names (``small/reward``, ``small/s_hete_mean``,
  ``time/step_s``, …) at the row's step, and each validation row's accuracy as ``val/<agent>/acc`` at its
  step: the same tags on every engine;
- one event directory per run, ``<run>/tensorboard``, so ``tensorboard --logdir results/runs`` shows every
  run of a workflow side by side, named by its path (kind, pair or model, method, seed);
- a resumed run's logs are cut back to its checkpoint; the view is then rebuilt from what they keep (the
  directory replaced, every kept row written again), so the event files hold each step exactly once whatever
  a kill left behind.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

from hacpo.runio import Metric, Validation

EVENTS_DIR = "tensorboard"


def validation_tag(agent: str) -> str:
    return f"val/{agent}/{Validation.ACC}"


def scalars(row: dict) -> dict[str, float]:
    """The numeric fields of a metrics row (not its step; not lists such as ω, nor missing values)."""
    out = {}
    for key, value in row.items():
        if key == Metric.STEP or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


class TensorBoardView:
    """The run's event directory; ``writer`` is torch's :class:`~torch.utils.tensorboard.SummaryWriter`."""

    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir) / EVENTS_DIR
        self._writer = None

    @property
    def writer(self):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

            self._writer = SummaryWriter(log_dir=str(self.dir), flush_secs=30)
        return self._writer

    def rebuild(self, metrics: list[dict], validation: list[dict]) -> None:
        """Replace the event directory by one holding exactly these rows (a fresh or resumed run)."""
        self.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        for row in validation:
            self.validation(row, flush=False)
        for row in metrics:
            self.metrics(row, flush=False)
        if metrics or validation:
            self.writer.flush()

    def metrics(self, row: dict, flush: bool = True) -> None:
        step = int(row[Metric.STEP])
        for tag, value in scalars(row).items():
            self.writer.add_scalar(tag, value, step)
        if flush:
            self.writer.flush()

    def validation(self, row: dict, flush: bool = True) -> None:
        acc = row[Validation.ACC]
        self.writer.add_scalar(validation_tag(row[Validation.AGENT]), float(acc), int(row[Validation.STEP]))
        if flush:
            self.writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every tag's (step, value) pairs of a run's event directory, read with TensorBoard's own reader, in
    the order written (each event file in turn)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted((Path(run_dir) / EVENTS_DIR).glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.HasField("tensor"):
                    from tensorboard.util import tensor_util

                    number = float(tensor_util.make_ndarray(value.tensor))
                else:
                    number = float(value.simple_value)
                out.setdefault(value.tag, []).append((int(event.step), number))
    return out
