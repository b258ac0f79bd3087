"""HACPO's training step inside OpenRLHF's actor: a plain subclass of ``ActorPPOTrainer``.

``ppo_train`` orders the learner's rows (the run's ``minibatch_order``, as the local engine does), cuts them
into micro-batches, groups ``gas`` micro-batches per optimizer step m, gives each micro-batch the step's
normalisers (:func:`.loss.step_norm`) and returns each step's metrics, merged over its micro-batches as
the local engine merges its own (:func:`hacpo.engines.core.metrics.merge_parts`); ``training_step`` runs
the actor forward, :func:`.loss.microbatch_loss`, DeepSpeed's backward and optimizer step, exactly where
OpenRLHF's own step does. Everything else (weight sync to vLLM, offload/reload, checkpoints) is OpenRLHF's,
inherited unchanged.

:func:`policy_actor_class` gives the Ray actor: ``PolicyModelActor`` whose trainer is this one (Ray forbids
subclassing a remote class, so it subclasses ``PolicyModelActor.__ray_actor_class__`` and wraps it again).
"""

from __future__ import annotations

import math

import torch
from openrlhf.trainer.ppo_utils.experience import make_experience_batch
from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer, PolicyModelActor

from hacpo.algo import LossSpec, NonFiniteLogProbs, metric_floats
from hacpo.engines.core.metrics import merge_parts
from hacpo.engines.core.nonfinite import NONFINITE_LOGP, SKIPPED, may_step, nonfinite_weights
from hacpo.engines.core.order import ORDERS, minibatch_order

from ..lora import peft_of
from .logprobs import action_log_probs, sliced_head
from .loss import StepNorm, microbatch_loss, step_norm
from .rows import IS_SELF, PROMPT_ID, SOURCE

# Per-micro-batch metrics of hacpo.algo merged into each optimizer step's; the rest are dropped.
STATUS_KEYS = (
    "rows", "own_rows", "loss", "pg_loss", "kl", "own_clip_frac", "cross_clip_frac", "cross_in_bounds_frac",
    "cross_below_frac", "cross_above_frac", "cross_lo", "omega_mean", "s_homo_mean", "s_hete_mean",
    "adv_mean", "rescue_rows", "own_adv_sum", "cross_adv_sum",
)  # fmt: skip


_ANNOUNCED: set[str] = set()


def _announce(what: str, head, sequences) -> None:
    """One line per process and pass in the run's log: which log-prob path it takes (:mod:`.logprobs`)."""
    if what not in _ANNOUNCED:
        _ANNOUNCED.add(what)
        how = "OpenRLHF's Actor.forward" if head is None else f"the head in slices (vocabulary {head.vocab})"
        print(f"hacpo: {what} log-probs of {tuple(sequences.shape)} tokens by {how}", flush=True)


