"""What every module of tests/openrlhf needs first: the real stack (openrlhf 0.11.2, vLLM, DeepSpeed, Ray) of
.venv-rehearsal, and on a machine without CUDA OpenRLHF's CUDA calls mapped as a CPU run maps them
(:mod:`hacpo.engines.openrlhf.cpu`). Nothing is faked: a module without the stack is skipped, or fails where
``HACPO_REQUIRE_REAL_STACK=1`` (CI: a broken rehearsal venv must not pass as skips)."""

from __future__ import annotations

import importlib

NEEDS = (
    "needs the real stack (openrlhf 0.11.2, vllm 0.29.0): bash scripts/setup_rehearsal.sh, then "
    ".venv-rehearsal/bin/python -m pytest tests/openrlhf"
)


def require(*modules: str) -> None:
    """Import each of ``modules`` for the test module that calls this at its top: skip it without them, or
    fail it where ``HACPO_REQUIRE_REAL_STACK=1``."""
    # imported here, not at the top: spawned processes (the weight-sync test's ranks) import this module
    # without tests/conftest.py, which registers tests/required.py
    from required import missing

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as err:
            missing("HACPO_REQUIRE_REAL_STACK", f"{name} does not import ({err})", NEEDS, module_level=True)


def toy_joint_config(agents: dict, data, out_dir, **over):
    """A two-agent HACPO run on the toy data, at the rehearsal's CPU settings (``over`` replaces keys)."""
    from hacpo.config import TrainConfig

    return TrainConfig.model_validate(
        {
            "method": "hacpo",
            "agents": [{"name": n, "path": str(p)} for n, p in agents.items()],
            "train_file": str(data / "train.jsonl"),
            "val_file": str(data / "dev.jsonl"),
            "val_size": 16,
            "val_every": 1,
            "out_dir": str(out_dir),
            "steps": 2,
            "prompts_per_step": 4,
            "group_size": 4,
            "minibatch_size": 8,  # 2 agents × 4 prompts × 4 = 32 rows per learner: 4 updates of 8
            "max_new_tokens": 13,
            "checkpoint_every": 1,
            "keep_checkpoints": 2,
            "lr": 1e-4,
            "openrlhf": {
                "cpu": True, "gpus_per_node": 1, "max_prompt_tokens": 64, "micro_train_batch_size": 4,
                "gradient_checkpointing": False, "vllm_gpu_memory_utilization": 0.1,
            },
            **over,
        }
    )  # fmt: skip


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
