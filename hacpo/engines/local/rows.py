"""What a step's rollouts and a learner's rows hold in the local engine (tensors on the CPU until an
update moves them)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rollouts:
    """One agent's rollouts of one step, in the agent's own tokenisation."""

    prompt_index: torch.Tensor  # [N] index into the step's prompt list
    tokens: torch.Tensor  # [N, T]
    logp: torch.Tensor  # [N, T] generator's pre-update token log-probs
    mask: torch.Tensor  # [N, T]
    texts: list[str]  # response text as shared with other agents (per ``cross_eos``)
    rewards: torch.Tensor  # [N] 0/1
    src_mean_logp: torch.Tensor  # [N] pre-update mean log-prob over the shared text's tokens
    ref_logp: torch.Tensor | None = None  # [N, T] reference log-probs (KL on own rows)


@dataclass
class Rows:
    """A learner's training rows (own + cross), all in the learner's tokenisation."""

    prompt_index: torch.Tensor
    response: torch.Tensor  # [R, T] right-padded
    mask: torch.Tensor
    is_own: torch.Tensor
    agent: torch.Tensor  # the generating agent's index in the run's agent order
    old_mean_logp: torch.Tensor
    adv: torch.Tensor
    omega: torch.Tensor
    old_logp: torch.Tensor  # own rows only (zeros elsewhere)
    ref_logp: torch.Tensor  # own rows only (zeros elsewhere)


def _pad_rows(seqs: list[list[int]], pad: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, width or max((len(s) for s in seqs), default=1))
    out = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        s = s[:width]
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = True
    return out, mask
