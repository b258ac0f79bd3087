"""The local engine: a real single-process trainer for every method of the registry (CPU or one GPU).

It follows the per-step procedure of ``spec/hacpo-algorithm.md`` §5 exactly and takes every formula from
:mod:`hacpo.algo`:

1. the same B prompts for every agent; G rollouts each from the agent's current policy and chat template;
   0/1 rewards; capability window updated (it includes this step);
2. scoring before any update: each generator's pre-update log-probs (the sampling log-probs, exact at
   temperature 1 / top-p 1, or a separate forward), reference log-probs for KL on own rows;
3. sequential updates, one learner after the other: own rows + the other agents' rows re-tokenised for
   the learner; per-prompt advantages; mixed (or self-first) mini-batches; update m drives stepwise clipping.

Outputs follow the run-directory contract of :mod:`hacpo.runio`; a killed run resumes from its last
checkpoint and ends with the same metrics as an uninterrupted one (bitwise on the same machine and threads).
"""

from __future__ import annotations

import contextlib
import resource
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hacpo.agents import adapters
from hacpo.agents.lm import (
    SharedPrefixes,
    generate,
    left_pad,
    policy_temperature,
    token_budget_chunks,
    token_logprobs,
    token_logprobs_shared_prompt,
)
from hacpo.agents.prompting import greedy_accuracy, prompt_ids
from hacpo.agents.retokenize import (
    pad_token_id,
    response_text,
    retokenize,
    same_tokenizer,
    source_logp_mask,
    stop_token_ids,
)
from hacpo.agents.vocab import head_grads_into_param, sparse_tied_embedding_grads
from hacpo.algo import (
    CapabilityTracker,
    MiniBatch,
    metric_floats,
    seq_mean_logp,
)
from hacpo.config import TrainConfig
from hacpo.cpu import keep_freed_memory, resolve_precision, return_freed_memory
from hacpo.data.synthetic import as_problem
from hacpo.engines import core
from hacpo.engines.core import AgentRollouts, RunLoop
from hacpo.engines.core.live_rows import policy_loss_live_rows
from hacpo.engines.core.metrics import merge_parts
from hacpo.engines.core.order import minibatch_order
from hacpo.engines.core.schedule import batch_for_step, read_problems  # noqa: F401 (old import path)
from hacpo.engines.phases import Phases
from hacpo.reward import Scorer
from hacpo.runio import (
    Profile,
    RunRecord,
    atomic_dir,
    intact_resume_step,
    keep_final_weights,
    machine,
    run_lock,
    sweep_temporaries,
    versions,
    write_checkpoint_manifest,
)

NO_CUDA = "device: cuda, but torch sees no CUDA device here: use device: auto (or cpu)"


