"""What both engines share of a run (issue 23): :mod:`.loop`, the run loop around the steps, and
:mod:`.step`, one step of any method over an engine's agents."""

from .loop import RunLoop
from .step import AgentRollouts, StepEngine, train_step

__all__ = ["AgentRollouts", "RunLoop", "StepEngine", "train_step"]
