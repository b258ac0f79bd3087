"""Which problems a run trains on, step by step: the same for both engines, so a seed's prompts are the
same whichever engine trains it."""

from __future__ import annotations

from pathlib import Path

import torch

from hacpo.runio import read_jsonl


def read_problems(path: str | Path) -> list[dict]:
    rows = read_jsonl(path)
    for i, r in enumerate(rows):
        if not {"id", "problem", "answer"} <= r.keys():
            raise ValueError(f"{path}: record {i} lacks one of id/problem/answer: {sorted(r)}")
    if not rows:
        raise ValueError(f"{path} holds no problems")
    return rows


def batch_for_step(n_problems: int, batch: int, step: int, seed: int) -> list[int]:
    """Indices of step ``step``'s prompts: a seeded shuffle per epoch, dropping the last incomplete batch."""
    per_epoch = n_problems // batch
    if per_epoch == 0:
        raise ValueError(f"prompts_per_step={batch} exceeds the {n_problems} training problems")
    epoch, pos = divmod(step, per_epoch)
    perm = torch.randperm(n_problems, generator=torch.Generator().manual_seed(seed * 7919 + epoch))
    return perm[pos * batch : (pos + 1) * batch].tolist()
