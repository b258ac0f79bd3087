"""What a test does where its precondition is missing: it skips and says how to get it, or, where CI requires
that precondition (``HACPO_REQUIRE_<THING>=1``: HACPO_REQUIRE_REAL_STACK, HACPO_REQUIRE_REAL_MODELS,
HACPO_REQUIRE_DOCS), it fails, so a broken environment never passes as skips."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def required(variable: str) -> bool:
    return os.environ.get(variable) == "1"


def missing(variable: str, why: str, fix: str, *, module_level: bool = False) -> NoReturn:
    """Skip (``why``: what is missing; ``fix``: what to do), or fail where ``variable`` is 1."""
    if required(variable):
        pytest.fail(f"{variable}=1 but {why}; {fix}", pytrace=False)
    pytest.skip(f"{why}: {fix}", allow_module_level=module_level)
