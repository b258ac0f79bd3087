"""Fault injection for the kill tests: run ``hacpo <args>`` and SIGKILL the process at a named point.

    python tests/faults.py KILL_SPEC COUNTS_FILE -- train run.json
    python tests/faults.py none     counts.json -- evaluate --source ... --settings ... --out ...

``KILL_SPEC`` is ``POINT:N`` (die at the N-th time the process reaches POINT), ``timer:SECONDS`` (die after
a wall-clock delay, wherever the process is), or ``none`` (run to the end). ``COUNTS_FILE`` receives how often
each point was reached (written at exit, so only a run that was not killed writes it): the test draws its
random kill points from the counts of an uninterrupted run. Before dying at ``score`` the scorer's worker
pids are written to ``COUNTS_FILE.orphans`` so the test can check that they exit once their parent is gone.

A kill is ``SIGKILL`` sent to the process itself: no ``finally``, no ``atexit``, no flush, exactly as the OOM
killer or ``scancel`` would end it. Points that write (``metrics``, ``validation``, ``run_json``,
``eval_write``) first write half of what they were given, so the kill leaves a torn line or a partial temp
file behind.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
from collections import Counter
from pathlib import Path

# Where each point sits (all reached by the local engine's `hacpo train`, by `hacpo eval` or, the last, by
# `hacpo release-weights`):
POINTS = {
    "generate": "after a rollout's generation, before its scoring",
    "score": "half-way through scoring a step's rollouts (pool workers busy)",
    "update": "before a mini-batch's loss: some of a step's optimizer updates done, some not",
    "metrics": "half of a metrics.jsonl line appended",
    "validate": "after one agent's greedy validation, before its row is appended",
    "validation": "half of a validation.jsonl line appended",
    "checkpoint": "inside an agent's checkpoint: weights written, trainer state not",
    "run_json": "half of run.json's temp file written, before the rename",
    "prune": "after run.json records a checkpoint, before older checkpoints are pruned",
    "eval_generate": "after an evaluation's generation for one benchmark, before scoring",
    "eval_write": "half of a benchmark's samples file written, before the rename",
    "release": "half the files of a run's weights removed by `hacpo release-weights`, the rest not",
}

reached: Counter[str] = Counter()


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def install(point: str | None, nth: int, orphans: Path) -> None:
    """Wrap each point's function; the N-th time ``point`` is reached, the process dies there."""
    import hacpo.engines.local.trainer as trainer
    import hacpo.eval.local as eval_local
    from hacpo import checkpoints, reward, runio

    def hit(name: str) -> bool:
        reached[name] += 1
        return name == point and reached[name] == nth

    def wrap(owner, attr: str, name: str, *, before: bool = False):
        real = getattr(owner, attr)

        def wrapped(*args, **kwargs):
            if before and hit(name):
                die()
            out = real(*args, **kwargs)
            if not before and hit(name):
                die()
            return out

        setattr(owner, attr, wrapped)

    wrap(trainer, "generate", "generate")
    wrap(trainer, "greedy_accuracy", "validate")
    wrap(trainer.LocalTrainer, "_minibatch_loss", "update", before=True)
    wrap(trainer.LocalTrainer, "_prune_checkpoints", "prune", before=True)
    wrap(eval_local.LocalGenerator, "generate", "eval_generate")

    wrap(trainer.torch, "save", "checkpoint", before=True)  # the trainer's only torch.save: trainer_state.pt

    real_score = reward.Scorer.score

    def score(self, responses, golds, *rest):
        if hit("score"):
            half = len(responses) // 2
            real_score(self, responses[:half], golds[:half])
            pool = self._pool
            pids = [w.proc.pid for w in pool._workers] if pool is not None else []
            orphans.write_text(json.dumps(pids))
            die()
        return real_score(self, responses, golds, *rest)

    reward.Scorer.score = score

    real_append = runio.MetricsLog.append

    def append(self, row):
        name = {"metrics.jsonl": "metrics", "validation.jsonl": "validation"}.get(self.path.name)
        if name and hit(name):
            line = json.dumps(row, sort_keys=True, default=float) + "\n"
            with open(self.path, "a") as f:
                f.write(line[: len(line) // 2])
                f.flush()
                os.fsync(f.fileno())
            die()
        return real_append(self, row)

    runio.MetricsLog.append = append

    real_write = runio.atomic_write_bytes

    def atomic_write_bytes(path, data):
        path = Path(path)
        name = {"run.json": "run_json"}.get(path.name)
        if path.name.endswith(".samples.jsonl"):
            name = "eval_write"
        if name and hit(name):
            tmp = path.parent / f".{path.name}.killed.tmp"  # the shape atomic_write_bytes gives its temp file
            tmp.write_bytes(data[: len(data) // 2])
            die()
        return real_write(path, data)

    runio.atomic_write_bytes = atomic_write_bytes

    real_remove = checkpoints._remove

    def remove(folder: Path) -> None:
        if hit("release"):
            files = sorted(f for f in Path(folder).rglob("*") if f.is_file())
            for f in files[: len(files) // 2]:
                f.unlink()
            die()
        real_remove(folder)

    checkpoints._remove = remove


def main(argv: list[str]) -> int:
    spec, counts_file, sep, *hacpo_args = argv
    assert sep == "--", "usage: faults.py KILL_SPEC COUNTS_FILE -- HACPO_ARGS..."
    counts_file = Path(counts_file)
    point, nth = None, 0
    if spec.startswith("timer:"):
        timer = threading.Timer(float(spec.split(":", 1)[1]), die)
        timer.daemon = True  # a run that ends first exits normally
        timer.start()
    elif spec != "none":
        point, n = spec.split(":")
        if point not in POINTS:
            raise SystemExit(f"unknown kill point {point!r}; known: {sorted(POINTS)}")
        nth = int(n)
    install(point, nth, counts_file.with_suffix(".orphans"))
    atexit.register(lambda: counts_file.write_text(json.dumps(dict(reached), sort_keys=True)))
    os.environ.pop("HACPO_WORKER", None)  # run here, never in a warm worker
    from hacpo.cli import main as hacpo_main

    return hacpo_main(hacpo_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
