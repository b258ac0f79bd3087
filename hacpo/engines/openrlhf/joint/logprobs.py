"""The actor's log-probs of response tokens without a ``[rows, tokens, V]`` logits tensor.

OpenRLHF's ``Actor.forward`` runs the whole causal LM: full-vocabulary logits for every position of a
micro-batch, a float32 copy of them, then the chosen tokens' log-probs (``log_softmax`` by chunks of 1,024
positions when the logits are float32, ``models/utils.py``). With Gemma-3's 262,144 tokens that is
``rows × tokens × 262,144 × (2 + 4)`` bytes per micro-batch before the backward keeps its own copies. The
joint driver's passes on the actors (HACPO's update over own and cross rows, :mod:`.actor`; the scoring of
rows, ``PolicyModelActor.forward``) use :func:`action_log_probs` instead: the backbone's hidden states, and
the model's own head (:class:`hacpo.agents.vocab.OutputHead`, the local engine's) applied in slices of rows
to the response positions only, recomputed in the backward. Same numbers as OpenRLHF's path (the head's
matmul in the weights' dtype, log-softmax in float32), to rounding.

Where the head cannot be rebuilt (an architecture outside :data:`hacpo.agents.vocab.HEADS`, ZeRO-3's
partitioned weights, packed samples, ring attention, a sampling temperature ≠ 1) or the micro-batch's logits
fit :data:`hacpo.agents.vocab.LOGITS_BUDGET` anyway (every toy agent), OpenRLHF's own forward runs.
"""

from __future__ import annotations

import torch

from hacpo.agents.vocab import LOGITS_BUDGET, OutputHead


def sliced_head(actor, tokens: int, zero_stage: int = 2, budget: int | None = None) -> OutputHead | None:
    """The head to apply by hand for a pass over ``tokens`` positions of OpenRLHF's ``actor`` (an ``Actor``
    or the DeepSpeed engine around one), or None when OpenRLHF's own forward should run (module docstring)."""
    inner = getattr(actor, "module", actor)  # a DeepSpeedEngine → the Actor
    model = getattr(inner, "model", None)
    model = getattr(model, "module", model)  # OpenRLHF puts the engine at Actor.model: → the HF model
    if model is None or zero_stage >= 3 or getattr(inner, "packing_samples", False):
        return None
    if getattr(inner, "temperature", 1.0) != 1.0 or getattr(inner, "is_vlm", False):
        return None
    head = OutputHead.of(model, budget)
    limit = LOGITS_BUDGET if budget is None else budget
    if head is None or tokens * head.vocab <= limit:
        return None
    return head


def action_log_probs(
    head: OutputHead, sequences: torch.Tensor, action_mask: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """OpenRLHF's ``Actor.forward(sequences, action_mask, attention_mask)`` (unpacked rows): the log-prob of
    each action token, ``[rows, action_mask.shape[1]]``, zero off the mask. Positions as OpenRLHF numbers
    them (left padding: cumulative attention mask − 1)."""
    position_ids = attention_mask.long().cumsum(-1) - 1
    position_ids.masked_fill_(attention_mask == 0, 1)
    hidden = head.backbone(sequences, attention_mask=attention_mask, position_ids=position_ids)[0]
    n_tokens, n_actions = sequences.shape[1], action_mask.shape[1]
    # log p(x[t+1] | x[≤t]): the last n_actions predictions of the shifted sequence, as OpenRLHF slices them
    predicting = hidden[:, n_tokens - 1 - n_actions : n_tokens - 1]
    targets = sequences[:, n_tokens - n_actions :]
    mask = action_mask.bool()
    out = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
    out[mask] = head.token_logprobs(predicting[mask], targets[mask])
    return out
