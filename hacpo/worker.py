"""Warm worker: a fork server that keeps torch/transformers imported, so short ``hacpo`` jobs start in ms.

Why: Snakemake runs every job as its own ``hacpo ...`` process, and each pays ~4 s of ``import torch,
transformers`` before doing a fraction of a second of work. The server imports the heavy modules once, then
``fork()``s a child per request that runs ``hacpo.cli.main(argv)`` with the client's argv, cwd, environment
and stdin/stdout/stderr (the client's own file descriptors, passed over the socket), so output, exit codes and
relative paths behave exactly as an in-process run.

Client: :func:`delegate` (standard library only; the ``hacpo`` entry point calls it first). It delegates only
when ``$HACPO_WORKER`` names a live socket; otherwise it returns None and the caller runs in-process. The
``worker`` command itself is never delegated.

Protocol, one Unix stream connection per request, newline-terminated JSON:

- client → server ``{"argv", "cwd", "env"}`` with fds 0, 1, 2 attached (SCM_RIGHTS);
  server → client ``{"pid": child}`` once forked, then ``{"rc": exit code}`` when the child exits
  (a signal-killed child reports 128 + signal, as a shell does). Client EOF = job cancelled: the server
  SIGTERMs the child's process group, then SIGKILLs it 5 s later.
- ``{"op": "ping"}`` → ``{"pid": server}`` (readiness probe);
  ``{"op": "stop"}`` → ``{"pid": server}``, then EOF once the server has terminated its children and exited.

Fork safety: the server runs no torch op, tokenizer or CUDA call and starts no thread; the only native thread
after preloading is OpenBLAS's pool (started by ``import numpy``), which OpenBLAS itself shuts down in its
``pthread_atfork`` handler, so from the first fork on the server is single-threaded. It is one ``selectors``
loop over the listening socket, the client connections and each child's pidfd (Linux ≥ 5.3).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import socket
import sys
import time

ENV_VAR = "HACPO_WORKER"
KILL_GRACE_S = 5.0
"""Seconds between SIGTERM and SIGKILL when a job is cancelled or the server stops."""
PRELOAD = (
    "torch",
    "transformers",
    "hacpo.cli",
    "hacpo.algo",
    "hacpo.config",
    "hacpo.data.synthetic",
    "hacpo.agents.warmup",
    "hacpo.engines.local",
    "hacpo.eval",
    "hacpo.eval.local",
    "hacpo.reward",
    "hacpo.pipeline.cli",
    "hacpo.data.prepare",
    "hacpo.report.cli",
    "hacpo.report.figures",
    "hacpo.report.tables",
    "hacpo.demo",
    "math_verify",
    "pandas",
    "matplotlib",
    "matplotlib.pyplot",
    "seaborn",
)
_PRELOAD_ATTRS = ("LlamaForCausalLM", "Qwen3ForCausalLM", "AutoTokenizer")  # transformers' lazy attributes
_MAX_REQUEST = 16 << 20
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_SPAWNED: list = []  # Popen objects of start_background, kept so they are not reported as leaked


# --------------------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------------------
# Server side


def _log(msg: str) -> None:
    print(
        f"{time.strftime('%Y-%m-%d %H:%M:%S')} hacpo-worker[{os.getpid()}] {msg}", file=sys.stderr, flush=True
    )


def _preload() -> None:
    """Import the heavy modules once. Imports only: running a torch op or a tokenizer here would start
    thread pools that a forked child inherits in a broken state."""
    import gc
    import importlib

    t0 = time.perf_counter()
    os.environ.setdefault("MPLBACKEND", "Agg")
    for name in PRELOAD:
        try:
            importlib.import_module(name)
            if name == "matplotlib":
                sys.modules["matplotlib"].use("Agg")
        except Exception as err:  # an optional module missing must not kill the server
            _log(f"preload: {name} unavailable ({type(err).__name__}: {err})")
    for attr in _PRELOAD_ATTRS:
        try:
            getattr(sys.modules["transformers"], attr)
        except Exception as err:
            _log(f"preload: transformers.{attr} unavailable ({type(err).__name__}: {err})")
    try:  # math-verify's one-time set-up (~0.7 s, pure Python): paid once here, not in every job
        from hacpo.reward import warmup

        warmup()
    except Exception as err:
        _log(f"preload: math-verify warm-up failed ({type(err).__name__}: {err})")
    gc.collect()
    gc.freeze()  # preloaded objects never get GC-touched in children: their pages stay shared
    threads = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    _log(f"preloaded in {time.perf_counter() - t0:.2f} s; native threads: {len(threads)} {threads}")


def _exit_code(code) -> int:
    """SystemExit.code → process exit status, as the interpreter maps it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _kill(pid: int, sig: int) -> None:
    """Signal the child's process group (it called setsid), or the child alone if not yet a leader."""
    for fn in (os.killpg, os.kill):
        try:
            fn(pid, sig)
            return
        except ProcessLookupError:
            continue


