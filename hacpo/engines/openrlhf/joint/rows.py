"""A learner's training rows as OpenRLHF ``Experience``s: own rows, cross rows, joint advantages.

Rows are single-sample ``Experience``s, the unit OpenRLHF's replay buffer holds (``split_experience_batch``
then ``remove_padding_in_sequences``). HACPO's per-row fields travel in ``info`` as scalars, so they survive
OpenRLHF's split → ``make_experience_batch`` → ``to_device`` unchanged (:data:`KEYS`):

- ``hacpo/prompt_id``: the joint group a row belongs to — advantages group by it, never by position (§3.2);
- ``hacpo/source``: the generating agent's index; ``hacpo/is_self``: 1 on the learner's own rows;
- ``hacpo/old_mean_logp``: the ratio denominator (§3.4) — own rows: the learner's pre-update mean log-prob;
  cross rows: the *source's* pre-update mean log-prob over the source's tokens of the shared text;
- ``hacpo/omega``: ω^(j,k) of a cross row (1 on own rows); ``hacpo/adv``: the learner's advantage A^(k).

Text exchange is :func:`hacpo.agents.retokenize.cross_tokens`, the function the local engine uses: ids
reused for identical tokenizers, else decoded (terminal EOS stripped) and re-encoded after the learner's
own templated prompt, so the learner sees its own chat template around every row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

import torch
from openrlhf.trainer.ppo_utils.experience import Experience

from hacpo.agents.retokenize import cross_tokens
from hacpo.algo.methods import Method

PROMPT_ID, SOURCE, IS_SELF = "hacpo/prompt_id", "hacpo/source", "hacpo/is_self"
OLD_MEAN_LOGP, OMEGA, ADV = "hacpo/old_mean_logp", "hacpo/omega", "hacpo/adv"
KEYS = (PROMPT_ID, SOURCE, IS_SELF, OLD_MEAN_LOGP, OMEGA, ADV)


def info_column(exp: Experience, key: str) -> torch.Tensor:
    """``info[key]`` of a batched Experience as a 1-D tensor (buffer batches hold lists of 0-d tensors)."""
    value = exp.info[key]
    if isinstance(value, list):
        return torch.stack([torch.as_tensor(v) for v in value]).reshape(-1)
    return torch.as_tensor(value).reshape(-1)


def _scalar(x) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.float64).reshape(())


def response_span(row: Experience) -> tuple[int, int]:
    """``[start, end)`` of the response in a single row's ``sequences`` (the action span, shifted by one)."""
    mask = row.action_mask.reshape(-1).bool()
    idx = torch.nonzero(mask).flatten()
    if len(idx) == 0:
        n = int(row.attention_mask.reshape(-1).sum())
        return n, n
    return int(idx[0]) + 1, int(idx[-1]) + 2


def response_ids(row: Experience) -> list[int]:
    start, end = response_span(row)
    return row.sequences.reshape(-1)[start:end].tolist()


def prompt_ids(row: Experience) -> list[int]:
    return row.sequences.reshape(-1)[: response_span(row)[0]].tolist()


def response_logp(row: Experience) -> torch.Tensor:
    """The row's per-token log-probs on its response tokens (from ``make_experience``, before any update)."""
    mask = row.action_mask.reshape(-1).bool()
    return row.action_log_probs.reshape(-1)[mask]


def mark_own(rows: Sequence[Experience], agent: int, prompt_ids_of: Sequence[int]) -> None:
    """Tag an agent's own rows after its ``make_experience``: prompt id, source, and the ratio denominator
    (its pre-update mean log-prob over the response, EOS included: the local engine's ``seq_mean_logp``)."""
    if len(rows) != len(prompt_ids_of):
        raise ValueError(f"{len(rows)} rows but {len(prompt_ids_of)} prompt ids")
    for row, pid in zip(rows, prompt_ids_of, strict=True):
        lp = response_logp(row)
        row.info.update(
            {
                PROMPT_ID: _scalar(pid),
                SOURCE: _scalar(agent),
                IS_SELF: _scalar(1.0),
                OLD_MEAN_LOGP: _scalar(lp.double().sum() / max(1, lp.numel())),
                OMEGA: _scalar(1.0),
            }
        )


