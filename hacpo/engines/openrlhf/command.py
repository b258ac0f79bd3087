"""A single-agent run as one ``python -m openrlhf.cli.train_ppo_ray`` command line (pure; no OpenRLHF import).

Every value comes from the run's :class:`~hacpo.config.TrainConfig` (the maths), its :class:`Method` (the
loss family, sample multiplier, epochs, mini-batch divisor) and :class:`OpenRLHFOptions` (GPUs and memory
modes). The paper's settings, with the sections of docs/algorithm.md they come from:

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
from hacpo.engine_options import OpenRLHFOptions
from hacpo.engines.core.trackers import wandb_run_id

from .lora import check_lora


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

    @property
    def rollouts(self) -> Path:  # the reward file's record of each launch's trained samples
        return self.root / "rollouts.jsonl"

    # joint runs: one OpenRLHF agent stack per agent, the controller's state beside them
    def agent(self, name: str) -> AgentLayout:
        return AgentLayout(self.root / "agents" / name)

    @property
    def joint_spec(self) -> Path:  # the driver's input: run config and every agent's OpenRLHF arguments
        return self.root / "joint.json"

    @property
    def verifier_stop(self) -> Path:  # written by the reward file when a verifier failed a whole first batch
        return self.root / "verifier_stop.json"

    @property
    def sync_check(self) -> Path:  # each agent's weight-sync check (joint/sync_check.py)
        return self.root / "sync_check.json"

    @property
    def joint_state(self) -> Path:  # step and capability window of the newest complete joint checkpoint
        return self.root / "joint_state.json"


@dataclass(frozen=True)
class AgentLayout:
    """One agent's OpenRLHF files in a joint run: its prompt file, DeepSpeed/HF checkpoints, final model."""

    root: Path

    @property
    def prompts(self) -> Path:
        return self.root / "prompts.jsonl"

    @property
    def ckpt(self) -> Path:
        return self.root / "ckpt"

    @property
    def final(self) -> Path:
        return self.root / "final"


def check_single_agent(cfg: TrainConfig) -> None:
    method = cfg.resolved_method()
    if method.joint:
        raise ValueError(
            f"method {cfg.method!r} is collaborative: it runs on HACPO's joint driver over one OpenRLHF "
            "stack per agent (joint_agent_args), not on train_ppo_ray"
        )


def prompt_order(n_problems: int, cfg: TrainConfig) -> list[int]:
    """Problem indices of the run's prompt file: step s's prompts are the local engine's (same seeded epoch
    shuffles, :func:`hacpo.engines.core.schedule.batch_for_step`), in step order."""
    from hacpo.engines.core.schedule import batch_for_step

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
    rows = cfg.prompts_per_step * cfg.group_size * method.rollout_multiplier
    args = _train_args(
        cfg, opts, agent, layout.prompts, layout.ckpt, layout.final, layout, rows, opts.gpus_per_node,
        lora=cfg.agent_adapter(0),
    )
    if cfg.val_file and cfg.val_size and cfg.val_every:  # greedy pass@1 on the validation file
        args += _flag("eval.dataset", layout.validation) + _flag("eval.steps", cfg.val_every)
        args += _flag("eval.temperature", 0.0) + _flag("eval.n_samples_per_prompt", 1)
    # OpenRLHF's own loggers: TensorBoard always (metrics.jsonl is converted from it), W&B when configured
    args += _flag("logger.tensorboard_dir", layout.tensorboard)
    args += _flag("logger.wandb.run_name", f"{cfg.method}-{agent.name}-seed{cfg.seed}")  # and TB's subfolder
    if (wandb := cfg.logging.wandb) is not None:
        # OpenRLHF turns W&B on when given a key and logs in only when wandb has none: WANDB_API_KEY (online)
        # keeps the real one; offline needs none. Mode, folder and run id come by wandb_env.
        args += _flag("logger.wandb.key", "from-WANDB_API_KEY") + _flag("logger.wandb.project", wandb.project)
        if wandb.group:
            args += _flag("logger.wandb.group", wandb.group)
        if wandb.entity:
            args += _flag("logger.wandb.org", wandb.entity)
    return [*program(opts, python), "openrlhf.cli.train_ppo_ray", *args, *opts.extra_args]


