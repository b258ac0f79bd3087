"""The run-directory contract: RunRecord (run.json) round trip, clear errors, the run lock and the sweep of
temporaries that killed writes leave."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hacpo.provenance import machine, machine_type
from hacpo.runio import RunRecord, atomic_dir, atomic_write_text, run_lock, sweep_temporaries, waiting_lock


def _record(**kw) -> RunRecord:
    base = dict(status="running", step=2, config_hash="abc", config={"method": "hacpo"}, engine="local")
    return RunRecord(**{**base, **kw})


def test_run_record_round_trip_and_engine_details(tmp_path):
    _record(details={"device": "cpu"}).write(tmp_path)
    assert RunRecord.read(tmp_path) == _record(details={"device": "cpu"})
    data = json.loads((tmp_path / "run.json").read_text())
    data["sampler_logp_as_old"] = True  # a key beside the contract (older run.json files) is kept as detail
    (tmp_path / "run.json").write_text(json.dumps(data))
    assert RunRecord.read(tmp_path).details == {"device": "cpu", "sampler_logp_as_old": True}
    assert RunRecord.read(tmp_path / "absent") is None


def test_run_record_errors_name_the_file_and_the_fix(tmp_path):
    (tmp_path / "run.json").write_text('{"status": "running"}')
    with pytest.raises(ValueError, match=r"run\.json: not a run record \(missing"):
        RunRecord.read(tmp_path)
    _record().write(tmp_path)
    with pytest.raises(ValueError, match="not complete; finish training first"):
        RunRecord.read(tmp_path).final_checkpoint("a", tmp_path)
    ckpt = str(tmp_path / "checkpoints/a/step-8")
    _record(status="complete", final_checkpoints={"a": ckpt}).write(tmp_path)
    missing = r"step-8, is not here .*results pack.*delete .* train it again"
    with pytest.raises(FileNotFoundError, match=missing):
        RunRecord.read(tmp_path).final_checkpoint("a", tmp_path)
    os.makedirs(ckpt)
    assert RunRecord.read(tmp_path).final_checkpoint("a") == ckpt
    with pytest.raises(ValueError, match=r"no final checkpoint for agent 'b'; agents: \['a'\]"):
        RunRecord.read(tmp_path).final_checkpoint("b")


def test_a_run_records_its_machine_type_and_is_never_resumed_on_another(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "model name\t: Intel(R) Xeon(R) Platinum\nflags\t\t: fpu avx2 avx512f amx_tile amx_bf16\n"
    )
    xeon = machine(str(cpuinfo))
    assert xeon["cpu"] == "Intel(R) Xeon(R) Platinum" and xeon["flags"] == [
        "avx2",
        "avx512f",
        "amx_bf16",
        "amx_tile",
    ]
    assert machine_type(xeon) == "Intel(R) Xeon(R) Platinum [avx2 avx512f amx_bf16 amx_tile]"
    cpuinfo.write_text(cpuinfo.read_text() + "cpu family\t: 6\nmodel\t\t: 143\nstepping\t: 8\n")
    sapphire = machine(str(cpuinfo))  # a generation is a note beside the type, not a new type
    assert sapphire["cpu_id"] == "family 6 model 143 stepping 8"
    assert machine_type(sapphire) == machine_type(xeon)
    run = tmp_path / "run"
    _record(machine=machine()).write(run)  # this machine's own run resumes
    assert RunRecord.for_config(run, "abc").machine == machine()
    _record(machine=xeon if machine_type(machine()) != machine_type(xeon) else {"cpu": "other"}).write(run)
    with pytest.raises(ValueError, match="another machine type.*results_from"):
        RunRecord.for_config(run, "abc")
    _record().write(run)  # a run from before machines were recorded resumes as it always did
    assert RunRecord.for_config(run, "abc").machine == {}


def test_a_second_writer_of_a_run_directory_is_refused_until_the_first_dies(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from hacpo.runio import run_lock\n"
            "with run_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match="being written by another process"):
            with run_lock(tmp_path):
                pass
    finally:
        holder.kill()  # SIGKILL: the kernel releases the lock
        holder.wait()
    with run_lock(tmp_path):
        pass


def test_a_second_writer_of_a_shared_cache_waits_for_the_first(tmp_path):
    """The model cache's import lock: a second importer waits (it does not fail, nor replace the first one's
    entry under its readers) and goes on once the first holder is gone, even killed."""
    import threading

    lock = tmp_path / "cache" / ".import.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from hacpo.runio import waiting_lock\n"
         "with waiting_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)", str(lock)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    got = threading.Event()

    def second():
        with waiting_lock(lock):
            got.set()

    try:
        assert holder.stdout.readline().strip() == "held"
        waiter = threading.Thread(target=second)
        waiter.start()
        assert not got.wait(1.0), "the second writer did not wait for the first"
    finally:
        holder.kill()  # SIGKILL: the kernel releases the lock
        holder.wait()
    waiter.join(30)
    assert got.is_set()


def test_sweep_removes_only_what_interrupted_atomic_writes_left(tmp_path):
    atomic_write_text(tmp_path / "keep.json", "{}")
    (tmp_path / ".keep.json.x1.tmp").write_text("{")  # a killed atomic_write_bytes
    ckpt = tmp_path / "checkpoints" / "a"
    with atomic_dir(ckpt / "step-2") as tmp:
        (tmp / "config.json").write_text("{}")
    (ckpt / ".step-4.x2.tmp").mkdir()  # a killed atomic_dir
    (ckpt / ".step-4.x2.tmp" / "model.safetensors").write_bytes(b"half")
    (ckpt / ".step-2.x3.old").mkdir()
    os.mkdir(tmp_path / ".hidden-but-ours")
    assert sweep_temporaries(tmp_path) == 3
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(
        [".hidden-but-ours", "checkpoints", "a", "step-2", "config.json", "keep.json"]
    )


def test_a_run_records_the_commit_of_the_code_it_ran(tmp_path):
    from hacpo.provenance import checkout_commit

    assert checkout_commit(tmp_path) is None  # an installed wheel: the release number alone
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout
    assert checkout_commit(tmp_path) == head.strip()
    (tmp_path / "b.py").write_text("")  # untracked files (results, caches) leave the code as committed
    assert checkout_commit(tmp_path) == head.strip()
    (tmp_path / "a.py").write_text("x = 2\n")
    assert checkout_commit(tmp_path) == head.strip() + "+dirty"
