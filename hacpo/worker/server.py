"""The warm worker's fork server: preloads the heavy modules, then forks a child per request that becomes the
client's process and runs the entry point (``MODULE:FUNCTION``, called with the client's argv)."""

from __future__ import annotations

import importlib
import json
import os
import selectors
import signal
import socket
import sys
import time

from .client import ENV_VAR

DEFAULT_ENTRY = "hacpo.cli:main"
KILL_GRACE_S = 5.0
"""Seconds between SIGTERM and SIGKILL when a job is cancelled or the server stops."""
PRELOAD = (
    "torch",
    "torch.utils.tensorboard",  # the run loop's live curves
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



def _log(msg: str) -> None:
    print(
        f"{time.strftime('%Y-%m-%d %H:%M:%S')} hacpo-worker[{os.getpid()}] {msg}", file=sys.stderr, flush=True
    )


def _preload() -> None:
    """Import the heavy modules once. Imports only: running a torch op or a tokenizer here would start
    thread pools that a forked child inherits in a broken state."""
    import gc

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


def load_entry(spec: str):
    """``MODULE:FUNCTION`` → the function (imported now, in the server: children inherit it)."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise RuntimeError(f"entry point {spec!r}: expected MODULE:FUNCTION, e.g. {DEFAULT_ENTRY}")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise RuntimeError(f"entry point {spec!r} cannot be loaded: {err}") from None


class _Server:
    def __init__(self, path: str, idle_timeout_s: float | None, parent_pid: int | None, entry=None):
        self.entry = entry
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
            os.environ.pop(ENV_VAR, None)  # the entry point must run here, never delegate back to us
            _reseed()
            _reapply_import_time_env()
            _adopt_stdio()
            sys.argv = ["hacpo", *req["argv"]]
            rc = _exit_code(self.entry(req["argv"]))
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
    entry: str = DEFAULT_ENTRY,
) -> None:
    """Serve requests on ``socket_path`` until stopped, signalled, idle for ``idle_timeout_s`` with nothing
    running (None: never), or ``parent_pid`` exits; each request runs ``entry`` (``MODULE:FUNCTION``, called
    with the request's argv) in a forked child. Raises RuntimeError if a live server owns the path or the
    entry point cannot be loaded. Meant to be a process's main: it installs handlers for SIGTERM/SIGINT/SIGHUP
    (they stop the server)."""
    _ensure_std_fds()
    server = _Server(socket_path, idle_timeout_s, parent_pid, load_entry(entry))
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

