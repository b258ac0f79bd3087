"""OpenRLHF's vLLM worker extension for the CPU rehearsal: importing this module (vLLM does, by name, in its
spawned engine-core process) applies :func:`hacpo.engines.openrlhf.cpu.install_vllm_worker` there."""

from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap

from .cpu import install_vllm_worker

install_vllm_worker()


class CpuWorkerWrap(WorkerWrap):
    """OpenRLHF's ``WorkerWrap`` unchanged, in a process where the CPU mappings are installed."""
