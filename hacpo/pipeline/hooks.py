"""Snakemake ``onstart``/``onsuccess``/``onerror`` hooks: a warm worker for local runs; the results folder's
owner.

Local jobs are many short ``hacpo …`` processes; each would pay ~4 s importing torch and transformers. The
worker (:mod:`hacpo.worker`) imports them once and forks per job, while Snakemake keeps tracking every job.
Cluster jobs (non-local executors) run ``hacpo`` directly. ``HACPO_WORKER=off`` opts out.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

OWNER = "hacpo-results.json"  # in a results folder: the config file(s) whose results it holds


def put_interpreter_on_path() -> None:
    """Rules call ``hacpo``: make it the one installed beside the Python running Snakemake (``.venv/bin``),
    also when the venv is not activated. A ``conda:`` env activated inside a job still comes first."""
    bindir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    if os.path.exists(os.path.join(bindir, "hacpo")) and bindir not in path.split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + path


def _owner_record(pipe) -> tuple[Path, str, list[str]]:
    """The owner file, this config's name in it (its config files, comma-separated) and the names it holds."""
    path = Path(pipe.results) / OWNER
    me = ", ".join(os.path.relpath(os.path.abspath(f)) for f in pipe.config_files)
    owners = json.loads(path.read_text()).get("configs", []) if path.is_file() else []
    return path, me, owners


def check_results_owner(pipe) -> None:
    """Before any job (dry runs too): refuse a config that would write over another config's results in the
    same folder (two ``x.yaml`` in different directories, a copied ``results_dir:``). A config that sets
    ``results_dir:`` itself shares a folder on purpose."""
    path, me, owners = _owner_record(pipe)
    if me and owners and me not in owners and not pipe.cfg.results_dir:
        raise ValueError(
            f"{pipe.results}/ holds the results of {'; '.join(owners)}, and {me} would write over them. Give "
            f"this config its own folder (`results_dir: results/<name>` in it), or, to share {pipe.results}/ "
            f"on purpose, set `results_dir: {pipe.results}` in it."
        )


def check_results_from(pipe) -> None:
    """Before any job: each scorecard's ``results_from:`` folder is another machine's results folder (its
    ``hacpo-results.json`` present), so a typo fails here rather than as a missing input deep in the DAG."""
    for name, t in pipe.cfg.tables.items():
        for i, folder in enumerate(getattr(t, "results_from", [])):
            where = folder if os.path.isabs(folder) else pipe.config_path(folder)
            if not os.path.isfile(os.path.join(where, OWNER)):
                raise ValueError(
                    f"tables.{name}.results_from.{i}: {folder} is not a hacpo results folder (no {OWNER} "
                    "there). Bring the other machine's folder here without its weights (`hacpo pack-results` "
                    "there, `hacpo unpack-results PACK FOLDER --other-machine` here) and name that folder "
                    "(docs/statistics.md)."
                )


GPU_RESOURCES = ("gpu_model", "gres")  # a profile's set-resources that put a GPU flag on every job of a rule


def check_profile_gpus(pipe, set_resources: dict, argv: list[str]) -> None:
    """Before any job is submitted: a profile that asks a GPU for every train or evaluate job (``gpu_model``
    or ``gres`` in its ``set-resources``) with a config whose models need none would submit CPU work to GPU
    nodes (``--gpus=h100:0``): refused, naming the config, the profile and the fix."""
    asking = sorted(
        rule for rule in ("train", "evaluate") if set(set_resources.get(rule, {})) & set(GPU_RESOURCES)
    )
    cpu_runs = sorted({r.group for r in pipe.runs if pipe.gpus(r) == 0})
    if not asking or not cpu_runs:
        return
    profile = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--workflow-profile", "--profile")),
                   "the workflow profile")  # fmt: skip
    configs = ", ".join(pipe.config_files) or "config/config.yaml (the default)"
    rules, shown = " and ".join(asking), ", ".join(cpu_runs[:4]) + (" …" if len(cpu_runs) > 4 else "")
    raise ValueError(
        f"{profile} asks a GPU for every {rules} job (set-resources: gpu_model or gres), but {configs} "
        f"trains on CPU ({shown} have gpus: 0): the jobs would go to GPU nodes with --gpus=<model>:0. Name a "
        "GPU config (`--configfile config/paper.yaml`), or run a CPU config with "
        "`--workflow-profile profiles/slurm-cpu`."
    )


def record_results_owner(pipe) -> None:
    """``onstart``: add this config to the folder's owners (read by :func:`check_results_owner`)."""
    from hacpo.runio import atomic_write_json

    path, me, owners = _owner_record(pipe)
    if me and me not in owners:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {"configs": [*owners, me]})


def start_worker(local_exec: bool, log: str) -> str | None:
    """``onstart``: the warm worker for the local jobs, its socket in ``HACPO_WORKER``; None where there is
    none. The worker only saves imports: one that does not come up (a machine too loaded to import torch
    within the wait) is said on stderr, and the jobs run as processes of their own, as with
    ``HACPO_WORKER=off``."""
    if not local_exec or os.environ.get("HACPO_WORKER", "") == "off":
        return None
    from hacpo import worker

    sock = os.path.join(tempfile.mkdtemp(prefix="hacpo-"), "worker.sock")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    try:
        worker.start_background(sock, log, parent_pid=os.getpid())
    except RuntimeError as err:
        shutil.rmtree(os.path.dirname(sock), ignore_errors=True)
        print(f"hacpo: no warm worker ({err}); each job imports torch in its own process", file=sys.stderr)
        os.environ["HACPO_WORKER"] = "off"
        return None
    os.environ["HACPO_WORKER"] = sock  # inherited by the local jobs' shells
    return sock


def stop_worker() -> None:
    sock = os.environ.get("HACPO_WORKER", "off")
    if sock != "off":
        from hacpo import worker

        worker.stop(sock)
        os.environ["HACPO_WORKER"] = "off"
        shutil.rmtree(os.path.dirname(sock), ignore_errors=True)  # the private socket directory
