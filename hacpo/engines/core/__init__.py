"""What both engines share of a run: :mod:`.loop`, the run loop around the steps, and
:mod:`.step`, one step of any method over an engine's agents, :mod:`.metrics`, the loss metrics merged
over an update's parts and a step's updates."""

from .loop import RunLoop
from .step import AgentRollouts, StepEngine, StepResult, train_step

__all__ = ["AgentRollouts", "RunLoop", "StepEngine", "StepResult", "train_step"]
