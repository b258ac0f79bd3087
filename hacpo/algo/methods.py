"""Method registry: every method is a small typed record of knobs, not a code branch (design.md).

Engines read :class:`Method` and never branch on its name. A method's name never encodes a value: α, 1−δ
and δ_step are the run's hyper-parameters (:meth:`Method.loss_spec`), and the spec's alternative readings
are documented variant knobs (:data:`VARIANT_KNOBS`, applied by :meth:`Method.variant`). Mini-batch size (in
sequences) is a run-level setting; the per-step update count follows from the arithmetic of spec §6:
``updates = epochs · ceil(rows / (minibatch_size / minibatch_divisor))``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Literal

import torch

from .losses import LossKind, LossSpec
from .sharing import Sharing, learner_rows

Baseline = Literal["capability", "joint_mean", "own_mean"]


@dataclass(frozen=True)
class Method:
    name: str
    loss: LossKind
    joint: bool = False  # learns from the other agents' rollouts (their rows, rewards or successes)
    # what a joint learner takes from its peers (hacpo.algo.sharing): their rows (Naive, HACPO), their rewards
    # in its baseline only (XGRPO), or their verified successes on the prompts it failed (SGT)
    sharing: Sharing = "rollouts"
    rescue_advantage: float = 1.0  # SGT: the advantage of a rescued peer success (run knob)
    rollout_multiplier: int = 1  # G_own = multiplier × G (GSPO×2 samples 2G)
    epochs: int = 1  # passes over the step's rows ("GSPO updates ×2", reading (a))
    minibatch_divisor: int = 1  # reading (b): half-size mini-batches
    baseline: Baseline | None = None  # joint advantage baseline (joint methods only)
    omega_in_loss: bool = True
    cross_clip: Literal["stepwise", "static", "none"] = "stepwise"
    # §2.5 readings (variant knob): cross-row denominators from the learner's own pre-update policy
    # (self_old: sharing rollouts without HACPO's machinery, as the paper's framework computes old log-probs)
    # or from the generating agent's (source)
    naive_cross_ratio: Literal["source", "self_old"] = "self_old"

    def loss_spec(
        self,
        *,
        alpha: float = 1.0,
        cross_clip_low: float = 0.8,
        delta_step: float = 0.025,
        kl_beta: float = 1e-3,
    ) -> LossSpec:
        """This method's loss: its own clip ε and mechanisms, the run's α, 1−δ, δ_step and KL β (Table 4)."""
        eps = (0.2, 0.28) if self.loss == "grpo" else (3e-4, 4e-4)  # GSPO's own clip for every other loss
        return LossSpec(
            kind=self.loss,
            eps_low=eps[0],
            eps_high=eps[1],
            cross_clip_low=cross_clip_low,
            delta_step=delta_step,
            cross_clip=self.cross_clip,
            alpha=alpha,
            omega_in_loss=self.omega_in_loss,
            kl_beta=kl_beta,
        )

    def updates_per_step(self, rows: int, minibatch_size: int) -> int:
        per_update = max(1, minibatch_size // self.minibatch_divisor)
        return self.epochs * -(-rows // per_update)

    @property
    def cross_rows(self) -> bool:
        """Whether a learner's update holds rows its peers generated (all of them, or SGT's rescue set)."""
        return self.joint and self.sharing != "baseline"

    def rows_per_learner(self, own_rows: int, n_agents: int) -> int:
        """Rows a learner trains on per step: its own, plus every peer's when it pools their rollouts (SGT's
        rescue rows take the slots of the failed own rows they replace)."""
        return own_rows * (n_agents if self.joint and self.sharing == "rollouts" else 1)

    def learner_rows(self, rewards, prompt_ids, sources, n_sources: int, learner: int, omega=None):
        """This method's advantages and kept rows for one learner (:func:`hacpo.algo.sharing.learner_rows`);
        ``sources``: each row's position among the ``n_sources`` agents whose rows are given (1: own only);
        returns :class:`~hacpo.algo.sharing.LearnerRows`."""
        return learner_rows(
            torch.as_tensor(rewards), prompt_ids, sources, n_sources, learner, sharing=self.sharing,
            baseline=self.baseline, omega_learner_over=omega, rescue_advantage=self.rescue_advantage,
        )  # fmt: skip

    @property
    def cross_old_from_learner(self) -> bool:
        """Naive's ``self_old`` reading (§2.5): cross rows' old log-probs are the learner's own, computed on
        the re-tokenised text before any update."""
        return self.loss == "naive" and self.naive_cross_ratio == "self_old"

    def reads(self, knob: str) -> bool:
        """Whether a run of this method reads ``knob`` (a HACPO or SGT hyper-parameter, or a variant knob)."""
        if knob in HACPO_KNOBS:
            return self.loss == "hacpo"
        if knob in SGT_KNOBS:
            return self.sharing == "successes"
        return self.name in VARIANT_KNOBS.get(knob, {}).get("methods", ())

    def variant(self, **knobs: str | None) -> Method:
        """This method under documented variant knobs (None: the default reading), e.g.
        ``get_method("naive").variant(naive_cross_ratio="self_old")``. A knob the method does not read, or
        an unknown value, is an error."""
        method = self
        for knob, value in knobs.items():
            if value is None:
                continue
            if knob not in VARIANT_KNOBS:
                raise ValueError(f"unknown variant knob {knob!r}; known: {sorted(VARIANT_KNOBS)}")
            spec = VARIANT_KNOBS[knob]
            if not self.reads(knob):
                raise ValueError(f"{knob} applies to {', '.join(spec['methods'])} only, not {self.name!r}")
            if value not in spec["values"]:
                raise ValueError(f"{knob}={value!r}; choose one of {sorted(spec['values'])}")
            method = replace(method, **spec["values"][value])
        return method

    def to_dict(self) -> dict:
        return asdict(self)


# The run hyper-parameters only HACPO's cross term reads (Table 4): other methods never receive them.
HACPO_KNOBS = ("alpha", "cross_clip_low", "delta_step")

# SGT's choice the paper leaves open (docs/algorithm.md): only methods sharing successes read it.
SGT_KNOBS = ("rescue_advantage",)

# The spec's alternative readings, as knobs: which methods read each, and what each value sets.
VARIANT_KNOBS: dict[str, dict] = {
    "gspo_updates_x2_mode": {  # §2.4: (a) two epochs over the step's rows, (b) half-size mini-batches
        "methods": ("gspo_updates_x2",),
        "values": {"epochs": {"epochs": 2}, "half_minibatch": {"epochs": 1, "minibatch_divisor": 2}},
    },
    "naive_cross_ratio": {  # §2.5: cross ratios against the source's old policy, or the learner's own
        "methods": ("naive",),
        "values": {"source": {"naive_cross_ratio": "source"}, "self_old": {"naive_cross_ratio": "self_old"}},
    },
}


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
        # §8's other reading of "− Adv": the learner's own group mean as the baseline (not in the paper)
        Method("hacpo_no_adv_own", loss="hacpo", joint=True, baseline="own_mean"),
        # Liu et al. 2026's other sharing rules (arXiv 2605.07244; docs/algorithm.md, "Sharing rules"):
        # XGRPO trains on its own rows with a baseline from the joint group (plain, or HACPO's
        # capability-aware one: HACPO's advantage module without its rollout sharing); SGT adds peers'
        # verified successes on the prompts it failed
        Method("xgrpo", loss="gspo", joint=True, baseline="joint_mean", sharing="baseline"),
        Method("xgrpo_capability", loss="gspo", joint=True, baseline="capability", sharing="baseline"),
        Method("sgt", loss="sgt", joint=True, sharing="successes"),
    ]
}


def get_method(name: str) -> Method:
    """The registry record of ``name``; an unknown name lists the known ones."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known methods: {', '.join(sorted(METHODS))}")
    return METHODS[name]


def method_names() -> list[str]:
    return list(METHODS)