# ---------------------------------------------------------------------------------------------- data
# ---------------------------------------------------------------------------------------------- agents
@dataclass
class Agent:
    name: str
    path: str
    model: torch.nn.Module
    ref: torch.nn.Module | None
    tok: object
    opt: torch.optim.Optimizer
    gen: torch.Generator
    stop_ids: frozenset[int]  # every id that ends this model's generations (EOS list, end of turn)
    pad_id: int
    peft: torch.nn.Module | None = None  # peft's wrapper of ``model`` when a LoRA adapter trains
    prompt_cache: dict = field(default_factory=dict)

    @contextlib.contextmanager
    def reference(self):
        """The KL reference: the base with the adapter off (LoRA), else the frozen copy (full)."""
        if self.peft is not None:
            with adapters.reference(self.peft) as model:
                yield model
        else:
            yield self.ref

    def prompt_ids(self, problems: list[dict], style: str, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt ids ``[B, Tp]`` and mask, rendered with this agent's chat template."""
        seqs = []
        for p in problems:
            ids = self.prompt_cache.get(p["id"])
            if ids is None:
                ids = self.prompt_cache[p["id"]] = prompt_ids(self.tok, as_problem(p), style)
            seqs.append(ids)
        ids, mask = left_pad(seqs, self.pad_id)
        return ids.to(device), mask.to(device)


def load_learner(ref, cfg: TrainConfig, device, index: int, with_ref: bool) -> Agent:
    """An agent to train: its model, reference model (KL), tokenizer, optimizer and sampling generator."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    tok = AutoTokenizer.from_pretrained(ref.path)
    model = AutoModelForCausalLM.from_pretrained(ref.path, dtype=torch.float32).to(device)
    lora, peft_model = cfg.agent_adapter(index), None
    if lora is not None:  # the base frozen and held once; the KL reference is the adapter switched off
        peft_model = adapters.attach(model, lora, ref.path, what=f"agent {ref.name!r}: adapter.lora")
        model, with_ref = adapters.inner(peft_model), False
    model.train()
    if peft_model is None:
        sparse_tied_embedding_grads(model)  # no second dense [V, H] gradient for a tied embedding
    if cfg.gradient_checkpointing:  # only the update's plain forward runs in train mode (see eval_mode)
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5.2x; the old name warns
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    ref_model = None
    if with_ref:
        ref_model = AutoModelForCausalLM.from_pretrained(ref.path, dtype=torch.float32).to(device).eval()
        ref_model.requires_grad_(False)
    # fused: one kernel for all parameters instead of a loop over them (2.5× faster step on a CPU)
    opt = torch.optim.AdamW(
        adapters.trainable_parameters(model),
        lr=cfg.lr,
        betas=cfg.betas,
        weight_decay=cfg.weight_decay,
        fused=True,
    )
    gen = torch.Generator(device=device).manual_seed(cfg.seed * 1000 + index)
    stops = stop_token_ids(tok, model)
    if not stops:
        raise ValueError(f"agent {ref.name!r}: {ref.path} has no stop id (no eos_token or generation_config)")
    pad = pad_token_id(tok, stops)
    return Agent(ref.name, ref.path, model, ref_model, tok, opt, gen, stops, pad, peft_model)


# ---------------------------------------------------------------------------------------------- rollouts
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


class LocalTrainer:
    def __init__(self, cfg: TrainConfig):
        problems = cfg.path_problems()  # every problem in one message
        if cfg.device == "cuda" and not torch.cuda.is_available():
            problems.insert(0, NO_CUDA)
        if problems:
            raise ValueError("; ".join(problems))
        self.cfg = cfg
        self.method = cfg.resolved_method()
        self.spec = cfg.loss_spec()
        self.out = Path(cfg.out_dir)
        if cfg.device == "auto":
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            self.device = torch.device(cfg.device)
        torch.set_num_threads(cfg.threads)
        self.precision = self._precision()
        self.problems = read_problems(cfg.train_file)
        val = read_problems(cfg.val_file)[: cfg.val_size] if cfg.val_file and cfg.val_size else []
        self.val = [as_problem(p) for p in val]  # greedy validation problems
        torch.manual_seed(cfg.seed)
        with_ref = self.spec.kl_beta > 0
        self.agents = [load_learner(a, cfg, self.device, i, with_ref) for i, a in enumerate(cfg.agents)]
        self.tracker = CapabilityTracker(len(self.agents), cfg.capability_window, cfg.omega_warmup_steps)
        self.scorer = Scorer(  # training and validation reward
            workers=cfg.scorer_workers,
            timeout_s=cfg.reward_timeout_s,
            reward=cfg.reward,
            retry_budget_s=cfg.reward_retry_budget_s,
        )
        reuse = cfg.same_tokenizer == "reuse_ids"  # reencode: the released code decodes every response
        self.same_tok = [[reuse and same_tokenizer(a.tok, b.tok) for b in self.agents] for a in self.agents]
        self.loop = RunLoop(cfg, [a.name for a in self.agents], val_size=len(self.val))
        self.phase = Phases(self.device)
        self.gen_tokens = 0
        if cfg.old_logp == "auto":  # the sampler's log-probs are π_old exactly only where the decoder and
            # the training forward run the same fp32 CPU kernels; on CUDA (TF32, other kernel shapes) or in
            # bf16 they differ by more than GSPO's 3e-4 clip, so π_old is recomputed by the trainer there
            self.sampler_logp = (
                cfg.temperature == 1.0
                and cfg.top_p == 1.0
                and self.device.type == "cpu"
                and self.precision == "fp32"
            )
        else:
            self.sampler_logp = cfg.old_logp == "sampler"

    def _precision(self) -> str:
        """fp32 or bf16: ``precision`` as given, or ``auto`` resolved for this machine (:mod:`hacpo.cpu`);
        a resumed run keeps the choice its ``run.json`` recorded, so one run never changes precision."""
        prev = RunRecord.read(self.out)
        if prev is not None and prev.config_hash == self.config_hash() and prev.details.get("precision"):
            return prev.details["precision"]
        return resolve_precision(self.cfg.precision, self.device.type)

    def autocast(self):
        """bf16 autocast around forwards when the precision is bf16 (fp32 master weights and optimizer)."""
        if self.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # ----------------------------------------------------------------------------- bookkeeping
    def config_hash(self) -> str:
        return self.cfg.config_hash()

    def _start_or_resume(self) -> int:
        """The step to start from: 0, the newest checkpoint every agent has, or -1 (already complete); the
        logs cut back to it and the validation at it run where due (:meth:`RunLoop.resume`)."""
        prev = RunRecord.for_config(self.out, self.config_hash())
        if prev is not None and prev.complete:
            return -1
        sweep_temporaries(self.out)  # leftovers of writes a kill interrupted (never read as complete)
        # the newest checkpoint every agent has intact (a damaged one is set aside, named with why)
        start = intact_resume_step(self.out, [a.name for a in self.agents], say=_say)
        if start:
            _say(f"resuming {self.out} from its step-{start} checkpoint")
            if prev is not None and prev.step > start:
                _say(f"hacpo: steps {start + 1}–{prev.step} of {self.out} will be trained again")
            self._load_checkpoint(start)
        self.loop.resume(start, self.validate)
        self._write_run_json("running", start)
        if start:
            self._prune_checkpoints(start)
        return start

    def _write_run_json(self, status: str, step: int, **final) -> None:
        RunRecord(
            status=status,
            step=step,
            config_hash=self.config_hash(),
            config=self.cfg.model_dump(),
            engine="local",
            versions=versions(),
            machine=machine(),
            details={
                "method": self.method.to_dict(),
                "loss_spec": self.spec.__dict__,
                "device": str(self.device),
                "sampler_logp_as_old": self.sampler_logp,
                "fidelity": self.cfg.fidelity_record(),
                "precision": self.precision,  # auto resolved here (hacpo.cpu.resolve_precision)
                "adapters": {
                    a.name: (lora.model_dump() if (lora := self.cfg.agent_adapter(i)) else "full")
                    for i, a in enumerate(self.cfg.agents)
                },
            },
            **final,
        ).write(self.out)

    def _save_checkpoint(self, step: int) -> None:
        """Every agent's checkpoint, then ``run.json`` (the step is resumable from here), then pruning: a kill
        at any point leaves the previous complete checkpoint of every agent in place."""
        for agent in self.agents:
            final = self.out / "checkpoints" / agent.name / f"step-{step}"
            with atomic_dir(final) as tmp:
                if agent.peft is not None:  # what trained: the adapter (megabytes), its base by path
                    adapters.save(agent.peft, tmp)
                    agent.model.generation_config.save_pretrained(tmp)  # every stop id, beside the tokenizer
                else:
                    agent.model.save_pretrained(tmp)
                agent.tok.save_pretrained(tmp)
                torch.save(
                    {
                        "step": step,
                        "optimizer": agent.opt.state_dict(),
                        "generator": agent.gen.get_state(),
                        "capability": self.tracker.state_dict(),
                        "torch_rng": torch.get_rng_state(),
                        "device_type": self.device.type,
                    },
                    tmp / "trainer_state.pt",
                )
                write_checkpoint_manifest(tmp)  # last: what the checkpoint holds, checked on resume
        self._write_run_json("running", step)
        self._prune_checkpoints(step)

    def _prune_checkpoints(self, newest: int) -> None:
        """Keep each agent's ``keep_checkpoints`` newest checkpoints, and always step ``newest`` (the one
        run.json records). Also run on resume: a kill between run.json and pruning leaves extra ones."""
        for agent in self.agents:
            folder = self.out / "checkpoints" / agent.name
            periodic = sorted(int(p.name.split("-")[1]) for p in folder.glob("step-*") if p.is_dir())
            for s in periodic[: -self.cfg.keep_checkpoints]:
                if s != newest:
                    shutil.rmtree(folder / f"step-{s}", ignore_errors=True)

    def _load_checkpoint(self, step: int) -> None:
        from transformers import AutoModelForCausalLM

        for agent in self.agents:
            d = self.out / "checkpoints" / agent.name / f"step-{step}"
            # host tensors: the optimizer moves its state to the parameters' device when it loads it
            # weights_only: a run directory copied from elsewhere cannot run code on resume
            state = torch.load(d / "trainer_state.pt", map_location="cpu", weights_only=True)
            saved = state.get("device_type", "cpu")
            if saved != self.device.type:
                raise ValueError(
                    f"{self.out} was trained on {saved} and would resume on {self.device.type}: its "
                    "samplers' random streams belong to one device type, so resume it with "
                    f"`device: {saved}`, or train into a new out_dir"
                )
            if agent.peft is not None:
                adapters.load_weights(agent.peft, d)
            else:
                loaded = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
                agent.model.load_state_dict(loaded.state_dict())
            agent.opt.load_state_dict(state["optimizer"])
            agent.gen.set_state(state["generator"])
            self.tracker.load_state_dict(state["capability"])
            torch.set_rng_state(state["torch_rng"])

    # ----------------------------------------------------------------------------- stage 1 and 2
    def _rollout(self, agent: Agent, problems: list[dict], g: int) -> Rollouts:
        cfg = self.cfg
        with self.phase("generate"), self.autocast():
            p_ids, p_mask = agent.prompt_ids(problems, cfg.prompt_style, self.device)
            index = torch.arange(len(problems)).repeat_interleave(g)
            agent.model.eval()
            out = generate(
                agent.model,
                p_ids,
                cfg.max_new_tokens,
                eos_id=agent.stop_ids,
                pad_id=agent.pad_id,
                prompt_mask=p_mask,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                generator=agent.gen,
                prompt_index=index.to(self.device),
            )
            agent.model.train()
            self.gen_tokens += int(out.mask.sum())

        with self.phase("score"):
            tokens = out.tokens.cpu()
            stops = agent.stop_ids  # the reward never sees a stop id
            reward_texts = [response_text(agent.tok, row, stops=stops) for row in tokens]
            texts = (
                reward_texts
                if cfg.cross_eos == "strip"
                else [response_text(agent.tok, row, cfg.cross_eos, stops=stops) for row in tokens]
            )
            picked = [problems[i] for i in index.tolist()]
            golds, ids = [p["answer"] for p in picked], [p.get("id") for p in picked]
            metadata = [p.get("metadata") or {} for p in picked]  # a custom verifier's extra fields
            rewards = torch.tensor(self.scorer.score(reward_texts, golds, metadata, ids), dtype=torch.float32)

        with self.phase("logprobs"), self.autocast(), eval_mode(agent.model):
            rows = index.to(self.device)
            logp = out.logp
            rollout = (p_ids, rows, out.tokens)
            masks = {"prompt_mask": p_mask, "response_mask": out.mask}
            budget = cfg.micro_batch_tokens  # the logits of a no-grad pass stay within the update's budget
            with torch.no_grad():
                if not self.sampler_logp:
                    logp = (
                        token_logprobs_shared_prompt(agent.model, *rollout, **masks, max_tokens=budget)
                        * out.mask
                    )
                ref_logp = None
                if self.spec.kl_beta > 0:
                    with agent.reference() as ref:
                        ref_logp = (
                            token_logprobs_shared_prompt(ref, *rollout, **masks, max_tokens=budget) * out.mask
                        )
            # The shared text drops the terminal EOS (cross_eos: strip): the generator's mean excludes it too.
            shared_mask = source_logp_mask(out.tokens, agent.stop_ids, cfg.cross_eos)
        return Rollouts(
            prompt_index=index,
            tokens=out.tokens,
            logp=logp,
            mask=out.mask,
            texts=texts,
            rewards=rewards,
            src_mean_logp=seq_mean_logp(logp, shared_mask),
            ref_logp=ref_logp,
        )

    # ----------------------------------------------------------------------------- stage 3
    def _rows_for(self, k: int, rolls: list[Rollouts], omegas: torch.Tensor) -> Rows:
        """Own rows of learner k plus (joint methods) every other agent's rows re-tokenised for k, as the
        method's sharing rule keeps them (all; none for XGRPO, whose baseline reads their rewards; SGT's
        rescue set)."""
        learner = self.agents[k]
        sources = list(range(len(self.agents))) if self.method.joint else [k]
        parts = []
        for pos, j in enumerate(sources):
            r = rolls[j]
            n = len(r.texts)
            if j == k or self.same_tok[j][k]:  # identical tokenizer: reuse the ids, EOS included (§4)
                resp, m = r.tokens.cpu(), r.mask.cpu()
                mean_src = seq_mean_logp(r.logp, r.mask).cpu()
            else:
                resp, m = _pad_rows(retokenize(r.texts, learner.tok, self.cfg.max_new_tokens), learner.pad_id)
                mean_src = r.src_mean_logp.cpu()
            zeros = torch.zeros_like(resp, dtype=torch.float32)
            own = j == k
            parts.append(
                dict(
                    response=resp,
                    mask=m,
                    is_own=torch.full((n,), own),
                    agent=torch.full((n,), j),
                    old_mean_logp=mean_src,
                    omega=torch.full((n,), 1.0 if own else float(omegas[j, k]), dtype=torch.float64),
                    prompt_index=r.prompt_index,
                    source=torch.full((n,), pos),
                    old_logp=r.logp.cpu() if own else zeros,
                    ref_logp=r.ref_logp.cpu() if (own and r.ref_logp is not None) else zeros,
                )
            )
        width = max(p["response"].shape[1] for p in parts)
        fill = {"response": learner.pad_id, "mask": False, "old_logp": 0.0, "ref_logp": 0.0}
        cat = {
            key: torch.cat(
                [
                    torch.nn.functional.pad(p[key], (0, width - p[key].shape[1]), value=fill[key])
                    if key in fill
                    else p[key]
                    for p in parts
                ]
            )
            for key in parts[0]
        }
        source = cat.pop("source")
        rewards = torch.cat([rolls[j].rewards for j in sources])
        pos, weights = sources.index(k), omegas[k, sources]
        got = self.method.learner_rows(rewards, cat["prompt_index"], source, len(sources), pos, weights)
        keep = torch.nonzero(got.keep).flatten()  # the method's sharing rule: XGRPO own rows, SGT rescues
        return Rows(**{key: v[keep] for key, v in cat.items()}, adv=got.adv[keep])

    def _order(self, rows: Rows, k: int, step: int) -> torch.Tensor:
        order = minibatch_order(
            self.cfg.minibatch_order, own=rows.is_own.tolist(), agent=rows.agent.tolist(),
            prompt=rows.prompt_index.tolist(), seed=self.cfg.seed, step=step, learner=k,
        )  # fmt: skip
        return torch.tensor(order, dtype=torch.long)

    def _update(self, k: int, rows: Rows, problems: list[dict], step: int) -> list[dict]:
        cfg, learner = self.cfg, self.agents[k]
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
                part_metrics = []
                for part in parts:
                    loss, metrics = self._part_loss(learner, rows, part, p_ids, p_mask, m, whole)
                    with head_grads_into_param():  # a later part adds its head gradient in place
                        loss.backward()
                    part_metrics.append((len(part), metrics))
                metrics = merge_parts(
                    [
                        (n, x)
                        for (n, _), x in zip(
                            part_metrics, metric_floats([x for _, x in part_metrics]), strict=True
                        )
                    ]
                )
                trained = adapters.trainable_parameters(learner.model)
                metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(trained, cfg.grad_clip))
                learner.opt.step()
                metrics["update"] = m
                logs.append(metrics)
                m += 1
        return logs

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
        batch = MiniBatch(
            logp=torch.empty(0),
            mask=resp_mask[:, :width].to(dev),
            adv=rows.adv[idx].to(dev),
            old_mean_logp=rows.old_mean_logp[idx].to(dev),
            is_own=rows.is_own[idx].to(dev),
            omega=rows.omega[idx].to(dev),
            old_logp=rows.old_logp[idx, :width].to(dev),
            ref_logp=rows.ref_logp[idx, :width].to(dev),
            n_total=whole[0] if whole else None,
            own_tokens=whole[1] if whole else None,
        )
        with self.autocast():
            return self._minibatch_loss(learner, batch, rows.prompt_index[idx], resp, p_ids, p_mask, m)

    def _shared(self, learner: Agent, prompt_index, resp, resp_mask, p_ids, p_mask) -> SharedPrefixes:
        """The rows' prompts and shared response prefixes, encoded once for every pass over these rows."""
        prompts, rows = torch.unique(prompt_index, return_inverse=True)
        dev = self.device
        return SharedPrefixes(
            learner.model,
            p_ids[prompts].to(dev),
            rows.to(dev),
            resp.to(dev),
            prompt_mask=p_mask[prompts].to(dev),
            response_mask=resp_mask.to(dev),
        )

    def _minibatch_loss(self, learner, batch: MiniBatch, prompt_index, resp, p_ids, p_mask, m: int):
        """Loss of one mini-batch (:func:`~hacpo.engines.core.live_rows.policy_loss_live_rows`: with
        ``skip_dead_rows``, no backward for HACPO cross rows whose clamp is flat; exact). Every pass over
        these rows reuses one encoding of their prompts and shared response prefixes; with
        ``gradient_checkpointing`` each pass is a plain forward over prompt + response instead (activation
        recomputation needs no KV cache)."""
        if self.cfg.gradient_checkpointing:
            logprobs = self._plain_logprobs(learner, prompt_index, resp, p_ids, p_mask)
        else:
            shared = self._shared(learner, prompt_index, resp, batch.mask, p_ids, p_mask)

            def logprobs(rows, detach):
                return shared.logprobs(rows, detach=detach)

        loss, metrics = policy_loss_live_rows(batch, self.spec, m, logprobs, self.cfg.skip_dead_rows)
        if loss is None:  # every row clamped: zero gradients, so the optimizer still steps as unskipped
            loss = sum(p.sum() for p in adapters.trainable_parameters(learner.model)) * 0.0
        return loss, metrics

    def _plain_logprobs(self, learner, prompt_index, resp, p_ids, p_mask):
        """``logprobs(rows, detach)`` by one plain forward of each row's left-padded prompt + response."""
        dev = self.device

        def logprobs(rows, detach):
            sel = torch.arange(resp.shape[0]) if rows is None else rows.cpu()
            pid = prompt_index[sel]
            ids = torch.cat([p_ids[pid], resp[sel]], dim=1).to(dev)
            attn = torch.cat([p_mask[pid], torch.ones_like(resp[sel], dtype=torch.bool)], dim=1).to(dev)
            with torch.no_grad() if detach else contextlib.nullcontext():
                return token_logprobs(learner.model, ids, p_ids.shape[1], attention_mask=attn)

        return logprobs

    # ----------------------------------------------------------------------------- validation
    def _judge(self, texts: list[str], answers: list[str]) -> list[float]:
        """The validation reward: greedy_accuracy keeps the validation problems' order."""
        return self.scorer.score(texts, answers, [p.metadata for p in self.val], [p.id for p in self.val])

    @torch.no_grad()
    def validate(self, step: int) -> list[float]:
        """Greedy accuracy of every agent on the validation problems (the run loop logs it)."""
        self.scorer.new_step()  # a validation has the retry budget of a step
        with self.phase("validate"), self.autocast():
            return [
                greedy_accuracy(
                    agent.model,
                    agent.tok,
                    self.val,
                    self.cfg.prompt_style,
                    self.cfg.max_new_tokens,
                    self._judge,
                    batch_tokens=self.cfg.generation_batch_tokens,
                )
                for agent in self.agents
            ]

    # ----------------------------------------------------------------------------- main loop
    def train(self) -> RunRecord:
        with run_lock(self.out):
            return self._train()

    def _train(self) -> RunRecord:
        cfg = self.cfg
        wall0 = time.perf_counter()  # the step-0 (or resume-point) validation included
        start = self._start_or_resume()
        if start < 0:
            return RunRecord.read(self.out)
        bar = None
        if cfg.progress:
            from tqdm import tqdm

            bar = tqdm(total=cfg.steps, initial=start, desc=f"{cfg.method}", unit="step")

        def progress(row: dict) -> None:
            if bar:
                bar.update(1)
                bar.set_postfix({a.name: f"{row[f'{a.name}/reward']:.2f}" for a in self.agents})

        self.loop.run(start, self.train_step, self.validate, self._save_checkpoint, on_row=progress)
        if bar:
            bar.close()
        wall = time.perf_counter() - wall0
        profile = Profile(
            engine="local",
            wall_s=wall,
            steps=cfg.steps - start,
            phase_s=self.phase.snapshot(),
            generated_tokens=self.gen_tokens,
            tokens_per_s=self.gen_tokens / max(self.phase.total["generate"], 1e-9),
            peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            peak_gpu_mem_mb=self.phase.peak_gpu_mb(),
            gpu_total_mb=torch.cuda.get_device_properties(self.device).total_memory / 2**20
            if self.device.type == "cuda"
            else None,
            details={
                "phase_peak_gpu_mem_mb": dict(self.phase.peak_mb) if self.device.type == "cuda" else None,
                "precision": self.precision,
            },
        ).write(self.out)
        final = {a.name: str(self.out / "checkpoints" / a.name / f"step-{cfg.steps}") for a in self.agents}
        self._write_run_json("complete", cfg.steps, final_checkpoints=final, profile=profile)
        if cfg.final_checkpoint == "weights":  # after "complete": a kill midway leaves a complete run
            keep_final_weights(self.out / "checkpoints", cfg.steps)
        self.scorer.close()
        return RunRecord.read(self.out)

    def train_step(self, step: int) -> core.StepResult:
        """One step (:func:`hacpo.engines.core.train_step`) on this step's prompt batch."""
        cfg = self.cfg
        idx = batch_for_step(len(self.problems), cfg.prompts_per_step, step, cfg.seed)
        samples = cfg.group_size * self.method.rollout_multiplier
        names, problems = [a.name for a in self.agents], [self.problems[i] for i in idx]
        self.scorer.new_step()  # a custom verifier's retry budget is per step
        with policy_temperature(cfg.temperature):  # π_old, π_θ and the reference: the sampled policy's
            return core.train_step(
                self,
                names,
                step,
                problems,
                samples=samples,
                tracker=self.tracker,
                phase=self.phase,
                spec=self.spec,
            )

    # ----------------------------------------------------------------------------- the StepEngine
    def rollout(self, k: int, step: int, problems: list[dict], g: int) -> AgentRollouts:
        rolls = self._rollout(self.agents[k], problems, g)
        return AgentRollouts(rolls.rewards, rolls.mask.sum(1), rolls)

    def before_updates(self, rolls: list[AgentRollouts]) -> None:
        pass  # old and reference log-probs came with each agent's rollouts

    def learner_rows(self, k: int, rolls: list[AgentRollouts], omegas, problems: list[dict]) -> Rows:
        own = [r.rows for r in rolls]
        if self.method.cross_old_from_learner:
            return self._self_old_rows(k, own, omegas, problems)
        return self._rows_for(k, own, omegas)

    def update(self, k: int, rows: Rows, step: int, problems: list[dict]) -> list[dict]:
        logs = self._update(k, rows, problems, step)
        return_freed_memory()  # the update's transients are free: no RSS creep from step to step
        return logs

    def sync(self) -> None:
        pass  # the generator samples from the weights the update changed

    def step_extras(self) -> dict[str, float]:
        extras = {"mem/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        if self.device.type == "cuda":  # the run's peak so far, over every phase
            extras["mem/peak_gpu_mb"] = self.phase.peak_gpu_mb()
        if self.scorer.verifier is not None:  # items a custom verifier failed on, so far (each logged)
            extras["verifier_failed"] = float(self.scorer.verifier_failed)
            extras |= self.scorer.take_verifier_counts()  # this step's: seconds, retried, timed-out, shared
        return extras

    def _self_old_rows(self, k, rolls, omegas, problems) -> Rows:
        """Naive variant ``naive_cross_ratio: self_old``: cross denominators = the learner's own pre-update
        mean log-prob on the re-tokenised text (cross samples treated as on-policy, §2.5)."""
        rows = self._rows_for(k, rolls, omegas)
        cross = torch.nonzero(~rows.is_own).flatten()
        if len(cross):
            dev, agent = self.device, self.agents[k]
            p_ids, p_mask = agent.prompt_ids(problems, self.cfg.prompt_style, "cpu")
            with torch.no_grad(), self.autocast(), eval_mode(agent.model):
                lp = token_logprobs_shared_prompt(
                    agent.model,
                    p_ids.to(dev),
                    rows.prompt_index[cross].to(dev),
                    rows.response[cross].to(dev),
                    prompt_mask=p_mask.to(dev),
                    response_mask=rows.mask[cross].to(dev),
                    max_tokens=self.cfg.micro_batch_tokens,
                )
            rows.old_mean_logp[cross] = seq_mean_logp(lp.cpu(), rows.mask[cross])
        return rows


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def eval_mode(model):
    """The model in eval mode for a no-grad pass over cached prompts: with gradient checkpointing, Hugging
    Face turns the KV cache off in train mode. Same values (the agents have no dropout)."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


def train(cfg: TrainConfig) -> RunRecord:
    """Train (or resume) one run; returns its final ``run.json``."""
    cfg.logging.check_environment()
    keep_freed_memory()
    return LocalTrainer(cfg).train()
