"""The local engine: a real single-process trainer for every method of the registry (CPU or one GPU).

It follows the per-step procedure of docs/algorithm.md (§5) exactly and takes every formula from
:mod:`hacpo.algo`:

1. the same B prompts for every agent; G rollouts each from the agent's current policy and chat template;
   0/1 rewards; capability window updated (it includes this step);
2. scoring before any update: each generator's pre-update log-probs (the sampling log-probs, exact at
   temperature 1 / top-p 1, or a separate forward), reference log-probs for KL on own rows;
3. sequential updates, one learner after the other: own rows + the other agents' rows re-tokenised for
   the learner; per-prompt advantages; mixed (or self-first) mini-batches; update m drives stepwise clipping.

The trainer's concepts live beside it: :mod:`.agent` (loading an agent), :mod:`.rows` (rollouts and rows),
:mod:`.checkpoint` (the run directory), :mod:`.update` (mini-batches and the loss), as the OpenRLHF engine's
live in its ``joint/`` package. Outputs follow the run-directory contract of :mod:`hacpo.runio`; a killed
run resumes from its last checkpoint and ends with the same metrics as an uninterrupted one (bitwise on the
same machine and threads).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch

from hacpo.agents.lm import (
    generate,
    policy_temperature,
    token_logprobs_shared_prompt,
)
from hacpo.agents.prompting import greedy_accuracy
from hacpo.agents.retokenize import (
    response_text,
    retokenize,
    same_tokenizer,
    source_logp_mask,
)
from hacpo.algo import (
    CapabilityTracker,
    seq_mean_logp,
)
from hacpo.checkpoints import keep_final_weights
from hacpo.config import TrainConfig
from hacpo.data.synthetic import as_problem
from hacpo.engines import core
from hacpo.engines.core import AgentRollouts, RunLoop, schedule
from hacpo.engines.phases import Phases
from hacpo.hardware import keep_freed_memory, peak_rss_mb, resolve_precision, return_freed_memory
from hacpo.reward import Scorer
from hacpo.runio import Profile, RunRecord, run_lock

from .agent import (  # noqa: F401 (the engine's names, read from here too)
    Agent,
    eval_mode,
    load_agents,
    load_learner,
    shared_base_problems,
    starting_adapter_problems,
)
from .checkpoint import CheckpointMixin
from .rows import Rollouts, Rows, _pad_rows  # noqa: F401 (Rollouts: read from here too)
from .update import UpdateMixin

NO_CUDA = "device: cuda, but torch sees no CUDA device here: use device: auto (or cpu)"


class LocalTrainer(CheckpointMixin, UpdateMixin):
    def __init__(self, cfg: TrainConfig):
        problems = cfg.path_problems()  # every problem in one message
        problems += shared_base_problems(cfg) + starting_adapter_problems(cfg) if not problems else []
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
        self.problems = schedule.read_problems(cfg.train_file)
        val = schedule.read_problems(cfg.val_file)[: cfg.val_size] if cfg.val_file and cfg.val_size else []
        self.val = [as_problem(p) for p in val]  # greedy validation problems
        torch.manual_seed(cfg.seed)
        with_ref = self.spec.kl_beta > 0
        self.agents = load_agents(cfg, self.device, with_ref)
        self.tracker = CapabilityTracker(len(self.agents), cfg.capability_window, cfg.omega_warmup_steps)
        self.scorer = Scorer(  # training and validation reward
            workers=cfg.scorer_workers,
            timeout_s=cfg.reward_timeout_s,
            reward=cfg.reward,
            retry_budget_s=cfg.reward_retry_budget_s,
        )
        reuse = cfg.same_tokenizer == "reuse_ids"  # reencode: the released code decodes every response
        self.same_tok = [[reuse and same_tokenizer(a.tok, b.tok) for b in self.agents] for a in self.agents]
        self.loop = RunLoop(
            cfg, [a.name for a in self.agents], val_size=len(self.val),
            checkpoint_of=lambda step: str(self.out / "checkpoints" / "<agent>" / f"step-{step}"),
        )  # fmt: skip
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
        """fp32 or bf16: ``precision`` as given, or ``auto`` resolved for this machine
        (:mod:`hacpo.hardware`); a resumed run keeps the choice its ``run.json`` recorded, so one run never
        changes precision."""
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

    def _rollout(self, agent: Agent, problems: list[dict], g: int) -> Rollouts:
        cfg = self.cfg
        agent.activate()  # sampling, π_old and the reference (all adapters off) through its adapter
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
                    agent.activate().model,
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
            try:
                return self._train()
            except Exception:  # stopped by an error: `failed` at its newest checkpoint (resumable)
                if (record := RunRecord.read(self.out)) is not None and not record.complete:
                    self._write_run_json("failed", record.step)
                self.scorer.close()  # its verifier workers go with the run, not with the process
                raise

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
            peak_rss_mb=peak_rss_mb(),
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
        idx = schedule.batch_for_step(len(self.problems), cfg.prompts_per_step, step, cfg.seed)
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
        extras = {"mem/peak_rss_mb": peak_rss_mb()}
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
            dev, agent = self.device, self.agents[k].activate()
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


def train(cfg: TrainConfig) -> RunRecord:
    """Train (or resume) one run; returns its final ``run.json``."""
    cfg.logging.check_environment()
    keep_freed_memory()
    return LocalTrainer(cfg).train()


def __getattr__(name: str):
    if name in ("read_problems", "batch_for_step"):  # moved in 0.2.0; the old path goes in 0.3.0
        import warnings

        message = f"hacpo.engines.local.trainer.{name} is now hacpo.engines.core.schedule.{name} (deprecated)"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return getattr(schedule, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
