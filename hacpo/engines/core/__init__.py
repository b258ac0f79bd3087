"""What both engines share of a run (issue 23): :mod:`.loop`, the run loop around an engine's step."""

from .loop import RunLoop

__all__ = ["RunLoop"]
