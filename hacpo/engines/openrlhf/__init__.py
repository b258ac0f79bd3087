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


def train(cfg, opts):
    """Train (or resume) one run on OpenRLHF (:func:`hacpo.engines.openrlhf.runner.train`)."""
    from .runner import train as _train

    return _train(cfg, opts)


__all__ = ["train"]
