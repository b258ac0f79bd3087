"""Locks of the OpenRLHF engine's node: a DeepSpeed op's build lock left by a killed builder is deleted, a
held or fresh one kept (hacpo.engines.openrlhf.build_locks: without it, every later job waits on the lock
for ever); a rendezvous port one actor reserved is not handed to another (launch.reserve_free_port)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hacpo.engines.openrlhf.build_locks import clear_stale_build_locks

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc (Linux)")


def _lock(root, op: str, age_s: float):
    path = root / "py311_cpu" / op / "lock"
    path.parent.mkdir(parents=True)
    path.touch()
    old = time.time() - age_s
    os.utime(path, (old, old))
    return path


def test_a_lock_no_process_holds_is_deleted_and_a_held_or_fresh_one_kept(tmp_path, capsys):
    dead = _lock(tmp_path, "fused_adam", 120)
    held = _lock(tmp_path, "deepspeed_shm_comm", 120)
    fresh = _lock(tmp_path, "cpu_adam", 5)
    # another process holds `held` open, as torch's FileBaton does while it builds
    holder = subprocess.Popen([sys.executable, "-c", f"f = open({str(held)!r}); import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while not any(str(held) == os.readlink(f"/proc/{holder.pid}/fd/{fd}")
                      for fd in os.listdir(f"/proc/{holder.pid}/fd")):  # fmt: skip
            assert time.monotonic() < deadline, "the holder never opened the lock"
            time.sleep(0.1)
        assert clear_stale_build_locks(30.0, tmp_path) == [dead]
    finally:
        holder.kill()
        holder.wait()
    assert not dead.exists() and held.exists() and fresh.exists()
    assert f"deleted {dead}" in capsys.readouterr().err
    assert clear_stale_build_locks(30.0, tmp_path) == [held]  # its holder is gone now
    assert clear_stale_build_locks(30.0, tmp_path) == [] and fresh.exists()


def test_a_reserved_rendezvous_port_is_not_handed_to_another_process(monkeypatch, tmp_path):
    """OpenRLHF's actors pick MASTER_PORT by binding port 0 and closing it; the OS may hand the same port to
    the next actor, whose bind then fails (EADDRINUSE, seen in CI). A reserved port is skipped by others."""
    import socket

    from hacpo.engines.openrlhf import launch

    monkeypatch.setattr(launch, "PORT_LOCKS", tmp_path)
    first = launch.reserve_free_port()
    handed = iter([first, first, first + 1])  # the OS offers `first` again, twice, then another

    class Offered(socket.socket):
        def getsockname(self):
            return ("", next(handed))

    monkeypatch.setattr(socket, "socket", Offered)
    lock = str(tmp_path / f"{first}.lock")
    code = f"import fcntl; f = open({lock!r}); fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode != 0  # held here
    assert launch.reserve_free_port() == first + 1