class _Job:
    """One client connection: reading its request, then (after fork) watching its child."""

    def __init__(self, conn: socket.socket):
        self.conn: socket.socket | None = conn
        self.buf = bytearray()
        self.fds: list[int] = []
        self.pid: int | None = None
        self.pidfd: int | None = None
        self.kill_at: float | None = None
        self.argv: list[str] = []
        self.t0 = time.monotonic()


class _Server:
    def __init__(self, path: str, idle_timeout_s: float | None, parent_pid: int | None):
        self.path = os.path.abspath(path)
        self.idle_timeout_s = idle_timeout_s
        self.parent_pid = parent_pid
        self.sel = selectors.DefaultSelector()
        self.jobs: list[_Job] = []
        self.stoppers: list[socket.socket] = []  # `stop` callers, answered by EOF when the server exits
        self.stopping = False
        self.last = time.monotonic()
        self.listener: socket.socket | None = None
        self.lock_fd: int | None = None
        self.inode: int | None = None
        self.parent_fd: int | None = None
        self.wake_r, self.wake_w = socket.socketpair()

    # -- setup / teardown
    def listen(self) -> None:
        """Bind the socket (mode 0600, in a directory we create 0700). A lock held for the server's lifetime
        tells a live server from a stale socket file without racing another starting server."""
        import fcntl

        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        self.lock_fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another hacpo worker is already serving on {self.path}") from None
        if os.path.lexists(self.path):  # we hold the lock, so any server that made this file is gone
            os.unlink(self.path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            self.listener.bind(self.path)
        finally:
            os.umask(old_umask)
        self.inode = os.stat(self.path).st_ino
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, self.on_accept)

    def watch(self) -> bool:
        """Signals and the parent process become selector events; False if the parent is already gone."""
        for s in _STOP_SIGNALS:
            signal.signal(s, lambda *_: None)  # the wakeup fd carries the signal number to the loop
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        signal.set_wakeup_fd(self.wake_w.fileno())
        self.sel.register(self.wake_r, selectors.EVENT_READ, self.on_signal)
        if self.parent_pid:
            try:
                self.parent_fd = os.pidfd_open(self.parent_pid)
            except ProcessLookupError:
                return False
            self.sel.register(self.parent_fd, selectors.EVENT_READ, self.on_parent_exit)
        return True

    def close(self) -> None:
        for job in list(self.jobs):
            if job.pid is not None:  # only after a crash of the loop: do not leave orphans running
                _kill(job.pid, signal.SIGKILL)
            self.drop(job)
        self.unlink()
        signal.set_wakeup_fd(-1)
        for sock in self.stoppers:
            sock.close()
        if self.lock_fd is not None:
            os.close(self.lock_fd)

    def unlink(self) -> None:
        if self.listener is None:
            return
        self.sel.unregister(self.listener)
        self.listener.close()
        self.listener = None
        try:
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        except FileNotFoundError:
            pass

    # -- loop
    def run(self) -> None:
        while not (self.stopping and not any(j.pid for j in self.jobs)):
            now = time.monotonic()
            deadlines = [j.kill_at for j in self.jobs if j.kill_at is not None]
            if not self.jobs and not self.stopping and self.idle_timeout_s is not None:
                deadlines.append(self.last + self.idle_timeout_s)
            timeout = max(0.0, min(deadlines) - now) if deadlines else None
            for key, _ in self.sel.select(timeout):
                if self.sel.get_map().get(key.fd) is key:  # not closed by an earlier event of this batch
                    key.data(key)
            now = time.monotonic()
            for job in self.jobs:
                if job.kill_at is not None and now >= job.kill_at and job.pid is not None:
                    _log(f"child {job.pid} still alive {KILL_GRACE_S:.0f} s after SIGTERM: SIGKILL")
                    _kill(job.pid, signal.SIGKILL)
                    job.kill_at = None
            if self.jobs:
                self.last = now
            elif (
                not self.stopping
                and self.idle_timeout_s is not None
                and now - self.last >= self.idle_timeout_s
            ):
                _log(f"idle for {self.idle_timeout_s:g} s: exiting")
                return

    def shutdown(self, reason: str) -> None:
        """Stop accepting; cancel pending requests (their clients run in-process); terminate children."""
        if self.stopping:
            return
        self.stopping = True
        _log(f"{reason}: stopping")
        self.unlink()
        for job in list(self.jobs):
            if job.pid is None:
                self.drop(job)
            else:
                _kill(job.pid, signal.SIGTERM)
                job.kill_at = time.monotonic() + KILL_GRACE_S

    def drop(self, job: _Job) -> None:
        """Close the job's connection and received fds; forget the job unless its child still runs."""
        if job.conn is not None:
            self.sel.unregister(job.conn)
            job.conn.close()
            job.conn = None
        for fd in job.fds:
            os.close(fd)
        job.fds = []
        if job.pid is None and job in self.jobs:
            self.jobs.remove(job)

    @staticmethod
    def send(job: _Job, msg: dict) -> None:
        try:
            job.conn.send(json.dumps(msg).encode() + b"\n")
        except OSError:  # client gone: nothing to tell
            pass

    # -- events
    def on_accept(self, _key) -> None:
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        conn.setblocking(False)
        job = _Job(conn)
        self.jobs.append(job)
        self.sel.register(conn, selectors.EVENT_READ, lambda _k, job=job: self.on_conn(job))

    def on_conn(self, job: _Job) -> None:
        if job.pid is not None:  # running: the only thing a client sends now is EOF (it was cancelled)
            try:
                if job.conn.recv(4096):
                    return
            except BlockingIOError:
                return
            except OSError:
                pass
            _log(f"client of child {job.pid} disconnected: SIGTERM to its process group")
            self.drop(job)
            _kill(job.pid, signal.SIGTERM)
            job.kill_at = time.monotonic() + KILL_GRACE_S
            return
        try:
            data, fds, _, _ = socket.recv_fds(job.conn, 65536, 3)
        except BlockingIOError:
            return
        except OSError:
            data, fds = b"", []
        job.fds += fds
        job.buf += data
        if not data or len(job.buf) > _MAX_REQUEST:
            self.drop(job)
            return
        if b"\n" not in job.buf:
            return
        try:
            req = json.loads(bytes(job.buf).partition(b"\n")[0])
        except ValueError:
            req = None
        req = req if isinstance(req, dict) else {}
        op = req.get("op")
        if op == "ping":
            self.send(job, {"pid": os.getpid()})
            self.drop(job)
        elif op == "stop":
            self.send(job, {"pid": os.getpid()})
            self.sel.unregister(job.conn)
            self.stoppers.append(job.conn)
            job.conn = None
            self.drop(job)
            self.shutdown("stop requested")
        elif isinstance(req.get("argv"), list) and len(job.fds) == 3 and not self.stopping:
            self.fork(job, req)
        else:
            self.send(job, {"error": "bad request" if not self.stopping else "server is stopping"})
            self.drop(job)

    def fork(self, job: _Job, req: dict) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        # Signals stay blocked across fork so the child cannot run the server's handlers (or write to its
        # wakeup fd) before it has reset them.
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            pid = os.fork()
            if pid == 0:
                self.child(job, req)  # never returns
        except OSError as err:
            self.send(job, {"error": f"fork failed: {err}"})
            self.drop(job)
            return
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        job.pid, job.argv, job.t0 = pid, req["argv"], time.monotonic()
        for fd in job.fds:
            os.close(fd)
        job.fds = []
        job.pidfd = os.pidfd_open(pid)
        self.sel.register(job.pidfd, selectors.EVENT_READ, lambda _k, job=job: self.on_exit(job))
        self.send(job, {"pid": pid})
        _log(f"child {pid}: hacpo {' '.join(job.argv)}")

    def on_exit(self, job: _Job) -> None:
        _, status = os.waitpid(job.pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        rc = 128 - rc if rc < 0 else rc
        self.sel.unregister(job.pidfd)
        os.close(job.pidfd)
        _log(f"child {job.pid} exited {rc} after {time.monotonic() - job.t0:.2f} s")
        if job.conn is not None:
            self.send(job, {"rc": rc})
        job.pid = job.pidfd = job.kill_at = None
        self.drop(job)

    def on_signal(self, _key) -> None:
        try:
            signums = self.wake_r.recv(64)
        except BlockingIOError:
            return
        self.shutdown(f"signal {', '.join(signal.Signals(s).name for s in signums)}")

    def on_parent_exit(self, _key) -> None:
        self.sel.unregister(self.parent_fd)
        os.close(self.parent_fd)
        self.parent_fd = None
        self.shutdown(f"parent process {self.parent_pid} exited")

    # -- the child
    def child(self, job: _Job, req: dict) -> None:
        """Become the client's process: its session, stdio, cwd, environment and argv; run the CLI; exit."""
        rc = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for s in (signal.SIGTERM, signal.SIGHUP):
                signal.signal(s, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
            os.setsid()  # own process group: cancelling the job kills whatever it spawned too
            fds, job.fds = job.fds, []
            self.close_inherited()
            for i, fd in enumerate(fds):
                os.dup2(fd, i)
            for fd in set(fds) - {0, 1, 2}:
                os.close(fd)
            os.chdir(req["cwd"])
            os.environ.clear()
            os.environ.update(req["env"])
            os.environ.pop(ENV_VAR, None)  # hacpo.cli.main must run here, never delegate back to us
            _reseed()
            _reapply_import_time_env()
            _adopt_stdio()
            sys.argv = ["hacpo", *req["argv"]]
            from hacpo.cli import main

            rc = _exit_code(main(req["argv"]))
        except SystemExit as err:
            rc = _exit_code(err.code)
        except KeyboardInterrupt:
            rc = 130
        except BaseException:
            import traceback

            traceback.print_exc()
            rc = 1
        finally:
            try:
                import atexit

                atexit._run_exitfuncs()  # as interpreter exit would (pools, temp dirs); os._exit skips them
                for stream in (sys.stdout, sys.stderr):
                    if stream is not None:
                        stream.flush()
            finally:
                os._exit(rc & 0xFF)

    def close_inherited(self) -> None:
        """In the child: close every server fd, so a dead server shows as EOF and no lock outlives it."""
        for job in self.jobs:
            if job.conn is not None:
                job.conn.close()
            if job.pidfd is not None:
                os.close(job.pidfd)
            for fd in job.fds:
                os.close(fd)
        for sock in [self.listener, self.wake_r, self.wake_w, *self.stoppers]:
            if sock is not None:
                sock.close()
        for fd in (self.lock_fd, self.parent_fd):
            if fd is not None:
                os.close(fd)
        self.sel.close()


def _reseed() -> None:
    """Forked children would share the server's RNG state; a fresh process gets fresh entropy."""
    import random

    random.seed()
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()


def _reapply_import_time_env() -> None:
    """Some settings are read once, when a library loads, so the server's environment fixed them. Re-apply
    the ones a job sets: the temp dir (Snakemake's ``tmpdir`` resource) and the thread count (Snakemake sets
    ``OMP_NUM_THREADS`` to the job's threads; libgomp read it when torch loaded in the server)."""
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile.tempdir = None  # recomputed from $TMPDIR on next use
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _adopt_stdio() -> None:
    """Keep the interpreter's stream objects (fds 0-2 now are the client's) but buffer as Python would for
    the client's files: line-buffered stdout on a terminal or with PYTHONUNBUFFERED."""
    import io

    if sys.stdout is None:
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False))
    if sys.stderr is None:
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), errors="backslashreplace", line_buffering=True
        )
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    try:
        sys.stdout.reconfigure(line_buffering=unbuffered or os.isatty(1), write_through=unbuffered)
    except (AttributeError, ValueError):
        pass


