"""The lock files scripts/setup_env.sh installs from (``requirements/lock-<extras>.txt``, made by
scripts/lock.sh): each pins every requirement of its extras set within pyproject.toml's range, with hashes,
and leaves torch to setup_env.sh; a run's provenance names the lock its environment came from."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCKS = sorted((ROOT / "requirements").glob("lock-*.txt"))
# the extras sets the README, the guides and CI install (scripts/lock.sh's default list)
SETS = ["dev", "dev,docs", "dev,models", "dev,models,data", "dev,models,docs"]


def _pins(lock: Path) -> dict[str, tuple[str, int]]:
    """name → (version, number of hashes) of every package a lock file pins."""
    pins, name = {}, None
    for line in lock.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^ ;\\]+)", line)
        if m:
            name = canonicalize_name(m.group(1))
            pins[name] = (m.group(2), 0)
        elif name and "--hash=sha256:" in line:
            pins[name] = (pins[name][0], pins[name][1] + 1)
    return pins


def test_every_extras_set_the_docs_install_has_a_lock():
    names = {f"lock-{'-'.join(sorted(s.split(',')))}.txt" for s in SETS}
    assert {p.name for p in LOCKS} == names


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.name)
def test_a_lock_pins_its_extras_within_pyprojects_ranges_with_hashes(lock):
    """pyproject.toml changed without `bash scripts/lock.sh` fails here, naming the requirement."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = lock.stem.removeprefix("lock-").split("-")
    wanted = [Requirement(r) for r in project["dependencies"]]
    wanted += [Requirement(r) for e in extras for r in project["optional-dependencies"][e]]
    pins = _pins(lock)
    assert "torch" not in pins and not [p for p in pins if p.startswith("nvidia-")]  # setup_env.sh's part
    for req in wanted:
        name = canonicalize_name(req.name)
        if name == "torch":
            continue
        assert name in pins, f"{lock.name} lacks {req}: bash scripts/lock.sh"
        assert req.specifier.contains(pins[name][0], prereleases=True), (
            f"{lock.name} pins {name}=={pins[name][0]} outside {req}: bash scripts/lock.sh"
        )
    assert all(n >= 1 for _, n in pins.values()), [k for k, (_, n) in pins.items() if n == 0]


def test_a_runs_versions_name_the_lock_its_environment_came_from(tmp_path, monkeypatch):
    from hacpo.provenance import versions

    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert "lock" not in versions()
    (tmp_path / "hacpo-lock").write_text("requirements/lock-dev.txt sha256:0123456789abcdef\n")
    assert versions()["lock"] == "requirements/lock-dev.txt sha256:0123456789abcdef"
