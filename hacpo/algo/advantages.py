"""Group advantages: GRPO/GSPO (own group) and HACPO's capability-aware joint advantages.

The § marks are docs/algorithm.md's (§2.1 GRPO, §3.2 capability-aware advantage, §8 ablations).
Shapes: a *joint group* tensor is ``[P, n, G]`` = prompts × agents × responses per agent, built by prompt id
with :func:`group_by_prompt` (never by position, §3.2.7).
"""

from __future__ import annotations

import torch

from ._checks import as_float, check_finite, check_nonempty

EPS = 1e-6  # §2.1, §3.2.5


def _unbiased_std(x: torch.Tensor, dim) -> torch.Tensor:
    n = 1
    for d in dim if isinstance(dim, tuple) else (dim,):
        n *= x.shape[d]
    if n < 2:  # a single response has no spread; std is defined as 0 so A = R − mean = 0
        return torch.zeros_like(x.mean(dim=dim, keepdim=True))
    return x.std(dim=dim, keepdim=True, unbiased=True)


def group_advantages(rewards) -> torch.Tensor:
    """GRPO/GSPO advantage over each prompt's own G responses (§2.1, Eq. "A_i = (R_i − mean)/(std + ε)").

    ``rewards``: ``[P, G]``. Unbiased (N−1) std, ε = 1e-6. Returns ``[P, G]``.
    """
    r = as_float("rewards", rewards)
    if r.dim() != 2:
        raise ValueError(f"rewards must be [prompts, G], got shape {tuple(r.shape)}")
    check_nonempty("rewards", r)
    check_finite("rewards", r)
    return (r - r.mean(dim=1, keepdim=True)) / (_unbiased_std(r, 1) + EPS)


def capability_baseline(rewards, learner: int, omega_learner_over: torch.Tensor) -> torch.Tensor:
    """Raw capability-aware baseline μ^(k) (§3.2 step 1), without the special cases.

    μ^(k) = (1/(nG)) · [Σ_own R + Σ_{j≠k} ω^(k,j) Σ_{from j} R].
    ``rewards``: ``[P, n, G]``; ``omega_learner_over[j]`` = ω^(k,j) = P̂_k/P̂_j (the entry for k itself is
    ignored and taken as 1). Returns ``[P, 1, 1]``.
    """
    r = as_float("rewards", rewards)
    w = as_float("omega", omega_learner_over).to(r.dtype).clone()
    w[learner] = 1.0
    n, g = r.shape[1], r.shape[2]
    return (r.sum(dim=2) * w).sum(dim=1).view(-1, 1, 1) / (n * g)


def joint_advantages(
    rewards,
    learner: int,
    omega_learner_over=None,
    baseline: str = "capability",
) -> torch.Tensor:
    """Learner k's advantages over the joint group of n·G responses per prompt (§3.2; ablation §8).

    Args:
        rewards: ``[P, n, G]`` raw rewards, agent axis in agent order.
        learner: index k of the learner on the agent axis.
        omega_learner_over: ``[n]`` with ω^(k,j) (clamped, §3.1) — the weight of agent j's rewards in the
            learner's baseline. Required for ``baseline="capability"``.
        baseline: ``"capability"`` (HACPO, Eq. of §3.2), ``"joint_mean"`` (HACPO − Adv and Naive: plain mean
            of all nG rewards), or ``"own_mean"`` (the configurable alternative ablation: mean of own G).

    Steps: μ per ``baseline``; special case A — all nG rewards equal → μ = plain mean (A ≡ 0);
    special case B — otherwise μ > 1 → own mean; σ = unbiased std of the raw nG rewards; A = (R − μ)/(σ + ε)
    for every response, own and cross (cross rewards unweighted in the numerator). Returns ``[P, n, G]``.
    """
    r = as_float("rewards", rewards)
    if r.dim() != 3:
        raise ValueError(f"rewards must be [prompts, agents, G], got shape {tuple(r.shape)}")
    check_nonempty("rewards", r)
    check_finite("rewards", r)
    p, n, g = r.shape
    if not 0 <= learner < n:
        raise ValueError(f"learner index {learner} out of range for {n} agents")
    flat = r.reshape(p, 1, n * g)
    plain = flat.mean(dim=2, keepdim=True)
    own = r[:, learner : learner + 1].mean(dim=2, keepdim=True)
    if baseline == "capability":
        if omega_learner_over is None:
            raise ValueError("baseline='capability' needs omega_learner_over (ω^(k,j) per agent)")
        w = as_float("omega", omega_learner_over)
        if w.shape != (n,):
            raise ValueError(f"omega_learner_over must have shape ({n},), got {tuple(w.shape)}")
        check_finite("omega", w)
        mu = capability_baseline(r, learner, w)
        mu = torch.where(mu > 1.0, own, mu)  # special case B: binary baseline guard
    elif baseline == "joint_mean":
        mu = plain
    elif baseline == "own_mean":
        mu = own
    else:
        raise ValueError(f"unknown baseline {baseline!r}; choose 'capability', 'joint_mean' or 'own_mean'")
    all_equal = (flat == flat[..., :1]).all(dim=2, keepdim=True)
    mu = torch.where(all_equal, plain, mu)  # special case A: takes precedence over B
    sigma = _unbiased_std(flat, 2)
    return (r - mu) / (sigma + EPS)


