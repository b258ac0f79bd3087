"""The order in which a learner's rows meet the optimizer, for both engines (``minibatch_order``).

Rows are cut into mini-batches in this order and the stepwise clip's update index m counts them (§3.5), so
the order decides which cross rows meet which lower bound:

- ``mixed``: a permutation seeded by (run seed, step, learner): a resumed run draws the one an
  uninterrupted run drew;
- ``self_first``: the learner's own rows, then the cross rows, each in buffer order;
- ``agent_order``: by generating agent in the run's agent order, then by prompt (samples of a prompt in
  generation order): the authors' released code (spec §10), the same order for every learner.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

ORDERS = ("mixed", "self_first", "agent_order")


def minibatch_order(
    order: str,
    *,
    own: Sequence[bool],
    agent: Sequence[int],
    prompt: Sequence[int],
    seed: int,
    step: int,
    learner: int,
) -> list[int]:
    """Row indices in the order the updates take them."""
    n = len(own)
    if not len(agent) == len(prompt) == n:
        raise ValueError(f"own, agent and prompt must describe the same {n} rows")
    if order == "self_first":
        return [i for i in range(n) if own[i]] + [i for i in range(n) if not own[i]]
    if order == "agent_order":
        return sorted(range(n), key=lambda i: (int(agent[i]), int(prompt[i])))  # stable: sample order kept
    if order == "mixed":
        g = torch.Generator().manual_seed(seed * 1_000_003 + step * 101 + learner)
        return torch.randperm(n, generator=g).tolist()
    raise ValueError(f"minibatch_order {order!r}: choose one of {', '.join(ORDERS)}")
