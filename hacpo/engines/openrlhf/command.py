"""A single-agent run as one ``python -m openrlhf.cli.train_ppo_ray`` command line (pure; no OpenRLHF import).

Every value comes from the run's :class:`~hacpo.config.TrainConfig` (the maths), its :class:`Method` (the
loss family, sample multiplier, epochs, mini-batch divisor) and :class:`OpenRLHFOptions` (GPUs and memory
modes). The paper's settings, with the spec sections they come from (``shared/spec/hacpo-algorithm.md``):

=====================================  ===========================================================  ======
flag                                   value                                                        spec
=====================================  ===========================================================  ======
advantage.estimator                    ``group_norm``: (r − mean)/(std + ε), unbiased std            §2.1
actor.policy_loss_type, eps_clip_*     GRPO: ``ppo``, token clip 0.2/0.28, token-mean; GSPO:          §2.1–2
                                       ``gspo``, sequence clip 3e-4/4e-4, seq-mean-token-mean
rollout.batch_size × n_samples         128 prompts × G (8; GSPO×2: 16)                                §2.3, §6
train.batch_size, max_epochs           sequences per optimizer update (512; GSPO×2 512 = 32 × 16);    §6
                                       updates ×2: two epochs, or half mini-batches
actor.adam.*, lr_scheduler             lr 1e-6 constant, no warm-up, weight decay 0.01, the run's      §7
                                       betas (OpenRLHF's defaults are 0.95 and 0.0: always passed)
actor.max_norm                         1.0                                                            §7
algo.kl.*                              k3 as a loss, β = 0.001, reference = the initial weights       §7
data.max_len, rollout.max_new_tokens   1,024 prompt + 4,096 response tokens                           §7
rollout.temperature / top_p            1.0 / 1.0                                                      §7
=====================================  ===========================================================  ======

OpenRLHF's ``group_norm`` divides by (std + 1e-9) where the paper adds 1e-6: with 0/1 rewards a group's std
is 0 (every advantage 0 either way) or at least 0.35, so the two differ by < 3e-6 relative.

The prompt file holds exactly ``steps × prompts_per_step`` rows (epochs laid out in it, see
:func:`prompt_order`), so one OpenRLHF episode is exactly ``steps`` steps.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from hacpo.config import TrainConfig

from .options import OpenRLHFOptions

ISSUE_JOINT = "issue 11"


@dataclass(frozen=True)
class Layout:
    """Where an OpenRLHF run keeps OpenRLHF's own files, inside the run directory (``<run>/openrlhf/``)."""

    run_dir: Path

    @property
    def root(self) -> Path:
        return Path(self.run_dir) / "openrlhf"

    @property
    def prompts(self) -> Path:
        return self.root / "prompts.jsonl"

    @property
    def validation(self) -> Path:
        return self.root / "validation.jsonl"

    @property
    def ckpt(self) -> Path:  # DeepSpeed states (`_actor/`) and Hugging Face copies (`global_step<N>_hf/`)
        return self.root / "ckpt"

    @property
    def final(self) -> Path:  # save_model() at the end of training
        return self.root / "final"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def log(self) -> Path:
        return self.root / "train.log"


def check_single_agent(cfg: TrainConfig) -> None:
    method = cfg.resolved_method()
    if method.joint:
        raise ValueError(
            f"method {cfg.method!r} is collaborative: the OpenRLHF joint trainer arrives with {ISSUE_JOINT}; "
            "train it with the local engine (`--engine local`) meanwhile"
        )


def prompt_order(n_problems: int, cfg: TrainConfig) -> list[int]:
    """Problem indices of the run's prompt file: step s's prompts are the local engine's (same seeded epoch
    shuffles, :func:`hacpo.engines.local.trainer.batch_for_step`), in step order."""
    from hacpo.engines.local.trainer import batch_for_step

    return [
        i
        for step in range(cfg.steps)
        for i in batch_for_step(n_problems, cfg.prompts_per_step, step, cfg.seed)
    ]


def _flag(name: str, *values) -> list[str]:
    return [f"--{name}", *(_num(v) for v in values)]


def _num(v) -> str:
    return repr(v) if isinstance(v, float) else str(v)


