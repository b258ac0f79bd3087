"""docs/extending.md, done the documented way: a method, a model pair, a benchmark, a table kind."""

from __future__ import annotations

import copy
import typing
from dataclasses import replace
from pathlib import Path

import yaml
from toy_runs import toy_train_config

from hacpo import specs
from hacpo.algo import methods as registry
from hacpo.cli import main
from hacpo.engines.local import train
from hacpo.pipeline import Pipeline
from hacpo.pipeline import config as schema
from hacpo.pipeline.views import TABLE_SPECS
from hacpo.report.tables import KINDS

ROOT = Path(__file__).resolve().parents[1]
CI = yaml.safe_load((ROOT / "config" / "ci.yaml").read_text())


def test_a_new_method_is_one_registry_entry(monkeypatch, tmp_path, toy_data, small_agent, other_agent, capsys):  # noqa: E501
    hacpo = registry.get_method("hacpo")
    new = replace(hacpo, name="hacpo_static_no_omega", cross_clip="static", omega_in_loss=False)
    monkeypatch.setitem(registry.METHODS, new.name, new)

    assert main(["methods"]) == 0 and "hacpo_static_no_omega" in capsys.readouterr().out
    agents = [("small", small_agent), ("other", other_agent)]
    cfg = toy_train_config(tmp_path, agents, new.name, data=toy_data, steps=1, val_size=0)
    assert cfg.loss_spec().cross_clip == "static" and not cfg.loss_spec().omega_in_loss
    assert train(cfg).complete

    workflow = copy.deepcopy(CI)
    workflow["tables"]["table1"]["methods"].append(new.name)
    p = Pipeline(workflow)
    planned = [r for r in p.runs if r.method == new.name]
    assert planned and all(r.kind == "joint" and r.group == "mixed" for r in planned)
    assert p.train_spec(planned[0])["method"] == new.name
    assert p.label(new.name) == new.name  # no label given: its name (LABELS or a methods: entry labels it)


def test_a_new_pair_is_one_config_entry():
    before = Pipeline(copy.deepcopy(CI))
    cfg = copy.deepcopy(CI)
    cfg["pairs"]["swapped"] = {"agents": ["qwen", "llama"], "heterogeneity": "model"}
    cfg["tables"]["table1"]["pairs"].append("swapped")
    after = Pipeline(cfg)
    new = set(after.runs) - set(before.runs)
    assert new and {r.group for r in new} == {"swapped"} and {r.kind for r in new} == {"joint"}
    assert set(before.runs) <= set(after.runs)  # the models' single-agent baselines are shared


def test_a_new_benchmark_is_two_config_entries():
    cfg = copy.deepcopy(CI)
    cfg["datasets"]["ci_mul"] = {
        "synthetic": {"families": ["add2"], "split": "test", "seed": 7, "n_test": 50, "n_dev": 10}
    }
    cfg["benchmarks"]["ci_mul"] = {"dataset": "ci_mul", "label": "ADD2 (seed 7)", "metric": "avg@1"}
    p = Pipeline(cfg)
    settings = p.eval_settings("main")
    assert settings["benchmarks"]["ci_mul"]["file"] == p.dataset_file("ci_mul")
    _, spec = p.table("table1")
    assert "ci_mul" in {c["key"] for c in spec["columns"]}


def test_every_table_kind_is_in_all_four_places():
    """The config schema, the spec that crosses the rule, the workflow's spec builder and the report's builder
    of every kind agree."""
    (union, *_), = typing.get_args(schema.Table)[:1],
    schema_kinds = {
        k for model in typing.get_args(union) for k in typing.get_args(model.model_fields["kind"].annotation)
    }
    workflow_kinds = set(TABLE_SPECS)
    spec_kinds = set(typing.get_args(specs.TableKind))
    assert schema_kinds == spec_kinds == workflow_kinds == set(KINDS), (schema_kinds, spec_kinds, set(KINDS))


def test_every_figure_kind_is_in_all_four_places():
    from hacpo.report.figures import KINDS as FIGURE_KINDS

    (union, *_), = typing.get_args(schema.Figure)[:1],
    schema_kinds = {
        k for model in typing.get_args(union) for k in typing.get_args(model.model_fields["kind"].annotation)
    }
    assert schema_kinds == set(typing.get_args(specs.FigureKind)) == set(FIGURE_KINDS), schema_kinds
