"""Moved to :mod:`hacpo.engine_options` (the run config reads it, and the base layer never imports an engine);
this name keeps working until 0.3.0."""

from hacpo.engine_options import *  # noqa: F403
from hacpo.engine_options import CPU_DEFAULTS, OpenRLHFOptions, VllmEvalOptions  # noqa: F401
