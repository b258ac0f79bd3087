"""Evaluation: ``generate(agent, prompts, sampling) → responses`` (engine-specific backend), then score.

Backends: :class:`hacpo.eval.local.LocalGenerator` (transformers, CPU or one GPU); the GPU engine plugs in
vLLM behind the same :class:`Generator` protocol, so tables do not care which engine produced the numbers.
"""

from .metrics import avg_at_k, pass_at_k, summarize
from .run import Decoding, Sampling, evaluate, evaluate_setting, rescore, resolve_source

__all__ = [
    "Decoding",
    "Sampling",
    "avg_at_k",
    "evaluate",
    "evaluate_setting",
    "pass_at_k",
    "rescore",
    "resolve_source",
    "summarize",
]
