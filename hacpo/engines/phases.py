"""Wall time per phase of training (generate, score, logprobs, retokenize, update, validate).

One clock for both engines: the per-step ``time/<phase>_s`` fields of ``metrics.jsonl`` and the run totals of
``profile.json`` (Tables 7 and 8) come from the same :class:`Phases`.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager


class Phases:
    """Accumulated seconds per phase: ``with phases("generate"): ...``."""

    def __init__(self) -> None:
        self.total: defaultdict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.total[name] += time.perf_counter() - t0

    def snapshot(self) -> dict[str, float]:
        return dict(self.total)

    def since(self, snapshot: dict[str, float]) -> dict[str, float]:
        """Seconds per phase spent after ``snapshot`` was taken (one step's share)."""
        return {name: t - snapshot.get(name, 0.0) for name, t in self.total.items()}
