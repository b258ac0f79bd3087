"""The ``hacpo`` command line: eval, train, data, methods, and clear errors for bad input."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml

from hacpo.cli import main
from hacpo.config import TrainConfig
from hacpo.eval.metrics import pass_at_k, summarize


def test_eval_greedy_and_sampled(tmp_path, toy_data, small_agent, capsys):
    bench = toy_data / "test.jsonl"
    assert (
        main(
            [
                "eval",
                "--checkpoint",
                str(small_agent),
                "--benchmark",
                str(bench),
                "--limit",
                "60",
                "--out",
                str(tmp_path / "greedy"),
            ]
        )
        == 0
    )
    summary = json.loads((tmp_path / "greedy" / "test.json").read_text())
    samples = [json.loads(x) for x in (tmp_path / "greedy" / "test.samples.jsonl").read_text().splitlines()]
    assert summary["n_problems"] == 60 and summary["samples_per_problem"] == 1 and len(samples) == 60
    assert summary["avg@1"] == pytest.approx(sum(s["correct"] for s in samples) / 60)
    assert 0.0 < summary["avg@1"] < 1.0  # a warmed-up toy agent solves some, not all
    assert {"id", "response", "extracted", "gold", "correct"} <= samples[0].keys()

    assert (
        main(
            [
                "eval",
                "--checkpoint",
                str(small_agent),
                "--benchmark",
                str(bench),
                "--limit",
                "30",
                "--sample",
                "--k",
                "4",
                "--out",
                str(tmp_path / "sampled"),
            ]
        )
        == 0
    )
    s = json.loads((tmp_path / "sampled" / "test.json").read_text())
    assert s["samples_per_problem"] == 4 and "avg@4" in s and "pass@4" in s and s["pass@4"] >= s["avg@4"]


def test_eval_rejects_missing_inputs(tmp_path, small_agent, capsys):
    assert (
        main(["eval", "--checkpoint", str(small_agent), "--benchmark", "nope.jsonl", "--out", str(tmp_path)])
        == 2
    )
    assert "benchmark file 'nope.jsonl' does not exist" in capsys.readouterr().err
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"problem": "1+1"}\n')
    assert main(["eval", "--checkpoint", str(tmp_path), "--benchmark", str(bad), "--out", str(tmp_path)]) == 2
    assert "neither a Hugging Face checkpoint" in capsys.readouterr().err


def test_train_from_yaml_with_overrides(tmp_path, toy_data, small_agent, capsys):
    cfg = {
        "method": "grpo",
        "agents": [{"name": "a", "path": str(small_agent)}],
        "train_file": str(toy_data / "train.jsonl"),
        "out_dir": str(tmp_path / "run"),
        "steps": 3,
        "prompts_per_step": 4,
        "group_size": 4,
        "val_size": 0,
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", str(tmp_path / "run.yaml"), "--set", "steps=1"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["step"] == 1
    assert main(["train", str(tmp_path / "run.yaml"), "--set", "method=nope"]) == 2
    assert "unknown method 'nope'" in capsys.readouterr().err


def test_workflow_mode_reuses_a_complete_run_and_moves_aside_only_a_stale_one(
    tmp_path, toy_data, small_agent, capsys
):
    """``hacpo train --marker`` (the train rule): a complete run of the same spec and inputs is reused under
    new runtime options; another spec, or an input with new content, moves it aside and trains again."""
    train = tmp_path / "train.jsonl"
    train.write_bytes((toy_data / "train.jsonl").read_bytes())
    spec = {
        "method": "grpo",
        "agents": [{"name": "a", "path": str(small_agent)}],
        "train_file": str(train),
        "out_dir": str(tmp_path / "run"),
        "steps": 1,
        "prompts_per_step": 4,
        "group_size": 4,
        "val_size": 0,
    }
    marker = tmp_path / "done.json"

    def job(spec, runtime=None):
        argv = ["train", json.dumps(spec), "--marker", str(marker)]
        assert main(argv + (["--runtime", json.dumps(runtime)] if runtime else [])) == 0, capsys.readouterr()
        return json.loads(marker.read_text()), capsys.readouterr().err

    first, _ = job(spec)
    assert first["status"] == "complete" and "reused" not in first
    trained = (tmp_path / "run" / "metrics.jsonl").stat().st_mtime_ns
    again, err = job(spec, {"threads": 2, "micro_batch_tokens": 4096, "scorer_workers": 1})
    assert again == {**first, "reused": True} and "reusing the complete run" in err
    assert (tmp_path / "run" / "metrics.jsonl").stat().st_mtime_ns == trained
    assert not list(tmp_path.glob("run.superseded-*"))

    train.write_bytes(train.read_bytes())  # rewritten, same content: still reused
    assert job(spec)[0].get("reused")
    lines = train.read_text().splitlines(keepends=True)
    train.write_text("".join(reversed(lines)))  # new content: trained again, the old run kept aside
    _, err = job(spec)
    assert "run.superseded-1 (complete, other inputs)" in err and (tmp_path / "run.superseded-1").is_dir()
    _, err = job({**spec, "lr": 1e-5})
    assert "run.superseded-2 (complete, another spec)" in err

    assert main(["train", json.dumps(spec), "--runtime", '{"lr": 0.1}']) == 2
    assert "--runtime takes runtime options only" in capsys.readouterr().err


def test_data_and_methods(tmp_path, capsys):
    assert (
        main(
            [
                "data",
                "--families",
                "add2",
                "sub2",
                "--n-test",
                "20",
                "--n-dev",
                "10",
                "--n-train",
                "30",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert len((tmp_path / "test.jsonl").read_text().splitlines()) == 40
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in ("grpo", "gspo_x2", "gspo_updates_x2", "naive", "hacpo_no_clip", "naive_cross_ratio"):
        assert name in out


def test_pass_at_k_and_summary_by_hand():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 − C(3,2)/C(4,2)
    assert pass_at_k(4, 3, 2) == 1.0
    s = summarize([[1, 0, 0, 0], [1, 1, 0, 0]])
    assert s["avg@4"] == pytest.approx((0.25 + 0.5) / 2)
    assert s["pass@1"] == pytest.approx(0.375) and s["pass@4"] == 1.0
    with pytest.raises(ValueError):
        summarize([[1, 0], [1]])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["data", "--out", "x", "--spec", "{}", "--families", "add2"], "not both"),
        (["data", "--out", "x", "--spec", "{}"], "give --manifest too"),
        (["eval", "--out", "x"], "give --checkpoint and --benchmark"),
        (["eval", "--out", "x", "--source", "{}"], "needs both --source and --settings"),
        (["eval", "--out", "x", "--checkpoint", "c", "--source", "{}", "--settings", "{}"], "not both"),
    ],
)
def test_one_command_per_job_refuses_mixed_forms(argv, message, capsys):
    """`data` and `eval` serve people and the workflow's rules alike; a mix of both forms is named."""
    from hacpo.cli import main

    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_vllm_evaluation_without_vllm_says_how_to_install(tmp_path, capsys):
    from hacpo.cli import main

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    bench = tmp_path / "b.jsonl"
    bench.write_text('{"problem": "1+1", "answer": "2"}\n')
    argv = ["eval", "--checkpoint", str(tmp_path / "ckpt"), "--benchmark", str(bench), "--out", str(tmp_path)]
    assert main([*argv, "--engine", "vllm"]) == 2
    assert "EXTRAS=dev,gpu" in capsys.readouterr().err


