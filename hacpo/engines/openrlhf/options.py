"""Deprecated alias of :mod:`hacpo.engine_options` (moved in 0.2.0: the run config reads it, and the base
layer never imports an engine); it goes in 0.3.0."""

import warnings

from hacpo.engine_options import *  # noqa: F403
from hacpo.engine_options import CPU_DEFAULTS, OpenRLHFOptions, VllmEvalOptions  # noqa: F401

warnings.warn(
    "hacpo.engines.openrlhf.options is now hacpo.engine_options (deprecated, removed in 0.3.0)",
    DeprecationWarning,
    stacklevel=2,
)
