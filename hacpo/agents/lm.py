"""Causal-LM primitives shared by warm-up, the local engine and CPU evaluation: sampling and log-probs.

A hand-written sampling loop (KV cache, :mod:`hacpo.agents.decode`) returns the per-token sampling
log-probs for free; at temperature 1 they are the policy's log-probs, so the trainer needs no second forward
for the generator's old log-probs. Log-probs of many rows run every shared prompt and shared response prefix
once (:class:`SharedPrefixes`), with or without gradients. Prompts are left-padded (``prompt_mask`` marks
real tokens); responses are right-padded after EOS.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Collection
from dataclasses import dataclass

import torch

from hacpo.agents.decode import cache_kwarg, decoder_for
from hacpo.agents.vocab import OutputHead, head_for


class _PolicyTemperature(threading.local):
    value = 1.0


_TEMPERATURE = _PolicyTemperature()


@contextlib.contextmanager
def policy_temperature(temperature: float):
    """Every log-prob computed inside is of the tempered policy softmax(z / T), the distribution a sampler
    at temperature T draws from, so π_old, π_θ and the reference agree with the rollouts (as OpenRLHF's
    actor divides its logits by the rollout temperature). The sampler's own ``temperature`` is separate."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    before, _TEMPERATURE.value = _TEMPERATURE.value, float(temperature)
    try:
        yield
    finally:
        _TEMPERATURE.value = before


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