def engine_gap(rows: Sequence[Experience]) -> dict[str, float]:
    """|vLLM's log-prob − the actor's| per response token of scored own rows: the sampled token's log-prob as
    the engine computed it while sampling (``rollout_log_probs``) against the DeepSpeed actor's for the same
    token (``action_log_probs``, from ``make_experience``). Both hold the same weights after every weight
    sync, so the gap is kernel rounding (bf16 actors: ~1e-2); a sync that missed a tensor (a tied embedding,
    one kind of attention layer) shows as the size of an update. ``{}`` when rows carry no vLLM log-probs."""
    gaps = []
    for row in rows:
        if row.rollout_log_probs is None:
            return {}
        mask = row.action_mask.reshape(-1).bool()
        vllm = row.rollout_log_probs.reshape(-1)[mask].double()
        gaps.append((vllm - row.action_log_probs.reshape(-1)[mask].double()).abs())
    gap = torch.cat(gaps) if gaps else torch.zeros(0, dtype=torch.float64)
    if gap.numel() == 0:
        return {}
    return {"engine_logp_gap_mean": float(gap.mean()), "engine_logp_gap_max": float(gap.max())}


def learner_prompts(own_rows: Sequence[Experience]) -> dict[int, list[int]]:
    """The learner's templated prompt ids per prompt id, taken from its own rows (rendered once, by it)."""
    return {int(row.info[PROMPT_ID]): prompt_ids(row) for row in own_rows}


def cross_rows(
    source_rows: Sequence[Experience],
    source_tok,
    learner_tok,
    prompts: dict[int, list[int]],
    omega: float,
    max_new_tokens: int,
    max_len: int,
    cross_eos: str = "strip",
    source_stops=None,
    same_tokenizer: str = "reuse_ids",
) -> list[Experience]:
    """Source j's rows in learner k's token space (spec §4), each a single-row Experience for k's buffer.

    ``prompts``: k's own templated prompt ids per prompt id (:func:`learner_prompts`). The row's ratio
    denominator is j's pre-update mean log-prob over the tokens of the shared text (EOS excluded when the
    text is re-encoded with ``cross_eos="strip"``, every stop id of j's counting as its EOS, ``source_stops``;
    ids and EOS reused for identical tokenizers unless ``same_tokenizer="reencode"``); j's reward
    and score are copied. Log-prob fields are zeros: k's loss needs no old or reference log-probs on cross
    rows (no token ratio, KL on own rows only).
    """
    if not source_rows:
        return []
    responses = [response_ids(r) for r in source_rows]
    shared = cross_tokens(
        source_tok, learner_tok, responses, max_new_tokens, cross_eos, source_stops=source_stops,
        reuse_same=same_tokenizer == "reuse_ids",
    )
    out = []
    for row, ids, n_src in zip(source_rows, shared.ids, shared.source_len, strict=True):
        pid = int(row.info[PROMPT_ID])
        if pid not in prompts:
            raise ValueError(f"prompt id {pid} of a cross row has no prompt in the learner's own rows")
        lp = response_logp(row)[:n_src]
        seq = (prompts[pid] + list(ids))[:max_len]
        n_prompt = min(len(prompts[pid]), len(seq))
        length = len(seq)
        action_mask = torch.zeros(max(length - 1, 0), dtype=row.action_mask.dtype)  # OpenRLHF's dtypes
        action_mask[max(n_prompt - 1, 0) :] = 1
        zeros = torch.zeros(max(length - 1, 0), dtype=torch.float32)
        info = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in row.info.items()}
        info.update(
            {
                IS_SELF: _scalar(0.0),
                OLD_MEAN_LOGP: _scalar(lp.double().sum() / max(1, lp.numel())),
                OMEGA: _scalar(omega),
                "kl": torch.zeros_like(torch.as_tensor(info.get("kl", 0.0))),
            }
        )
        out.append(
            Experience(
                sequences=torch.tensor(seq, dtype=torch.long),
                attention_mask=torch.ones(length, dtype=torch.long),
                action_mask=action_mask,
                action_log_probs=zeros,
                base_action_log_probs=None if row.base_action_log_probs is None else zeros.clone(),
                rollout_log_probs=None,
                rewards=row.rewards.clone(),
                scores=None if row.scores is None else row.scores.clone(),
                response_length=torch.tensor(length - n_prompt, dtype=row.response_length.dtype),
                truncated=row.truncated.clone() if row.truncated is not None else None,
                total_length=torch.tensor(length, dtype=row.total_length.dtype),
                prompts=list(row.prompts),
                labels=list(row.labels),
                images=list(row.images),
                mm_train_inputs=list(row.mm_train_inputs),
                info=info,
            )
        )
    return out


def rollout_form(row: Experience) -> Experience:
    """A buffer row (no batch dimension) as OpenRLHF's generator makes a sample: every tensor with a batch
    dimension of 1, ``info`` values of shape (1,). ``make_experience`` (``Experience.concat_experiences``)
    takes samples of this form only."""
    out = {}
    for f in fields(Experience):
        value = getattr(row, f.name)
        if isinstance(value, torch.Tensor):
            value = value.reshape(1, -1) if Experience.is_step_tensor_field(f.name) else value.reshape(1)
        elif f.name == "info":
            value = {k: torch.as_tensor(v).reshape(1) for k, v in value.items()}
        elif isinstance(value, list):
            value = list(value)
        out[f.name] = value
    return Experience(**out)


