"""The warm worker (hacpo.worker): delegated commands behave like in-process ones, and the server's lifetime.

Most tests use a server without preloading (fast); one slow test preloads torch and times a real ``eval``.
Clients run in subprocesses, as Snakemake's jobs would, so their real fds 0-2 travel to the forked child.
A client blocked in ``hacpo train /dev/stdin`` (it reads its config from the client's stdin pipe) is a real
long-running command that needs no CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from polling import wait_for

from hacpo.worker import ENV_VAR, delegate, ping, start_background, stop

# What the `hacpo` entry point does first; 99 = "not delegated" (the caller would run in-process).
CLIENT = "import sys; from hacpo.worker import delegate; rc = delegate(sys.argv[1:]); sys.exit(99 if rc is None else rc)"  # noqa: E501


def _env(sock: str, **extra) -> dict:
    return {**os.environ, ENV_VAR: sock, **extra}


def _client(sock: str, *argv: str, env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CLIENT, *argv], env=env or _env(sock), **kw)


def _run(sock: str, *argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CLIENT, *argv],
        env=kw.pop("env", None) or _env(sock),
        text=True,
        capture_output=True,
        timeout=120,
        **kw,
    )


def _children(pid: int) -> set[int]:
    out = set()
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (OSError, ValueError):
            continue
        if entry.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.add(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def sockdir():
    d = Path(tempfile.mkdtemp(dir="/tmp", prefix="hw-"))  # pytest's tmp_path may exceed the 107-byte limit
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def server():
    """A shared no-preload server: (socket path, server pid)."""
    d = Path(tempfile.mkdtemp(dir="/tmp", prefix="hw-"))
    sock = str(d / "w" / "s.sock")
    pid = start_background(sock, str(d / "server.log"), preload=False, idle_timeout_s=300)
    yield sock, pid
    assert stop(sock)
    shutil.rmtree(d, ignore_errors=True)


def _blocked_client(sock: str, server_pid: int, **kw) -> tuple[subprocess.Popen, int]:
    """A client running ``hacpo train /dev/stdin`` (waits on its stdin pipe); it and its child's pid."""
    before = _children(server_pid)
    client = _client(
        sock,
        "train",
        "/dev/stdin",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )
    new = wait_for(lambda: _children(server_pid) - before, what="the forked child")
    assert len(new) == 1
    return client, new.pop()


def test_methods_via_worker_matches_in_process(server, sockdir, capsys, monkeypatch):
    from hacpo.cli import main

    out = sockdir / "stdout.txt"
    with open(out, "w") as f:
        assert _client(server[0], "methods", stdout=f).wait(timeout=120) == 0
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert main(["methods"]) == 0
    expected = capsys.readouterr().out
    assert "variant knobs" in expected and out.read_text() == expected


def test_exit_codes_and_stderr_propagate(server):
    r = _run(server[0], "train", "/nonexistent.yaml")
    assert r.returncode == 2 and "hacpo train: error" in r.stderr and "/nonexistent.yaml" in r.stderr
    r = _run(server[0], "no-such-command")  # argparse's SystemExit(2) in the child
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_environment_is_the_clients(server, capsys, monkeypatch):
    """argparse wraps --help to $COLUMNS, read when the help is printed: the child must see the client's."""
    from hacpo.cli import main

    monkeypatch.delenv(ENV_VAR, raising=False)
    outs = {}
    for cols in ("60", "200"):
        r = _run(server[0], "--help", env=_env(server[0], COLUMNS=cols))
        assert r.returncode == 0
        monkeypatch.setenv("COLUMNS", cols)
        with pytest.raises(SystemExit):
            main(["--help"])
        assert r.stdout == capsys.readouterr().out
        outs[cols] = r.stdout
    assert outs["60"] != outs["200"]


def test_cwd_is_the_clients(server, sockdir):
    argv = ["data", "--out", "rel/dir", "--n-test", "5", "--n-dev", "5", "--n-train", "10"]
    r = _run(server[0], *argv, cwd=sockdir)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (sockdir / "rel" / "dir").iterdir()) == [
        "dev.jsonl",
        "test.jsonl",
        "train.jsonl",
    ]
    assert len((sockdir / "rel" / "dir" / "train.jsonl").read_text().splitlines()) == 10
    assert "train: 10 problems" in r.stdout


