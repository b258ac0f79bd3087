"""The run-directory contract shared by both engines (design.md): atomic writes, metrics.jsonl, checkpoints.

```
run_dir/run.json                         RunRecord: status, resumable step, config (+ hash), versions, machine
run_dir/metrics.jsonl                    one JSON object per training step (same schema for every engine)
run_dir/updates.jsonl                    one JSON object per learner's optimizer update (Update)
run_dir/profile.json                     per-phase wall time, tokens/s, peak memory
run_dir/checkpoints/<agent>/step-N/      Hugging Face format or a LoRA adapter (+ trainer_state.pt for resume,
                                         hacpo-checkpoint.json: what it holds, written last, checked by
                                         hacpo.checkpoints before a resume)
run_dir/weights-released.json            the run's weights removed once its evaluations were written
                                         (hacpo.checkpoints.release_weights; the workflow's `retention:`)
```
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import ClassVar, Literal

from hacpo.provenance import machine, machine_type


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory, fsync and ``os.replace``: readers
    see the old file or the new one, never a half-written one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """:func:`atomic_write_bytes` of UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks (dataset manifests)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _quick_digest(path: Path, edge: int = 1 << 20) -> str:
    """sha256 of a file's size, first and last ``edge`` bytes: weights of any size in milliseconds."""
    h = hashlib.sha256(str(path.stat().st_size).encode())
    with open(path, "rb") as f:
        h.update(f.read(edge))
        if path.stat().st_size > 2 * edge:
            f.seek(-edge, os.SEEK_END)
        h.update(f.read(edge))
    return h.hexdigest()


def input_fingerprint(data_files: Iterable[str | None], model_dirs: Iterable[str]) -> dict[str, str]:
    """What a run read, by content: data files whole, a model directory by its files' names, sizes and (its
    ``*.json``, tokenizer files) contents or (weights) first and last MiB. A complete run is reused only
    while this is unchanged: a rebuilt agent or regenerated data with new content trains again, the same
    content rewritten does not."""
    out = {}
    for f in data_files:
        if f:
            out[f] = sha256_file(f)
    for d in model_dirs:
        h = hashlib.sha256()
        for p in sorted(q for q in Path(d).rglob("*") if q.is_file()):
            h.update(str(p.relative_to(d)).encode())
            small = p.suffix in (".json", ".txt", ".model", ".jinja") or p.stat().st_size <= 1 << 20
            h.update((sha256_file(p) if small else _quick_digest(p)).encode())
        out[d] = h.hexdigest()
    return out


def json_arg(text: str, what: str = "--spec") -> dict:
    """A JSON object given inline or as ``@path`` (command-line arguments of the workflow's rules)."""
    src = what
    if text.startswith("@"):
        path = Path(text[1:])
        if not path.is_file():
            raise ValueError(f"{what}: file {str(path)!r} does not exist")
        src, text = str(path), path.read_text()
    return _json_object(text, src)


def _json_object(text: str, where: str) -> dict:
    """``text`` parsed as a JSON object; errors start with ``where``."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not valid JSON ({err})") from err
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return obj


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Rows of a JSONL file, plain or gzip (told by its magic bytes, not its name); blank lines skipped.

    Every line must be a JSON object; errors name the file and line (``path:n: …``).
    """
    return [row for _, row in read_jsonl_lines(path)]


def read_jsonl_lines(path: str | os.PathLike) -> list[tuple[int, dict]]:
    """:func:`read_jsonl`'s rows with their line numbers in the file (1-based, blank lines counted)."""
    path = Path(path)
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    opener = gzip.open if gz else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [(n, _json_object(line, f"{path}:{n}")) for n, line in enumerate(f, 1) if line.strip()]


def atomic_write_json(path: str | Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | Path):
    with open(path) as f:
        return json.load(f)


def atomic_dir(final: str | Path):
    """Context manager yielding a temp sibling directory that replaces ``final`` on success."""
    return _AtomicDir(Path(final))