def test_version_is_the_packages_and_the_changelogs(capsys):
    from pathlib import Path

    import hacpo

    root = Path(__file__).resolve().parents[1]
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"hacpo {hacpo.__version__}"
    assert f'version = "{hacpo.__version__}"' in (root / "pyproject.toml").read_text()
    assert f"## [{hacpo.__version__}]" in (root / "CHANGELOG.md").read_text()


def _run_config(tmp_path, **keys) -> str:
    cfg = {"method": "grpo", "agents": [{"name": "a", "path": str(tmp_path / "agent")}],
           "train_file": str(tmp_path / "train.jsonl"), "out_dir": str(tmp_path / "run"), **keys}  # fmt: skip
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    return str(tmp_path / "run.yaml")


def _diverged(message: str):
    from hacpo.engines.core.nonfinite import Diverged  # an engine's stop: hacpo.runio.RunStopped

    return Diverged(message)


@pytest.mark.parametrize("error", [ValueError, _diverged], ids=["ValueError", "a diverged run"])
def test_an_error_is_one_line_naming_debug_which_shows_the_traceback(error, monkeypatch, capsys):
    from hacpo import cli

    def broken(args):
        raise error("an internal slip")

    monkeypatch.setattr(cli, "cmd_methods", broken)
    monkeypatch.delenv("HACPO_WORKER", raising=False)
    monkeypatch.delenv("HACPO_DEBUG", raising=False)
    assert main(["methods"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "an internal slip" in err and "hacpo --debug methods" in err
    with pytest.raises(Exception, match="an internal slip"):
        main(["--debug", "methods"])
    monkeypatch.setenv("HACPO_DEBUG", "1")
    with pytest.raises(Exception, match="an internal slip"):
        main(["methods"])


def test_a_config_typo_names_the_closest_key_at_any_depth(tmp_path, capsys):
    config = _run_config(tmp_path, lrr=1e-5, openrlhf={"gpus_per_nod": 4}, logging={"wandb": {"projet": "x"}})
    assert main(["train", config]) == 2
    err = capsys.readouterr().err
    assert "lrr: Extra inputs are not permitted (did you mean lr?)" in err
    assert "openrlhf.gpus_per_nod: Extra inputs are not permitted (did you mean gpus_per_node?)" in err
    assert "logging.wandb.projet: Extra inputs are not permitted (did you mean project?)" in err
    from hacpo.pipeline.config import ConfigError, load_pipeline_config

    with pytest.raises(ConfigError, match=r"resultz_dir: Extra inputs .* \(did you mean results_dir\?\)"):
        load_pipeline_config({"resultz_dir": "x"})


def test_set_null_gives_a_key_its_default(tmp_path, monkeypatch, capsys):
    from hacpo.engines import local

    seen = []
    run = SimpleNamespace(status="complete", step=0)
    monkeypatch.setattr(local, "train", lambda cfg: seen.append(cfg) or run)
    config = _run_config(tmp_path, lr=0.5, seed=7)
    assert main(["train", config, "--set", "lr=null", "--set", "seed=3"]) == 0
    assert seen[-1].lr == TrainConfig.model_fields["lr"].default and seen[-1].seed == 3
    assert main(["train", config, "--set", "lrr=null"]) == 2
    assert "lrr: not a run config key, nothing to unset (did you mean lr?)" in capsys.readouterr().err
