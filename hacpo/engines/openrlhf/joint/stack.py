"""One agent of a joint run on OpenRLHF: its vLLM engines, DeepSpeed actor and reference groups.

:class:`OpenRLHFStack` is the :class:`~.controller.AgentStack` the controller drives, made of OpenRLHF's own
classes with this agent's own arguments (model, lengths, lr: ``args`` parsed from
:func:`hacpo.engines.openrlhf.command.joint_agent_args`):

- ``generate``: the explicit prompt list to this agent's vLLM engines, one seeded request per sample
  (OpenRLHF's ``generate_responses`` and executor, our reward file inside each engine, rows from
  OpenRLHF's ``_process_response_into_experience``), vLLM woken for it and put back to sleep;
- ``score``: ``RemoteExperienceMaker.make_experience`` — the actor's and reference's log-probs;
- ``train``: rows made batchable and shared out over the data-parallel ranks (own and cross rows evenly)
  → ``append`` → reload states → ``fit_step`` (:class:`~.actor.HacpoActorTrainer`) → offload states; each
  update's metrics merged over the ranks;
- ``evaluate``: the same dispatch, greedy, one sample per prompt (in-training validation);
- ``sync``: the actor's weights to this agent's engines (CUDA IPC when colocated; each agent's own NCCL
  group otherwise, never the shared ``sync_with_ray`` group name; gloo on CPU), asleep again after it
  when it was (:func:`sync_calls`).

"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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

from hacpo.engines.core.metrics import merge_parts
from hacpo.engines.core.nonfinite import SKIPPED, NonFiniteWeights

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


def sync_calls(sleep_mode: bool, sleep_after: bool) -> list:
    """The engine calls around a weight broadcast. vLLM's executor stays *asleep* while any tag sleeps
    (``Executor.wake_up``), and ``sleep()`` on a sleeping executor does nothing: waking only the weights to
    receive them and calling ``sleep()`` after would leave the weights on the GPU. So the KV cache is woken
    too before the engine is put back to sleep (agents sharing GPUs keep only the working agent awake)."""
    if not sleep_mode:
        return ["broadcast"]
    calls = [("wake_up", {"tags": ["weights"]}), "broadcast"]
    if sleep_after:
        calls += [("wake_up", {"tags": ["kv_cache"]}), ("sleep", {})]
    return calls


# Values every rank reports alike for an optimizer step (DeepSpeed's global gradient norm, the lr, m, and
# whether DeepSpeed skipped it: its check for non-finite gradients is all-reduced over the ranks).
SHARED_KEYS = ("actor_lr", "grad_norm", "update", SKIPPED)


def merge_rank_updates(ranks: list[list[dict]]) -> list[dict]:
    """One learner's updates from every data-parallel rank's ``fit``: each update's metrics merged over the
    ranks' shares of it as over micro-batches (:func:`hacpo.engines.core.metrics.merge_parts`: the local
    engine's numbers over the whole mini-batch), the shared values (:data:`SHARED_KEYS`) from the first
    rank."""
    if len({len(r) for r in ranks}) > 1:
        raise ValueError(f"data-parallel ranks ran different numbers of updates: {[len(r) for r in ranks]}")
    out = []
    for shares in zip(*ranks, strict=True):
        parts = [(s.get("rows", 0.0), {k: v for k, v in s.items() if k not in SHARED_KEYS}) for s in shares]
        out.append({**merge_parts(parts), **{k: shares[0][k] for k in SHARED_KEYS if k in shares[0]}})
    return out


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
        from hacpo.agents.retokenize import stop_token_ids

        args = self.strategy.args
        self.args = args
        # every id vLLM stops at (generation_config's eos ids too): each ends a response in the text exchange
        self.stop_ids = stop_token_ids(self.tokenizer, args.actor.model_name_or_path)
        self.generator = SamplesGenerator(self.strategy, None, None, self.tokenizer, self.vllm_engines)
        kl = FixedKLController(0.0)  # KL is a loss on own rows (HACPO's trainer), never in the reward
        self.maker = RemoteExperienceMaker(
            self.actor_group, None, None, self.ref_group, kl, self.strategy, self.tokenizer
        )

    def generate(
        self,
        prompts: list[str],
        labels: list[str],
        n: int,
        temperature: float | None = None,
        seed: int | None = None,
    ) -> list:
        """``n`` samples per prompt as single-row Experiences (OpenRLHF's own executor, reward file and
        ``_process_response_into_experience``). Each sample is its own request: with ``seed``, request
        (i, j) samples with seed ``seed + i·n + j``, so a resumed run, whose engines are new, draws the
        samples an uninterrupted run draws (OpenRLHF's generator seeds nothing per request, and its ``n``
        requests of a prompt would share one seed). ``min_tokens`` 0: the policy as it is, EOS first
        included (OpenRLHF's default of 1 masks it, which the actor's log-probs do not)."""
        from vllm import SamplingParams

        args = self.args
        temperature = args.rollout.temperature if temperature is None else temperature
        greedy = temperature == 0
        engines = self.vllm_engines
        if args.vllm.enable_sleep:
            batch_vllm_engine_call(engines, "wake_up")
        try:
            refs = []
            for i, (prompt, label) in enumerate(zip(prompts, labels, strict=True)):
                for j in range(1 if greedy else n):
                    params = SamplingParams(
                        temperature=temperature,
                        top_p=1.0 if greedy else args.rollout.top_p,
                        max_tokens=args.rollout.max_new_tokens,
                        min_tokens=0,
                        skip_special_tokens=False,
                        seed=None if seed is None or greedy else seed + i * n + j,
                        logprobs=0,  # the sampled token's log-prob: rows carry vLLM's view (rows.engine_gap)
                    )
                    engine = engines[(i * n + j) % len(engines)]
                    refs.append(
                        engine.generate_responses.remote(
                            prompt=prompt, label=label, sampling_params=params,
                            max_length=args.data.max_len, hf_tokenizer=self.tokenizer,
                            num_samples=n if greedy else 1,
                        )
                    )  # fmt: skip
            responses = [r for batch in ray.get(refs) for r in batch]
        finally:
            if args.vllm.enable_sleep:
                batch_vllm_engine_call(engines, "sleep")
        return [
            self.generator._process_response_into_experience(r, max_len=args.data.max_len) for r in responses
        ]

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

    def train(self, rows: list, step: int) -> list[dict]:
        group = self.actor_group
        ranks = len(group._actor_handlers) // group.duplicate_actors
        chunks = balanced_chunks(batchable(rows), ranks)
        batches = [make_experience_batch(c) for c in chunks]
        ray.get(group.async_run_method_batch(method_name="append", experience=batches))
        sleep = self.args.ds.enable_sleep
        if sleep:
            ray.get(group.async_run_method(method_name="reload_states"))
        try:
            statuses = ray.get(group.async_run_method(method_name="fit_step", step=step))
        finally:
            if sleep:
                ray.get(group.async_run_method(method_name="offload_states"))
        return merge_rank_updates(statuses[:: group.duplicate_actors])

    def set_lr(self, lr: float) -> None:
        """The learning rate of this agent's next optimizer step (the run's constant schedule restores its
        own after it): the weight-sync check's update (:mod:`.sync_check`)."""
        ray.get(self.actor_group.async_run_method(method_name="set_lr", lr=lr))

    def sync(self) -> None:
        for call in sync_calls(self.args.vllm.enable_sleep, self.sleep_after_sync):
            if call == "broadcast":
                ray.get(self.actor_group.async_run_method(method_name="broadcast_to_vllm"))
            else:
                name, kwargs = call
                batch_vllm_engine_call(self.vllm_engines, name, **kwargs)

    def save_checkpoint(self, step: int) -> None:
        """DeepSpeed states (resume) and a Hugging Face copy (``global_step<N>_hf``) of this agent; then what
        the DeepSpeed folder holds (:func:`hacpo.checkpoints.write_checkpoint_manifest`, checked on
        resume). None of weights holding NaN/inf (:class:`~hacpo.engines.core.nonfinite.NonFiniteWeights`)."""
        from hacpo.checkpoints import write_checkpoint_manifest

        # weights holding NaN/inf are never written (every rank checks its own: ZeRO-3 shards)
        ranks = ray.get(self.actor_group.async_run_method(method_name="nonfinite_weights"))
        if bad := sorted({name for names in ranks for name in names}):
            raise NonFiniteWeights(self.name, bad)
        tag = f"global_step{step}"
        ray.get(self.actor_group.async_run_method(method_name="save_checkpoint", tag=tag))
        write_checkpoint_manifest(Path(self.args.ckpt.path) / "_actor" / tag)  # every rank has written

    def save_model(self) -> None:
        ray.get(self.actor_group.async_save_model())