class _AtomicDir:
    def __init__(self, final: Path):
        self.final = final

    def __enter__(self) -> Path:
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(dir=self.final.parent, prefix=f".{self.final.name}.", suffix=".tmp"))
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        if self.final.exists():  # unique name: concurrent writers of the same directory never collide
            old = Path(tempfile.mkdtemp(dir=self.final.parent, prefix=f".{self.final.name}.", suffix=".old"))
            os.rmdir(old)
            os.replace(self.final, old)
            os.replace(self.tmp, self.final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(self.tmp, self.final)
        return False


def sweep_temporaries(root: str | Path) -> int:
    """Remove what interrupted atomic writes left below ``root`` (the hidden ``.<name>.*.tmp`` / ``.old``
    siblings of :func:`atomic_write_bytes` and :func:`atomic_dir`); returns how many were removed. Call it
    only while holding :func:`run_lock`: a live writer's temporaries look the same."""
    found = [p for p in Path(root).rglob(".*") if p.name.endswith((".tmp", ".old"))]
    for p in found:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return len(found)


@contextlib.contextmanager
def _flock(path: Path, flags: int):
    """Hold the file ``path`` under ``fcntl.flock(flags)``; the kernel drops it when the holder dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, flags)
        try:
            yield path
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def waiting_lock(path: str | Path):
    """Hold the file ``path`` exclusively, waiting for any other holder: for writers of a shared cache, so
    that a second writer finds the first one's entry complete instead of replacing it under its readers."""
    return _flock(Path(path), fcntl.LOCK_EX)


@contextlib.contextmanager
def run_lock(run_dir: str | Path):
    """Hold ``run_dir/.lock`` exclusively (flock): a second process training the same run directory fails at
    once instead of interleaving writes. The kernel drops the lock when the holder dies, even by SIGKILL."""
    run_dir = Path(run_dir)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(_flock(run_dir / ".lock", fcntl.LOCK_EX | fcntl.LOCK_NB))
        except BlockingIOError:
            raise ValueError(
                f"{run_dir} is being written by another process (it holds {run_dir / '.lock'}); "
                "wait for it or stop it"
            ) from None
        yield run_dir


class RunStopped(RuntimeError):
    """An engine stopped a run for a reason its message names, with what to do next (the CLI prints it as one
    line); ``run.json`` then says ``failed``, and the run is resumable from its newest checkpoint."""


WEIGHTS_RELEASED = "weights-released.json"  # written first when a run's weights go (hacpo.checkpoints)


def weights_released(run_dir: str | Path) -> str | None:
    """Why ``run_dir`` has no weights to evaluate when the workflow's retention removed them (its
    :data:`WEIGHTS_RELEASED` note), with how to get them back; None when it was not released."""
    if not (Path(run_dir) / WEIGHTS_RELEASED).is_file():
        return None
    return (
        f"{run_dir}: its weights were removed once its evaluations were written (the workflow config's "
        "`retention: {weights: after_eval}`), and an evaluation (new, or changed in the config) needs them. "
        f"To get them back, set `retention: {{weights: keep}}` in the config, delete {run_dir} and rerun the "
        "workflow: it trains the run again from the same spec and evaluates it (docs/guide/watching.md, "
        '"Disk")'
    )


@dataclass
class RunRecord:
    """``run.json``: what a run is and where it stands. Engines write it (atomically) after every checkpoint
    and at the end; the CLI, evaluation and the workflow read it only through this type.

    ``step`` is the newest step every agent has a checkpoint of (resumable); ``status`` turns ``complete``
    once the final checkpoints and ``profile.json`` are written, and only then ``final_checkpoints`` (agent
    → checkpoint directory) and ``profile`` are filled. ``details`` holds what an engine records beside the
    contract (resolved method and loss knobs, device, ...), for people, not for code.
    """

    status: Literal["running", "failed", "complete"]  # failed: the engine stopped with an error; resumable
    step: int
    config_hash: str
    config: dict
    engine: str
    versions: dict[str, str] = field(default_factory=dict)
    final_checkpoints: dict[str, str] = field(default_factory=dict)
    profile: dict | None = None
    details: dict = field(default_factory=dict)
    machine: dict = field(default_factory=dict)  # :func:`machine`: the type of machine that trained it

    FILE: ClassVar[str] = "run.json"

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    @classmethod
    def read(cls, run_dir: str | Path) -> RunRecord | None:
        """The record of ``run_dir``, or None when the run never started; errors name the file."""
        path = Path(run_dir) / cls.FILE
        if not path.is_file():
            return None
        data, known = _record_fields(cls, path, "not a run record ({}); was it written by hacpo?")
        return cls(
            **{k: v for k, v in data.items() if k in known and k != "details"},
            details={**data.get("details", {}), **{k: v for k, v in data.items() if k not in known}},
        )

    @classmethod
    def for_config(cls, run_dir: str | Path, config_hash: str) -> RunRecord | None:
        """The record of ``run_dir`` for a run of ``config_hash`` (None: never started); a run of another
        config there is refused, so an engine never resumes or returns someone else's run."""
        prev = cls.read(run_dir)
        if prev is not None and prev.config_hash != config_hash:
            raise ValueError(
                f"{run_dir} holds a run with a different config; choose another out_dir or delete it"
            )
        recorded = prev.machine if prev is not None else None  # runs before this field: no check
        if recorded and machine_type(recorded) != machine_type(here := machine()):
            raise ValueError(
                f"{run_dir} holds a run of another machine type ({machine_type(recorded)}; this one is "
                f"{machine_type(here)}): a run's numbers are specific to its machine's kernels, so it is "
                "never resumed or replaced elsewhere. Give each machine its own results folder and combine "
                "them with `results_from:` (docs/statistics.md)"
            )
        return prev

    def write(self, run_dir: str | Path) -> None:
        atomic_write_json(Path(run_dir) / self.FILE, asdict(self))

    def final_checkpoint(self, agent: str, run_dir: str | Path = "") -> str:
        """The final checkpoint directory of ``agent``; a clear error if the run is unfinished or lacks it."""
        where = Path(run_dir) / self.FILE
        if not self.complete:
            raise ValueError(f"{where}: run is {self.status!r}, not complete; finish training first")
        if agent not in self.final_checkpoints:
            raise ValueError(
                f"{where}: no final checkpoint for agent {agent!r}; agents: {sorted(self.final_checkpoints)}"
            )
        checkpoint = self.final_checkpoints[agent]
        if released := weights_released(run_dir or "."):
            raise FileNotFoundError(released)
        if not Path(checkpoint).is_dir():
            raise FileNotFoundError(
                f"{where}: the final checkpoint of {agent!r}, {checkpoint}, is not here (the run came "
                f"without its weights, from a results pack, or they were deleted); delete "
                f"{run_dir or 'the run directory'} and rerun the workflow to train it again"
            )
        return checkpoint


@dataclass
class Profile:
    """``profile.json`` (and ``run.json``'s ``profile``): what a complete run cost, one shape for every
    engine. Tables 7–8 and ``hacpo profiles`` read it only through this type.

    ``peak_rss_mb``: host memory of the run's processes at their busiest (the local engine's process; on
    OpenRLHF the sum over the job's Ray processes); ``peak_gpu_mem_mb`` / ``gpu_total_mb``: the busiest
    device, None without a GPU; ``tokens_per_s``: generated tokens per second of generation. ``details``
    holds what only one engine measures (phase peaks, precision, per-device and per-process peaks, notes).
    """

    engine: str
    wall_s: float
    steps: int
    phase_s: dict[str, float]
    generated_tokens: float
    tokens_per_s: float
    peak_rss_mb: float
    peak_gpu_mem_mb: float | None = None
    gpu_total_mb: float | None = None
    details: dict = field(default_factory=dict)

    FILE: ClassVar[str] = "profile.json"

    def write(self, run_dir: str | Path) -> dict:
        data = asdict(self)
        atomic_write_json(Path(run_dir) / self.FILE, data)
        return data

    @classmethod
    def read(cls, run_dir: str | Path) -> Profile:
        path = Path(run_dir) / cls.FILE
        data, known = _record_fields(cls, path, "not a hacpo profile ({}); rerun the training job")
        return cls(**{k: v for k, v in data.items() if k in known})


def _record_fields(cls, path: Path, problem: str) -> tuple[dict, set[str]]:
    """A dataclass record's JSON object from ``path`` and the class's field names; a file lacking a
    required field is refused with ``problem`` (``{}``: the missing fields) after its path."""
    data = _json_object(path.read_text(), str(path))
    required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
    missing = sorted(required - data.keys())
    if missing:
        raise ValueError(f"{path}: " + problem.format(f"missing {missing}"))
    return data, {f.name for f in fields(cls)}


class Metric:
    """The names of ``metrics.jsonl`` fields, declared once: the engines write them
    (:func:`hacpo.engines.core.step.train_step`), tables and figures read them."""

    STEP = "step"
    REWARD = "reward"  # per agent: mean 0/1 reward of its samples
    P_HAT = "p_hat"  # per agent: the capability window's accuracy (§3.1)
    RESPONSE_TOKENS = "response_tokens"  # per agent: mean generated tokens per sample
    OMEGA = "omega"  # [n, n] capability discrepancy coefficients of the step
    # ... and per agent, the loss's own metrics under their names in hacpo.algo.losses (e.g. s_homo_mean)
    STEP_S = "time/step_s"
    TOKENS_PER_S = "time/tokens_per_s"
    VALIDATE_S = "time/validate_s"

    @staticmethod
    def of(agent: str, name: str) -> str:
        """A per-agent field: ``<agent>/<name>``."""
        return f"{agent}/{name}"

    @staticmethod
    def phase(name: str) -> str:
        """Seconds the step spent in a phase (:class:`hacpo.engines.phases.Phases`)."""
        return f"time/{name}_s"


class Validation:
    """The fields of a ``validation.jsonl`` row (one per agent and validation point), declared once."""

    STEP, AGENT, ACC, N = "step", "agent", "acc", "n"  # greedy accuracy of `agent` on n problems

    @staticmethod
    def row(step: int, agent: str, acc: float, n: int) -> dict:
        return {Validation.STEP: step, Validation.AGENT: agent, Validation.ACC: float(acc), Validation.N: n}


class Update:
    """The fields of an ``updates.jsonl`` row: one per optimizer update of one learner, written by
    :func:`hacpo.engines.core.metrics.update_record`; the figure of cross rows inside the clip reads them."""

    STEP, AGENT, UPDATE = "step", "agent", "update"  # the run's step, the learner's name, m within the step
    OWN_ROWS, CROSS_ROWS = "own_rows", "cross_rows"
    CROSS_LO = "cross_lo"  # lo_m of the stepwise clip (§3.5); None for losses without it
    CROSS_IN_BOUNDS = "cross_in_bounds_frac"  # cross rows with s in [lo_m, 1]: those that can carry gradient
    OWN_CLIP, CROSS_CLIP = "own_clip_frac", "cross_clip_frac"  # rows whose clip is active (flat)
    KL_TERM = "kl_term"  # whether the update had a KL term (it needs own rows)
    SKIPPED = "skipped"  # its optimizer step was skipped: a non-finite loss or gradient norm (never applied)

    @staticmethod
    def row(step: int, agent: str, update: int, **fields) -> dict:
        return {Update.STEP: step, Update.AGENT: agent, Update.UPDATE: update, **fields}


class MetricsLog:
    """Append-only ``metrics.jsonl``; each line is flushed and fsynced so a kill loses at most one line."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        rows = []
        with open(self.path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:  # a torn last line from a kill
                    break
        return rows

    def truncate_to(self, step: int) -> None:
        """Keep only the rows of steps < ``step`` (resume from a checkpoint taken after ``step`` steps)."""
        rows = [r for r in self.read() if r.get("step", -1) < step]
        atomic_write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))

    def append(self, row: dict) -> None:
        self.extend([row])

    def extend(self, rows: Iterable[dict]) -> None:
        """Append ``rows`` in one write, flushed and fsynced."""
        text = "".join(json.dumps(row, sort_keys=True, default=float) + "\n" for row in rows)
        if not text:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def rename_to_free(path: str | Path, name_of, into: str | Path | None = None) -> Path:
    """Rename ``path`` to the first ``name_of(n)``, n = 1, 2, …, that does not exist, beside it or in
    ``into``; the new path."""
    path, n = Path(path), 1
    where = Path(into) if into is not None else path.parent
    while (where / name_of(n)).exists():
        n += 1
    return path.rename(where / name_of(n))


# names moved out in 0.2.0, kept here for one release: name → its module now
_MOVED = dict.fromkeys(
    ["CHECKPOINT_MANIFEST", "write_checkpoint_manifest", "keep_final_weights", "checkpoint_problem",
     "set_aside", "newest_intact_step", "intact_resume_step", "checkpoint_steps"],
    "hacpo.checkpoints",
) | dict.fromkeys(["versions", "KERNEL_FLAGS"], "hacpo.provenance")  # fmt: skip


def __getattr__(name: str):
    if name in _MOVED:
        import warnings

        from hacpo import checkpoints, provenance

        where = _MOVED[name]
        warnings.warn(f"hacpo.runio.{name} is now {where}.{name}", DeprecationWarning, stacklevel=2)
        return getattr(checkpoints if where == "hacpo.checkpoints" else provenance, name)
    raise AttributeError(f"module 'hacpo.runio' has no attribute {name!r}")
