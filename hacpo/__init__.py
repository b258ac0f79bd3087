"""HACPO: Heterogeneous Agent Collaborative Policy Optimization.

Layers (lower never import upper): ``hacpo.algo`` (maths) → ``hacpo.reward``/``hacpo.data``/``hacpo.agents``
→ ``hacpo.engines`` → ``hacpo.pipeline``/``hacpo.cli``.
"""

__version__ = "0.1.0"
