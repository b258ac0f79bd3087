"""Live curves of a run for people watching it: TensorBoard scalars written by the run loop
(:class:`~hacpo.engines.core.loop.RunLoop`) beside the logs it owns, for both engines' joint runs and the
local engine's single-agent runs.

The jsonl logs stay the record (tables and figures read them); the event files are a view of them:

- each metrics row's numeric fields under their ``runio`` names (``small/reward``, ``small/s_hete_mean``,
  ``time/step_s``, …) at the row's step, and each validation row's accuracy as ``val/<agent>/acc`` at its
  step: the same tags on every engine;
- one event directory per run, ``<run>/tensorboard``, so ``tensorboard --logdir results/<config>/runs`` shows
  every run of a workflow side by side, named by its path (kind, pair or model, method, seed);
- a resumed run's logs are cut back to its checkpoint; the view is then rebuilt from what they keep (the
  directory replaced, every kept row written again), so the event files hold each step exactly once whatever
  a kill left behind.

W&B (``logging.wandb``) gets the same rows under the same names, one W&B step per training step (a step's
metrics row with the validation at that step), in one W&B run per run directory whose id is kept in
``<run>/wandb/hacpo-run-id``. A resumed run continues that W&B run:

- offline, its files (``<run>/wandb/offline-run-*``) are rebuilt like the event files: replaced by one run
  holding exactly the rows the logs keep, so ``wandb sync`` uploads each step once;
- online, W&B keeps what it received; the run resumes at the server's next step (``run.step``) and logs only
  later steps. Steps between the checkpoint and the kill are then the killed attempt's, which the resumed run
  recomputes to the same numbers (the loop's bitwise resume).

A fresh start (no row kept) opens a new W&B run.
"""

from __future__ import annotations

import json
import math
import secrets
import shutil
import struct
from pathlib import Path

from hacpo.runio import Metric, Validation, atomic_write_text

EVENTS_DIR = "tensorboard"
WANDB_DIR = "wandb"  # W&B's own folder under the dir it is given (the run directory)
WANDB_ID_FILE = "hacpo-run-id"


def validation_tag(agent: str) -> str:
    return f"val/{agent}/{Validation.ACC}"


NONFINITE_VALUES = "nonfinite/values"  # a row's count of NaN/inf fields, where it has any


def scalars(row: dict) -> dict[str, float]:
    """The numeric fields of a metrics row (not its step; not lists such as ω, nor missing values). A NaN or
    inf is kept as it is (a diverging run must show it) and counted: ``nonfinite/values``, in rows that
    have any."""
    out = {}
    for key, value in row.items():
        if key == Metric.STEP or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        out[key] = float(value)
    bad = sum(not math.isfinite(v) for v in out.values())
    if bad:
        out[NONFINITE_VALUES] = float(bad)
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

    def close(self, failed: bool = False) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def wandb_run_name(run_dir: str | Path) -> str:
    """A run's W&B name, as the workflow lays runs out: ``joint/<pair>/<method>/seed<k>``, ``single/…``."""
    return "/".join(Path(run_dir).resolve().parts[-4:])


