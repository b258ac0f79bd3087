"""OpenRLHF 0.11.2 on a machine without CUDA: the rehearsal's adaptation, explicit, small and apart.

OpenRLHF is written for CUDA; a few of its lines call CUDA unconditionally. ``openrlhf: {cpu: true}`` (the
rehearsal configs) applies :func:`install` in every process of a run: the driver and every Ray worker
(:mod:`.launch` with ``--cpu``: Ray's ``worker_process_setup_hook``). On a GPU this module is never
imported. No file of OpenRLHF, vLLM or DeepSpeed is copied or edited: each
mapping wraps one name at its site.

Site → mapping (why):

- ``torch.cuda.set_device / current_device / empty_cache / synchronize / current_stream`` (22 calls in
  openrlhf) → no-ops, ``current_device()`` is ``"cpu"``: a valid ``device=`` wherever OpenRLHF passes it.
- ``trainer/ppo_utils/replay_buffer.py:40`` ``torch.device(f"cuda:{current_device()}")`` → the buffer's
  target device is the CPU.
- ``utils/deepspeed/deepspeed.py:106`` ``init_device_mesh("cuda", …)`` → the mesh is built for ``"cpu"``.
- ``trainer/ray/vllm_worker_wrap.py:40`` ``torch.empty(…, device="cuda")`` → the weight-sync receive
  buffer is allocated on the CPU.
- ``utils/distributed_util.stateless_init_process_group`` → vLLM's PyNccl communicator *silently does
  nothing* without CUDA (``disabled``: vLLM would load its uninitialised receive buffers as weights); the
  same rendezvous forms a gloo group instead, whose ``broadcast`` moves the weights
  (:func:`stateless_gloo_group`).
- ``flash_attn_2_cuda`` (compiled kernels, not built on CPU) → an empty module, so ``flash_attn.bert_padding``
  (pure torch) imports.
- ``flash_attn.ops.triton.cross_entropy`` (Triton) → fails to import: OpenRLHF then computes log-probs
  with its own torch log-softmax (``models/utils.py``).
- vLLM's ``dispatch_cpu_unquantized_gemm`` → plain ``F.linear`` on the live weights: vLLM's CPU path
  pre-packs linear weights and drops the Parameter (no ``weight_loader``: the weight sync fails) or keeps a
  packed copy beside it (the lm head: the synced weights would never be used).
- DeepSpeed's CPU ops ``deepspeed_shm_comm`` (fast all-reduce between ranks of one node) and ``fused_adam``
  compile at first use (two ``cc1plus`` for about two minutes on 2 cores, on every fresh machine) under a
  lock file that a builder killed mid-way leaves behind, so that every later job waits on it for ever →
  ``deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False`` (DeepSpeed then all-reduces through
  torch.distributed, as it does wherever the op is unavailable), and OpenRLHF's ``AdamW`` optimizer config
  gets DeepSpeed's ``torch_adam: true`` (``torch.optim.AdamW``, the same update; ZeRO supports it).
- ``vllm.AsyncEngineArgs`` (in OpenRLHF's vLLM actor) → OpenRLHF's worker extension ``WorkerWrap`` is
  named :class:`~.cpu_vllm.CpuWorkerWrap` instead: vLLM's engine core is a process vLLM *spawns* inside its
  Ray actor, out of the setup hook's reach; importing that class there applies
  :func:`install_vllm_worker`.

Every CPU process also gets :data:`CPU_ENV` (DeepSpeed's CPU accelerator, vLLM's KV cache size and its
worker in the engine's process). What stays
for a GPU: vLLM sleep mode, CUDA IPC and NCCL weight sync, flash-attention kernels and sample packing,
several nodes (docs/openrlhf.md, "Rehearsal on CPU").
"""

from __future__ import annotations

import functools
import os
import sys
import types

