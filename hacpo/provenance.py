"""What made a run, recorded in its ``run.json``: the machine type whose kernels computed it (two CPUs that
differ in bf16 or AMX support give different numbers from one seed) and the versions it ran with, the lock
file of its environment included."""

from __future__ import annotations

import contextlib
import functools
import platform
import subprocess
import sys
from pathlib import Path

# The flags that decide which kernels compute a run (bf16 in hardware or emulated, AMX tiles): two machines
# that differ in one of them compute different numbers from the same seed.
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
CPU_ID_FIELDS = (("family", "cpu family"), ("model", "model"), ("stepping", "stepping"))


def machine(cpuinfo: str = "/proc/cpuinfo") -> dict:
    """What a run's numbers depend on beyond its config: the CPU's model name and :data:`KERNEL_FLAGS`, and
    the GPU's name where CUDA is in use. Recorded in ``run.json``; :func:`machine_type` names it.
    ``cpu_id`` (x86's family, model and stepping) tells apart generations that share a name and flags,
    as cloud CPUs often do; it is a note for the reader, not part of the type."""
    from hacpo.hardware import cpu_fields

    fields = cpu_fields(cpuinfo)  # one read of /proc/cpuinfo for the name and the flags
    flags = set(fields.get("flags", "").split())
    out = {
        "cpu": fields.get("model name") or platform.processor() or platform.machine(),
        "flags": [f for f in KERNEL_FLAGS if f in flags],
    }
    if "cpu family" in fields:
        out["cpu_id"] = " ".join(f"{k} {fields.get(f, '?')}" for k, f in CPU_ID_FIELDS)
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name()
    return out


def machine_type(m: dict) -> str:
    """A machine's type in one short name, ``"AMD EPYC [avx2 avx512f avx512_bf16]"`` (a GPU's name first):
    the stratum its runs belong to when results of several machines are combined."""
    cpu = f"{m.get('cpu', '?')} [{' '.join(m.get('flags', []))}]"
    return f"{m['gpu']} on {cpu}" if m.get("gpu") else cpu


def versions() -> dict[str, str]:
    """The versions a run was made with; ``lock``: the lock file the environment was installed from and its
    hash (``scripts/setup_env.sh`` writes it into the venv), absent for an environment resolved unlocked;
    ``hacpo_commit``: the commit of the checkout hacpo runs from (:func:`checkout_commit`)."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for pkg in ("hacpo", "torch", "transformers", "math-verify", "snakemake", "openrlhf", "vllm"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    if commit := _own_commit():
        out["hacpo_commit"] = commit
    lock = Path(sys.prefix) / "hacpo-lock"
    if lock.is_file():
        out["lock"] = lock.read_text().strip()
    return out


@functools.cache
def _own_commit() -> str | None:
    """The commit of the code this process imported, read once: a run's record is rewritten at every
    checkpoint, and a commit made while it trains does not change the code it runs."""
    return checkout_commit(Path(__file__).resolve().parents[1])


def checkout_commit(root: Path) -> str | None:
    """The git commit ``root`` is checked out at, ``+dirty`` where tracked files differ from it; None outside
    a git checkout (an installed wheel). The release number alone does not say which code ran: between two
    commits of one release a seed's numbers can move."""
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, timeout=30, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None  # no git on the machine, or a broken checkout: the release number still stands
    return f"{head}+dirty" if changed else head
