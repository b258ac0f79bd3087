"""Build locks that no process holds any more: DeepSpeed's just-in-time ops (``fused_adam``, ``cpu_adam``,
``deepspeed_shm_comm``) compile through ``torch.utils.cpp_extension.load``, which serialises builds with a
file (``<torch_extensions>/<python>_<device>/<op>/lock``, torch's ``FileBaton``). The builder holds the file
open from the moment it creates it until it closes and deletes it. A builder killed in between (Ray's memory
monitor, a cancelled job) leaves the file behind, and every later process that loads the op waits on it for
ever, at 0 % CPU, with nothing in its log.

:func:`clear_stale_build_locks` deletes such a lock: one that no process of this machine holds open (read
from ``/proc``) and that is older than ``min_age_s``. The runner calls it before a job starts its actors and
then every minute while the job runs, and says which lock it deleted. Where the build folder is shared
between machines (a cluster's home directory), a lock held on another node is invisible here: the age rule
(default :data:`SHARED_MIN_AGE_S`, several times a compile) keeps such a build's lock.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

CPU_MIN_AGE_S = 30.0  # one machine (`openrlhf: {cpu: true}`): /proc sees every holder
SHARED_MIN_AGE_S = 900.0  # a GPU cluster: a compile takes minutes; another node's holder is invisible here


def extensions_root() -> Path:
    """Where torch builds its extensions: ``TORCH_EXTENSIONS_DIR``, else the user's cache (torch's rule)."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "torch_extensions"


def open_paths() -> set[str]:
    """Every file some process of this machine holds open (the ones this user may read)."""
    held = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            for fd in os.scandir(fd_dir):
                try:
                    held.add(os.readlink(fd.path))
                except OSError:  # closed since listed
                    continue
        except OSError:  # the process exited, or is not ours
            continue
    return held


def clear_stale_build_locks(min_age_s: float = CPU_MIN_AGE_S, root: Path | None = None) -> list[Path]:
    """Delete every build lock under ``root`` that no process holds and that is older than ``min_age_s``;
    return them. A lock is checked twice, a second apart, so that a builder between closing its lock and
    deleting it is never mistaken for a dead one."""
    locks = sorted((root or extensions_root()).glob("*/*/lock"))
    now = time.time()
    candidates = [p for p in locks if _age(p, now) >= min_age_s]
    if not candidates or not Path("/proc/self/fd").is_dir():
        return []
    held = open_paths()
    time.sleep(1.0)
    held |= open_paths()
    stale = []
    for lock in candidates:
        if str(lock.resolve()) in held or not lock.exists():
            continue
        age = _age(lock, now)
        lock.unlink(missing_ok=True)
        stale.append(lock)
        print(f"hacpo: deleted {lock}, a build lock {age:.0f} s old that no process holds (its builder was "
              "killed): the op is built again", file=sys.stderr)  # fmt: skip
    return stale


def _age(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except OSError:  # gone since listed
        return -1.0
