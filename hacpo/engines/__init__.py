"""The two engines that train runs, and what they share.

- :mod:`.core`: the run loop, one step of any method, the loss metrics, the dead-row scheduling of the loss
  and the prompt schedule, written once for both;
- :mod:`.local`: a single-process trainer (CPU or one GPU), the embedded default;
- :mod:`.openrlhf`: OpenRLHF 0.11.2 (Ray, vLLM, DeepSpeed) for GPUs and clusters.

Neither engine imports the other (``tests/test_layering.py``).
"""
