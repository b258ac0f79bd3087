"""Tiny local agents: tokenizers, models, supervised warm-up, and re-tokenisation between tokenizers."""
