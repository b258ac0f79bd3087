"""HACPO: Heterogeneous Agent Collaborative Policy Optimization.

Layers (lower never import upper; ``tests/test_layering.py``): the base, ``hacpo.config`` (the typed run
config), ``hacpo.algo`` (the maths), ``hacpo.reward`` (verifiers), ``hacpo.runio`` (the run-directory
contract) → ``hacpo.data``/``hacpo.agents`` → ``hacpo.engines`` → ``hacpo.eval``/``hacpo.report`` →
``hacpo.pipeline``/``hacpo.cli``.
"""

__version__ = "0.2.0"
