"""The HACPO maths: pure torch, engine-agnostic, tested against docs/algorithm.md ("The equations").

- :mod:`~hacpo.algo.advantages` — GRPO group advantages (§2.1); capability-aware joint advantages (§3.2)
- :mod:`~hacpo.algo.capability` — P̂ window and ω (§3.1)
- :mod:`~hacpo.algo.ratios` — token / GSPO sequence / cross-agent ratios (§2.2, §3.4)
- :mod:`~hacpo.algo.losses` — GRPO, GSPO, Naive and HACPO losses, stepwise clip, k3 KL (§3.5–3.6)
- :mod:`~hacpo.algo.sharing` — what a learner takes from its peers: rows, baseline, or successes (XGRPO, SGT)
- :mod:`~hacpo.algo.methods` — the method registry (§2, §8)
"""

from ._checks import NonFiniteLogProbs
from .advantages import (
    capability_baseline,
    group_advantages,
    group_by_prompt,
    joint_advantages,
    row_advantages,
)
from .capability import CapabilityTracker, omega, omega_matrix, step_accuracy
from .losses import (
    LossSpec,
    MiniBatch,
    cross_bounds,
    cross_in_bounds,
    gspo_row_loss,
    hacpo_cross_row_loss,
    k3_kl,
    k3_kl_tokens,
    metric_floats,
    policy_loss,
    ppo_clipped,
    rescue_row_loss,
    rows_with_gradient,
    stepwise_lower_bound,
)
from .methods import HACPO_KNOBS, METHODS, SGT_KNOBS, VARIANT_KNOBS, Method, get_method, method_names
from .ratios import gspo_token_ratio, masked_mean, seq_mean_logp, sequence_log_ratio, token_ratio
from .sharing import SHARING_RULES, LearnerRows, learner_rows, rescue_set

__all__ = [
    "HACPO_KNOBS",
    "SGT_KNOBS",
    "SHARING_RULES",
    "LearnerRows",
    "learner_rows",
    "rescue_row_loss",
    "rescue_set",
    "METHODS",
    "VARIANT_KNOBS",
    "CapabilityTracker",
    "LossSpec",
    "Method",
    "MiniBatch",
    "NonFiniteLogProbs",
    "capability_baseline",
    "cross_bounds",
    "cross_in_bounds",
    "get_method",
    "group_advantages",
    "group_by_prompt",
    "gspo_row_loss",
    "gspo_token_ratio",
    "hacpo_cross_row_loss",
    "joint_advantages",
    "row_advantages",
    "k3_kl",
    "k3_kl_tokens",
    "masked_mean",
    "method_names",
    "omega",
    "omega_matrix",
    "metric_floats",
    "policy_loss",
    "ppo_clipped",
    "rows_with_gradient",
    "seq_mean_logp",
    "sequence_log_ratio",
    "step_accuracy",
    "stepwise_lower_bound",
    "token_ratio",
]


def __getattr__(name: str):
    """``policy_loss_live_rows`` moved to :mod:`hacpo.engines.core.live_rows` (engine scheduling, not maths);
    the old name works, with a warning, until 0.3.0."""
    if name == "policy_loss_live_rows":
        import warnings

        warnings.warn(
            "hacpo.algo.policy_loss_live_rows moved to hacpo.engines.core.live_rows (until 0.3.0 both work)",
            DeprecationWarning,
            stacklevel=2,
        )
        from hacpo.engines.core.live_rows import policy_loss_live_rows

        return policy_loss_live_rows
    raise AttributeError(f"module 'hacpo.algo' has no attribute {name!r}")
