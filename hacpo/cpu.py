"""Deprecated alias of :mod:`hacpo.hardware` (renamed in 0.2.0: its old name read as a CPU engine, which does
not exist, and clashed with :mod:`hacpo.engines.openrlhf.cpu`); it goes in 0.3.0."""

import warnings

from hacpo.hardware import *  # noqa: F403

warnings.warn("hacpo.cpu is now hacpo.hardware", DeprecationWarning, stacklevel=2)
