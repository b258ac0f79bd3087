"""``python -m hacpo.engines.openrlhf.launch [--cpu] MODULE ARGS…``: an OpenRLHF program of a run.

MODULE (OpenRLHF's ``openrlhf.cli.train_ppo_ray``, or HACPO's joint driver) runs as ``__main__``, unchanged,
with the project's hooks in its own process and in every Ray worker it starts (Ray's
``worker_process_setup_hook``, added to the program's own ``ray.init`` runtime env):

- **prompts in the order of the run's prompt file** (:func:`prompts_in_file_order`): OpenRLHF shuffles its
  prompt dataloader with an unseeded generator inside its trainer actor, so the order trained would be
  neither the local engine's step batches, which the prompt file lays out, nor reproducible from the seed;
- **validation at step 0, rollouts with** ``min_tokens`` **0** (:func:`fit_like_the_local_engine`);
- **LoRA adapters reach vLLM merged** into their base's weights (:func:`.lora.sync_merged_adapters`);
- **a rendezvous port per actor group, reserved on this node** (:func:`distinct_master_ports`);
- with ``--cpu``, :func:`hacpo.engines.openrlhf.cpu.install` (OpenRLHF's CUDA calls mapped; the rehearsal).
"""

from __future__ import annotations

import functools
import inspect
import os
import runpy
import sys
import tempfile
from pathlib import Path

CPU_FLAG_ENV = "HACPO_OPENRLHF_CPU"  # "1" in every process of a CPU rehearsal run
SETUP_HOOK = "hacpo.engines.openrlhf.launch.setup_process"
# The driver's variables its Ray workers need: the project where it is not installed, the reward file's knobs
FORWARDED_ENV = (
    "PYTHONPATH", "HACPO_ROLLOUT_LOG", "HACPO_REWARD", "HACPO_REWARD_WORKERS", "HACPO_REWARD_TIMEOUT_S",
    "HACPO_VERIFIER_FIRST_BATCH", "HACPO_VERIFIER_STOP",
)  # fmt: skip
FORWARDED_PREFIXES = ("WANDB_",)  # the actor that logs to W&B: key, mode, folder, run id (logging.wandb)


def prompts_in_file_order() -> None:
    """OpenRLHF's ``prepare_datasets`` with its prompt dataloader unshuffled (its only shuffled loader)."""
    from openrlhf.trainer import ppo_trainer

    original = ppo_trainer.prepare_datasets
    if getattr(original, "_hacpo", False):
        return

    @functools.wraps(original)
    def prepare_datasets(strategy, tokenizer):
        setup = strategy.setup_dataloader
        signature = inspect.signature(setup)

        def unshuffled(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.arguments["shuffle"] = False
            return setup(*bound.args, **bound.kwargs)

        strategy.setup_dataloader = unshuffled  # this call only: the instance attribute is removed after
        try:
            return original(strategy, tokenizer)
        finally:
            del strategy.setup_dataloader

    prepare_datasets._hacpo = True
    ppo_trainer.prepare_datasets = prepare_datasets


def fit_like_the_local_engine() -> None:
    """OpenRLHF's trainer ``fit`` with two differences, both what the local engine and the joint driver do:

    - validation at step 0 too (OpenRLHF validates after every ``eval.steps`` steps, never before the
      first; Figure 2's curves start there): OpenRLHF's own ``evaluate``, logged as step 0, in a fresh run;
    - rollouts from the policy as it is: OpenRLHF samples with ``min_tokens=1`` unless told otherwise,
      which masks an immediate EOS that the actor's log-probs (the ratio's numerator) do not mask.
    """
    from openrlhf.trainer import ppo_trainer

    # Ray copies the methods into the class it exports at the first .remote(): patch that one too
    actor = ppo_trainer.PPOTrainer
    for cls in (actor.__ray_actor_class__, actor.__ray_metadata__.modified_class):
        cls.fit = _fit_validated_first(cls.fit)


def _fit_validated_first(fit):
    if getattr(fit, "_hacpo", False):
        return fit

    @functools.wraps(fit)
    def fit_validated_first(self, global_step: int = 0):
        self.generate_kwargs.setdefault("min_new_tokens", 0)
        if self.eval_dataloader is not None and self.init_checkpoint_states()["global_step"] == 0:
            kwargs = dict(self.generate_kwargs)
            kwargs["temperature"] = self.args.eval.temperature
            kwargs["n_samples_per_prompt"] = self.args.eval.n_samples_per_prompt
            self.evaluate(0, **kwargs)
        return fit(self, global_step)

    fit_validated_first._hacpo = True
    return fit_validated_first


PORT_LOCKS = Path(tempfile.gettempdir()) / f"hacpo-master-ports-{os.getuid()}"  # per user (a shared /tmp)
_held_ports: list = []  # the lock files of the ports this process picked: held until it exits


def reserve_free_port() -> int:
    """A free TCP port that no other process of this node has reserved: the OS's free port, kept only once
    its lock file is ours (``flock``, released when this process exits)."""
    from .ray_cluster import free_port, try_lock

    PORT_LOCKS.mkdir(exist_ok=True)
    for _ in range(100):
        port = free_port()
        if (f := try_lock(PORT_LOCKS / f"{port}.lock")) is not None:
            _held_ports.append(f)
            return port
    raise RuntimeError(f"no free TCP port this node's other jobs had not reserved ({PORT_LOCKS})")


def distinct_master_ports() -> None:
    """OpenRLHF's rank-0 actors each pick their ``MASTER_PORT`` by binding port 0 and closing it, and bind it
    again later (``BaseDistributedActor._get_free_port``): two actors starting together (a joint run's
    policy and reference groups, two jobs of one node) can be handed the same port, and the second fails
    with EADDRINUSE. Each now reserves the port it picks (:func:`reserve_free_port`)."""
    from openrlhf.trainer.ray import launcher

    launcher.BaseDistributedActor._get_free_port = staticmethod(reserve_free_port)


def setup_process() -> None:
    """Every process of the run (the driver, and each Ray worker through the setup hook)."""
    if os.environ.get(CPU_FLAG_ENV) == "1":
        from .cpu import install

        install()
    distinct_master_ports()
    prompts_in_file_order()
    fit_like_the_local_engine()
    from .lora import sync_merged_adapters

    sync_merged_adapters()  # an adapter reaches vLLM merged into its base's weights


def job_runtime_env(own: dict | None, cpu: bool) -> dict:
    """A program's own ``ray.init`` runtime env plus the setup hook and, on CPU, the CPU environment."""
    env = dict(own or {})
    env_vars = dict(env.get("env_vars") or {})
    if cpu:
        from .cpu import CPU_ENV

        env_vars.update({**CPU_ENV, CPU_FLAG_ENV: "1"})
    for key, value in os.environ.items():
        if key in FORWARDED_ENV or key.startswith(FORWARDED_PREFIXES):
            env_vars.setdefault(key, value)
    return {**env, "env_vars": env_vars, "worker_process_setup_hook": SETUP_HOOK}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    cpu = bool(argv) and argv[0] == "--cpu"
    argv = argv[1:] if cpu else argv
    if not argv:
        print("usage: python -m hacpo.engines.openrlhf.launch [--cpu] MODULE [ARGS...]", file=sys.stderr)
        return 2
    if cpu:
        os.environ[CPU_FLAG_ENV] = "1"
    setup_process()
    import ray

    ray_init = ray.init

    @functools.wraps(ray_init)
    def init(*args, runtime_env=None, **kwargs):
        return ray_init(*args, runtime_env=job_runtime_env(runtime_env, cpu), **kwargs)

    ray.init = init
    sys.argv = list(argv)
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