def wandb_env(cfg: TrainConfig, layout: Layout, resume: bool) -> dict[str, str]:
    """The environment OpenRLHF's W&B logger of a single-agent run needs (wandb reads these in the Ray
    actor that logs): the mode, ``<run>/wandb`` as for the run loop's W&B, and one W&B run id over resumes
    (a fresh start is a new W&B run; its earlier offline files go)."""
    wandb = cfg.logging.wandb
    if wandb is None:
        return {}
    run_dir = Path(layout.run_dir).resolve()
    run_id = wandb_run_id(run_dir, resume=resume, drop_offline=not resume)
    return {
        "WANDB_MODE": wandb.mode,
        "WANDB_DIR": str(run_dir),
        "WANDB_RUN_ID": run_id,
        "WANDB_RESUME": "allow",
        "WANDB_CONSOLE": "off",
        "WANDB_SILENT": "true",
        "WANDB_DISABLE_GIT": "true",
    }


def module_and_args(argv: list[str]) -> tuple[str, list[str]]:
    """(the module a run's command runs, its arguments) from the argv :func:`program` starts."""
    rest = argv[3:]
    if rest and rest[0] == "--cpu":
        rest = rest[1:]
    if len(argv) < 4 or argv[1:3] != ["-m", "hacpo.engines.openrlhf.launch"] or not rest:
        raise ValueError(f"not a run's OpenRLHF command: {argv[:4]}")
    return rest[0], rest[1:]


def program(opts: OpenRLHFOptions, python: str = sys.executable) -> list[str]:
    """The launcher a run's OpenRLHF program (its module follows) runs behind: :mod:`.launch` (prompts in
    file order; on CPU, OpenRLHF's CUDA calls mapped in every process)."""
    return [python, "-m", "hacpo.engines.openrlhf.launch", *(["--cpu"] if opts.cpu else [])]


def agent_gpus(cfg: TrainConfig, opts: OpenRLHFOptions) -> list[int]:
    """GPUs per node of each agent of a joint run: all of them, shared (hybrid engine, every agent asleep
    while another works), or the split ``openrlhf.agent_gpus`` gives."""
    n = len(cfg.agents)
    if opts.agent_gpus is None:
        return [opts.gpus_per_node] * n
    if len(opts.agent_gpus) != n or sum(opts.agent_gpus) != opts.gpus_per_node:
        raise ValueError(
            f"openrlhf.agent_gpus {opts.agent_gpus} must give each of the {n} agents its GPUs per node, "
            f"{opts.gpus_per_node} in all"
        )
    return list(opts.agent_gpus)


VLLM_HYBRID_FRACTION = 0.2  # create_vllm_engines' share per TP=1 engine in a shared placement group


def gpu_fraction(n_agents_sharing: int, with_ref: bool = True) -> float:
    """GPU (and CPU) share of each DeepSpeed actor/reference when ``n`` agents share every GPU bundle.

    Each bundle holds n vLLM engines at 0.2 (OpenRLHF's fixed share) plus n actors and n references, so
    f = (1 − 0.2·n) / (n · (1 + with_ref)), rounded down to 0.01. Ray fractions only place actors; memory
    is what the sleep modes manage.
    """
    per_agent = 2 if with_ref else 1
    left = 1.0 - VLLM_HYBRID_FRACTION * n_agents_sharing
    f = int(100 * left / (n_agents_sharing * per_agent)) / 100
    if f <= 0:
        most = round(1 / VLLM_HYBRID_FRACTION) - 1
        raise ValueError(
            f"{n_agents_sharing} agents cannot share every GPU in OpenRLHF's hybrid engine (vLLM takes "
            f"{VLLM_HYBRID_FRACTION} of a GPU per agent: at most {most} agents); give each agent its own "
            "GPUs with the pair's gpu_split"
        )
    return f