class HacpoActorTrainer(ActorPPOTrainer):
    """``ActorPPOTrainer`` with HACPO's loss. ``spec``: the method's :class:`~hacpo.algo.LossSpec`;
    ``order``: the run's ``minibatch_order``; ``seed``, ``learner``: the run's seed and this agent's index."""

    def __init__(self, *args, spec: LossSpec, order: str = "mixed", seed: int = 0, learner: int = 0, **kw):
        super().__init__(*args, **kw)
        self.configure(spec, order, seed, learner)

    def configure(self, spec: LossSpec, order: str, seed: int, learner: int = 0) -> None:
        if order not in ORDERS:
            raise ValueError(f"minibatch_order {order!r}: choose one of {', '.join(ORDERS)}")
        if self.args.train.dynamic_batch_enable:
            raise ValueError(
                "HACPO on OpenRLHF needs fixed micro-batches: turn off train.dynamic_batch_enable"
            )
        self.spec, self.order, self.seed, self.learner, self.step = spec, order, seed, learner, 0
        skip_nonfinite_steps(self.actor_optim)

    # ------------------------------------------------------------------------------------ order
    def row_order(self, items: list) -> list[int]:
        """This rank's rows in the run's ``minibatch_order`` (the local engine's function,
        :func:`~hacpo.engines.core.order.minibatch_order`) at the run's step: a resumed run orders them as an
        uninterrupted one."""
        return minibatch_order(
            self.order, own=[bool(float(it.info[IS_SELF])) for it in items],
            agent=[int(float(it.info[SOURCE])) for it in items],
            prompt=[int(float(it.info[PROMPT_ID])) for it in items],
            seed=self.seed, step=self.step, learner=self.learner,
        )  # fmt: skip

    def steps(self) -> list[tuple[list, int]]:
        """The fit's optimizer steps: (micro-batches, m) for every epoch, m counting across epochs."""
        items = self.replay_buffer.items
        mb, gas = self.micro_train_batch_size, max(1, int(self.strategy.accumulated_gradient))
        per_step = mb * gas
        if not items or len(items) % per_step:
            raise ValueError(
                f"{len(items)} rows on this rank do not split into optimizer steps of {gas} micro-batches of "
                f"{mb}: make rows per learner a multiple of train.batch_size (hacpo checks this at start)"
            )
        out, m = [], 0
        for _epoch in range(self.max_epochs):
            order = self.row_order(items)
            for s in range(0, len(order), per_step):
                idx = order[s : s + per_step]
                micro = [
                    make_experience_batch([items[i] for i in idx[j : j + mb]]) for j in range(0, per_step, mb)
                ]
                out.append((micro, m))
                m += 1
        return out

    # ------------------------------------------------------------------------------------ train
    def ppo_train(self, kl_ctl: float = 0.0) -> list[dict[str, float]]:
        """One learner's updates on this step's rows; returns each optimizer step's metrics on this rank
        (its share of ``loss``, ``pg_loss``, ``kl``; its ``rows``, ``own_rows``; means over its rows), with
        the values every rank shares (``update`` = m, ``grad_norm``, ``actor_lr``)."""
        device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
        pending = []
        for micro, m in self.steps():
            norm = step_norm(micro, m, *self._dp())
            parts, last, bad_logp = [], {}, False
            for i, exp in enumerate(micro):
                exp.to_device(device)
                status = self.training_step(exp, kl_ctl, i, {"norm": norm, "boundary": i == len(micro) - 1})
                parts.append((status["num_samples"], status["metrics"]))
                last.update(status["last"])
                bad_logp |= status["nonfinite_logp"]
            pending.append((parts, {**last, NONFINITE_LOGP: float(bad_logp)}))
        # the step's loss metrics are tensors on the GPU: to the host in one transfer, not one per number
        floats = iter(metric_floats([metrics for parts, _ in pending for _, metrics in parts]))
        return [{**merge_parts([(n, next(floats)) for n, _ in parts]), **last} for parts, last in pending]

    def _dp(self):
        """(dp_size, all_reduce) over this actor group's data-parallel ranks; (1, None) in one process."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return 1, None
        mesh = getattr(self.strategy, "ds_device_mesh", None)
        group = mesh["dp"].get_group() if mesh is not None else None
        device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"

        def reduce(t: torch.Tensor) -> torch.Tensor:
            t = t.to(device)
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
            return t.cpu()

        return dist.get_world_size(group=group), reduce

    def training_step(self, experience, kl_ctl: float, step: int, loss_batch_info=None) -> dict:
        """Forward, HACPO loss (:func:`.loss.microbatch_loss`), DeepSpeed backward and optimizer step.

        ``loss_batch_info`` carries ``{"norm": StepNorm}`` from :meth:`ppo_train`; ``kl_ctl`` is unused
        (β comes from the loss spec: KL as a loss on own rows, never in the reward)."""
        norm: StepNorm = loss_batch_info["norm"]
        self.actor.train()
        head = None
        if self.strategy.ring_attn_group is None:  # a real vocabulary: its head in slices (.logprobs)
            head = sliced_head(self.actor, experience.sequences.numel(), self.strategy.stage)
        _announce("update", head, experience.sequences)
        if head is not None:
            logp = action_log_probs(
                head, experience.sequences, experience.action_mask, experience.attention_mask
            )
        else:
            logp, _ = self.actor(
                experience.sequences,
                experience.action_mask,
                attention_mask=experience.attention_mask,
                return_output=True,
                ring_attn_group=self.strategy.ring_attn_group,
            )
        bad_logp = False
        try:
            loss, metrics = microbatch_loss(logp, experience, self.spec, norm)
        except NonFiniteLogProbs:
            # no loss to take: NaN gradients instead, which DeepSpeed's check (skip_nonfinite_steps) turns
            # into a skipped step on every rank; no rank leaves its backward out (the others wait on it)
            loss, metrics, bad_logp = logp.float().sum() * math.nan, {}, True
        self.strategy.backward(loss, self.actor, self.actor_optim)
        self.strategy.optimizer_step(self.actor_optim, self.actor, self.actor_scheduler, name="actor")
        last = {"actor_lr": float(self.actor_scheduler.get_last_lr()[0]), "update": float(norm.m)}
        engine = getattr(self.actor, "model", None)  # the DeepSpeed engine; at the boundary: this step's
        applied = bool(engine.was_step_applied()) if hasattr(engine, "was_step_applied") else True
        grad_norm = self.strategy.get_grad_norm(self.actor)
        if grad_norm is not None:  # a skipped step's norm is not computed: NaN, never a stale one
            last["grad_norm"] = float(grad_norm) if applied else math.nan
        last[SKIPPED] = 0.0 if applied else 1.0
        if loss_batch_info.get("boundary") and applied and not may_step(None, grad_norm):
            raise RuntimeError(
                f"DeepSpeed applied an optimizer step with gradient norm {float(grad_norm)} (update "
                f"{norm.m}): its optimizer ({type(self.actor_optim).__name__}) has no check that skips a "
                "non-finite step, so the actor's weights may now hold NaN/inf. Resume from the run's last "
                "checkpoint with a lower lr, or with openrlhf.zero_stage 1 or 2 (their optimizer skips it)"
            )
        return {
            "metrics": {k: metrics[k] for k in STATUS_KEYS if k in metrics},
            "last": last,
            "num_samples": float(experience.action_mask.shape[0]),
            "loss": loss.detach(),
            "nonfinite_logp": bad_logp,
        }


class HacpoPolicyActor(PolicyModelActor.__ray_actor_class__):
    """OpenRLHF's policy actor (DeepSpeed model, optimizer, checkpoints, weight sync) with HACPO's trainer.

    ``init_model_from_pretrained`` is OpenRLHF's; :meth:`use_hacpo` then turns the ``ActorPPOTrainer`` it
    built into a :class:`HacpoActorTrainer` in place (re-creating it would open a second vLLM sync group).
    """

    def use_hacpo(self, spec: dict, order: str = "mixed", seed: int = 0, learner: int = 0) -> None:
        self.trainer.__class__ = HacpoActorTrainer
        self.trainer.configure(LossSpec(**spec), order, seed, learner)

    def forward(self, sequences, action_mask=None, attention_mask=None, packed_seq_lens=None,
                mm_train_inputs_list=None):  # fmt: skip
        """OpenRLHF's scoring pass (``make_experience``: own rows, and cross rows for Naive's old
        log-probs), with a real vocabulary's head applied in slices (:mod:`.logprobs`)."""
        head = None
        multimodal = any(m for m in mm_train_inputs_list or ())  # OpenRLHF passes one None per text row
        if action_mask is not None and not multimodal and self.strategy.ring_attn_group is None:
            head = sliced_head(self.actor, sequences.numel(), self.strategy.stage)
        _announce("scoring", head, sequences)
        if head is None:
            mm = mm_train_inputs_list
            return super().forward(sequences, action_mask, attention_mask, packed_seq_lens, mm)
        device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
        self.actor.eval()
        try:
            with torch.no_grad():
                logp = action_log_probs(
                    head, sequences.to(device), action_mask.to(device), attention_mask.to(device)
                )
        finally:
            self.actor.train()
        return logp.to("cpu")

    def ref_forward(self, sequences, action_mask=None, attention_mask=None, packed_seq_lens=None,
                    mm_train_inputs_list=None):  # fmt: skip
        """The KL reference's scoring pass of a LoRA agent: :meth:`forward` with the adapter switched off,
        the base's log-probs without a second model (:class:`~..lora.AdapterOffReference`)."""
        peft_model = peft_of(self.actor)
        if peft_model is None:
            raise RuntimeError("ref_forward serves LoRA agents only: a fully trained agent has a reference")
        if "reference" not in _ANNOUNCED:
            _ANNOUNCED.add("reference")
            print("hacpo: reference log-probs by the actor with its LoRA adapter off", flush=True)
        with peft_model.disable_adapter():
            return self.forward(sequences, action_mask, attention_mask, packed_seq_lens, mm_train_inputs_list)

    def nonfinite_weights(self) -> list[str]:
        """This rank's parameters holding NaN/inf (ZeRO-3: its shards), checked before a checkpoint."""
        named = self.actor.model.named_parameters()
        return nonfinite_weights((n, getattr(p, "ds_tensor", p)) for n, p in named)

    def set_lr(self, lr: float) -> None:
        """The next optimizer step's learning rate (the scheduler sets its own again after that step)."""
        for group in self.actor_optim.param_groups:
            group["lr"] = lr

    def fit_step(self, step: int) -> dict:
        """OpenRLHF's ``fit`` for the run's ``step`` (the mini-batch order's seed: a resumed run, whose
        actors are new processes, draws the order an uninterrupted run draws)."""
        self.trainer.step = step
        return self.fit()


def skip_nonfinite_steps(optim) -> bool:
    """Turn on DeepSpeed's check for non-finite gradients before its optimizer step where the optimizer has
    one (ZeRO-1/2's; off by default in bf16, where a NaN/inf gradient then steps into the weights): a step
    with NaN/inf gradients is then skipped on every data-parallel rank alike (the check is all-reduced), its
    gradients dropped, the lr schedule held, and the engine's ``was_step_applied()`` is False. Returns whether
    the optimizer has such a check (fp16's loss scaler always checks); where it has none, a non-finite step
    is caught after the fact (:meth:`HacpoActorTrainer.training_step` stops the run)."""
    if hasattr(optim, "check_grad_overflow"):
        optim.check_grad_overflow = True
        return True
    return hasattr(optim, "overflow")


def policy_actor_class(num_gpus: float = 1):
    """The Ray actor class for a HACPO learner (``RayActorGroup(..., policy_actor_class(), ...)``)."""
    import ray

    return ray.remote(num_gpus=num_gpus)(HacpoPolicyActor)
