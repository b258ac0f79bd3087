"""Method registry: every method is a small typed record of knobs, not a code branch (design.md).

Engines read :class:`Method` and never branch on its name. Mini-batch size (in sequences) is a run-level
setting; the per-step update count follows from the arithmetic of spec §6:
``updates = epochs · ceil(rows / (minibatch_size / minibatch_divisor))``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from typing import Literal

from .losses import LossSpec

Baseline = Literal["capability", "joint_mean", "own_mean"]


@dataclass(frozen=True)
class Method:
    name: str
    loss: Literal["grpo", "gspo", "naive", "hacpo"]
    joint: bool = False  # learns from the other agents' rollouts
    rollout_multiplier: int = 1  # G_own = multiplier × G (GSPO×2 samples 2G)
    epochs: int = 1  # passes over the step's rows ("GSPO updates ×2", reading (a))
    minibatch_divisor: int = 1  # reading (b): half-size mini-batches
    baseline: Baseline | None = None  # joint advantage baseline (joint methods only)
    omega_in_loss: bool = True
    cross_clip: Literal["stepwise", "static", "none"] = "stepwise"
    alpha: float | None = None  # None: take α from the pair's hyper-parameters (Table 4)
    naive_cross_ratio: Literal["source", "self_old"] = "source"

    def loss_spec(
        self,
        *,
        alpha: float = 1.0,
        cross_clip_low: float = 0.8,
        delta_step: float = 0.025,
        kl_beta: float = 1e-3,
    ) -> LossSpec:
        """This method's loss knobs; the pair's hyper-parameters fill what the method leaves open."""
        eps = (0.2, 0.28) if self.loss == "grpo" else (3e-4, 4e-4)
        return LossSpec(
            kind=self.loss,
            eps_low=eps[0],
            eps_high=eps[1],
            cross_clip_low=cross_clip_low,
            delta_step=delta_step,
            cross_clip=self.cross_clip,
            alpha=self.alpha if self.alpha is not None else alpha,
            omega_in_loss=self.omega_in_loss,
            kl_beta=kl_beta,
        )

    def updates_per_step(self, rows: int, minibatch_size: int) -> int:
        per_update = max(1, minibatch_size // self.minibatch_divisor)
        return self.epochs * -(-rows // per_update)

    def to_dict(self) -> dict:
        return asdict(self)


_HACPO = Method("hacpo", loss="hacpo", joint=True, baseline="capability")

METHODS: dict[str, Method] = {
    m.name: m
    for m in [
        Method("grpo", loss="grpo"),
        Method("gspo", loss="gspo"),
        Method("gspo_x2", loss="gspo", rollout_multiplier=2),
        Method("gspo_updates_x2", loss="gspo", epochs=2),  # reading (a): two epochs (§2.4)
        Method("naive", loss="naive", joint=True, baseline="joint_mean"),
        _HACPO,
        replace(_HACPO, name="hacpo_no_adv", baseline="joint_mean"),
        replace(_HACPO, name="hacpo_no_omega", omega_in_loss=False),
        replace(_HACPO, name="hacpo_no_stepwise", cross_clip="static"),
        replace(_HACPO, name="hacpo_no_clip", cross_clip="none"),
    ]
}

_ALPHA = re.compile(r"^hacpo_alpha(\d+(?:p\d+)?)$")
_VARIANTS = {
    "gspo_updates_x2_half_minibatch": replace(
        METHODS["gspo_updates_x2"], name="gspo_updates_x2_half_minibatch", epochs=1, minibatch_divisor=2
    ),
    "naive_self_old": replace(METHODS["naive"], name="naive_self_old", naive_cross_ratio="self_old"),
    "hacpo_no_adv_own": replace(METHODS["hacpo_no_adv"], name="hacpo_no_adv_own", baseline="own_mean"),
}


def get_method(name: str, **overrides) -> Method:
    """Look a method up by name; ``hacpo_alpha{N}`` (``N`` may be ``1p5`` for 1.5) fixes α = N.

    Keyword overrides replace fields (e.g. ``get_method("hacpo", alpha=3.0)``).
    """
    if name in METHODS:
        method = METHODS[name]
    elif name in _VARIANTS:
        method = _VARIANTS[name]
    elif match := _ALPHA.match(name):
        method = replace(_HACPO, name=name, alpha=float(match.group(1).replace("p", ".")))
    else:
        known = ", ".join(sorted([*METHODS, *_VARIANTS])) + ", hacpo_alpha<N>"
        raise ValueError(f"unknown method {name!r}; known methods: {known}")
    if overrides:
        bad = set(overrides) - set(Method.__dataclass_fields__)
        if bad:
            raise ValueError(f"unknown method field(s) {sorted(bad)} for {name!r}")
        method = replace(method, **overrides)
    if method.alpha is not None and method.alpha < 0:
        raise ValueError(f"alpha must be ≥ 0, got {method.alpha}")
    return method


def method_names() -> list[str]:
    return list(METHODS)
