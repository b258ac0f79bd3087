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
    """Accumulated seconds per phase: ``with phases("generate"): ...``.

    With a CUDA ``device``, the device is synchronised where a phase starts and ends, so its seconds hold its
    own GPU work (CUDA runs kernels after their launch); and each phase's peak of allocated GPU memory is kept
    (``peak_mb``, MiB): the allocator's peak is reset when a phase starts and read when it ends, so
    ``max(peak_mb.values())`` is the run's peak. Phases are not nested.
    """

    def __init__(self, device=None) -> None:
        self.total: defaultdict[str, float] = defaultdict(float)
        self.device = device if device is not None and getattr(device, "type", None) == "cuda" else None
        self.peak_mb: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.device is not None:
            import torch

            # CUDA runs kernels after their launch: without a sync at each boundary a phase's GPU work is
            # timed in whichever later phase first waits for it
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.device is not None:
                torch.cuda.synchronize(self.device)
            self.total[name] += time.perf_counter() - t0
            if self.device is not None:
                peak = torch.cuda.max_memory_allocated(self.device) / 2**20
                self.peak_mb[name] = max(self.peak_mb.get(name, 0.0), peak)

    def peak_gpu_mb(self) -> float | None:
        """The run's peak of allocated GPU memory over all phases (None without CUDA)."""
        return max(self.peak_mb.values(), default=0.0) if self.device is not None else None

    def snapshot(self) -> dict[str, float]:
        return dict(self.total)

    def since(self, snapshot: dict[str, float]) -> dict[str, float]:
        """Seconds per phase spent after ``snapshot`` was taken (one step's share)."""
        return {name: t - snapshot.get(name, 0.0) for name, t in self.total.items()}