def joint_agent_args(cfg: TrainConfig, opts: OpenRLHFOptions, layout: Layout, k: int) -> list[str]:
    """Agent k's OpenRLHF arguments in a joint run (the driver parses them with OpenRLHF's own parser).

    The agent's own samples get GSPO's flags (HACPO's own term, §3.6); the cross term, advantages and
    stepwise bound are HACPO's trainer's (:mod:`.joint.actor`), which reads them from the run config. A
    learner trains on n·B·G rows per step (own and cross; B·G for XGRPO and SGT: ``Method.rows_per_learner``),
    in mini-batches of ``minibatch_size``.
    """
    layout = Layout(Path(layout.run_dir).resolve())
    method = cfg.resolved_method()
    if not method.joint:
        raise ValueError(
            f"method {cfg.method!r} is single-agent: build_command runs it on OpenRLHF's trainer"
        )
    if method.rollout_multiplier != 1 or method.epochs != 1:
        raise ValueError(
            f"joint method {cfg.method!r}: the OpenRLHF joint trainer samples G and runs one epoch"
        )
    agent = cfg.agents[k]
    paths = layout.agent(agent.name)
    rows = method.rows_per_learner(cfg.prompts_per_step * cfg.group_size, len(cfg.agents))
    gpus = agent_gpus(cfg, opts)[k]
    args = _train_args(
        cfg, opts, agent, paths.prompts, paths.ckpt, paths.final, layout, rows, gpus, gspo=True,
        lora=cfg.agent_adapter(k),
    )
    return args + list(opts.extra_args)  # no OpenRLHF loggers: the run loop writes TensorBoard and W&B


