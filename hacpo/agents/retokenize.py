"""Text exchange between agents (spec §4): reuse ids for identical tokenizers, else decode → re-encode.

Default ``cross_eos="strip"`` for different tokenizers:
- the source's terminal EOS (and any padding after it) is cut from the text: :func:`response_text`;
- the same EOS is excluded from the source's mean log-prob: average the generator's per-token log-probs
  with :func:`source_logp_mask` (or divide their sum over the first :func:`source_token_count` tokens by
  that count) instead of the generation mask, which includes the EOS;
- the learner's EOS is not appended: :func:`retokenize`.

``cross_eos="keep_text"`` reproduces the original code: decode up to and including the EOS with special
tokens kept as literal text (a foreign EOS becomes plain characters for the learner) and count the EOS in
the source's mean. With identical tokenizers (:func:`same_tokenizer`) the source ids are reused unchanged,
EOS included, and both means run over the same tokens. :func:`cross_tokens` applies the right rule.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from hacpo.agents.lm import response_mask, stop_tensor
from hacpo.agents.tokenizers import tokenizer_fingerprint

CROSS_EOS = ("strip", "keep_text")


def _check_mode(cross_eos: str) -> None:
    if cross_eos not in CROSS_EOS:
        raise ValueError(f"unknown cross_eos {cross_eos!r}; use one of {CROSS_EOS}")


def same_tokenizer(tok_a, tok_b) -> bool:
    """True when both encode identically (fingerprints of vocab/model/specials; chat templates ignored)."""
    return tok_a is tok_b or tokenizer_fingerprint(tok_a) == tokenizer_fingerprint(tok_b)


def _ids(token_ids) -> list[int]:
    if isinstance(token_ids, torch.Tensor):
        return [int(x) for x in token_ids.tolist()]
    return [int(x) for x in token_ids]


def _first_stop(ids: list[int], stops: int | Collection[int]) -> int | None:
    """Index of the first stop id in ``ids`` (None: no stop). Several ids can end a generation: vLLM stops
    at every id of the model's ``generation_config.eos_token_id`` (Qwen3: ``<|im_end|>`` and
    ``<|endoftext|>``), not only at the tokenizer's ``eos_token_id`` (:func:`stop_token_ids`)."""
    stops = {stops} if isinstance(stops, int) else set(stops)
    return next((i for i, t in enumerate(ids) if t in stops), None)


def stop_token_ids(tok, model=None) -> frozenset[int]:
    """Every id that ends a generation of this model: the tokenizer's EOS and each ``eos_token_id`` (an int
    or a list) of the model's generation config. ``model``: a model directory (its
    ``generation_config.json``, as vLLM reads it) or a loaded model (its ``generation_config``). Imported
    models list there the end-of-turn of their prompt format too (:mod:`hacpo.agents.sources`)."""
    import json
    from pathlib import Path

    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    eos = None
    if isinstance(model, str | Path):
        config = Path(model) / "generation_config.json"
        if config.is_file():
            eos = json.loads(config.read_text()).get("eos_token_id")
    elif model is not None and getattr(model, "generation_config", None) is not None:
        eos = model.generation_config.eos_token_id
    ids |= {eos} if isinstance(eos, int) else set(eos or ())
    return frozenset(ids)


def pad_token_id(tok, stops: Collection[int]) -> int:
    """The tokenizer's pad id, or (a tokenizer without one) a stop id: padding follows a row's stop anyway."""
    return tok.pad_token_id if tok.pad_token_id is not None else min(stops)


def source_token_count(
    token_ids: Sequence[int] | torch.Tensor, eos_id: int | Collection[int], cross_eos: str = "strip"
) -> int:
    """Tokens of one generated row that enter the source's mean log-prob.

    ``strip``: the tokens before the first EOS (``eos_id``: one id or every stop id); ``keep_text``: up to
    and including it. A row without EOS (truncated at the length limit) counts all its tokens either way;
    pass only the generated response, or the row with padding (padding after EOS is never counted).
    """
    _check_mode(cross_eos)
    ids = _ids(token_ids)
    k = _first_stop(ids, eos_id)
    if k is not None:
        return k + 1 if cross_eos == "keep_text" else k
    return len(ids)


