"""The GPU benchmark script runs end to end on a CPU at tiny sizes (--tiny): it must not rot between the
sessions that have a GPU. Its numbers here mean nothing; docs/performance.md has the GPU figures."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_bench_gpu_tiny_on_cpu(tmp_path):
    out = tmp_path / "bench"
    script = ROOT / "benchmarks" / "bench_gpu.py"
    cmd = [sys.executable, str(script), "--tiny", "--device", "cpu", "--steps", "1", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    report = json.loads((out / "bench_gpu.json").read_text())
    assert set(report["pairs"]) == {"small", "realistic"}
    for pair, body in report["pairs"].items():
        assert [(x["method"], len(x["agents"])) for x in body["runs"]] == [
            ("gspo", 1), ("gspo", 1), ("gspo_x2", 1), ("gspo_x2", 1), ("hacpo", 2),
            ("hacpo+lora8", 2)]  # fmt: skip
        assert body["compare"]["hacpo_over_gspo_x2"] > 0 and "hacpo_time_split" in body["compare"]
        assert body["compare"]["hacpo_lora_over_hacpo_step"] > 0  # issue 42: the LoRA case
        assert all(x["synthetic_reward"] == (pair == "realistic") for x in body["runs"])
    assert "declared synthetic reward" in (out / "bench_gpu.md").read_text()

    # a time limit mid-pair leaves the report written after the last finished run: it renders as such
    spec = importlib.util.spec_from_file_location("bench_gpu", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cut = report["pairs"]["realistic"]
    del cut["compare"], cut["runs"][2:]
    text = bench.markdown(report)
    assert "(incomplete: 2 of 6 runs)" in text and text.count("| gspo (") == 4 and "hacpo (" in text


def test_bench_serve_on_a_tiny_frozen_model(small_agent, toy_data):
    """benchmarks/bench_serve.py (docs/performance.md, "Serving a frozen model") serves a checkpoint."""
    script, problems = ROOT / "benchmarks" / "bench_serve.py", toy_data / "test.jsonl"
    cmd = [sys.executable, str(script), "--checkpoint", str(small_agent), "--problems", str(problems),
           "--n", "4", "--frozen", "--precision", "fp32"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["n"] == 4 and out["frozen"] and 0 < out["encode_s"] <= out["generate_s"]
    assert out["peak_rss_mb"] > 0
