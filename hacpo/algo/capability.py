"""Capability estimate P̂ and the capability discrepancy coefficient ω (spec §3.1)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from ._checks import as_float, check_finite, check_nonempty

OMEGA_MIN, OMEGA_MAX = 0.1, 10.0  # §3.1 clamp; closed under inversion
P_FLOOR = 1e-8


def step_accuracy(rewards) -> float:
    """P_t^(k): mean reward of *all* of agent k's responses in step t (§3.1, whole step, not one group)."""
    r = as_float("rewards", rewards)
    check_nonempty("rewards", r)
    check_finite("rewards", r)
    return float(r.mean())


def omega(p_hat_k: float, p_hat_j: float) -> float:
    """ω^(k,j) = clamp(P̂_k / P̂_j, 0.1, 10) (§3.1). > 1 means k is stronger than j."""
    if not (p_hat_k > 0 and p_hat_j > 0):
        raise ValueError(f"capabilities must be > 0 (floored at {P_FLOOR}); got {p_hat_k}, {p_hat_j}")
    return min(max(p_hat_k / p_hat_j, OMEGA_MIN), OMEGA_MAX)


def omega_matrix(p_hat) -> torch.Tensor:
    """``W[k, j] = ω^(k,j)`` for all agent pairs (diagonal 1). Row k = weights on j's rewards in k's baseline;
    column k = loss factors ω^(j,k) of j's samples for learner k."""
    p = as_float("p_hat", p_hat).double()
    if p.dim() != 1 or bool((p <= 0).any()):
        raise ValueError(f"p_hat must be a 1-D tensor of positive capabilities, got {p.tolist()}")
    return (p[:, None] / p[None, :]).clamp(OMEGA_MIN, OMEGA_MAX)


@dataclass
class CapabilityTracker:
    """Sliding-window capability P̂_t^(k) = max(mean(P_{t−K+1..t}), 1e-8), window including step t (§3.1, T12).

    During the first K−1 steps it averages whatever is available. ``warmup_steps`` (W) forces ω = 1 for the
    first W steps (reference option, default off). State round-trips through :meth:`state_dict` for resume.
    """

    n_agents: int
    window: int = 5
    warmup_steps: int = 0
    history: list[deque] = field(default_factory=list)
    steps_seen: int = 0

    def __post_init__(self):
        if self.n_agents < 1 or self.window < 1 or self.warmup_steps < 0:
            raise ValueError(f"need n_agents ≥ 1, window ≥ 1, warmup ≥ 0; got {self}")
        if not self.history:
            self.history = [deque(maxlen=self.window) for _ in range(self.n_agents)]

    def update(self, step_rewards: list) -> torch.Tensor:
        """Push one step's per-agent rewards (any shape each); returns P̂ for all agents, ``[n]``."""
        if len(step_rewards) != self.n_agents:
            raise ValueError(f"expected rewards for {self.n_agents} agents, got {len(step_rewards)}")
        accs = [step_accuracy(r) for r in step_rewards]  # validate all before touching any window
        for h, acc in zip(self.history, accs, strict=True):
            h.append(acc)
        self.steps_seen += 1
        return self.p_hat()

    def p_hat(self) -> torch.Tensor:
        if any(len(h) == 0 for h in self.history):
            raise ValueError("capability is undefined before the first update()")
        return torch.tensor([max(sum(h) / len(h), P_FLOOR) for h in self.history], dtype=torch.float64)

    def omegas(self) -> torch.Tensor:
        """Clamped ω matrix for the current step (all ones during the warm-up)."""
        if self.steps_seen <= self.warmup_steps:
            return torch.ones(self.n_agents, self.n_agents, dtype=torch.float64)
        return omega_matrix(self.p_hat())

    def state_dict(self) -> dict:
        return {
            "window": self.window,
            "history": [list(h) for h in self.history],
            "steps_seen": self.steps_seen,
        }

    def load_state_dict(self, state: dict) -> None:
        if state["window"] != self.window or len(state["history"]) != self.n_agents:
            raise ValueError("capability state does not match this tracker (window or agent count differ)")
        self.history = [deque(h, maxlen=self.window) for h in state["history"]]
        self.steps_seen = int(state["steps_seen"])
