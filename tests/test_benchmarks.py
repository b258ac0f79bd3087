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


def test_bench_shared_base_on_a_tiny_model(small_agent, tmp_path):
    """benchmarks/bench_shared_base.py (docs/performance-real.md, "Agents on one shared base") on the tiny
    Llama, one step: the single agent, two adapters on one base and the two as separate models, each a fresh
    process with its own peak RSS and step time."""
    spec = importlib.util.spec_from_file_location(
        "bench_shared_base", ROOT / "benchmarks" / "bench_shared_base.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    argv = "--agents 2 --steps 1 --prompts 2 --group 2 --max-new-tokens 4 --rank 2 --prompt-style compact"
    args = bench.parse_args(argv.split())
    report = bench.bench(small_agent, tmp_path, args)
    rows = report["rows"]
    assert [(r["agents"], r["shared"]) for r in rows] == [(1, False), (2, True), (2, False)]
    for r in rows:
        keys = {"setting", "peak_rss_mb", "step_s", "step_cpu_s", "steps_s", "process_s", "process_cpu_s"}
        assert keys | {"rss_over_alone"} <= set(r), r
        assert r["peak_rss_mb"] > 100 and min(r["step_s"], r["step_cpu_s"], r["process_cpu_s"]) > 0, r
        assert len(r["steps_s"]) == len(r["steps_cpu_s"]) == 1, r
    assert rows[0]["rss_over_alone"] == 1.0
    goals = report["goals"]
    assert goals["memory"] == rows[1]["rss_over_alone"] and goals["time"] > 0
    assert goals["time"] == rows[1]["step_s"] / rows[2]["step_s"] and goals["time_cpu"] > 0
    table = bench.markdown(report)
    assert "| 2 adapters on one base (HACPO) |" in table and "- time: " in table