def rows_per_batch(budget_tokens: int | None, tokens_per_row: int, default: int) -> int:
    """Rows to generate at once: ``default`` without a budget, else as many rows of ``tokens_per_row``
    (prompt + new tokens: the KV cache) as fit in ``budget_tokens``, at least one."""
    if budget_tokens is None:
        return default
    return max(1, budget_tokens // max(1, tokens_per_row))


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def generate(
    model,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    eos_id: int | Collection[int],
    pad_id: int,
    prompt_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    prompt_index: torch.Tensor | None = None,
) -> Generation:
    """Sample (or greedy-decode) up to ``max_new_tokens`` per row; a row ends at its first stop id
    (``eos_id``: one id, or every id that ends this model's generations: :func:`stop_token_ids`), and the
    loop once every row has ended.

    With ``prompt_index`` ``[B]``, ``prompt_ids``/``prompt_mask`` hold each *distinct* prompt once
    (``[P, Tp]``): the prompts are encoded once and their KV cache is expanded to the B rows (a group's G
    samples share one prefill). Results are identical to passing ``prompt_ids[prompt_index]``.
    """
    if prompt_ids.dim() != 2 or prompt_ids.shape[0] == 0:
        raise ValueError(f"prompt_ids must be [batch, length] with batch ≥ 1, got {tuple(prompt_ids.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}")
    if not greedy and temperature <= 0:
        raise ValueError(f"temperature must be > 0 for sampling (use greedy=True), got {temperature}")
    device = prompt_ids.device
    prompts = encode_prompts(model, prompt_ids, prompt_mask=prompt_mask)
    if prompt_index is None:
        prompt_index = torch.arange(prompt_ids.shape[0], device=device)
    decoder = decoder_for(model, prompts, prompt_index, max_new_tokens)
    logits = prompts.first_logits[prompt_index]
    pos = prompts.response_positions(prompt_index, 1)[:, 0]
    b = logits.shape[0]
    tokens = torch.full((b, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logps = torch.zeros((b, max_new_tokens), dtype=torch.float32, device=device)
    alive = torch.ones(b, dtype=torch.bool, device=device)
    stops = stop_tensor(eos_id, device)
    length = 0
    for t in range(max_new_tokens):
        logits = logits.float()
        if greedy:
            logprobs = torch.log_softmax(logits, dim=-1)
            tok = logprobs.argmax(dim=-1)
        else:
            logprobs = torch.log_softmax(logits / temperature, dim=-1)
            probs = logprobs.exp()
            if top_p < 1.0:
                probs = _top_p_filter(probs, top_p)
            tok = _sample(probs, generator)
        lp = logprobs.gather(1, tok[:, None]).squeeze(1)
        tokens[:, t] = torch.where(alive, tok, torch.full_like(tok, pad_id))
        logps[:, t] = torch.where(alive, lp, torch.zeros_like(lp))
        length = t + 1
        alive = alive & ~torch.isin(tok, stops)
        if not bool(alive.any()) or t == max_new_tokens - 1:
            break
        logits = decoder.step(tok, pos + t)
    tokens, logps = tokens[:, :length], logps[:, :length]
    mask = response_mask(tokens, stops)
    return Generation(tokens=tokens, logp=logps * mask, mask=mask)


def _sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row from unnormalised ``probs`` ``[B, V]`` by inverting the CDF at a uniform draw.

    Needs one random number per row where ``torch.multinomial`` draws one per vocabulary entry (an
    exponential each); on a CPU that was 15% of decoding. float64 sums; ``right=True`` never returns a
    zero-probability entry (its CDF equals its predecessor's).
    """
    cdf = probs.double().cumsum(dim=-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, dtype=torch.float64, device=probs.device)
    tok = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    return tok.clamp_(max=probs.shape[1] - 1).squeeze(1)


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    keep = sorted_p.cumsum(-1) - sorted_p < top_p
    sorted_p = sorted_p * keep
    return torch.zeros_like(probs).scatter(-1, idx, sorted_p)


def stop_tensor(stops: int | Collection[int] | torch.Tensor, device) -> torch.Tensor:
    """Stop ids (one, several, or already a tensor) as a tensor for ``torch.isin``."""
    if isinstance(stops, torch.Tensor):
        return stops.to(device)
    ids = [stops] if isinstance(stops, int) else sorted(stops)
    if not ids:
        raise ValueError("no stop id: a model needs at least one id that ends its generations")
    return torch.tensor(ids, dtype=torch.long, device=device)


def response_mask(tokens: torch.Tensor, eos_id: int | Collection[int] | torch.Tensor) -> torch.Tensor:
    """True up to and including the first stop id (``eos_id``: one or several) of each row."""
    is_eos = torch.isin(tokens, stop_tensor(eos_id, tokens.device)).long()
    before = is_eos.cumsum(-1) - is_eos  # EOS count strictly before each position
    return before == 0


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    response_start: int,
    *,
    attention_mask: torch.Tensor | None = None,
    padded: bool | None = None,
) -> torch.Tensor:
    """Log-probs ``[B, T - response_start]`` of tokens ``input_ids[:, response_start:]`` given their prefix.

    ``input_ids`` = left-padded prompt (common length ``response_start``) + right-padded response. Right
    padding needs no attention mask for a causal model; pass ``attention_mask`` when prompts are left-padded.
    ``padded``: whether it masks any token, where the caller knows (None: read from it, a GPU sync).
    """
    pos = None
    if padded is None:
        padded = attention_mask is not None and not bool(attention_mask.all())
    if attention_mask is not None and padded:
        pos = _positions(attention_mask)
    else:
        attention_mask = None
    head = head_for(model, input_ids.numel())
    tail = _forward(model, head, input_ids=input_ids, attention_mask=attention_mask, position_ids=pos)
    return _logprobs(tail[:, response_start - 1 : -1], head, input_ids[:, response_start:])


def _forward(model, head: OutputHead | None, keep: int | None = None, cache=None, **kwargs) -> torch.Tensor:
    """The model's logits at the last ``keep`` positions (all when None), or with a ``head``
    (:func:`~hacpo.agents.vocab.head_for`) the backbone's hidden states there, for ``head`` to project."""
    module = model if head is None else head.backbone
    if cache is not None:
        kwargs[cache_kwarg(module)] = cache
    if head is None:
        if keep is None:
            return model(**kwargs).logits
        # the last ``keep`` positions as indices, not HF's int (a slice): the rows gathered are contiguous,
        # so torch's matmul folds them into one mm; a sliced [B, keep, H] view against a head that needs no
        # grad (a frozen model, a LoRA base) took the bmm path, copying the [V, H] head B times: 8.3 GB and
        # 3× the time for 128 prompts of SmolLM2 (docs/performance.md)
        length = kwargs["input_ids"].shape[1]
        last = torch.arange(length - keep, length, device=kwargs["input_ids"].device)
        return model(**kwargs, logits_to_keep=last).logits
    hidden = module(**kwargs).last_hidden_state
    return hidden if keep is None else hidden[:, -keep:]


def _logprobs(tail: torch.Tensor, head: OutputHead | None, targets: torch.Tensor) -> torch.Tensor:
    """Log-probs (float32) of ``targets`` ``[..., T]`` from logits ``tail`` ``[..., T, V]``, or from hidden
    states ``[..., T, H]`` through ``head`` in slices (never a full-vocabulary tensor for the batch); of the
    tempered policy inside :func:`policy_temperature`."""
    t = _TEMPERATURE.value
    if head is not None:
        return head.token_logprobs(tail, targets, t)
    z = tail.float() if t == 1.0 else tail.float() / t
    return torch.log_softmax(z, dim=-1).gather(-1, targets[..., None]).squeeze(-1)


@dataclass
class EncodedPrompts:
    """Distinct prompts run through the model once (:func:`encode_prompts`), reusable for any rows.

    ``keys``/``values`` hold each layer's KV cache ``[P, heads, Tp, head_dim]``; ``tail`` ``[P, k, ·]`` holds
    the last k positions, the last of which (``first_logits``) predicts each prompt's first response token:
    logits ``[P, k, V]``, or with a ``head`` the hidden states ``[P, k, H]`` it projects (a big vocabulary:
    :mod:`hacpo.agents.vocab`). Built with grad, the tensors carry it to every use.
    """

    tail: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    mask: torch.Tensor | None  # [P, Tp] bool when some prompt is left-padded, else None
    length: int  # Tp
    head: OutputHead | None = None

    def detach(self) -> EncodedPrompts:
        """The same encoding cut from the graph: for no-grad passes that must not rerun the prompts."""
        return EncodedPrompts(
            self.tail.detach(),
            [k.detach() for k in self.keys],
            [v.detach() for v in self.values],
            self.mask,
            self.length,
            self.head,
        )

    @property
    def first_logits(self) -> torch.Tensor:
        last = self.tail[:, -1, :]
        return last if self.head is None else self.head.logits(last)

    def response_positions(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """Position ids ``[R, width]`` of response tokens after the prompt of each of ``rows``."""
        steps = torch.arange(width, device=rows.device)
        if self.mask is None:
            return (self.length + steps).expand(len(rows), width)
        return self.mask[rows].long().sum(-1, keepdim=True) + steps

    def cache_for(self, rows: torch.Tensor):
        """A fresh ``DynamicCache`` holding the prompt of each of ``rows`` (indices into the prompts)."""
        from transformers import DynamicCache

        cache = DynamicCache()
        for layer, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            cache.update(k[rows], v[rows], layer)
        return cache


def encode_prompts(
    model,
    prompt_ids: torch.Tensor,
    *,
    prompt_mask: torch.Tensor | None = None,
    keep_logits: int = 1,
    head: OutputHead | None = None,
    padded: bool | None = None,
) -> EncodedPrompts:
    """Run left-padded prompts ``[P, Tp]`` once; ``prompt_mask`` marks real tokens (None: no padding).
    The last ``keep_logits`` positions are kept (the others' logits are never computed): as logits, or as
    hidden states for ``head`` to project. ``padded``: whether ``prompt_mask`` masks any token, where the
    caller knows (None: read from the mask, a device sync on a GPU)."""
    from transformers import DynamicCache

    if padded is None:
        padded = prompt_mask is not None and not bool(prompt_mask.all())
    padded = padded and prompt_mask is not None
    cache = DynamicCache()
    tail = _forward(
        model,
        head,
        keep_logits,
        input_ids=prompt_ids,
        attention_mask=prompt_mask.long() if padded else None,
        position_ids=_positions(prompt_mask) if padded else None,
        use_cache=True,
        cache=cache,
    )
    return EncodedPrompts(
        tail=tail,
        keys=[layer.keys for layer in cache.layers],
        values=[layer.values for layer in cache.layers],
        mask=prompt_mask if padded else None,
        length=prompt_ids.shape[1],
        head=head,
    )


def response_logprobs(
    model, prompts: EncodedPrompts, prompt_index: torch.Tensor, response: torch.Tensor
) -> torch.Tensor:
    """Log-probs ``[R, T]`` of ``response`` ``[R, T]`` (right-padded) after prompts ``prompt_index``."""
    pos = prompts.response_positions(prompt_index, response.shape[1])
    attn = None
    if prompts.mask is not None:
        ones = torch.ones_like(response, dtype=torch.bool)
        attn = torch.cat([prompts.mask[prompt_index], ones], dim=1).long()
    cache = prompts.cache_for(prompt_index)
    rest = _forward(
        model, prompts.head, input_ids=response, attention_mask=attn, position_ids=pos, use_cache=True,
        cache=cache,
    )  # fmt: skip
    # the position before each response token: the prompt's last, then the response's own
    before = torch.cat([prompts.tail[prompt_index, -1:], rest[:, :-1]], dim=1)
    return _logprobs(before, prompts.head, response)


def _group_by_prefix(
    prompt_index: torch.Tensor, response: torch.Tensor, lengths: torch.Tensor, prompt_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group rows by (prompt, first c tokens of the response): ``(row_group [R], shared [G])``.

    A row shares ``c_r = min(d, len_r − 1)`` tokens (it always keeps one of its own to run); the depth d is
    the one that minimises the tokens run: groups × (prompt + d) for the prefixes plus rows × the longest
    remaining suffix. Shallow depths keep few groups; deep ones keep short suffixes; d = 0 is plain prompt
    sharing. Group ids are exact (dense re-numbering per depth), never hashes.

    Once every row is a group of its own, a deeper d costs each row one more prefix token and saves at most
    one suffix token, so the search stops there: sampled answers part within a few tokens, and 4,096-token
    responses need not try 4,096 depths.
    """
    rows = response.shape[0]
    ids = torch.unique(prompt_index, return_inverse=True)[1]
    stop = (lengths - 1).clamp(min=0)
    vocab = int(response.max()) + 2 if response.numel() else 2
    best = (len(torch.unique(ids)) * prompt_len + rows * int(lengths.max()), ids, 0)
    for d in range(1, int(stop.max()) + 1):
        token = torch.where(stop >= d, response[:, d - 1] + 1, 0)  # 0: this row stopped sharing
        ids = torch.unique(ids * vocab + token, return_inverse=True)[1]
        shared = stop.clamp(max=d)
        groups = int(ids.max()) + 1
        cost = groups * (prompt_len + d) + rows * int((lengths - shared).max())
        if cost < best[0]:
            best = (cost, ids, d)
        if groups == rows:
            break
    _, ids, d = best
    shared = torch.zeros(int(ids.max()) + 1, dtype=torch.long, device=ids.device)
    shared.scatter_(0, ids, stop.clamp(max=d))
    return ids, shared


class SharedPrefixes:
    """Log-probs of many responses, with every shared prefix run through the model once.

    Rows with the same prompt (a prompt's G samples, and in HACPO the other agents' samples too) share the
    prompt, and usually the start of the response as well (on the toy task every answer opens with the 7
    tokens of ``\\boxed{``). A causal LM's state at a position depends only on the tokens up to it, so
    rows are grouped by (prompt, first c response tokens) (:func:`_group_by_prefix` picks c), each group's
    prompt and prefix are encoded once, and each row runs only the rest of its response on that KV cache.
    Values and gradients equal a plain forward over every row (float rounding aside; ``tests/test_lm.py``);
    a row's forward and backward shrink from ≈ 12.5 tokens to ≈ 5 on the toy task.

    Built under grad, :meth:`logprobs` can be called for several row subsets (e.g. a no-grad pass over
    some rows with ``detach=True``, then a grad pass over others) without encoding the prefixes again.
    The inputs may stay on the host with ``device`` naming where the model runs (the local update's rows
    do): the grouping runs there without a device sync (docs/design.md, "Host syncs").
    """

    def __init__(
        self,
        model,
        prompt_ids: torch.Tensor,
        prompt_index: torch.Tensor,
        response: torch.Tensor,
        *,
        prompt_mask: torch.Tensor | None = None,
        response_mask: torch.Tensor | None = None,
        device: torch.device | str | None = None,
    ):
        # The grouping reads sizes as it goes (a depth search, group counts, widths): index arithmetic on a
        # few rows, done on the host, where a read is no device sync. Host inputs then move to ``device``
        # (default: ``response``'s) without waiting; inputs on a GPU come back once (one copy each).
        dev = response.device if device is None else torch.device(device)
        rows = response.shape[0]
        if response_mask is None:
            response_mask = torch.ones_like(response, dtype=torch.bool)
        if prompt_mask is None:
            prompt_mask = torch.ones_like(prompt_ids, dtype=torch.bool)
        index, resp, r_mask, p_ids, p_mask = (
            t.cpu() for t in (prompt_index, response, response_mask, prompt_ids, prompt_mask)
        )
        lengths = r_mask.sum(1)
        row_group, shared = _group_by_prefix(index, resp, lengths, p_ids.shape[1])
        rep = torch.full((len(shared),), rows)
        rep.scatter_reduce_(0, row_group, torch.arange(rows), "amin")  # a row per group
        prompts = index[rep]
        c_max = int(shared.max())
        ext_ids, ext_mask = self._extended_prompts(p_ids[prompts], p_mask[prompts], resp[rep], shared, c_max)
        self.suffix_width = max(1, int((lengths - shared[row_group]).max()))
        # log-probs of each group's shared tokens: token j is predicted by tail position c_max - c_g + j
        at = ((c_max - shared)[:, None] + torch.arange(c_max)).clamp(max=c_max)

        def to_dev(t: torch.Tensor) -> torch.Tensor:
            return t.to(dev, non_blocking=True)  # from pageable host memory: staged at once, no stream sync

        self.model, self.response = model, to_dev(response)
        self.row_group, self.shared = to_dev(row_group), to_dev(shared)
        # a big vocabulary: project hidden states in slices (hacpo.agents.vocab), not whole-batch logits
        head = head_for(model, max(len(rep) * (c_max + 1), rows * self.suffix_width))
        padded = not bool(ext_mask.all())  # read here, on the host
        mask = to_dev(ext_mask) if padded else None
        self.encoded = encode_prompts(
            model, to_dev(ext_ids), prompt_mask=mask, keep_logits=c_max + 1, head=head, padded=padded
        )
        tail = self.encoded.tail
        pick = tail.gather(1, to_dev(at)[..., None].expand(-1, -1, tail.shape[-1]))
        self.prefix_logp = _logprobs(pick, head, to_dev(resp[rep, :c_max]))

    @staticmethod
    def _extended_prompts(prompt_ids, prompt_mask, heads, shared, c_max):
        """Each group's prompt followed by its shared response prefix, left-padded to a common length."""
        n_groups, tp = prompt_ids.shape
        length = tp + c_max
        cols = torch.arange(length, device=prompt_ids.device)[None, :]
        p_col = cols - (c_max - shared)[:, None]  # column within the prompt
        r_col = cols - (length - shared)[:, None]  # column within the shared prefix
        in_prompt, in_prefix = (p_col >= 0) & (p_col < tp), r_col >= 0
        p_ids = prompt_ids.gather(1, p_col.clamp(0, tp - 1))
        r_ids = heads.gather(1, r_col.clamp(0, heads.shape[1] - 1))
        ids = torch.where(in_prompt, p_ids, torch.where(in_prefix, r_ids, torch.zeros_like(p_ids)))
        mask = torch.where(in_prompt, prompt_mask.gather(1, p_col.clamp(0, tp - 1)), in_prefix)
        return ids, mask

    def logprobs(self, rows: torch.Tensor | None = None, detach: bool = False) -> torch.Tensor:
        """Log-probs ``[R, T]`` of the responses of ``rows`` (default all); arbitrary past each row's mask."""
        if rows is None:
            rows = torch.arange(self.response.shape[0], device=self.response.device)
        group, resp = self.row_group[rows], self.response[rows]
        encoded, prefix_logp = self.encoded, self.prefix_logp
        if detach:
            encoded, prefix_logp = encoded.detach(), prefix_logp.detach()
        width = resp.shape[1]
        cols = torch.arange(width, device=resp.device)[None, :]
        start = self.shared[group][:, None]
        s_col = cols[:, : self.suffix_width] + start
        suffix = resp.gather(1, s_col.clamp(max=width - 1))
        s_logp = response_logprobs(self.model, encoded, group, suffix)  # [R, suffix_width]
        rel = cols - start
        from_suffix = s_logp.gather(1, rel.clamp(0, self.suffix_width - 1))
        from_suffix = torch.where(rel < self.suffix_width, from_suffix, torch.zeros_like(from_suffix))
        if prefix_logp.shape[1] == 0:
            return from_suffix
        from_prefix = torch.nn.functional.pad(prefix_logp[group], (0, width - prefix_logp.shape[1]))
        return torch.where(rel < 0, from_prefix, from_suffix)


def token_budget_chunks(
    lengths: torch.Tensor, budget: int | None, prompt_len: int = 0, group: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """Row indices ``[0, R)`` cut into chunks that each run at most ``budget`` tokens *as padded*: rows ×
    (``prompt_len`` + the chunk's longest length), the tokens a padded forward runs and the full-vocabulary
    logits it makes (≈ 2 MB per token for a 152k vocabulary). Rows are taken longest first, so a chunk pads
    little (one 4,096-token answer among 400-token ones would otherwise pad them all to 4,096); rows of one
    ``group`` (a prompt) stay adjacent among equal lengths, so they can share it. A row longer than the
    budget is a chunk of its own. ``budget`` None: one chunk, rows in order."""
    if budget is None:
        return [torch.arange(len(lengths))]
    lengths = lengths.cpu()
    order = torch.arange(len(lengths)) if group is None else torch.sort(group.cpu(), stable=True).indices
    order = order[torch.sort(lengths[order], descending=True, stable=True).indices]
    sizes = (lengths[order] + prompt_len).tolist()
    chunks, start = [], 0
    while start < len(order):
        rows = max(1, budget // max(1, sizes[start]))  # the chunk's first row is its longest
        chunks.append(order[start : start + rows])
        start += rows
    return chunks


def token_logprobs_shared_prompt(
    model,
    prompt_ids: torch.Tensor,
    prompt_index: torch.Tensor,
    response: torch.Tensor,
    *,
    prompt_mask: torch.Tensor | None = None,
    response_mask: torch.Tensor | None = None,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """:func:`token_logprobs` of ``cat(prompt_ids[prompt_index], response)``, each shared prefix run once.

    A group's G (HACPO: n·G) rows share one prompt and usually the start of their responses; see
    :class:`SharedPrefixes`. Gradients flow through the shared cache, so the result and its gradient equal
    the plain forward. Shapes: ``prompt_ids`` ``[P, Tp]`` (left-padded, ``prompt_mask``), ``prompt_index``
    ``[R]``, ``response`` ``[R, T]`` (right-padded after ``response_mask``; values there are arbitrary).

    ``max_tokens`` (no-grad passes over a whole rollout): rows run in chunks of at most that many padded
    prompt + response tokens (:func:`token_budget_chunks`), prefixes shared within a chunk, so neither the
    prefix encoding nor the suffix pass makes more logits than the budget. Same values (rows are
    independent); zeros past each row's mask.
    """
    if max_tokens is None:
        shared = SharedPrefixes(
            model, prompt_ids, prompt_index, response, prompt_mask=prompt_mask, response_mask=response_mask
        )
        return shared.logprobs()
    if response_mask is None:
        response_mask = torch.ones_like(response, dtype=torch.bool)
    lengths = response_mask.sum(1).cpu()
    out = torch.zeros(response.shape, dtype=torch.float32, device=response.device)
    for chunk in token_budget_chunks(lengths, max_tokens, prompt_ids.shape[1], prompt_index):
        width = max(1, int(lengths[chunk].max()))
        chunk = chunk.to(response.device)
        cols = (chunk, slice(0, width))
        shared = SharedPrefixes(model, prompt_ids, prompt_index[chunk], response[cols],
                                prompt_mask=prompt_mask, response_mask=response_mask[cols])  # fmt: skip
        out[cols] = shared.logprobs()
    return out
