"""``python -m hacpo.engines.openrlhf.joint.driver <run>/openrlhf/joint.json``: a joint run on OpenRLHF.

Mirrors OpenRLHF's ``train_ppo_ray.train()`` with one agent stack per model:

1. every agent's arguments go through OpenRLHF's own parser, ``hierarchize`` and checks
   (:func:`parse_args`), then ``get_strategy`` — each agent keeps its own model, lr and lengths;
2. placement: agents sharing every GPU get one placement group (vLLM at OpenRLHF's 0.2 per engine, actor
   and reference at ``command.gpu_fraction``), each asleep while another works; with the pair's
   ``gpu_split`` each agent gets its own GPUs and the standard hybrid layout on them;
3. per agent: ``create_vllm_engines`` (our reward file inside), a ``RayActorGroup`` of
   :class:`~.actor.HacpoPolicyActor`, a reference group; models loaded (and, on resume, DeepSpeed states of
   the controller's step, :func:`pin_resume_step`); HACPO's loss switched on (``use_hacpo``);
4. :class:`HacpoController` — a plain subclass of OpenRLHF's ``BasePPOTrainer`` wrapped with ``ray.remote``
   (Ray forbids subclassing a remote class) — runs :class:`~.controller.JointLoop` over the stacks.
"""

from __future__ import annotations

import json
import runpy
import sys
from dataclasses import asdict
from pathlib import Path

from openrlhf.trainer.ppo_trainer import BasePPOTrainer

from hacpo.config import TrainConfig

from ..command import Layout, gpu_fraction
from .controller import JointLoop
from .state import pin_resume_step, read_state


class _Parsed(Exception):
    def __init__(self, namespace):
        super().__init__("parsed")
        self.namespace = namespace  # not `args`: Exception.args is the exception's own tuple


def parse_args(argv: list[str]):
    """OpenRLHF's own ``train_ppo_ray`` parser, ``hierarchize`` and argument checks on ``argv`` → its args
    namespace. The parser lives in the CLI's ``__main__`` block, so the module runs as ``__main__`` with
    ``get_strategy`` (the first call after the checks) capturing the args instead of training."""
    import openrlhf.utils
    import ray

    def capture(args):
        raise _Parsed(args)

    saved = (openrlhf.utils.get_strategy, sys.argv, ray.is_initialized)
    openrlhf.utils.get_strategy = capture
    ray.is_initialized = lambda: True  # train() would start Ray before get_strategy
    sys.argv = ["train_ppo_ray", *argv]
    try:
        runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__")
    except _Parsed as parsed:
        return parsed.namespace
    finally:
        openrlhf.utils.get_strategy, sys.argv, ray.is_initialized = saved
    raise RuntimeError("openrlhf.cli.train_ppo_ray returned without reaching get_strategy")


def build(spec: dict):
    """Every agent's engines, actor and reference groups, models loaded, HACPO's loss on; the controller."""
    import ray

    return ray.remote(num_cpus=1)(HacpoController).remote(spec, build_parts(spec))


