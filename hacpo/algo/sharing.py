"""What a learner takes from its peers: the rows it trains on and their advantages, for every sharing rule.

Liu et al. (2026, "Experience Sharing in Mutual Reinforcement Learning for Heterogeneous Language Models",
arXiv 2605.07244) name three probes of sharing between heterogeneous LLMs on top of GRPO; HACPO and Naive are
the first kind (docs/algorithm.md, "Sharing rules"):

- ``rollouts`` (PRP, peer rollout pooling; Naive, HACPO): the learner trains on its own rows and every peer's,
  re-encoded, with joint-group advantages (:func:`~.advantages.row_advantages`);
- ``baseline`` (XGRPO, cross-policy advantage sharing): own rows only; their baseline μ and σ come from the
  prompt's joint group of n·G rewards (the plain mean, or HACPO's capability-aware μ, spec §3.2);
- ``successes`` (SGT, success-gated transfer): own rows with GSPO's own-group advantages, plus a rescue set:
  on a prompt where all G of the learner's answers failed, the peers' verified successes (:func:`rescue_set`).

Inputs are flat rows in any order, grouped by prompt id and source (:func:`~.advantages.group_by_prompt`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from ._checks import as_float
from .advantages import group_by_prompt, row_advantages

Sharing = Literal["rollouts", "baseline", "successes"]
SHARING_RULES: tuple[str, ...] = get_args(Sharing)
SUCCESS = 1.0  # a verified success: the verifier's full reward (rewards are 0/1)


@dataclass(frozen=True)
class LearnerRows:
    """One learner's rows of a step: ``adv`` [R] the advantage of every row (0 where dropped), ``keep`` [R]
    the rows its update trains on."""

    adv: torch.Tensor
    keep: torch.Tensor


def rescue_set(rewards, prompt_ids, sources, n_sources: int, learner: int):
    """SGT's rescue set and the own rows it replaces (arXiv 2605.07244's success-gated transfer).

    Gate: a prompt where none of the learner's G answers is a verified success (reward ≥ 1) and a peer has
    one. Rescue rows: the peers' verified successes on that prompt, in source order then row order, at most
    G of them [choice]. They take the slots of the learner's failed answers there, which carry no policy
    gradient (an all-0 group has A ≡ 0), so the update keeps GSPO's rows, mini-batches and cost [choice].

    Returns ``(rescue [R] bool, replaced [R] bool)``: the peer rows added, and the own rows they replace.
    """
    r = as_float("rewards", rewards)
    index, _ = group_by_prompt(prompt_ids, sources, n_sources)  # [P, n, G]
    success = r[index] >= SUCCESS
    failed = ~success[:, learner].any(dim=1)  # [P]: the gate
    peers = torch.ones(n_sources, dtype=torch.bool)
    peers[learner] = False
    g = index.shape[2]
    peer_index = index[:, peers].reshape(len(index), -1)  # [P, (n−1)G] in source order, then row order
    peer_success = success[:, peers].reshape(len(index), -1) & failed[:, None]
    rank = peer_success.long().cumsum(dim=1) - 1
    taken = peer_success & (rank < g)
    n_taken = taken.sum(dim=1)  # [P] ≤ G
    replaced_slots = torch.arange(g)[None, :] < n_taken[:, None]  # the first n_taken own rows
    rescue = torch.zeros(len(r), dtype=torch.bool)
    rescue[peer_index[taken]] = True
    replaced = torch.zeros(len(r), dtype=torch.bool)
    replaced[index[:, learner][replaced_slots]] = True
    return rescue, replaced


def learner_rows(
    rewards,
    prompt_ids,
    sources,
    n_sources: int,
    learner: int = 0,
    *,
    sharing: Sharing = "rollouts",
    baseline: str | None = None,
    omega_learner_over=None,
    rescue_advantage: float = 1.0,
) -> LearnerRows:
    """Learner ``learner``'s advantages and kept rows under a sharing rule, for flat rows of ``n_sources``
    agents (its own at position ``learner``); ``n_sources`` = 1 with ``baseline`` None: GRPO/GSPO's own group.

    - ``rollouts``: every row kept; joint advantages with ``baseline`` (§3.2, §2.5);
    - ``baseline`` (XGRPO): joint advantages with ``baseline`` (``joint_mean``: μ and σ of the n·G rewards;
      ``capability``: HACPO's μ with its special cases A and B, σ joint), own rows kept only;
    - ``successes`` (SGT): own rows with their own group's advantages (GSPO's, §2.1); the rescue set
      (:func:`rescue_set`) with advantage ``rescue_advantage`` [choice: 1, a verified success's direction at
      the scale of one standardised reward], in place of the failed own rows it replaces.
    """
    r = as_float("rewards", rewards)
    src, pid = torch.as_tensor(sources).long(), torch.as_tensor(prompt_ids)
    own = src == learner
    if sharing not in SHARING_RULES:
        raise ValueError(f"unknown sharing rule {sharing!r}; choose one of {', '.join(SHARING_RULES)}")
    if n_sources == 1:
        return LearnerRows(row_advantages(r, pid, src, 1), torch.ones_like(own))  # GRPO/GSPO
    if baseline is None and sharing != "successes":
        raise ValueError(f"sharing {sharing!r} between {n_sources} agents needs a joint `baseline`")
    if sharing == "successes":
        adv = torch.zeros_like(r)
        adv[own] = row_advantages(r[own], pid[own], torch.zeros_like(src[own]), 1)
        rescue, replaced = rescue_set(r, pid, src, n_sources, learner)
        adv[rescue] = float(rescue_advantage)
        return LearnerRows(adv, (own & ~replaced) | rescue)
    adv = row_advantages(r, pid, src, n_sources, learner, omega_learner_over, baseline)
    return LearnerRows(adv, own.clone() if sharing == "baseline" else torch.ones_like(own))