def _ensure_std_fds() -> None:
    """Keep fds 0-2 occupied so a received fd never lands on them (dup2 onto 0-2 would then clobber it)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)


def serve(
    socket_path: str,
    *,
    preload: bool = True,
    idle_timeout_s: float | None = 600,
    parent_pid: int | None = None,
) -> None:
    """Serve requests on ``socket_path`` until stopped, signalled, idle for ``idle_timeout_s`` with nothing
    running (None: never), or ``parent_pid`` exits. Raises RuntimeError if a live server owns the path.
    Meant to be a process's main: it installs handlers for SIGTERM/SIGINT/SIGHUP (they stop the server)."""
    _ensure_std_fds()
    server = _Server(socket_path, idle_timeout_s, parent_pid)
    try:
        server.listen()  # before preloading: a duplicate fails fast; early clients just wait for the loop
        if not server.watch():
            _log(f"parent process {parent_pid} is already gone: exiting")
            return
        if preload:
            _preload()
        _log(f"serving on {server.path} (idle timeout {idle_timeout_s} s, parent {parent_pid})")
        server.run()
    finally:
        server.close()
    _log("exited")


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


# --------------------------------------------------------------------------------------------------------
# Command line: `hacpo worker ...` (add_cli) and `python -m hacpo.worker ...`


