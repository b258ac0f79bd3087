"""Which problems a run trains on, step by step: the same for both engines, so a seed's prompts are the
same whichever engine trains it."""

from __future__ import annotations

from pathlib import Path

import torch

from hacpo.runio import read_jsonl_lines


def read_problems(path: str | Path) -> list[dict]:
    """A train or validation file's problems, each with ``id``, ``problem`` and ``answer``, ids unique: the
    engines know a problem by its id (the local engine caches its prompt by it), so a repeated id would
    train the second problem on the first one's prompt. Errors name the file and the lines."""
    numbered = read_jsonl_lines(path)
    first: dict[str, int] = {}
    repeats: list[str] = []
    for line, r in numbered:
        if not {"id", "problem", "answer"} <= r.keys():
            raise ValueError(f"{path}:{line}: the record lacks one of id/problem/answer: {sorted(r)}")
        key = str(r["id"])
        if key in first:
            repeats.append(f"id {key!r} on lines {first[key]} and {line}")
        else:
            first[key] = line
    if repeats:
        more = f" (and {len(repeats) - 1} more repeated ids)" if len(repeats) > 1 else ""
        raise ValueError(
            f"{path}: problem {repeats[0]}{more}: each problem needs its own id; "
            "give one of them another id, or drop the copy"
        )
    if not numbered:
        raise ValueError(f"{path} holds no problems")
    return [r for _, r in numbered]


def batch_for_step(n_problems: int, batch: int, step: int, seed: int) -> list[int]:
    """Indices of step ``step``'s prompts: a seeded shuffle per epoch, dropping the last incomplete batch."""
    per_epoch = n_problems // batch
    if per_epoch == 0:
        raise ValueError(f"prompts_per_step={batch} exceeds the {n_problems} training problems")
    epoch, pos = divmod(step, per_epoch)
    perm = torch.randperm(n_problems, generator=torch.Generator().manual_seed(seed * 7919 + epoch))
    return perm[pos * batch : (pos + 1) * batch].tolist()