def test_stdin_and_fds_are_the_clients(server, sockdir):
    client, child = _blocked_client(server[0], server[1], cwd=sockdir)
    # The child becomes the client: same stdin/stdout/stderr objects, same cwd, its own session.
    assert wait_for(lambda: os.readlink(f"/proc/{child}/cwd") == str(sockdir), what="chdir")
    for fd in (0, 1, 2):
        assert os.readlink(f"/proc/{child}/fd/{fd}") == os.readlink(f"/proc/{client.pid}/fd/{fd}")
    assert os.getsid(child) == child
    out, err = client.communicate("steps: 3\n", timeout=120)  # read from the client's stdin: invalid config
    assert client.returncode == 2 and "hacpo train: error" in err, err


def test_concurrent_requests_do_not_block_each_other(server):
    (a, child_a), (b, child_b) = (_blocked_client(*server) for _ in range(2))
    assert _alive(child_a) and _alive(child_b)  # both run at once
    assert b.communicate("{}\n", timeout=120)[0] == "" and b.returncode == 2  # the second finishes first
    assert _alive(child_a) and not _alive(child_b)
    a.communicate("{}\n", timeout=120)
    assert a.returncode == 2


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_killing_the_client_kills_the_child(server, sig):
    client, child = _blocked_client(*server)
    time.sleep(0.3)  # let the client reach its wait for the exit code
    client.send_signal(sig)
    assert client.wait(timeout=30) == 128 + sig
    wait_for(lambda: not _alive(child), timeout_s=15, what=f"child {child} to die")
    client.communicate()
    assert ping(server[0]) == server[1]  # the server carries on


