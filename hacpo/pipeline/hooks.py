"""Snakemake ``onstart``/``onsuccess``/``onerror`` hooks: a warm worker for local runs.

Local jobs are many short ``hacpo …`` processes; each would pay ~4 s importing torch and transformers. The
worker (:mod:`hacpo.worker`) imports them once and forks per job, while Snakemake keeps tracking every job.
Cluster jobs (non-local executors) run ``hacpo`` directly. ``HACPO_WORKER=off`` opts out.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile


def put_interpreter_on_path() -> None:
    """Rules call ``hacpo``: make it the one installed beside the Python running Snakemake (``.venv/bin``),
    also when the venv is not activated. A ``conda:`` env activated inside a job still comes first."""
    bindir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    if os.path.exists(os.path.join(bindir, "hacpo")) and bindir not in path.split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + path


def start_worker(local_exec: bool, log: str = "results/logs/worker.log") -> str | None:
    if not local_exec or os.environ.get("HACPO_WORKER", "") == "off":
        return None
    from hacpo import worker

    sock = os.path.join(tempfile.mkdtemp(prefix="hacpo-"), "worker.sock")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    worker.start_background(sock, log, parent_pid=os.getpid())
    os.environ["HACPO_WORKER"] = sock  # inherited by the local jobs' shells
    return sock


def stop_worker() -> None:
    sock = os.environ.get("HACPO_WORKER", "off")
    if sock != "off":
        from hacpo import worker

        worker.stop(sock)
        os.environ["HACPO_WORKER"] = "off"
        shutil.rmtree(os.path.dirname(sock), ignore_errors=True)  # the private socket directory
