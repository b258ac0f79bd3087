"""Polling for the tests that wait on other processes (worker children, SLURM jobs, Ray clusters)."""

from __future__ import annotations

import time


def wait_for(cond, timeout_s: float = 30, what: str = "condition", every_s: float = 0.05):
    """Poll ``cond()`` every ``every_s`` seconds until it is truthy and return its value; fail the test after
    ``timeout_s`` seconds, naming ``what`` it waited for."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