def source_logp_mask(
    tokens: torch.Tensor, eos_id: int | Collection[int], cross_eos: str = "strip"
) -> torch.Tensor:
    """Bool mask ``[B, T]`` of generated tokens that enter the source's mean log-prob for cross rows.

    Source mean log-prob for row b: ``(logp * m).sum(-1) / m.sum(-1).clamp(min=1)`` with ``m`` this mask and
    ``logp`` the generator's per-token log-probs (``Generation.logp`` or a trainer forward). ``strip``
    excludes the EOS (the generation mask includes it); ``keep_text`` keeps it. ``eos_id``: one id or every
    stop id of the generating model (:func:`stop_token_ids`).
    """
    _check_mode(cross_eos)
    stops = stop_tensor(eos_id, tokens.device)
    mask = response_mask(tokens, stops)
    if cross_eos == "strip":
        mask = mask & ~torch.isin(tokens, stops)
    return mask


def response_text(
    tok,
    token_ids: Sequence[int] | torch.Tensor,
    cross_eos: str = "strip",
    *,
    stops: Collection[int] | None = None,
) -> str:
    """Text of one generated response (ids after the prompt, optionally right-padded).

    ``strip``: everything from the first EOS on is cut, the rest decoded with ``skip_special_tokens=False``
    (no other specials occur in well-formed toy responses). ``keep_text``: decoded up to and including the
    first EOS, the EOS kept as literal text. Padding after EOS is dropped in both modes. ``stops``: every
    id that ends this model's generations (:func:`stop_token_ids`; default the tokenizer's EOS).
    """
    _check_mode(cross_eos)
    ids = _ids(token_ids)
    k = _first_stop(ids, stops if stops else tok.eos_token_id)
    if k is not None:
        ids = ids[: k + 1] if cross_eos == "keep_text" else ids[:k]
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def retokenize(texts: list[str], learner_tok, max_len: int) -> list[list[int]]:
    """Encode response texts with the learner's tokenizer: no special tokens added, no learner EOS
    appended, truncated to ``max_len`` learner tokens. Append after the learner's own templated prompt."""
    if max_len < 1:
        raise ValueError(f"max_len must be ≥ 1, got {max_len}")
    if not texts:
        return []
    enc = learner_tok(list(texts), add_special_tokens=False)["input_ids"]
    return [list(ids[:max_len]) for ids in enc]


@dataclass
class CrossTokens:
    """How one source's responses enter one learner's batch."""

    ids: list[list[int]]  # learner-token response ids, to append after the learner's templated prompt
    source_len: list[int]  # source tokens counted in the source's mean log-prob (prefix of each row)
    learner_len: list[int]  # len(ids[i]); recorded with source_len for diagnostics
    reused: bool  # True: identical tokenizers, source ids reused unchanged (EOS included)
    texts: list[str] | None = None  # exchanged texts (None when ids were reused)


def cross_tokens(
    source_tok,
    learner_tok,
    responses: Sequence[Sequence[int]] | torch.Tensor,
    max_len: int,
    cross_eos: str = "strip",
    *,
    source_stops: Collection[int] | None = None,
    reuse_same: bool = True,
) -> CrossTokens:
    """Map generated responses (source ids, right-padded after EOS) into the learner's token space.

    Identical tokenizers (unless ``reuse_same`` is off: ``same_tokenizer: reencode``, the released code, which
    decodes and re-encodes every response): ids cut after the first EOS (kept) and reused; ``source_len`` =
    that length.
    Different tokenizers: :func:`response_text` → :func:`retokenize`; ``source_len`` from
    :func:`source_token_count` with the same ``cross_eos``. ``source_stops``: every id that ends the
    source's generations (:func:`stop_token_ids`; default its tokenizer's EOS).
    """
    _check_mode(cross_eos)
    rows = [_ids(r) for r in responses]
    eos = frozenset(source_stops) if source_stops else source_tok.eos_token_id
    if reuse_same and same_tokenizer(source_tok, learner_tok):
        ids = []
        for r in rows:
            n = source_token_count(r, eos, "keep_text")
            ids.append(r[: min(n, max_len)])
        counts = [len(r) for r in ids]
        return CrossTokens(ids=ids, source_len=counts, learner_len=list(counts), reused=True)
    texts = [response_text(source_tok, r, cross_eos, stops=source_stops) for r in rows]
    ids = retokenize(texts, learner_tok, max_len)
    return CrossTokens(
        ids=ids,
        source_len=[source_token_count(r, eos, cross_eos) for r in rows],
        learner_len=[len(x) for x in ids],
        reused=False,
        texts=texts,
    )
