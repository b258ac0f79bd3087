"""Causal-LM primitives shared by warm-up, the local engine and CPU evaluation: sampling and log-probs.

A hand-written sampling loop (KV cache) returns the per-token sampling log-probs for free; at temperature 1
they are the policy's log-probs, so the trainer needs no second forward for the generator's old log-probs.
Prompts are left-padded (``prompt_mask`` marks real tokens); responses are right-padded after EOS.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Generation:
    tokens: torch.Tensor  # [B, T] response ids, ``pad_id`` after EOS
    logp: torch.Tensor  # [B, T] log-prob of each sampled token under the sampling distribution
    mask: torch.Tensor  # [B, T] bool, response tokens including the EOS


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists to ``[B, width]``; returns ``(ids, mask)`` with mask True on real tokens."""
    width = max(1, max((len(r) for r in rows), default=1))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = True
    return ids, mask


def _cache_kwarg(model) -> str:
    """Newer transformers 5.x call ``past_key_values`` ``cache``; older 5.x releases know only the former."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def generate(
    model,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    eos_id: int,
    pad_id: int,
    prompt_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    prompt_index: torch.Tensor | None = None,
) -> Generation:
    """Sample (or greedy-decode) up to ``max_new_tokens`` per row; stops early once every row hit EOS.

    With ``prompt_index`` ``[B]``, ``prompt_ids``/``prompt_mask`` hold each *distinct* prompt once
    (``[P, Tp]``): the prompts are encoded once and their KV cache is expanded to the B rows (a group's G
    samples share one prefill). Results are identical to passing ``prompt_ids[prompt_index]``.
    """
    from transformers import DynamicCache

    if prompt_ids.dim() != 2 or prompt_ids.shape[0] == 0:
        raise ValueError(f"prompt_ids must be [batch, length] with batch ≥ 1, got {tuple(prompt_ids.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}")
    if not greedy and temperature <= 0:
        raise ValueError(f"temperature must be > 0 for sampling (use greedy=True), got {temperature}")
    device = prompt_ids.device
    padded = prompt_mask is not None and not bool(prompt_mask.all())
    attn = prompt_mask.long() if padded else None
    pos = _positions(prompt_mask) if padded else None
    dyn = DynamicCache()
    cache = {_cache_kwarg(model): dyn}
    out = model(input_ids=prompt_ids, attention_mask=attn, position_ids=pos, use_cache=True, **cache)
    last_logits = out.logits[:, -1, :]
    if prompt_index is not None:
        dyn.batch_select_indices(prompt_index)
        last_logits = last_logits[prompt_index]
        if padded:
            attn, pos = attn[prompt_index], pos[prompt_index]
    b = last_logits.shape[0]
    next_pos = (pos[:, -1:] + 1) if padded else None
    tokens = torch.full((b, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logps = torch.zeros((b, max_new_tokens), dtype=torch.float32, device=device)
    alive = torch.ones(b, dtype=torch.bool, device=device)
    length = 0
    for t in range(max_new_tokens):
        logits = (last_logits if t == 0 else out.logits[:, -1, :]).float()
        if greedy:
            logprobs = torch.log_softmax(logits, dim=-1)
            tok = logprobs.argmax(dim=-1)
        else:
            logprobs = torch.log_softmax(logits / temperature, dim=-1)
            probs = logprobs.exp()
            if top_p < 1.0:
                probs = _top_p_filter(probs, top_p)
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        lp = logprobs.gather(1, tok[:, None]).squeeze(1)
        tokens[:, t] = torch.where(alive, tok, torch.full_like(tok, pad_id))
        logps[:, t] = torch.where(alive, lp, torch.zeros_like(lp))
        length = t + 1
        alive = alive & (tok != eos_id)
        if not bool(alive.any()) or t == max_new_tokens - 1:
            break
        if padded:
            attn = torch.cat([attn, torch.ones((b, 1), dtype=attn.dtype, device=device)], dim=1)
            step_pos = next_pos + t
        else:
            step_pos = None
        out = model(
            input_ids=tok[:, None], attention_mask=attn, position_ids=step_pos, use_cache=True, **cache
        )
    tokens, logps = tokens[:, :length], logps[:, :length]
    mask = response_mask(tokens, eos_id)
    return Generation(tokens=tokens, logp=logps * mask, mask=mask)


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    keep = sorted_p.cumsum(-1) - sorted_p < top_p
    sorted_p = sorted_p * keep
    return torch.zeros_like(probs).scatter(-1, idx, sorted_p)


def response_mask(tokens: torch.Tensor, eos_id: int) -> torch.Tensor:
    """True up to and including the first EOS of each row."""
    is_eos = (tokens == eos_id).long()
    before = is_eos.cumsum(-1) - is_eos  # EOS count strictly before each position
    return before == 0


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    response_start: int,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probs ``[B, T - response_start]`` of tokens ``input_ids[:, response_start:]`` given their prefix.

    ``input_ids`` = left-padded prompt (common length ``response_start``) + right-padded response. Right
    padding needs no attention mask for a causal model; pass ``attention_mask`` when prompts are left-padded.
    """
    pos = None
    if attention_mask is not None and not bool(attention_mask.all()):
        pos = _positions(attention_mask)
    else:
        attention_mask = None
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos).logits
    logits = logits[:, response_start - 1 : -1, :].float()
    targets = input_ids[:, response_start:]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)


def token_logprobs_shared_prompt(
    model,
    prompt_ids: torch.Tensor,
    prompt_index: torch.Tensor,
    response: torch.Tensor,
    prompt_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`token_logprobs` of ``cat(prompt_ids[prompt_index], response)``, each distinct prompt run once.

    A group's G (HACPO: n·G) rows share one prompt, and on a toy task the prompt is half of each row, so
    running the prompts once and expanding their KV cache to the rows halves the forward *and* backward
    work. Gradients flow through the shared cache, so the result and its gradient equal the plain forward.
    Shapes: ``prompt_ids`` ``[P, Tp]`` (left-padded, ``prompt_mask``), ``prompt_index`` ``[R]``,
    ``response`` ``[R, T]``.
    """
    from transformers import DynamicCache

    key = _cache_kwarg(model)
    padded = prompt_mask is not None and not bool(prompt_mask.all())
    pos_p = _positions(prompt_mask) if padded else None
    cache = DynamicCache()
    out = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask.long() if padded else None,
        position_ids=pos_p,
        use_cache=True,
        **{key: cache},
    )
    first = out.logits[:, -1, :][prompt_index]  # predicts response token 0
    cache.batch_select_indices(prompt_index)
    rows, width = response.shape
    steps = torch.arange(width, device=response.device)
    if padded:
        ones = torch.ones_like(response, dtype=torch.bool)
        attn = torch.cat([prompt_mask[prompt_index], ones], dim=1).long()
        pos = pos_p[prompt_index][:, -1:] + 1 + steps
    else:
        attn, pos = None, (prompt_ids.shape[1] + steps).expand(rows, width)
    rest = model(input_ids=response, attention_mask=attn, position_ids=pos, use_cache=True, **{key: cache})
    rest = rest.logits
    logits = torch.cat([first[:, None, :], rest[:, :-1, :]], dim=1).float()
    return torch.log_softmax(logits, dim=-1).gather(-1, response[..., None]).squeeze(-1)
