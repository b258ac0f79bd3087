"""Input validation shared by the maths: fail early with a message that names the problem and the fix."""

from __future__ import annotations

import torch


def as_float(name: str, x) -> torch.Tensor:
    t = torch.as_tensor(x)
    if not torch.is_floating_point(t):
        t = t.to(torch.get_default_dtype())
    return t


def check_finite(name: str, t: torch.Tensor) -> None:
    if t.numel() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise ValueError(
            f"{name} contains {bad} non-finite value(s) (NaN/inf); rewards and log-probs must be finite"
        )


class NonFiniteLogProbs(ValueError):
    """The learner's current log-probs hold NaN/inf on response tokens: its forward overflowed or its weights
    are no longer finite. Not bad input: an engine skips the update (hacpo.engines.core.nonfinite)."""


def check_all_finite(**tensors: torch.Tensor) -> None:
    """:func:`check_finite` of several tensors with one host sync (each ``bool(tensor)`` is a device sync on a
    GPU); the error names the first that is not finite (``logp``, the learner's own: NonFiniteLogProbs)."""
    named = {k: t for k, t in tensors.items() if t is not None and t.numel()}
    if not named:
        return
    ok = torch.stack([torch.isfinite(t).all() for t in named.values()]).tolist()
    for (name, t), good in zip(named.items(), ok, strict=True):
        if good:
            continue
        if name == "logp":
            bad = int((~torch.isfinite(t)).sum())
            raise NonFiniteLogProbs(
                f"logp (the learner's current log-probs) contains {bad} non-finite value(s) (NaN/inf) on "
                "response tokens: its forward overflowed or its weights are no longer finite"
            )
        check_finite(name, t)


def check_nonempty(name: str, t: torch.Tensor) -> None:
    if t.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(t.shape)}); every group needs at least one response")


def check_same_shape(**tensors: torch.Tensor) -> None:
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"shape mismatch: {shapes}; these tensors must have identical shapes")


def check_rows(n_rows: int, **tensors: torch.Tensor) -> None:
    bad = {k: tuple(v.shape) for k, v in tensors.items() if v.dim() == 0 or v.shape[0] != n_rows}
    if bad:
        raise ValueError(f"expected {n_rows} rows (first dimension) but got {bad}")