CPU_ENV = {
    "DS_ACCELERATOR": "cpu",  # DeepSpeed's CPU accelerator (gloo)
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache per vLLM engine (tiny models)
    # vLLM pins its OpenMP threads to cores it picks alone (core 0 for every engine here): two jobs, or two
    # agents' engines, would then share one core while the other idles
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    # vLLM's model worker in its engine's process (the "uni" executor), not one more spawned process: on CPU,
    # vLLM switches "uni" to "mp" unless this is 0. Each engine then imports vLLM once less, holds one process
    # less, and an evaluation's engine runs in the job's process: faster on a few busy cores, the same
    # outputs (docs/openrlhf.md, "Rehearsal on CPU"). OpenRLHF's async engine keeps its engine-core process.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TOKENIZERS_PARALLELISM": "false",
}
_installed = False


def _cpu(device):
    """``device`` with CUDA replaced by the CPU (strings, ``torch.device``, ints of a CUDA ordinal)."""
    import torch

    if device is None:
        return None
    if isinstance(device, int) or str(device).startswith("cuda"):
        return torch.device("cpu")
    return device


def _map_torch_cuda() -> None:
    import torch

    cuda = torch.cuda
    cuda.set_device = lambda device=None: None
    cuda.current_device = lambda: "cpu"
    cuda.empty_cache = lambda: None
    cuda.synchronize = lambda device=None: None
    cuda.current_stream = lambda device=None: None


def _wrap_init(cls, after) -> None:
    """``cls.__init__`` run with ``torch.cuda.current_device()`` = 0 (it formats ``f"cuda:{…}"``, which
    names a device without touching CUDA), then ``after(self)``; subclasses' ``super().__init__`` too."""
    import torch

    original = cls.__init__
    if getattr(original, "_hacpo_cpu", False):
        return

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        current = torch.cuda.current_device
        torch.cuda.current_device = lambda: 0
        try:
            original(self, *args, **kwargs)
        finally:
            torch.cuda.current_device = current
        after(self)

    __init__._hacpo_cpu = True
    cls.__init__ = __init__


class GlooBroadcast:
    """The one method OpenRLHF calls on its weight-sync group (PyNccl's ``broadcast(tensor, src, stream)``),
    over a gloo process group formed by vLLM's stateless rendezvous at the same address and port."""

    def __init__(self, pg):
        self.pg = pg

    def broadcast(self, tensor, src: int = 0, stream=None) -> None:
        self.pg.broadcast(tensor, src).wait()


def stateless_gloo_group(master_address, master_port, rank, world_size, device=None) -> GlooBroadcast:
    """CPU twin of ``openrlhf.utils.distributed_util.stateless_init_process_group`` (same arguments)."""
    from vllm.distributed.utils import stateless_init_torch_distributed_process_group

    pg = stateless_init_torch_distributed_process_group(
        master_address, master_port, rank, world_size, backend="gloo"
    )
    return GlooBroadcast(pg)