def _add_actions(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    default = os.environ.get(ENV_VAR)
    sock = dict(default=default, required=not default, help=f"socket path (default: ${ENV_VAR})")
    s = sub.add_parser("serve", help="run the server in the foreground")
    t = sub.add_parser("start", help="start a detached server and wait until it is ready")
    for p in (s, t):
        p.add_argument("--socket", **sock)
        p.add_argument("--idle-timeout", type=float, default=600, help="exit after this many idle seconds")
        p.add_argument("--parent-pid", type=int, default=None, help="exit when this process exits")
    s.add_argument("--no-preload", action="store_true", help="do not import torch etc. up front")
    t.add_argument("--log", default=None, help="server log (default: <socket>.log)")
    sub.add_parser("stop", help="stop the server and its running jobs").add_argument("--socket", **sock)


def _cmd_worker(args) -> int:
    if args.action == "serve":
        try:
            serve(
                args.socket,
                preload=not args.no_preload,
                idle_timeout_s=args.idle_timeout,
                parent_pid=args.parent_pid,
            )
        except RuntimeError as err:
            print(f"hacpo worker: error: {err}", file=sys.stderr)
            return 1
        return 0
    if args.action == "start":
        log = args.log or args.socket + ".log"
        try:
            pid = start_background(
                args.socket, log, idle_timeout_s=args.idle_timeout, parent_pid=args.parent_pid
            )
        except RuntimeError as err:
            print(f"hacpo worker: error: {err}", file=sys.stderr)
            return 1
        print(f"hacpo worker {pid} serving on {args.socket} (log: {log}); export {ENV_VAR}={args.socket}")
        return 0
    if stop(args.socket):
        return 0
    print(f"hacpo worker: no server on {args.socket}", file=sys.stderr)
    return 1


def add_cli(subparsers) -> None:
    """Register ``hacpo worker {serve,start,stop}`` on the CLI's subparsers."""
    w = subparsers.add_parser("worker", help="warm worker: serve hacpo commands from preloaded forks")
    _add_actions(w)
    w.set_defaults(func=_cmd_worker)


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="python -m hacpo.worker", description=__doc__.splitlines()[0])
    _add_actions(_parser)
    sys.exit(_cmd_worker(_parser.parse_args()))
