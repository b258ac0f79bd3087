"""HACPO, Naive sharing and the ablations for n ≥ 2 agents on OpenRLHF 0.11.2.

- :mod:`.rows` — own and cross rows as OpenRLHF ``Experience``s, per-row fields, joint advantages;
- :mod:`.loss` — hacpo.algo's loss per micro-batch, normalised per optimizer step (accumulation, DP);
- :mod:`.actor` — ``ActorPPOTrainer`` / ``PolicyModelActor`` with that loss (OpenRLHF's own classes).

These modules import OpenRLHF: load them only where it is installed (the GPU env, or the CPU install).
"""