def _map_openrlhf() -> None:
    import torch
    from openrlhf.trainer.ppo_utils import replay_buffer
    from openrlhf.trainer.ray import ppo_actor
    from openrlhf.utils import distributed_util
    from openrlhf.utils.deepspeed import deepspeed as ds_strategy

    def on_cpu(buffer):
        buffer.target_device = torch.device("cpu")

    _wrap_init(replay_buffer.NaiveReplayBuffer, on_cpu)

    mesh = ds_strategy.init_device_mesh
    if not getattr(mesh, "_hacpo_cpu", False):

        @functools.wraps(mesh)
        def init_device_mesh(device_type, *args, **kwargs):
            return mesh("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

        init_device_mesh._hacpo_cpu = True
        ds_strategy.init_device_mesh = init_device_mesh

    # the actor imported the name at its top, the vLLM worker imports it when called: rebind both
    distributed_util.stateless_init_process_group = stateless_gloo_group
    ppo_actor.stateless_init_process_group = stateless_gloo_group


def _map_deepspeed_ops() -> None:
    """No DeepSpeed op compiled at first use (see the module table): the shared-memory all-reduce is marked
    incompatible, DeepSpeed's own test before it builds it, and OpenRLHF's AdamW config asks DeepSpeed for
    torch's AdamW (its documented ``torch_adam`` parameter) instead of the CPU ``FusedAdam`` op."""
    import deepspeed.ops
    from openrlhf.utils.deepspeed import deepspeed as ds_strategy

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    config = ds_strategy.get_train_ds_config
    if getattr(config, "_hacpo_cpu", False):
        return

    @functools.wraps(config)
    def get_train_ds_config(*args, **kwargs):
        ds_config = config(*args, **kwargs)
        optimizer = ds_config.get("optimizer") or {}
        if str(optimizer.get("type", "")).lower() in ("adam", "adamw"):
            optimizer["params"] = {**optimizer.get("params", {}), "torch_adam": True}
        return ds_config

    get_train_ds_config._hacpo_cpu = True
    ds_strategy.get_train_ds_config = get_train_ds_config


def _map_vllm_worker() -> None:
    """``WorkerWrap.update_weight`` allocates its receive buffer with ``device="cuda"``."""
    import torch
    from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap

    update = WorkerWrap.update_weight
    if getattr(update, "_hacpo_cpu", False):
        return

    @functools.wraps(update)
    def update_weight(self, *args, **kwargs):
        empty = torch.empty
        torch.empty = lambda *a, device=None, **k: empty(*a, device=_cpu(device), **k)
        try:
            return update(self, *args, **kwargs)
        finally:
            torch.empty = empty

    update_weight._hacpo_cpu = True
    WorkerWrap.update_weight = update_weight


def _map_vllm_gemm() -> None:
    """vLLM CPU's linear layers compute with ``F.linear`` on their Parameters (see the module table)."""
    import torch
    from vllm.model_executor.layers import utils as layer_utils

    def dispatch_cpu_unquantized_gemm(layer, remove_weight: bool) -> None:
        layer.cpu_linear = torch.nn.functional.linear

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm


def _map_flash_attn() -> None:
    if "flash_attn_2_cuda" not in sys.modules:
        sys.modules["flash_attn_2_cuda"] = types.ModuleType("flash_attn_2_cuda")  # kernels not built
    sys.modules["flash_attn.ops.triton.cross_entropy"] = None  # import fails: OpenRLHF's torch fallback


OPENRLHF_VLLM_EXTENSION = "openrlhf.trainer.ray.vllm_worker_wrap.WorkerWrap"
CPU_VLLM_EXTENSION = "hacpo.engines.openrlhf.cpu_vllm.CpuWorkerWrap"


def _map_vllm_engine_args() -> None:
    """vLLM's engine core is a process of its own, spawned (never forked) inside a Ray actor, so neither the
    setup hook nor the mappings reach it; OpenRLHF names its worker extension there, and on CPU that name is
    :class:`~.cpu_vllm.CpuWorkerWrap`, whose import applies :func:`install_vllm_worker` in that process."""
    import vllm

    base = vllm.AsyncEngineArgs
    if getattr(base, "_hacpo_cpu", False):
        return

    class AsyncEngineArgs(base):
        _hacpo_cpu = True

        def __init__(self, *args, **kwargs):
            if kwargs.get("worker_extension_cls") == OPENRLHF_VLLM_EXTENSION:
                kwargs["worker_extension_cls"] = CPU_VLLM_EXTENSION
            super().__init__(*args, **kwargs)

    AsyncEngineArgs.__name__ = AsyncEngineArgs.__qualname__ = base.__name__
    vllm.AsyncEngineArgs = AsyncEngineArgs


def install_vllm_worker() -> None:
    """The mappings a vLLM engine-core process needs (OpenRLHF's ``WorkerWrap`` and vLLM's linear layers)."""
    _set_env()
    _map_torch_cuda()
    from openrlhf.utils import distributed_util

    distributed_util.stateless_init_process_group = stateless_gloo_group
    _map_vllm_worker()
    _map_vllm_gemm()


def install() -> None:
    """Apply every mapping of the module table in this process (idempotent). Ray's setup hook calls it."""
    global _installed
    if _installed:
        return
    _set_env()
    _map_flash_attn()
    _map_torch_cuda()
    _map_openrlhf()
    _map_deepspeed_ops()
    _map_vllm_worker()
    _map_vllm_gemm()
    _map_vllm_engine_args()
    _installed = True


def _set_env() -> None:
    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)