def test_no_server_runs_in_process(server, sockdir, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert delegate(["methods"]) is None
    monkeypatch.setenv(ENV_VAR, str(sockdir / "absent.sock"))
    assert delegate(["methods"]) is None
    stale = str(sockdir / "stale.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(stale)
    s.close()  # the file stays, nobody listens: as after a crashed server
    monkeypatch.setenv(ENV_VAR, stale)
    assert Path(stale).is_socket() and delegate(["methods"]) is None
    monkeypatch.setenv(ENV_VAR, server[0])
    assert delegate(["worker", "stop"]) is None  # never delegated, even to a live server
    assert ping(server[0]) == server[1]


def test_worker_command_line(sockdir):
    import argparse

    from hacpo.worker import add_cli

    p = argparse.ArgumentParser(prog="hacpo")
    add_cli(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(["worker", "serve", "--socket", "s", "--idle-timeout", "5", "--no-preload"])
    assert (args.action, args.socket, args.idle_timeout, args.no_preload, args.parent_pid) == (
        "serve",
        "s",
        5,
        True,
        None,
    )
    args = p.parse_args(["worker", "stop", "--socket", str(sockdir / "absent.sock")])
    assert args.func(args) == 1  # no server: says so, fails


@pytest.mark.parametrize(
    "entry, message",
    [
        ("hacpo.cli", "expected MODULE:FUNCTION"),
        ("hacpo.nope:main", "cannot be loaded"),
        ("hacpo.cli:nope", "cannot be loaded"),
    ],
)
def test_the_server_runs_a_named_entry_point_and_refuses_a_bad_one(sockdir, entry, message):
    """The server imports nothing of the CLI: it runs the entry point it is given (hacpo.cli:main by
    default), so ``hacpo.cli`` → ``hacpo.worker`` is the only direction."""
    from hacpo.cli import main
    from hacpo.worker.server import DEFAULT_ENTRY, load_entry, serve

    assert load_entry(DEFAULT_ENTRY) is main
    with pytest.raises(RuntimeError, match=message):
        serve(str(sockdir / "e.sock"), preload=False, entry=entry)


def _serve(sock: str, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hacpo.worker", "serve", "--socket", sock, "--no-preload", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: ping(sock, timeout_s=1) == proc.pid or proc.poll() is not None, what="the server")
    return proc


def test_idle_timeout_exits_and_removes_socket(sockdir):
    sock = str(sockdir / "w" / "s.sock")
    proc = _serve(sock, "--idle-timeout", "1")
    client, _ = _blocked_client(sock, proc.pid)
    time.sleep(2.5)
    assert proc.poll() is None  # a running job is not idleness
    client.communicate("{}\n", timeout=120)
    assert client.returncode == 2
    assert proc.wait(timeout=30) == 0
    assert not os.path.exists(sock)


def test_exits_when_parent_exits(sockdir):
    parent = subprocess.Popen(["sleep", "300"])
    sock = str(sockdir / "w" / "s.sock")
    proc = _serve(sock, "--parent-pid", str(parent.pid))
    assert ping(sock) == proc.pid
    parent.kill()
    parent.wait()
    assert proc.wait(timeout=30) == 0
    assert not os.path.exists(sock)


def test_socket_permissions_stale_file_replaced_live_server_refused(sockdir):
    sock = str(sockdir / "w" / "s.sock")
    os.makedirs(os.path.dirname(sock))
    s = socket.socket(socket.AF_UNIX)
    s.bind(sock)
    s.close()
    proc = _serve(sock)
    assert ping(sock) == proc.pid  # the stale file was replaced
    assert os.stat(sock).st_mode & 0o777 == 0o600
    second = subprocess.run(
        [sys.executable, "-m", "hacpo.worker", "serve", "--socket", sock, "--no-preload"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1 and "already serving" in second.stderr
    assert ping(sock) == proc.pid
    assert stop(sock)
    assert proc.wait(timeout=30) == 0 and not os.path.exists(sock)
    assert not stop(sock)
    fresh = str(sockdir / "new" / "s.sock")
    proc = _serve(fresh, "--idle-timeout", "30")
    assert os.stat(os.path.dirname(fresh)).st_mode & 0o777 == 0o700
    assert stop(fresh) and proc.wait(timeout=30) == 0


def test_stop_terminates_running_children(sockdir):
    sock = str(sockdir / "w" / "s.sock")
    pid = start_background(sock, str(sockdir / "log"), preload=False)
    client, child = _blocked_client(sock, pid)
    assert stop(sock)
    assert client.wait(timeout=30) == 128 + signal.SIGTERM
    assert not _alive(child) and not os.path.exists(sock)
    client.communicate()


def test_lost_server_fails_the_client_clearly(sockdir):
    sock = str(sockdir / "w" / "s.sock")
    proc = _serve(sock)
    client, child = _blocked_client(sock, proc.pid)
    time.sleep(0.3)
    proc.kill()
    proc.wait()
    assert client.wait(timeout=30) == 1
    client.stdin.write("{}\n")  # let the orphaned child finish
    client.stdin.close()
    assert "lost the connection to the warm worker" in client.stderr.read()
    wait_for(lambda: not _alive(child), what="the orphaned child to finish")


@pytest.mark.slow
def test_preloaded_server_runs_eval_fast(sockdir, small_agent, toy_data):
    """End to end with the real preload: same eval summary as in-process; timings printed, not asserted."""
    sock = str(sockdir / "w" / "s.sock")
    t0 = time.perf_counter()
    start_background(sock, str(sockdir / "log"), preload=True, wait_s=300)
    t_start = time.perf_counter() - t0
    argv = [
        "eval",
        "--checkpoint",
        str(small_agent),
        "--benchmark",
        str(toy_data / "test.jsonl"),
        "--limit",
        "50",
    ]
    try:
        t0 = time.perf_counter()
        r = _run(sock, *argv, "--out", str(sockdir / "worker"), env=_env(sock, OMP_NUM_THREADS="1"))
        t_worker = time.perf_counter() - t0
        assert r.returncode == 0, r.stderr
        t0 = time.perf_counter()
        assert _run(sock, "methods").returncode == 0
        t_methods = time.perf_counter() - t0
    finally:
        assert stop(sock)
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    t0 = time.perf_counter()
    local = subprocess.run(
        [sys.executable, "-m", "hacpo.cli", *argv, "--out", str(sockdir / "local")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    t_local = time.perf_counter() - t0
    assert local.returncode == 0, local.stderr

    def results(text: str) -> dict:
        return {k: v for k, v in json.loads(text).items() if not k.startswith("time_")}

    assert results(r.stdout) == results(local.stdout)
    assert results((sockdir / "worker" / "test.json").read_text()) == results(
        (sockdir / "local" / "test.json").read_text()
    )
    assert (sockdir / "worker" / "test.samples.jsonl").read_text() == (
        sockdir / "local" / "test.samples.jsonl"
    ).read_text()
    print(
        f"\nworker start {t_start:.2f} s; eval via worker {t_worker:.2f} s vs in-process {t_local:.2f} s; "
        f"methods via worker {t_methods:.2f} s"
    )


def test_a_worker_that_does_not_come_up_leaves_the_jobs_to_their_own_processes(tmp_path, monkeypatch, capsys):
    """The workflow's ``onstart``: a worker that does not answer in time (a loaded machine still importing
    torch) is said on stderr and switched off for the jobs, instead of stopping the workflow."""
    from hacpo import worker
    from hacpo.pipeline.hooks import start_worker

    def slow(sock, log, **_):
        raise RuntimeError(f"hacpo worker did not answer on {sock} within 60 s; see {log}")

    monkeypatch.setattr(worker, "start_background", slow)
    monkeypatch.setenv("HACPO_WORKER", "")
    assert start_worker(True, str(tmp_path / "logs" / "worker.log")) is None
    assert os.environ["HACPO_WORKER"] == "off"
    assert "no warm worker (hacpo worker did not answer" in capsys.readouterr().err