def wandb_run_id(run_dir: str | Path, resume: bool, drop_offline: bool) -> str:
    """The W&B run id of a run starting now: the one kept in ``<run>/wandb/hacpo-run-id`` when it resumes,
    else a new one (a fresh start is a new W&B run). ``drop_offline`` removes earlier offline files first."""
    folder = Path(run_dir) / WANDB_DIR
    id_file = folder / WANDB_ID_FILE
    run_id = id_file.read_text().strip() if resume and id_file.is_file() else secrets.token_hex(6)
    if drop_offline:
        for old in folder.glob("offline-run-*"):
            shutil.rmtree(old, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(id_file, run_id + "\n")
    return run_id


class WandbView:
    """The run's W&B run (:class:`~hacpo.config.WandbLogging`); the same calls as :class:`TensorBoardView`."""

    def __init__(self, run_dir: str | Path, settings, config: dict | None = None):
        self.run_dir = Path(run_dir)
        self.settings = settings
        self.config = config or {}
        self._run = None
        self._first = 0  # steps below it are already in the W&B run (online resume)
        self._pending: dict[int, dict[str, float]] = {}  # step → values not yet logged

    def rebuild(self, metrics: list[dict], validation: list[dict]) -> None:
        import wandb

        self.close()
        offline = self.settings.mode == "offline"
        # offline, the files will hold exactly the kept rows: every earlier attempt's go
        run_id = wandb_run_id(self.run_dir, resume=bool(metrics or validation), drop_offline=offline)
        self._run = wandb.init(
            project=self.settings.project,
            group=self.settings.group,
            entity=self.settings.entity,
            name=wandb_run_name(self.run_dir),
            id=run_id,
            dir=str(self.run_dir),
            mode=self.settings.mode,
            resume="allow",
            reinit="create_new",
            config=self.config,
            settings=wandb.Settings(silent=True, console="off", disable_git=True, save_code=False),
        )
        self._first = 0 if offline else self._run.step
        self._pending.clear()
        for row in validation:
            self.validation(row)
        for row in metrics:
            self.metrics(row)

    def metrics(self, row: dict) -> None:
        step = int(row[Metric.STEP])
        self._pending.setdefault(step, {}).update(scalars(row))
        self._log_through(step)

    def validation(self, row: dict) -> None:
        # held until its step's metrics row (W&B steps only increase; the validation at s + 1 comes first)
        values = self._pending.setdefault(int(row[Validation.STEP]), {})
        values[validation_tag(row[Validation.AGENT])] = float(row[Validation.ACC])

    def _log_through(self, last: int | None) -> None:
        for step in sorted(s for s in self._pending if last is None or s <= last):
            values = self._pending.pop(step)
            if step >= self._first:
                self._run.log(values, step=step)

    def close(self, failed: bool = False) -> None:
        if self._run is not None:
            self._log_through(None)
            self._run.finish(exit_code=1 if failed else 0)
            self._run = None
            import wandb

            if wandb.run is None:  # finish returns before wandb's service has written everything: wait for it
                wandb.teardown()  # (unless the process has a run of its own, which teardown would finish)


def read_wandb_history(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every numeric key's (step, value) pairs of a run's offline W&B files
    (``<run>/wandb/offline-run-*/*.wandb``), in the order written; W&B's own ``_step``/``_runtime``/
    ``_timestamp`` and media (OpenRLHF's sample tables) left out.

    wandb 0.31 reads these files only in its Go core, so this is the file format as wandb writes it: a
    LevelDB-style log (7-byte file header ``:W&B``, 0xBEE1, version 0; 32 KiB blocks of records with a 7-byte
    header: CRC, length, type full/first/middle/last) of ``wandb_internal_pb2.Record`` protobufs."""
    from wandb.proto import wandb_internal_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(Path(run_dir, WANDB_DIR).glob("offline-run-*/run-*.wandb")):
        for record in _leveldb_records(path.read_bytes(), path):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(record)
            if rec.WhichOneof("record_type") != "history":
                continue
            for item in rec.history.item:
                key = item.key or "/".join(item.nested_key)
                value = json.loads(item.value_json)
                if not key.startswith("_") and isinstance(value, int | float) and not isinstance(value, bool):
                    out.setdefault(key, []).append((int(rec.history.step.num), float(value)))
    return out


def _leveldb_records(data: bytes, path: Path):
    block, header = 32768, 7
    if data[:header] != struct.pack("<4sHB", b":W&B", 0xBEE1, 0):
        raise ValueError(f"{path}: not a W&B run file (no :W&B header)")
    pos, parts = header, b""
    while pos + header <= len(data):
        left = block - pos % block
        if left < header:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + header])
        if kind == 0:  # zero padding at a block's end (or a file cut short by a kill)
            pos += left
            continue
        parts += data[pos + header : pos + header + length]
        pos += header + length
        if kind in (1, 4):  # full, or the last fragment
            yield parts
            parts = b""


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
