"""A job's own Ray cluster: head on this node, workers on the job's other SLURM nodes, all stopped at exit.

``with ray_cluster() as address:`` starts ``ray start --head --block`` here (free ports, a temp dir of its
own, so two jobs sharing a node never meet), one ``ray start --address … --block`` per other node of the
SLURM allocation through ``srun`` (multi-node jobs only), waits until the head answers, and yields its
address (children get it as ``RAY_ADDRESS``, which ``ray.init()`` in OpenRLHF joins). At exit — normal, an
exception, or SIGTERM from ``scancel`` (:func:`terminate_on_sigterm`) — the workers and the head are
stopped, and any process still naming this cluster's temp dir is killed: nothing of it outlives the job.
``ray stop`` is never used: it would stop every Ray of the user on the node, other jobs' included.

``hacpo ray-job -- CMD ...`` runs one command inside such a cluster.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def slurm_nodes(env=os.environ) -> list[str]:
    """Hostnames of this SLURM job's nodes (``[]`` outside SLURM)."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return []
    if shutil.which("scontrol"):
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()
    return [nodelist] if "," not in nodelist and "[" not in nodelist else []


def node_ip() -> str:
    """An address of this node that the job's other nodes can reach."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent; picks the outgoing interface
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def ray_executable() -> str:
    found = shutil.which("ray", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    if not found:
        raise ValueError(
            "the `ray` command is not installed: the OpenRLHF engine needs "
            "`EXTRAS=dev,gpu bash scripts/setup_env.sh`"
        )
    return found


class _SigTerm(SystemExit):
    pass


@contextlib.contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM (``scancel``, SLURM's time limit) into SystemExit(143), so ``finally`` blocks run."""
    if not _in_main_thread():
        yield
        return

    def handler(signum, frame):
        raise _SigTerm(128 + signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def ray_cluster(
    *,
    num_gpus: int | None = None,
    num_cpus: int | None = None,
    start_timeout_s: float = 120.0,
    env=None,
) -> Iterator[str]:
    """Start this job's Ray cluster, yield its address (``ip:port``), stop everything of it at exit."""
    env = dict(os.environ if env is None else env)
    ray = ray_executable()
    ip, port = node_ip(), free_port()
    job = env.get("SLURM_JOB_ID") or str(os.getpid())
    temp_dir = Path(tempfile.mkdtemp(prefix=f"ray-hacpo-{job}-", dir="/tmp"))  # short: socket paths ≤ 107 B
    ports = worker_port_block()
    block = next(ports)  # held (a lock file) until this cluster is stopped
    resources = [f"--num-gpus={num_gpus}"] if num_gpus is not None else []
    resources += [f"--num-cpus={num_cpus}"] if num_cpus is not None else []
    head_cmd = [
        ray, "start", "--head", "--block", "--disable-usage-stats", "--include-dashboard=false",
        f"--node-ip-address={ip}", f"--port={port}", f"--temp-dir={temp_dir}",
        f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
        f"--min-worker-port={block[0]}", f"--max-worker-port={block[1]}", *resources,
    ]  # fmt: skip
    started: list[subprocess.Popen] = []
    address = f"{ip}:{port}"
    log = open(temp_dir / "ray-start.log", "ab")
    try:
        started.append(
            subprocess.Popen(head_cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )
        _wait_for_head(address, started[0], start_timeout_s, temp_dir)
        others = [n for n in slurm_nodes(env)[1:]]
        if others:
            worker_cmd = [
                ray,
                "start",
                "--block",
                "--disable-usage-stats",
                f"--address={address}",
                f"--min-worker-port={block[0]}",
                f"--max-worker-port={block[1]}",
                *resources,
            ]
            srun = [
                "srun", f"--nodes={len(others)}", f"--ntasks={len(others)}", "--ntasks-per-node=1",
                f"--nodelist={','.join(others)}", "--overlap", "--kill-on-bad-exit=0",
            ]  # fmt: skip
            started.append(
                subprocess.Popen(
                    srun + worker_cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
        yield address
    finally:
        for proc in reversed(started):
            stop_process(proc)
        _kill_leftovers(temp_dir)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)
        ports.close()


PORT_BLOCKS = (20000, 60000, 400)  # first port, end, ports per cluster: 100 clusters on a node at most


def try_lock(path: Path):
    """``path`` opened and ``flock``-ed by this process (held until the file is closed or the process
    exits), or None when another process holds it."""
    import fcntl

    f = open(path, "a")  # noqa: SIM115 (the caller holds it open)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return None
    return f


def worker_port_block(lock_dir: str = "/tmp") -> Iterator[tuple[int, int]]:
    """A range of worker ports no other cluster of this node uses (Ray's default, 10002-19999, is the same
    for every cluster: two jobs sharing a node then fail with "Failed to add any wildcard listeners").
    Yields ``(min, max)`` once and holds the block's lock file until closed."""
    first, end, size = PORT_BLOCKS
    for start in range(first, end, size):
        f = try_lock(Path(lock_dir) / f"ray-hacpo-ports-{start}.lock")
        if f is None:
            continue
        try:
            yield start, start + size - 1
        finally:
            f.close()  # releases the lock
        return
    raise RuntimeError(f"every Ray worker-port block of this node is in use ({first}-{end - 1})")


HEAD_READY = "Ray runtime started."  # `ray start` prints it once the head's GCS and raylet are up


def _wait_for_head(address: str, head: subprocess.Popen, timeout_s: float, temp_dir: Path) -> None:
    """Until ``ray start --head`` says its runtime started. Read from its log: a ``ray status`` probe is a
    Python process importing Ray (about 2 s of CPU each), and several ran per job start on a busy machine."""
    log = temp_dir / "ray-start.log"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if HEAD_READY in log.read_text(errors="replace"):
            return
        if head.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"`ray start --head` exited with {head.returncode}:\n{tail}")
        time.sleep(0.2)
    raise RuntimeError(f"the Ray head at {address} did not start within {timeout_s:.0f} s (its log: {log})")


def stop_process(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM the process group (``ray start --block`` then stops what it started), SIGKILL after grace."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _kill_leftovers(temp_dir: Path, grace_s: float = 10.0) -> int:
    """Kill processes of this cluster that outlived their parents (their command line names ``temp_dir``)."""
    import psutil  # a Ray dependency

    mine = str(temp_dir)

    def ours():
        found = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            with contextlib.suppress(psutil.Error, TypeError):
                if p.pid != os.getpid() and any(mine in part for part in p.info["cmdline"] or []):
                    found.append(p)
        return found

    procs = ours()
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return len(procs)


def run_in_cluster(command: list[str], *, num_gpus: int | None = None, num_cpus: int | None = None) -> int:
    """``hacpo ray-job``: run ``command`` with ``RAY_ADDRESS`` pointing at a fresh cluster; its exit code."""
    if not command:
        raise ValueError("give the command to run after `--`, e.g. hacpo ray-job -- python train.py")
    with terminate_on_sigterm(), ray_cluster(num_gpus=num_gpus, num_cpus=num_cpus) as address:
        child = subprocess.Popen(command, env={**os.environ, "RAY_ADDRESS": address}, start_new_session=True)
        try:
            return child.wait()
        finally:
            stop_process(child)


def add_cli(sub) -> None:
    p = sub.add_parser("ray-job", help="run one command inside this job's own Ray cluster (stopped at exit)")
    p.add_argument("--gpus", type=int, default=None, help="GPUs per node for Ray (default: all visible)")
    p.add_argument("--cpus", type=int, default=None, help="CPUs per node for Ray (default: all)")
    p.add_argument("cmd", nargs="+", help="the command (after --)")
    p.set_defaults(func=lambda a: run_in_cluster(a.cmd, num_gpus=a.gpus, num_cpus=a.cpus))
