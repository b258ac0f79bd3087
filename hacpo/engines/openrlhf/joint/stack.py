"""One agent of a joint run on OpenRLHF: its vLLM engines, DeepSpeed actor and reference groups (issue 11).

:class:`OpenRLHFStack` is the :class:`~.controller.AgentStack` the controller drives, made of OpenRLHF's own
classes with this agent's own arguments (model, lengths, lr: ``args`` parsed from
:func:`hacpo.engines.openrlhf.command.joint_agent_args`):

- ``generate``: OpenRLHF's ``SamplesGenerator`` dispatch on an explicit prompt list (no dataloader, no
  dynamic filtering), vLLM woken for it and put back to sleep; our reward file runs inside each engine;
- ``score``: ``RemoteExperienceMaker.make_experience`` — the actor's and reference's log-probs;
- ``train``: rows shared out over the data-parallel ranks (own and cross rows evenly) → ``append`` →
  reload states → ``fit`` (:class:`~.actor.HacpoActorTrainer`) → offload states;
- ``evaluate``: the same dispatch, greedy, one sample per prompt (in-training validation);
- ``sync``: the actor's weights to this agent's engines (CUDA IPC when colocated; each agent's own NCCL
  group otherwise, never the shared ``sync_with_ray`` group name).

"""

from __future__ import annotations

from dataclasses import dataclass

import ray
from openrlhf.trainer.ppo_utils.experience import (
    make_experience_batch,
    remove_padding_in_sequences,
    split_experience_batch,
)
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
from openrlhf.trainer.ray.vllm_engine import batch_vllm_engine_call

from .rows import IS_SELF, batchable


def balanced_chunks(rows: list, ranks: int) -> list[list]:
    """Rows dealt to ``ranks`` data-parallel ranks, own rows first then cross rows, round robin: every rank
    gets the same number of rows and of own rows (± 1), so self-first order holds on every rank."""
    if len(rows) % ranks:
        raise ValueError(f"{len(rows)} rows do not split evenly over {ranks} data-parallel ranks")
    own = [r for r in rows if float(r.info[IS_SELF]) == 1]
    cross = [r for r in rows if float(r.info[IS_SELF]) != 1]
    chunks: list[list] = [[] for _ in range(ranks)]
    for i, row in enumerate(own + cross):
        chunks[i % ranks].append(row)
    return chunks


@dataclass
class OpenRLHFStack:
    name: str
    strategy: object  # DeepspeedStrategy over this agent's args
    tokenizer: object
    vllm_engines: list
    actor_group: object  # RayActorGroup of HacpoPolicyActor
    ref_group: object | None  # RayActorGroup of ReferenceModelActor (KL on own rows)
    sleep_after_sync: bool = True  # agents share GPUs: keep vLLM weights off the GPU between steps

    def __post_init__(self):
        args = self.strategy.args
        self.args = args
        self.generator = SamplesGenerator(self.strategy, None, None, self.tokenizer, self.vllm_engines)
        kl = FixedKLController(0.0)  # KL is a loss on own rows (HACPO's trainer), never in the reward
        self.maker = RemoteExperienceMaker(
            self.actor_group, None, None, self.ref_group, kl, self.strategy, self.tokenizer
        )

    def generate(
        self, prompts: list[str], labels: list[str], n: int, temperature: float | None = None
    ) -> list:
        args = self.args
        batch = iter([(None, list(prompts), list(labels), [None] * len(prompts))])
        temperature = args.rollout.temperature if temperature is None else temperature
        if args.vllm.enable_sleep:
            batch_vllm_engine_call(self.vllm_engines, "wake_up")
        try:
            rows, _, _ = self.generator._generate_vllm(
                dataloader_iter=batch,
                num_prompts=len(prompts),
                dynamic_filtering=False,
                n_samples_per_prompt=n,
                max_new_tokens=args.rollout.max_new_tokens,
                max_len=args.data.max_len,
                temperature=temperature,
                top_p=args.rollout.top_p if temperature > 0 else 1.0,
            )
        finally:
            if args.vllm.enable_sleep:
                batch_vllm_engine_call(self.vllm_engines, "sleep")
        return rows

    def evaluate(self, prompts: list[str], labels: list[str]) -> list[float]:
        """Greedy (temperature 0) pass@1 reward per prompt, scored by our reward file in the engines."""
        from .controller import assign_prompt_ids

        rows = self.generate(prompts, labels, 1, temperature=0.0)
        out = [0.0] * len(prompts)
        for row, pid in zip(rows, assign_prompt_ids(rows, prompts, 1), strict=True):
            out[pid] = float(row.rewards.reshape(-1)[0])
        return out

    def score(self, rows: list) -> list:
        batches = self.maker.make_experience(self.maker.split_rollout_samples(list(rows)))
        out = []
        for batch in batches:
            out += remove_padding_in_sequences(split_experience_batch(batch))
        return out

    def train(self, rows: list) -> dict:
        group = self.actor_group
        ranks = len(group._actor_handlers) // group.duplicate_actors
        chunks = balanced_chunks(batchable(rows), ranks)
        batches = [make_experience_batch(c) for c in chunks]
        ray.get(group.async_run_method_batch(method_name="append", experience=batches))
        sleep = self.args.ds.enable_sleep
        if sleep:
            ray.get(group.async_run_method(method_name="reload_states"))
        try:
            status = ray.get(group.async_run_method(method_name="fit"))[0]
        finally:
            if sleep:
                ray.get(group.async_run_method(method_name="offload_states"))
        return status

    def sync(self) -> None:
        if self.args.vllm.enable_sleep:
            batch_vllm_engine_call(self.vllm_engines, "wake_up", tags=["weights"])
        ray.get(self.actor_group.async_run_method(method_name="broadcast_to_vllm"))
        if self.args.vllm.enable_sleep and self.sleep_after_sync:
            batch_vllm_engine_call(self.vllm_engines, "sleep")

    def save_checkpoint(self, step: int) -> None:
        """DeepSpeed states (resume) and a Hugging Face copy (``global_step<N>_hf``) of this agent."""
        ray.get(self.actor_group.async_run_method(method_name="save_checkpoint", tag=f"global_step{step}"))

    def save_model(self) -> None:
        ray.get(self.actor_group.async_save_model())