def _train_args(
    cfg: TrainConfig,
    opts: OpenRLHFOptions,
    agent,
    prompts: Path,
    ckpt: Path,
    final: Path,
    layout: Layout,
    rows_per_learner: int,
    gpus_per_node: int,
    *,
    gspo: bool = False,
    lora=None,
) -> list[str]:
    """``train_ppo_ray`` arguments of one agent (no program name): model, GPUs, data, rollout, mini-batches,
    loss (the method's, or GSPO's own term for a joint learner), optimiser, LoRA (``lora``: the agent's
    :class:`~hacpo.config.LoraSpec`, :mod:`.lora`), checkpoints, logging, reward."""
    method = cfg.resolved_method()
    nodes = opts.nodes
    total = nodes * gpus_per_node
    spec = cfg.loss_spec()
    samples = cfg.group_size * method.rollout_multiplier
    update_size = max(1, cfg.minibatch_size // method.minibatch_divisor)
    if rows_per_learner % update_size:
        raise ValueError(
            f"{rows_per_learner} sequences per step do not split into mini-batches of {update_size}: "
            "OpenRLHF drops the remainder; choose a minibatch_size dividing a learner's rows per step"
        )
    if update_size % (total * opts.micro_train_batch_size):
        raise ValueError(
            f"a mini-batch of {update_size} sequences does not split over {total} GPUs × "
            f"micro_train_batch_size {opts.micro_train_batch_size}"
        )
    if total % opts.vllm_tensor_parallel_size:
        raise ValueError(
            f"{total} GPUs of agent {agent.name!r} do not split into vLLM engines of tensor_parallel_size "
            f"{opts.vllm_tensor_parallel_size}"
        )

    args: list[str] = []
    model = Path(agent.path).resolve() if Path(agent.path).exists() else agent.path  # a path or a Hub id
    args += _flag("actor.model_name_or_path", model)
    args += _flag("actor.num_nodes", nodes) + _flag("actor.num_gpus_per_node", gpus_per_node)
    if spec.kl_beta > 0:  # a reference group exists only with a KL term
        args += _flag("ref.num_nodes", nodes) + _flag("ref.num_gpus_per_node", gpus_per_node)
    args += _flag("vllm.num_engines", total // opts.vllm_tensor_parallel_size)
    args += _flag("vllm.tensor_parallel_size", opts.vllm_tensor_parallel_size)
    args += _flag("vllm.gpu_memory_utilization", opts.vllm_gpu_memory_utilization)
    if opts.enable_prefix_caching:
        args += _flag("vllm.enable_prefix_caching")
    if opts.colocate:
        args += _flag("train.colocate_all")
    if opts.sleep:
        args += _flag("vllm.enable_sleep") + _flag("ds.enable_sleep")
    args += _flag("ds.zero_stage", opts.zero_stage) + _flag("ds.param_dtype", opts.param_dtype)
    args += _flag("ds.attn_implementation", opts.attn_implementation)
    if opts.packing_samples:
        args += _flag("ds.packing_samples")
    if lora is not None:  # OpenRLHF's own LoRA; the sync to vLLM sends merged weights (.lora)
        check_lora(lora, opts, agent.name)
        args += _flag("ds.lora.rank", lora.rank) + _flag("ds.lora.alpha", int(lora.alpha))
        args += _flag("ds.lora.dropout", float(lora.dropout))
        if not isinstance(lora.target_modules, str):  # all-linear is OpenRLHF's default; as a list, a name
            args += _flag("ds.lora.target_modules", *lora.target_modules)
    if opts.gradient_checkpointing:
        args += _flag("actor.gradient_checkpointing_enable")
    if opts.adam_offload:
        args += _flag("ds.adam_offload")
    if opts.cpu:  # no NCCL, no CUDA IPC: weights go to vLLM by broadcast (gloo, hacpo.engines.openrlhf.cpu)
        args += _flag("vllm.sync_backend", "gloo") + _flag("vllm.enforce_eager")

    # data: pre-rendered prompts (the agent's chat template, thinking off), one episode of exactly `steps`
    args += _flag("data.prompt_dataset", prompts) + _flag("data.input_key", "prompt")
    # max_samples also truncates OpenRLHF's eval dataset: at least val_size (the prompt file has exactly
    # steps × prompts_per_step rows, so every one is trained either way)
    max_samples = max(cfg.steps * cfg.prompts_per_step, cfg.val_size if cfg.val_file else 0)
    args += _flag("data.label_key", "answer") + _flag("data.max_samples", max_samples)
    args += _flag("data.max_len", opts.max_prompt_tokens + cfg.max_new_tokens)
    args += _flag("train.num_episodes", 1) + _flag("train.seed", cfg.seed)

    # rollout and mini-batches (spec §6)
    args += _flag("rollout.batch_size", cfg.prompts_per_step) + _flag("rollout.n_samples_per_prompt", samples)
    args += _flag("rollout.max_new_tokens", cfg.max_new_tokens)
    args += _flag("rollout.temperature", cfg.temperature) + _flag("rollout.top_p", cfg.top_p)
    args += _flag("rollout.micro_batch_size", opts.micro_rollout_batch_size)
    args += _flag("train.batch_size", update_size) + _flag("train.max_epochs", method.epochs)
    args += _flag("train.micro_batch_size", opts.micro_train_batch_size)

    # the loss (spec §2.1, §2.2; a joint learner's own term is GSPO's, §3.6)
    args += _flag("algo.advantage.estimator", "group_norm")
    token_level = spec.kind == "grpo" and not gspo
    eps = (3e-4, 4e-4) if gspo else (spec.eps_low, spec.eps_high)
    args += _flag("actor.policy_loss_type", "ppo" if token_level else "gspo")
    args += _flag("actor.eps_clip_low_high", *eps)
    args += _flag("actor.loss_agg_mode", "token-mean" if token_level else "seq-mean-token-mean")
    args += _flag("algo.kl.init_coef", spec.kl_beta)
    if spec.kl_beta > 0:
        args += _flag("algo.kl.use_loss") + _flag("algo.kl.estimator", "k3")

    # optimiser (spec §7): every value passed, OpenRLHF's defaults differ
    args += _flag("actor.adam.lr", cfg.lr) + _flag("actor.adam.betas", *cfg.betas)
    args += _flag("actor.adam.weight_decay", cfg.weight_decay) + _flag("actor.max_norm", cfg.grad_clip)
    args += _flag("actor.lr_scheduler", "constant") + _flag("actor.lr_warmup_ratio", 0.0)

    # checkpoints: DeepSpeed states to resume from, Hugging Face copies for the contract's step-N folders
    args += _flag("ckpt.path", ckpt) + _flag("ckpt.output_dir", final)
    args += _flag("ckpt.save_steps", cfg.checkpoint_every or -1) + _flag("ckpt.max_num", cfg.keep_checkpoints)
    args += _flag("ckpt.save_hf") + _flag("ckpt.load_enable") + _flag("ckpt.best_metric_key", "none")

    args += _flag("logger.logging_steps", 1)
    return args + _flag("reward.remote_url", reward_file())


def reward_file() -> Path:
    """The ``--reward.remote_url`` Python file: :mod:`hacpo.engines.openrlhf.reward_func`."""
    return Path(__file__).with_name("reward_func.py").resolve()