def learner_old_logp(cross: Sequence[Experience], scored: Sequence[Experience]) -> None:
    """Naive's ``self_old`` reading (spec §2.5): each cross row's ratio denominator becomes the *learner's*
    pre-update mean log-prob of the row's tokens, from ``scored`` = the same rows through the learner's
    ``make_experience`` (cross samples treated as on-policy, as the paper's framework computes every row's
    old log-probs with the learner's actor). Matched row by row; a reordering is an error."""
    if len(cross) != len(scored):
        raise ValueError(f"{len(scored)} scored rows for {len(cross)} cross rows")
    for row, s in zip(cross, scored, strict=True):
        if not torch.equal(row.sequences.reshape(-1), s.sequences.reshape(-1)):
            raise ValueError("the learner's log-probs came back for other rows than its cross rows")
        lp = response_logp(s)
        row.info[OLD_MEAN_LOGP] = _scalar(lp.double().sum() / max(1, lp.numel()))


# Experience fields HACPO's loss reads (joint/loss.py); any other field is OpenRLHF's bookkeeping.
LOSS_FIELDS = ("sequences", "attention_mask", "action_mask", "action_log_probs", "advantages")


def batchable(rows: Sequence[Experience]) -> list[Experience]:
    """Rows that OpenRLHF's ``make_experience_batch`` can stack together, whatever made them.

    It batches a field by its first row's type: a field set on some rows and ``None`` on others (own rows
    carry ``make_experience``'s per-token ``kl``, values, rollout log-probs; cross rows do not) would be
    zero-padded with a ``None`` inside, and an ``info`` key missing on some rows raises. Such fields are set
    to ``None`` on every row, ``info`` keeps the keys every row has; a field the loss reads must be on
    every row (KL's ``base_action_log_probs`` is zeros on cross rows, so it stays)."""
    rows = list(rows)
    if not rows:
        return rows
    for f in fields(Experience):
        present = [getattr(r, f.name) is not None for r in rows]
        if all(present) or not any(present):
            continue
        if f.name in LOSS_FIELDS or f.name == "base_action_log_probs":
            raise ValueError(f"Experience.{f.name} is missing on {present.count(False)} of {len(rows)} rows")
        for r in rows:
            setattr(r, f.name, None)
    common = set.intersection(*(set(r.info) for r in rows))
    lost = sorted(k for k in KEYS if k not in common)
    if lost:
        raise ValueError(f"HACPO's row fields {lost} are missing on some rows")
    for r in rows:
        r.info = {k: v for k, v in r.info.items() if k in common}
    return rows


def assign_advantages(
    rows: Sequence[Experience], learner: int, n_agents: int, omegas, method: Method
) -> list[Experience]:
    """Learner k's advantages on its rows (own + cross), grouped by prompt id and source (§3.2), and the rows
    its update trains on under the method's sharing rule (:meth:`hacpo.algo.Method.learner_rows`: all of
    them; XGRPO's own rows; SGT's own rows with the rescue set in place of the failed ones).

    Joint methods: ω^(k,·) = ``omegas[k]`` and the method's baseline; single-agent methods: the own group's.
    Written to ``info`` and, as OpenRLHF expects, to ``advantages`` = ``returns`` on every response token.
    """
    if not rows:
        raise ValueError("no rows to compute advantages on")
    pid = torch.stack([torch.as_tensor(r.info[PROMPT_ID]) for r in rows]).long()
    src = torch.stack([torch.as_tensor(r.info[SOURCE]) for r in rows]).long()
    sources = sorted(set(src.tolist()))
    if learner not in sources:
        raise ValueError(f"learner {learner} has no own rows among the rows (sources {sources})")
    pos = torch.tensor([sources.index(s) for s in src.tolist()])
    rewards = torch.stack([r.rewards.reshape(()) for r in rows]).to(torch.float32)
    weights = None
    if method.joint:
        w = torch.as_tensor(omegas, dtype=torch.float64)
        if w.shape != (n_agents, n_agents):
            raise ValueError(f"omegas must be [{n_agents}, {n_agents}], got {tuple(w.shape)}")
        weights = w[learner, sources]
    elif len(sources) != 1:
        raise ValueError(f"method {method.name!r} is single-agent but rows come from agents {sources}")
    got = method.learner_rows(rewards, pid, pos, len(sources), sources.index(learner), weights)
    for row, a in zip(rows, got.adv.tolist(), strict=True):
        row.info[ADV] = _scalar(a)
        per_token = row.action_mask.to(torch.float32) * a
        row.advantages, row.returns = per_token, per_token.clone()
    return [row for row, kept in zip(rows, got.keep.tolist(), strict=True) if kept]