def build_command(
    cfg: TrainConfig, opts: OpenRLHFOptions, layout: Layout, *, python: str = sys.executable
) -> list[str]:
    """The ``train_ppo_ray`` argv of one single-agent run (OpenRLHF 0.11.2 flags); paths are absolute (Ray
    workers do not share the driver's working directory)."""
    check_single_agent(cfg)
    layout = Layout(Path(layout.run_dir).resolve())
    method = cfg.resolved_method()
    (agent,) = cfg.agents
    gpus_per_node, nodes = opts.gpus_per_node, opts.nodes
    total = opts.total_gpus
    spec = cfg.loss_spec()
    samples = cfg.group_size * method.rollout_multiplier
    update_size = max(1, cfg.minibatch_size // method.minibatch_divisor)
    rollout_rows = cfg.prompts_per_step * samples
    if rollout_rows % update_size:
        raise ValueError(
            f"{rollout_rows} sequences per step do not split into mini-batches of {update_size}: OpenRLHF "
            "drops the remainder; choose minibatch_size dividing prompts_per_step × group_size"
        )
    if update_size % (total * opts.micro_train_batch_size):
        raise ValueError(
            f"a mini-batch of {update_size} sequences does not split over {total} GPUs × "
            f"micro_train_batch_size {opts.micro_train_batch_size}"
        )

    argv = [python, "-m", "openrlhf.cli.train_ppo_ray"]
    model = Path(agent.path).resolve() if Path(agent.path).exists() else agent.path  # a path or a Hub id
    argv += _flag("actor.model_name_or_path", model)
    argv += _flag("actor.num_nodes", nodes) + _flag("actor.num_gpus_per_node", gpus_per_node)
    if spec.kl_beta > 0:  # a reference group exists only with a KL term
        argv += _flag("ref.num_nodes", nodes) + _flag("ref.num_gpus_per_node", gpus_per_node)
    argv += _flag("vllm.num_engines", total // opts.vllm_tensor_parallel_size)
    argv += _flag("vllm.tensor_parallel_size", opts.vllm_tensor_parallel_size)
    argv += _flag("vllm.gpu_memory_utilization", opts.vllm_gpu_memory_utilization)
    if opts.enable_prefix_caching:
        argv += _flag("vllm.enable_prefix_caching")
    if opts.colocate:
        argv += _flag("train.colocate_all")
    if opts.sleep:
        argv += _flag("vllm.enable_sleep") + _flag("ds.enable_sleep")
    argv += _flag("ds.zero_stage", opts.zero_stage) + _flag("ds.param_dtype", opts.param_dtype)
    argv += _flag("ds.attn_implementation", opts.attn_implementation)
    if opts.packing_samples:
        argv += _flag("ds.packing_samples")
    if opts.gradient_checkpointing:
        argv += _flag("actor.gradient_checkpointing_enable")
    if opts.adam_offload:
        argv += _flag("ds.adam_offload")

    # data: pre-rendered prompts (the agent's chat template, thinking off), one episode of exactly `steps`
    argv += _flag("data.prompt_dataset", layout.prompts) + _flag("data.input_key", "prompt")
    argv += _flag("data.label_key", "answer") + _flag("data.max_samples", cfg.steps * cfg.prompts_per_step)
    argv += _flag("data.max_len", opts.max_prompt_tokens + cfg.max_new_tokens)
    argv += _flag("train.num_episodes", 1) + _flag("train.seed", cfg.seed)

    # rollout and mini-batches (spec §6)
    argv += _flag("rollout.batch_size", cfg.prompts_per_step) + _flag("rollout.n_samples_per_prompt", samples)
    argv += _flag("rollout.max_new_tokens", cfg.max_new_tokens)
    argv += _flag("rollout.temperature", cfg.temperature) + _flag("rollout.top_p", cfg.top_p)
    argv += _flag("rollout.micro_batch_size", opts.micro_rollout_batch_size)
    argv += _flag("train.batch_size", update_size) + _flag("train.max_epochs", method.epochs)
    argv += _flag("train.micro_batch_size", opts.micro_train_batch_size)

    # the loss (spec §2.1, §2.2)
    argv += _flag("algo.advantage.estimator", "group_norm")
    token_level = spec.kind == "grpo"
    argv += _flag("actor.policy_loss_type", "ppo" if token_level else "gspo")
    argv += _flag("actor.eps_clip_low_high", spec.eps_low, spec.eps_high)
    argv += _flag("actor.loss_agg_mode", "token-mean" if token_level else "seq-mean-token-mean")
    argv += _flag("algo.kl.init_coef", spec.kl_beta)
    if spec.kl_beta > 0:
        argv += _flag("algo.kl.use_loss") + _flag("algo.kl.estimator", "k3")

    # optimiser (spec §7): every value passed, OpenRLHF's defaults differ
    argv += _flag("actor.adam.lr", cfg.lr) + _flag("actor.adam.betas", *cfg.betas)
    argv += _flag("actor.adam.weight_decay", cfg.weight_decay) + _flag("actor.max_norm", cfg.grad_clip)
    argv += _flag("actor.lr_scheduler", "constant") + _flag("actor.lr_warmup_ratio", 0.0)

    # in-training validation: greedy pass@1 on the validation file every val_every steps
    if cfg.val_file and cfg.val_size and cfg.val_every:
        argv += _flag("eval.dataset", layout.validation) + _flag("eval.steps", cfg.val_every)
        argv += _flag("eval.temperature", 0.0) + _flag("eval.n_samples_per_prompt", 1)

    # checkpoints: DeepSpeed states to resume from, Hugging Face copies for the contract's step-N folders
    argv += _flag("ckpt.path", layout.ckpt) + _flag("ckpt.output_dir", layout.final)
    argv += _flag("ckpt.save_steps", cfg.checkpoint_every or -1) + _flag("ckpt.max_num", cfg.keep_checkpoints)
    argv += _flag("ckpt.save_hf") + _flag("ckpt.load_enable") + _flag("ckpt.best_metric_key", "none")

    # logging: TensorBoard always (metrics.jsonl is converted from it), W&B when configured
    argv += _flag("logger.logging_steps", 1) + _flag("logger.tensorboard_dir", layout.tensorboard)
    argv += _flag("logger.wandb.run_name", f"{cfg.method}-{agent.name}-seed{cfg.seed}")
    if opts.wandb is not None:
        # OpenRLHF logs in only when no key is configured; the real key stays in WANDB_API_KEY
        argv += _flag("logger.wandb.key", "from-WANDB_API_KEY") + _flag(
            "logger.wandb.project", opts.wandb.project
        )
        if opts.wandb.group:
            argv += _flag("logger.wandb.group", opts.wandb.group)
        if opts.wandb.org:
            argv += _flag("logger.wandb.org", opts.wandb.org)

    argv += _flag("reward.remote_url", reward_file())
    return argv + list(opts.extra_args)


def reward_file() -> Path:
    """The ``--reward.remote_url`` Python file: :mod:`hacpo.engines.openrlhf.reward_func`."""
    return Path(__file__).with_name("reward_func.py").resolve()