def build_parts(spec: dict) -> list[dict]:
    """Every agent's ``{name, strategy, engines, actor, ref, args}``: engines, actor and reference groups
    created, models loaded, HACPO's loss on (:func:`make_stacks` turns them into agent stacks)."""
    import ray
    from openrlhf.trainer.ray import create_vllm_engines
    from openrlhf.trainer.ray.launcher import RayActorGroup, ReferenceModelActor
    from openrlhf.utils import get_strategy
    from ray.util.placement_group import placement_group

    from ..lora import AdapterOffReference
    from .actor import policy_actor_class

    cfg = TrainConfig.model_validate(spec["config"])
    names = [a.name for a in cfg.agents]
    all_args = [parse_args(spec["argv"][name]) for name in names]
    shared = spec["shared_gpus"]
    with_ref = cfg.loss_spec().kl_beta > 0
    fraction = gpu_fraction(len(names) if shared else 1, with_ref)
    state = read_state(Path(spec["state"]))
    pin_resume_step([a.ckpt.path for a in all_args], state["step"])

    pg = None
    parts = []
    for name, args in zip(names, all_args, strict=True):
        strategy = get_strategy(args)
        gpus = args.actor.num_nodes * args.actor.num_gpus_per_node
        if pg is None or not shared:
            pg = placement_group([{"GPU": 1, "CPU": 1} for _ in range(gpus)], strategy="PACK")
            ray.get(pg.ready())
        engines = create_vllm_engines(
            args.vllm.num_engines, args.vllm.tensor_parallel_size, args.actor.model_name_or_path,
            args.train.seed, args.train.full_determinism_enable, args.vllm.enable_prefix_caching,
            args.vllm.enforce_eager, args.data.max_len, pg, args.vllm.gpu_memory_utilization,
            args.vllm.enable_sleep, None, remote_rm_url=args.reward.remote_url,
        )  # fmt: skip
        duplicates = args.ds.ring_attn_size * args.ds.tensor_parallel_size
        actor = RayActorGroup(
            args.actor.num_nodes, args.actor.num_gpus_per_node, policy_actor_class(), pg=pg,
            num_gpus_per_actor=fraction, duplicate_actors=duplicates,
        )  # fmt: skip
        ref = None
        if with_ref and cfg.agent_adapter(len(parts)) is not None:  # LoRA: the base, adapter off
            ref = AdapterOffReference(actor)
        elif with_ref:
            ref = RayActorGroup(
                args.ref.num_nodes, args.ref.num_gpus_per_node, ReferenceModelActor, pg=pg,
                num_gpus_per_actor=fraction, duplicate_actors=duplicates,
            )  # fmt: skip
        parts.append(dict(name=name, strategy=strategy, engines=engines, actor=actor, ref=ref, args=args))

    for k, part in enumerate(parts):  # one agent at a time: models load while the others' are offloaded
        args = part["args"]  # scheduler length: optimizer steps of the run (the lr is constant anyway)
        steps = cfg.steps * max(1, len(names) * cfg.prompts_per_step * cfg.group_size // cfg.minibatch_size)
        refs = part["actor"].async_init_model_from_pretrained(
            part["strategy"], args.actor.model_name_or_path, steps, part["engines"]
        )
        if isinstance(part["ref"], RayActorGroup):  # a model of its own (full fine-tuning)
            refs += part["ref"].async_init_model_from_pretrained(
                part["strategy"], args.actor.model_name_or_path
            )
        ray.get(refs)
        hacpo = dict(spec=asdict(cfg.loss_spec()), order=cfg.minibatch_order, seed=cfg.seed, learner=k)
        ray.get(part["actor"].async_run_method(method_name="use_hacpo", **hacpo))
    return parts


def make_stacks(spec: dict, parts: list[dict]) -> list:
    """One :class:`~.stack.OpenRLHFStack` per agent over its built parts, with OpenRLHF's tokenizer."""
    from openrlhf.utils.utils import get_tokenizer

    from .stack import OpenRLHFStack

    stacks = []
    for p in parts:
        args = p["args"]
        fast = not args.data.disable_fast_tokenizer
        tok = get_tokenizer(args.actor.model_name_or_path, None, "left", p["strategy"], use_fast=fast)
        stacks.append(
            OpenRLHFStack(
                p["name"], p["strategy"], tok, p["engines"], p["actor"], p["ref"],
                sleep_after_sync=spec["shared_gpus"],
            )
        )  # fmt: skip
    return stacks


class HacpoController(BasePPOTrainer):
    """OpenRLHF's ``BasePPOTrainer`` (the first agent's groups) driving every agent's stack
    through :class:`~.controller.JointLoop`, whose run loop writes the logs, TensorBoard and W&B; the joint
    command gives OpenRLHF's own loggers nothing to write to."""

    def __init__(self, spec: dict, parts: list[dict]):
        stacks = make_stacks(spec, parts)
        first = parts[0]
        super().__init__(
            first["strategy"], first["actor"], None, None, first["ref"], first["engines"], stacks[0].tokenizer
        )
        self.cfg, self.spec = TrainConfig.model_validate(spec["config"]), spec
        self.loop = JointLoop(self.cfg, stacks, Path(spec["state"]))

    def save_logs_and_checkpoints(self, global_step: int, logs_dict=None, client_states=None) -> None:
        """Nothing: checkpoints are the loop's (every agent, then the controller state), and so are the logs
        (TensorBoard and W&B from the run loop, the same tags as the local engine's)."""

    def fit(self, global_step: int = 0) -> int:
        start = read_state(self.loop.state_file)["step"]
        if start:  # the engines hold the initial weights: give them the resumed ones
            for stack in self.loop.stacks:
                stack.sync()
        steps = self.loop.run()
        if self.spec.get("sync_check"):  # after save_model: the check's update never reaches saved weights
            from .sync_check import check_stacks

            report = check_stacks(self.loop.stacks, self.cfg, self.spec["sync_check"])
            failed = [name for name, r in report.items() if not r["holds"]]
            if failed:
                raise RuntimeError(f"the weight sync did not hold for {failed}: {self.spec['sync_check']}")
        return steps


def openrlhf_worker_env() -> dict[str, str]:
    """The environment ``train_ppo_ray`` gives its Ray workers (its ``ray.init``), the same for ours."""
    import os

    defaults = {
        "TOKENIZERS_PARALLELISM": "true",
        "NCCL_DEBUG": "WARN",
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1",
    }
    return {k: os.environ.get(k, v) for k, v in defaults.items()}


def main(argv: list[str] | None = None) -> int:
    """The joint run of ``joint.json``; with ``--sync-check OUT``, only each agent's weight-sync check on
    fresh stacks (:mod:`.sync_check`; exit 1 when it does not hold)."""
    import ray

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--sync-check"):
        usage = "usage: python -m hacpo.engines.openrlhf.joint.driver <run>/openrlhf/joint.json"
        usage += " [--sync-check OUT]"
        print(usage, file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    if not ray.is_initialized():
        ray.init(runtime_env={"env_vars": openrlhf_worker_env()})
    if len(argv) == 3:
        from .sync_check import check_stacks

        cfg = TrainConfig.model_validate(spec["config"])
        report = check_stacks(make_stacks(spec, build_parts(spec)), cfg, argv[2])
        print(json.dumps(report, indent=1), flush=True)
        return 0 if all(r["holds"] for r in report.values()) else 1
    controller = build(spec)
    steps = ray.get(controller.fit.remote())
    print(f"hacpo joint run finished: {steps} steps ({Layout(Path(spec['run_dir'])).root})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
