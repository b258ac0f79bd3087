"""The warm worker's client side (standard library only: ``hacpo``'s entry path must cost milliseconds)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

ENV_VAR = "HACPO_WORKER"
_SPAWNED: list = []  # Popen objects of start_background, kept so they are not reported as leaked

# Client side (standard library only: this path must cost milliseconds)


class _Signalled(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _read_msg(sock: socket.socket, buf: bytearray) -> dict | None:
    """Next JSON line from ``sock`` (None on EOF); ``buf`` keeps bytes received past it."""
    while b"\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return json.loads(line)


def _connect(path: str | None) -> socket.socket | None:
    if not path:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:  # absent, stale (ECONNREFUSED), not a socket, no permission: no server to talk to
        sock.close()
        return None
    return sock


def _request(path: str, msg: dict, timeout_s: float = 10.0) -> tuple[socket.socket, dict] | None:
    """Send a control message; the open socket and the first reply, or None if no server answers."""
    sock = _connect(path)
    if sock is None:
        return None
    try:
        sock.settimeout(timeout_s)
        sock.sendall(json.dumps(msg).encode() + b"\n")
        reply = _read_msg(sock, bytearray())
    except (OSError, ValueError):
        reply = None
    if reply is None:
        sock.close()
        return None
    return sock, reply


def ping(socket_path: str, timeout_s: float = 10.0) -> int | None:
    """PID of the server listening on ``socket_path``, or None if none answers."""
    res = _request(socket_path, {"op": "ping"}, timeout_s)
    if res is None:
        return None
    res[0].close()
    return res[1].get("pid")


def delegate(argv: list[str]) -> int | None:
    """Run ``hacpo <argv>`` in the warm worker named by ``$HACPO_WORKER``; its exit code, or None.

    None means "nothing ran, run in-process": the variable is unset, the socket is absent or stale, argv is
    the ``worker`` command, or the server went away (e.g. its idle timeout) before starting the job.
    SIGTERM/SIGINT close the connection, which makes the server kill the job, and return 128 + signal.
    """
    argv = list(argv)
    if argv[:1] == ["worker"]:
        return None
    sock = _connect(os.environ.get(ENV_VAR))
    if sock is None:
        return None
    old: dict[int, object] = {}

    def on_signal(signum, _frame):
        raise _Signalled(signum)

    try:
        try:
            for s in (signal.SIGTERM, signal.SIGINT):
                old[s] = signal.signal(s, on_signal)
        except ValueError:  # not the main thread: cannot handle signals, run without
            pass
        buf = bytearray()
        try:
            req = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode() + b"\n"
            sent = socket.send_fds(sock, [req], [0, 1, 2])
            sock.sendall(req[sent:])
            ack = _read_msg(sock, buf)
        except (OSError, ValueError):
            ack = None
        if ack is None or "pid" not in ack:
            if ack is not None:
                print(
                    f"hacpo: warm worker refused the job ({ack.get('error')}); running here", file=sys.stderr
                )
            return None
        try:
            res = _read_msg(sock, buf)
        except (OSError, ValueError):
            res = None
        if res is None or "rc" not in res:
            print(
                f"hacpo: lost the connection to the warm worker ({os.environ.get(ENV_VAR)}) while it ran "
                f"`hacpo {' '.join(argv)}` (child pid {ack['pid']}); its exit status is unknown",
                file=sys.stderr,
            )
            return 1
        return int(res["rc"])
    except _Signalled as sig:
        return 128 + sig.signum
    finally:
        sock.close()  # before restoring handlers: a cancelled job must see EOF even if we die right after
        for s, h in old.items():
            signal.signal(s, h)



def start_background(
    socket_path: str,
    log_path: str,
    *,
    idle_timeout_s: float = 600,
    parent_pid: int | None = None,
    wait_s: float = 60,
    preload: bool = True,
) -> int:
    """Start a detached server (own session, output appended to ``log_path``) and wait until it answers
    (preloading takes seconds); its PID. RuntimeError naming the log if it does not come up."""
    import subprocess

    _SPAWNED[:] = [p for p in _SPAWNED if p.poll() is None]  # reap servers that have exited
    cmd = [sys.executable, "-m", "hacpo.worker", "serve", "--socket", socket_path]
    cmd += ["--idle-timeout", str(idle_timeout_s)] + (["--parent-pid", str(parent_pid)] if parent_pid else [])
    cmd += [] if preload else ["--no-preload"]
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True
        )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"hacpo worker exited with status {proc.returncode} on start; see {log_path}")
        if ping(socket_path, timeout_s=max(0.1, deadline - time.monotonic())) == proc.pid:
            _SPAWNED.append(proc)
            return proc.pid
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"hacpo worker did not answer on {socket_path} within {wait_s:g} s; see {log_path}")


def stop(socket_path: str, timeout_s: float = 30) -> bool:
    """Stop the server (its running children get SIGTERM) and wait until it has exited; False if none."""
    res = _request(socket_path, {"op": "stop"})
    if res is None:
        return False
    sock = res[0]
    try:
        sock.settimeout(timeout_s)
        while sock.recv(4096):
            pass
    except OSError:
        pass
    finally:
        sock.close()
    return True

