"""A missing precondition skips a test and says what to set up, except where CI requires it
(``HACPO_REQUIRE_<THING>=1``), where it fails: tests/required.py, the one helper every such test calls."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from required import missing

ROOT = Path(__file__).resolve().parents[1]


def test_a_missing_precondition_skips_unless_required(monkeypatch):
    monkeypatch.delenv("HACPO_REQUIRE_DOCS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="node is not installed: install it"):
        missing("HACPO_REQUIRE_DOCS", "node is not installed", "install it")
    monkeypatch.setenv("HACPO_REQUIRE_DOCS", "1")
    with pytest.raises(pytest.fail.Exception, match="DOCS=1 but node is not installed; install"):
        missing("HACPO_REQUIRE_DOCS", "node is not installed", "install it")


def test_the_katex_check_fails_without_node_where_the_docs_are_required(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("docs_tests", ROOT / "tests" / "test_docs.py")
    docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs)
    (tmp_path / "page.html").write_text('<span class="arithmatex">\\(x^2\\)</span>' * 21)
    monkeypatch.setattr(docs.shutil, "which", lambda name: None)
    check = docs.test_the_site_reads_offline_and_katex_renders_every_equation

    def outcome() -> str:
        try:
            check(tmp_path)
        except (pytest.skip.Exception, pytest.fail.Exception) as stop:
            return f"{type(stop).__name__}: {stop}"
        return "ran"

    monkeypatch.setenv("HACPO_REQUIRE_DOCS", "1")
    assert outcome().startswith("Failed: HACPO_REQUIRE_DOCS=1 but node is not installed")
    monkeypatch.delenv("HACPO_REQUIRE_DOCS")
    assert outcome().startswith("Skipped: node is not installed")


def test_the_rehearsal_checks_fail_without_their_folder_where_the_real_stack_is_required():
    """tests/openrlhf/test_rehearsal_outputs.py reads a finished rehearsal: without HACPO_REHEARSAL_DIR it
    skips, but fails under HACPO_REQUIRE_REAL_STACK=1 (CI), naming the variable to set."""
    test = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/openrlhf/test_rehearsal_outputs.py"]
    unset = ("HACPO_REHEARSAL_DIR", "HACPO_REQUIRE_REAL_STACK")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    required = subprocess.run([sys.executable, *test], cwd=ROOT, env={**env, "HACPO_REQUIRE_REAL_STACK": "1"},
                              capture_output=True, text=True)  # fmt: skip
    assert required.returncode != 0, required.stdout
    assert "HACPO_REQUIRE_REAL_STACK=1 but HACPO_REHEARSAL_DIR is not set" in required.stdout, required.stdout
    skipped = subprocess.run([sys.executable, *test], cwd=ROOT, env=env, capture_output=True, text=True)
    assert skipped.returncode in (0, 5) and "1 skipped" in skipped.stdout, skipped.stdout
