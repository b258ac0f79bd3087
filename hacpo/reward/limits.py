"""Bounds and tuning of the reward (public limits first; the rest are internal knobs)."""

MAX_ANSWER_CHARS = 1000
"""Boxed content (and gold) longer than this scores 0 unless it matches the gold exactly."""
MAX_NESTING = 16
"""Deeper ``{}``/``()``/``[]`` nesting in the boxed content scores 0 (keeps the ANTLR parser shallow)."""
MAX_NUMBER_BITS = 1 << 20
"""Parsed expressions whose numeric value may need more bits than this (≈315k decimal digits) score 0."""

_SOFT_FRACTION = 0.75  # soft (signal) deadline as a fraction of timeout_s; the rest is headroom
_REFIRE_S = 0.05  # the deadline signal repeats until disarmed, in case some library swallows it
_WORKER_START_TIMEOUT_S = 60.0
_MAX_CHUNK = 4  # items per message; math-verify items take ms, so small chunks balance load at no cost
_DEFAULT_CACHE = 32768
# Deterministic verdicts only: timeouts/kills depend on machine load (a busy moment must not pin a 0 for the
# rest of the run); within one batch a repeated pair is scored once anyway.
_CACHEABLE = frozenset({"math_verify", "unparsed", "gold_unparsed", "too_big"})
_GOLD_CACHE_SIZE = 4096
