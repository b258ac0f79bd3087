"""What every module of tests/openrlhf needs first: the real stack (openrlhf 0.11.2, vLLM, DeepSpeed, Ray) of
.venv-rehearsal, and on a machine without CUDA OpenRLHF's CUDA calls mapped as a CPU run maps them
(:mod:`hacpo.engines.openrlhf.cpu`). Nothing is faked: a module without the stack is skipped."""

from __future__ import annotations

NEEDS = (
    "needs the real stack (openrlhf 0.11.2, vllm 0.29.0): bash scripts/setup_rehearsal.sh, then "
    ".venv-rehearsal/bin/python -m pytest tests/openrlhf"
)


def on_this_machine() -> None:
    import torch

    if not torch.cuda.is_available():
        from hacpo.engines.openrlhf.cpu import install

        install()


def broadcast_rank(rank: int, port: int, queue) -> None:
    """One side of OpenRLHF's weight-sync group with the CPU mapping (a spawned process of
    test_real_stack.py; here, where the child can import it): rank 0 sends, rank 1 receives."""
    import torch

    from hacpo.engines.openrlhf.cpu import install

    install()
    from openrlhf.utils import distributed_util

    group = distributed_util.stateless_init_process_group("127.0.0.1", port, rank, 2, "cpu")
    tensor = torch.arange(6, dtype=torch.float32) if rank == 0 else torch.zeros(6)
    group.broadcast(tensor, src=0, stream=torch.cuda.current_stream())
    queue.put((rank, tensor.tolist()))
