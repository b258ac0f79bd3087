"""GPU engine on OpenRLHF 0.11.2 (Ray + vLLM + DeepSpeed): single-agent baselines through OpenRLHF's own
``train_ppo_ray``, joint methods through HACPO's driver over one OpenRLHF stack per agent (:mod:`.joint`),
both writing the same run directory as the local engine.

- :mod:`hacpo.engine_options` (outside this package: the run config reads it) — typed GPU/memory/logging
  options (the ``openrlhf:`` config section);
- :mod:`.command` — a run → one ``train_ppo_ray`` command line (pure, tested against OpenRLHF's parser);
- :mod:`.reward_func` — the ``--reward.remote_url`` file: our reward, bounded, never raising;
- :mod:`.logs` — OpenRLHF's TensorBoard scalars → ``metrics.jsonl`` / ``validation.jsonl``;
- :mod:`.gpumem` — peak GPU memory per device and process (NVML);
- :mod:`.ray_cluster` — a job's own Ray cluster on its SLURM nodes, stopped at exit;
- :mod:`.runner` — ``train``: all of the above for one run;
- :mod:`.joint` — HACPO, Naive and the ablations for n ≥ 2 agents (imports OpenRLHF: GPU/CPU install only).

Nothing here imports OpenRLHF, Ray or vLLM at module level: the CPU install imports it all.
"""

from __future__ import annotations


def refuse_local_only(cfg) -> None:
    """A run config's keys only the local engine honours stop an OpenRLHF run rather than go unread."""
    local_only = [f"agents.{i}.{k}" for i, a in enumerate(cfg.agents) for k in ("shared_base", "lr")
                  if getattr(a, k) is not None]  # fmt: skip
    if local_only:
        raise ValueError(
            f"{', '.join(local_only)}: the local engine's (a base shared by several agents, an "
            "agent's own learning rate); the OpenRLHF engine loads a base per agent at the run's lr: "
            "remove them"
        )


def train(cfg, opts):
    """Train (or resume) one run on OpenRLHF (:func:`hacpo.engines.openrlhf.runner.train`)."""
    refuse_local_only(cfg)
    from .runner import train as _train

    return _train(cfg, opts)


__all__ = ["refuse_local_only", "train"]
