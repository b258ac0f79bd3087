"""A learner's update in the local engine: mini-batches in the method's order, micro-batches within a
token budget, and the loss of each with the backward restricted to rows that have a gradient."""

from __future__ import annotations

import contextlib
import math

import torch

from hacpo.agents.lm import (
    SharedPrefixes,
    token_budget_chunks,
    token_logprobs,
)
from hacpo.agents.vocab import head_grads_into_param
from hacpo.algo import (
    MiniBatch,
    NonFiniteLogProbs,
    metric_floats,
)
from hacpo.engines.core.live_rows import policy_loss_live_rows
from hacpo.engines.core.metrics import merge_parts
from hacpo.engines.core.nonfinite import NONFINITE_LOGP, SKIPPED, may_step
from hacpo.engines.core.order import minibatch_order

from .agent import Agent
from .rows import Rows


class UpdateMixin:
    """:class:`~hacpo.engines.local.trainer.LocalTrainer`'s updates: one learner's optimizer steps on its
    rows of a step."""

    def _order(self, rows: Rows, k: int, step: int) -> torch.Tensor:
        order = minibatch_order(
            self.cfg.minibatch_order, own=rows.is_own.tolist(), agent=rows.agent.tolist(),
            prompt=rows.prompt_index.tolist(), seed=self.cfg.seed, step=step, learner=k,
        )  # fmt: skip
        return torch.tensor(order, dtype=torch.long)

    def _update(self, k: int, rows: Rows, problems: list[dict], step: int) -> list[dict]:
        cfg, learner = self.cfg, self.agents[k].activate()  # its adapter on (a shared base's others off)
        p_ids, p_mask = learner.prompt_ids(problems, cfg.prompt_style, "cpu")
        order = self._order(rows, k, step)
        size = max(1, cfg.minibatch_size // self.method.minibatch_divisor)
        chunks = [order[i : i + size] for i in range(0, len(order), size)]
        logs, m = [], 0
        for _epoch in range(self.method.epochs):
            for idx in chunks:
                learner.opt.zero_grad(set_to_none=True)
                parts = self._micro_batches(idx, rows, p_ids)
                whole = None
                if len(parts) > 1:  # each part's loss is its share of the mini-batch's (hacpo.algo)
                    own = rows.is_own[idx]
                    whole = (float(len(idx)), float(rows.mask[idx][own].sum()))
                metrics = self._backward(learner, rows, parts, p_ids, p_mask, m, whole)
                trained = learner.trained()
                if metrics is None:  # non-finite log-probs: no loss, no gradient to take
                    own_rows = float(rows.is_own[idx].sum())
                    metrics = {"rows": float(len(idx)), "own_rows": own_rows, "loss": math.nan}
                    metrics |= {"grad_norm": math.nan, NONFINITE_LOGP: 1.0}
                else:
                    metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(trained, cfg.grad_clip))
                    metrics[NONFINITE_LOGP] = 0.0
                # a NaN/inf loss or gradient norm never reaches the weights (AdamW's moments included)
                step_ok = may_step(metrics.get("loss"), metrics["grad_norm"])
                if step_ok:
                    learner.opt.step()
                else:
                    learner.opt.zero_grad(set_to_none=True)
                metrics[SKIPPED] = 0.0 if step_ok else 1.0
                metrics["update"] = m
                logs.append(metrics)
                m += 1
        return logs

    def _backward(self, learner, rows: Rows, parts, p_ids, p_mask, m: int, whole) -> dict | None:
        """Each part's loss and backward; the update's merged metrics, or None when the learner's log-probs
        are not finite (:class:`~hacpo.algo.NonFiniteLogProbs`: the update is skipped, not the run)."""
        part_metrics = []
        for part in parts:
            try:
                loss, metrics = self._part_loss(learner, rows, part, p_ids, p_mask, m, whole)
            except NonFiniteLogProbs:
                learner.opt.zero_grad(set_to_none=True)
                return None
            with head_grads_into_param():  # a later part adds its head gradient in place
                loss.backward()
            part_metrics.append((len(part), metrics))
        floats = metric_floats([x for _, x in part_metrics])
        return merge_parts([(n, x) for (n, _), x in zip(part_metrics, floats, strict=True)])

    def _micro_batches(self, idx: torch.Tensor, rows: Rows, p_ids: torch.Tensor) -> list[torch.Tensor]:
        """``idx`` cut into parts of at most ``micro_batch_tokens`` tokens as the forward runs them, padded:
        rows × (prompt width + the part's longest response), longest rows first
        (:func:`~hacpo.agents.lm.token_budget_chunks`; a row longer than the budget is a part of its own).
        The loss is a sum over rows, so the parts' order changes nothing but float summation order. The
        whole mini-batch, in order, when unset."""
        lengths = rows.mask[idx].sum(1)
        budget, width = self.cfg.micro_batch_tokens, p_ids.shape[1]
        chunks = token_budget_chunks(lengths, budget, width, rows.prompt_index[idx])
        return [idx[chunk] for chunk in chunks]

    def _part_loss(self, learner, rows: Rows, idx, p_ids, p_mask, m: int, whole):
        """Loss of rows ``idx`` at update m: the mini-batch's, or (``whole`` = its row and own-token counts)
        this micro-batch's share of it."""
        resp_mask = rows.mask[idx]
        width = max(1, int(resp_mask.sum(1).max()))
        resp = rows.response[idx, :width]
        dev = self.device

        def to_dev(t: torch.Tensor) -> torch.Tensor:
            return t.to(dev, non_blocking=True)  # from pageable host memory: staged at once, no stream sync

        batch = MiniBatch(
            logp=torch.empty(0),
            mask=to_dev(resp_mask[:, :width]),
            adv=to_dev(rows.adv[idx]),
            old_mean_logp=to_dev(rows.old_mean_logp[idx]),
            is_own=to_dev(rows.is_own[idx]),
            omega=to_dev(rows.omega[idx]),
            old_logp=to_dev(rows.old_logp[idx, :width]),
            ref_logp=to_dev(rows.ref_logp[idx, :width]),
            n_total=whole[0] if whole else None,
            own_tokens=whole[1] if whole else None,
        )
        with self.autocast():
            index = rows.prompt_index[idx]
            return self._minibatch_loss(learner, batch, index, resp, p_ids, p_mask, m, resp_mask[:, :width])

    def _shared(self, learner: Agent, prompt_index, resp, resp_mask, p_ids, p_mask) -> SharedPrefixes:
        """The rows' prompts and shared response prefixes, encoded once for every pass over these rows."""
        prompts, rows = torch.unique(prompt_index, return_inverse=True)
        return SharedPrefixes(  # host tensors: it groups them there and moves them itself (no device sync)
            learner.model,
            p_ids[prompts],
            rows,
            resp,
            prompt_mask=p_mask[prompts],
            response_mask=resp_mask,
            device=self.device,
        )

    def _minibatch_loss(self, learner, batch: MiniBatch, prompt_index, resp, p_ids, p_mask, m, mask=None):
        """Loss of one mini-batch (:func:`~hacpo.engines.core.live_rows.policy_loss_live_rows`: with
        ``skip_dead_rows``, no backward for HACPO cross rows whose clamp is flat; exact). Every pass over
        these rows reuses one encoding of their prompts and shared response prefixes; with
        ``gradient_checkpointing`` each pass is a plain forward over prompt + response instead (activation
        recomputation needs no KV cache). ``mask``: ``batch.mask`` on the host (default: copied there)."""
        if self.cfg.gradient_checkpointing:
            logprobs = self._plain_logprobs(learner, prompt_index, resp, p_ids, p_mask)
        else:
            mask = batch.mask.cpu() if mask is None else mask
            shared = self._shared(learner, prompt_index, resp, mask, p_ids, p_mask)

            def logprobs(rows, detach):
                return shared.logprobs(rows, detach=detach)

        loss, metrics = policy_loss_live_rows(batch, self.spec, m, logprobs, self.cfg.skip_dead_rows)
        if loss is None:  # every row clamped: zero gradients, so the optimizer still steps as unskipped
            loss = sum(p.sum() for p in learner.trained()) * 0.0
        return loss, metrics

    def _plain_logprobs(self, learner, prompt_index, resp, p_ids, p_mask):
        """``logprobs(rows, detach)`` by one plain forward of each row's left-padded prompt + response."""
        dev = self.device

        def logprobs(rows, detach):
            sel = torch.arange(resp.shape[0]) if rows is None else rows.cpu()
            pid = prompt_index[sel]
            ids = torch.cat([p_ids[pid], resp[sel]], dim=1).to(dev, non_blocking=True)
            attn = torch.cat([p_mask[pid], torch.ones_like(resp[sel], dtype=torch.bool)], dim=1)
            padded = not bool(attn.all())  # read here, on the host
            attn = attn.to(dev, non_blocking=True)
            with torch.no_grad() if detach else contextlib.nullcontext():
                return token_logprobs(learner.model, ids, p_ids.shape[1], attention_mask=attn, padded=padded)

        return logprobs