def group_by_prompt(prompt_ids, agent_ids, n_agents: int):
    """Index tensor ``[P, n, G]`` that arranges flat rows into joint groups by prompt id (§3.2.7).

    Rows may arrive in any order; each (prompt, agent) must hold the same number G of responses.
    Returns ``(index, unique_prompt_ids)`` so that ``values[index]`` is ``[P, n, G]``.
    """
    pid = torch.as_tensor(prompt_ids).long()
    aid = torch.as_tensor(agent_ids).long()
    if pid.shape != aid.shape or pid.dim() != 1:
        raise ValueError(
            f"prompt_ids and agent_ids must be 1-D of equal length, got {pid.shape}, {aid.shape}"
        )
    check_nonempty("prompt_ids", pid)
    if int(aid.min()) < 0 or int(aid.max()) >= n_agents:
        raise ValueError(
            f"agent ids must lie in [0, {n_agents}), got range [{int(aid.min())}, {int(aid.max())}]"
        )
    uniq, pinv = torch.unique(pid, return_inverse=True)
    key = pinv * n_agents + aid
    counts = torch.bincount(key, minlength=len(uniq) * n_agents)
    if not bool((counts == counts[0]).all()) or int(counts[0]) == 0:
        raise ValueError(
            "every (prompt, agent) pair must have the same, non-zero number of responses; "
            f"got counts from {int(counts.min())} to {int(counts.max())}"
        )
    order = torch.argsort(key, stable=True)
    return order.view(len(uniq), n_agents, int(counts[0])), uniq


def row_advantages(
    rewards,
    prompt_ids,
    agent_ids,
    n_agents: int,
    learner: int = 0,
    omega_learner_over=None,
    baseline: str | None = None,
) -> torch.Tensor:
    """One learner's advantages for flat rows in any order (§3.2): rows grouped by prompt id and agent
    (:func:`group_by_prompt`), then :func:`joint_advantages` with ``baseline`` (joint methods), or
    :func:`group_advantages` over the single agent's rows when ``baseline`` is None. Returns ``[R]``, aligned
    with ``rewards``.
    """
    r = as_float("rewards", rewards)
    index, _ = group_by_prompt(prompt_ids, agent_ids, n_agents)
    grouped = r[index]  # [P, n, G]
    if baseline is None:
        if n_agents != 1:
            raise ValueError(f"group advantages are single-agent; got rows of {n_agents} agents")
        adv = group_advantages(grouped[:, 0]).unsqueeze(1)
    else:
        adv = joint_advantages(grouped, learner, omega_learner_over, baseline)
    out = torch.empty_like(r)
    out[index.reshape(-1)] = adv.reshape(-1).to(out.dtype)
    return out

