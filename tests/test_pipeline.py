"""hacpo.pipeline: the config schema (shipped configs pass, a corpus of bad ones fails naming the key) and the
config → runs/paths/parameters logic the Snakemake rules rely on. No Snakemake here (see test_workflow.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from hacpo.config import load_train_config
from hacpo.pipeline import ConfigError, Pipeline, Run

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = (
    "config", "paper", "ci", "one-gpu", "real", "countdown", "rehearsal", "rehearsal-ci", "rehearsal-real",
    "real-claims", "real-four",
)
# an overlay → the configs it is laid over (every file given, in order)
OVERLAYS = {
    name: ("real-claims",)
    for name in ("real-claims-ci", "real-claims-pairs", "real-claims-state", "real-claims-model",
                 "real-claims-weak")
} | {"real-claims-state-base": ("real-claims", "real-claims-state"), "one-gpu-full-ft-94gb": ("one-gpu",)}
CONFIGS = {name: yaml.safe_load((ROOT / "config" / f"{name}.yaml").read_text()) for name in SHIPPED}


def pipe(name: str = "config", **changes) -> Pipeline:
    cfg = copy.deepcopy(CONFIGS[name])
    cfg.update(changes)
    return Pipeline(cfg, base_dir=str(ROOT), config_files=[str(ROOT / "config" / f"{name}.yaml")])


@pytest.mark.parametrize(
    ("part", "groups"),
    [
        ("state", {"smollm2", "smollm2_warm", "state"}),
        ("model", {"smollm2", "gemma3_warm", "model"}),
        ("weak", {"smollm2", "gemma3", "model_cold"}),
        ("pairs", {"smollm2", "smollm2_warm", "gemma3_warm", "state", "model"}),
    ],
)
def test_a_part_of_the_real_target_is_a_subset_of_its_runs(part, groups):
    """config/real-claims-{state,model,weak,pairs}.yaml share the whole target's folder: every run a part
    trains is one of the target's, with the same run config, so the target (and the other parts) reuses
    them."""
    files = [str(ROOT / "config" / f"{n}.yaml") for n in ("real-claims", f"real-claims-{part}")]
    part_pipe = Pipeline.from_files(files, base_dir=str(ROOT))
    whole = Pipeline.from_files(files[:1], base_dir=str(ROOT))
    assert part_pipe.results == whole.results and set(part_pipe.runs) < set(whole.runs)
    assert {r.group for r in part_pipe.runs} == groups
    for run in part_pipe.runs:
        assert part_pipe.train_config(run) == whole.train_config(run)


def test_the_four_state_config_holds_one_base_and_four_adapters():
    """config/real-four.yaml: four SmolLM2 states, each a LoRA adapter (three warm-ups' and a fresh one) on
    the one imported model, so its joint runs name one shared base; its GSPO runs train each agent alone."""
    p = pipe("real-four")
    joint = [r for r in p.runs if r.method == "hacpo"]
    assert len(joint) == len(p.cfg.seeds) == 5 and len([r for r in p.runs if r.method == "gspo"]) == 4 * 5
    agents = p.train_config(joint[0])["agents"]
    assert [a["shared_base"] for a in agents] == ["smollm2"] * 4
    assert all(a["adapter"]["lora"]["rank"] == 8 for a in agents)
    steps = [p.cfg.models[a["name"]].warm.max_steps for a in agents[1:]]
    assert steps == sorted(steps) and len(set(steps)) == 3  # three states beside the imported model


def test_every_shipped_workflow_config_is_tested():
    assert sorted(p.stem for p in (ROOT / "config").glob("*.yaml")) == sorted([*SHIPPED, *OVERLAYS])


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_overlays_validate_on_their_config(overlay):
    """An overlay (CI's size of a target, a part of one) laid over its config as Snakemake merges them:
    valid, its results folder, and a run config for every run."""
    files = [str(ROOT / "config" / f"{name}.yaml") for name in (*OVERLAYS[overlay], overlay)]
    p = Pipeline.from_files(files, base_dir=str(ROOT))
    assert p.results == (p.cfg.results_dir or f"results/{overlay}") and p.runs
    for run in p.runs:
        assert load_train_config(p.train_config(run)).out_dir == run.dir
    for t in p.cfg.tables:
        assert p.table(t)[1]["title"]
    for f in p.cfg.figures:
        assert p.figure(f)[1]["panels"]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_shipped_configs_validate_and_every_run_config_is_a_valid_train_config(name):
    p = pipe(name)
    assert p.runs, "every shipped config trains something"
    for run in p.runs:
        cfg = load_train_config(p.train_config(run))  # the exact JSON the train rule passes
        assert cfg.out_dir == run.dir and cfg.seed == run.seed
    for t in p.cfg.tables:
        files, spec = p.table(t)
        assert spec["kind"] == p.cfg.tables[t].kind and spec["title"]
    for f in p.cfg.figures:
        assert p.figure(f)[1]["panels"]


def test_paper_config_matches_the_paper_run_inventory():
    """shared/spec/paper-results.md §5: 39 single-agent runs and 27 joint runs (no 150-step reuse), plus
    the Naive readings table's 3 runs of Naive's other reading (source) on the Table 1 pairs."""
    runs = pipe("paper").runs
    assert sum(r.kind == "single" for r in runs) == 39
    assert sum(r.kind == "joint" and r.method != "naive_source" for r in runs) == 27
    assert sum(r.method == "naive_source" for r in runs) == 3
    single_models = {r.group for r in runs if r.kind == "single" and r.method == "grpo"}
    assert len(single_models) == 7  # every model's GRPO once, shared by all its pairs


def test_single_agent_baselines_are_shared_across_pairs():
    p = pipe("config")
    # `big` is in the size, model, size_b and state_b pairs: one GSPO seed-42 run, with no pair in its path
    gspo_big = [r for r in p.runs if r == Run("single", "big", "gspo", 42, p.results)]
    assert len(gspo_big) == 1 and "/size/" not in gspo_big[0].dir
    assert (
        p.target("gspo", "size", "big", 42)
        == p.target("gspo", "model", "big", 42)
        == "single/big/gspo/seed42"
    )
    assert p.target("hacpo", "size", "big", 42) == "joint/size/hacpo/seed42/big"
    assert p.target("base", "size", "big", 42) == "base/big"


def test_hyper_parameters_layer_global_then_pair_then_method():
    cfg = copy.deepcopy(CONFIGS["config"])
    cfg["pairs"]["size"]["train"] = {"lr": 1e-5}
    cfg["methods"]["long_hacpo"] = {"method": "hacpo", "train": {"steps": 50, "lr": 2e-5}}
    cfg["figures"]["figure3"]["methods"] = ["long_hacpo", "hacpo_no_clip"]
    p = Pipeline(cfg, base_dir=str(ROOT))
    joint = p.train_config(Run("joint", "size", "hacpo", 42, p.results))
    assert (joint["alpha"], joint["cross_clip_low"], joint["delta_step"], joint["lr"]) == (
        1.0,
        0.8,
        0.025,
        1e-5,
    )
    state = p.train_config(Run("joint", "state", "hacpo", 42, p.results))
    assert (state["alpha"], state["delta_step"], state["lr"]) == (3.0, 0.01, 3e-5)
    long = p.train_config(Run("joint", "size_b", "long_hacpo", 42, p.results))
    assert (long["method"], long["steps"], long["lr"]) == ("hacpo", 50, 2e-5)
    single = p.train_config(Run("single", "small", "gspo", 42, p.results))
    assert "alpha" not in single
    assert single["agents"] == [{"name": "small", "path": "results/config/agents/small"}]
    naive = p.train_config(Run("joint", "size", "naive", 42, p.results))  # its loss reads no HACPO knob
    assert not {"alpha", "cross_clip_low", "delta_step"} & set(naive)
    assert Run("joint", "size_b", "long_hacpo", 42, p.results) in p.runs


def test_alpha_table_reuses_the_default_run_at_the_pairs_own_alpha():
    p = pipe("config")
    methods = {r.method for r in p.runs if r.group == "size" and r.kind == "joint"}
    assert "hacpo_alpha1" not in methods and {"hacpo_alpha0", "hacpo_alpha2", "hacpo_alpha3"} <= methods
    _, spec = p.table("alpha_ablation")
    row = next(r for r in spec["rows"] if r["block"] == "size" and r["model"] == "small")
    assert row["evals"]["1"] == ["results/config/eval/main/joint/size/hacpo/seed42/small/toy_test.json"]
    assert [c["paper_method"] for c in spec["columns"]] == [f"hacpo_alpha{a}" for a in range(4)]
    # each α is an explicit override of hacpo (the name is only a path part), labelled with its value
    run = p.train_config(Run("joint", "size", "hacpo_alpha2", 42, p.results))
    assert (run["method"], run["alpha"], run["delta_step"]) == ("hacpo", 2.0, 0.025)
    assert p.label("hacpo_alpha0") == "HACPO α=0"


def test_a_pairs_alpha_change_reruns_only_its_hacpo_runs():
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    before = Pipeline(cfg)
    cfg["pairs"]["size"]["hacpo"]["alpha"] = 2.0
    after = Pipeline(cfg)
    changed = {
        r.method for r in before.runs if r.group == "size" and before.train_config(r) != after.train_config(r)
    }
    assert "naive" not in changed and {"hacpo", "hacpo_no_omega"} <= changed
    assert "hacpo_alpha0" not in changed  # its α is its own


def test_an_adapter_is_one_config_entry_and_part_of_each_runs_identity():
    """Issue 42: `training.adapter` trains every agent with LoRA, a model's own `adapter` wins (`{}`: that
    model fully trained, in its single runs and every pair); a rank change retrains exactly the runs that
    train that adapter."""
    cfg = copy.deepcopy(CONFIGS["real"])
    cfg["training"]["adapter"] = {"lora": {"rank": 8}}
    cfg["models"]["gemma3"]["adapter"] = {}
    p = Pipeline(cfg, base_dir=str(ROOT))
    joint = next(r for r in p.runs if r.kind == "joint")
    run = load_train_config(p.train_config(joint))
    assert [a.name for a in run.agents] == ["smollm2", "gemma3"]
    assert run.agent_adapter(0).rank == 8 and run.agent_adapter(1) is None
    single = {r.group: load_train_config(p.train_config(r)) for r in p.runs if r.kind == "single"}
    assert single["smollm2"].agent_adapter(0).rank == 8 and single["gemma3"].agent_adapter(0) is None

    cfg["training"]["adapter"] = {"lora": {"rank": 16}}
    q = Pipeline(cfg, base_dir=str(ROOT))
    changed = {(r.group, r.method) for r in p.runs if p.train_spec(r) != q.train_spec(r)}
    assert changed and all(group in ("smollm2", "real") for group, _ in changed)  # gemma3's runs keep theirs
    with pytest.raises(ValueError, match="rank"):
        cfg["models"]["smollm2"]["adapter"] = {"lora": {"rank": 0}}
        Pipeline(cfg, base_dir=str(ROOT))


RUNTIME_VALUES = {  # a non-default value of every runtime option a config sets (hacpo.config.RUNTIME_OPTIONS)
    "threads": 2,
    "scorer_workers": 2,
    "device": "cpu",
    "gradient_checkpointing": True,
    "micro_batch_tokens": 4096,
    "generation_batch_tokens": 8192,
    "final_checkpoint": "weights",
    "nonfinite_max_skips": 5,
}


@pytest.mark.parametrize(
    "name, option",
    [(n, o) for n in ("config", "paper") for o in RUNTIME_VALUES]
    + [("paper", "openrlhf"), ("rehearsal-ci", "openrlhf")],
)
def test_a_runtime_option_changes_no_runs_identity(name, option):
    """The train rule reruns a job when its spec changes: no runtime option is in it, nor in the run's
    config_hash; the job still gets the option (the rule's unrecorded `runtime` parameter)."""
    cfg = copy.deepcopy(CONFIGS[name])
    if option == "openrlhf":  # the GPU engine's placement, memory modes and trackers
        cfg["openrlhf"] = {**cfg.get("openrlhf", {}), "vllm_gpu_memory_utilization": 0.3}
        cfg["openrlhf"] |= {"micro_train_batch_size": 1}
    else:
        cfg["training"] = {**cfg.get("training", {}), option: RUNTIME_VALUES[option]}
    before = pipe(name)
    after = Pipeline(cfg, base_dir=str(ROOT), config_files=before.config_files)
    assert before.runs == after.runs
    for run in after.runs:
        assert after.train_spec(run) == before.train_spec(run)
        assert option in after.train_runtime(run) and option not in after.train_spec(run)
        full = load_train_config({**after.train_spec(run), **after.train_runtime(run)})
        assert full.config_hash() == load_train_config(before.train_config(run)).config_hash()


def test_eval_runtime_options_are_apart_from_what_an_evaluation_computes():
    cfg = copy.deepcopy(CONFIGS["one-gpu"])
    before = Pipeline(copy.deepcopy(cfg), base_dir=str(ROOT))
    cfg["eval_settings"]["len4k"] |= {"scorer_workers": 3, "batch_tokens": 1024}
    after = Pipeline(cfg, base_dir=str(ROOT), config_files=before.config_files)
    assert after.eval_settings("len4k") == before.eval_settings("len4k")
    assert after.eval_runtime("len4k") == {"scorer_workers": 3, "batch_tokens": 1024}
    cfg["eval_settings"]["len4k"]["precision"] = "fp32"  # what it computes: a change is a rerun
    assert Pipeline(cfg, base_dir=str(ROOT)).eval_settings("len4k") != before.eval_settings("len4k")


def test_table_specs_point_at_the_files_the_rules_make():
    p = pipe("config")
    files, spec = p.table("table1")
    assert all(f.endswith("summary.json") for f in files)
    rows = {(r["block"], r["model"], r["method"]) for r in spec["rows"]}
    assert len(rows) == 3 * 2 * 6 and ("model", "qwen", "naive") in rows
    for r in spec["rows"]:
        for paths in r["evals"].values():
            for path in paths:
                assert str(Path(path).parent / "summary.json") in files
    hacpo_row = next(
        r for r in spec["rows"] if r["block"] == "size" and r["model"] == "small" and r["method"] == "hacpo"
    )
    assert (
        hacpo_row["paper_block"] == "Qwen3-1.7B-Base+Qwen3-4B-Base"
        and hacpo_row["paper_model"] == "Qwen3-1.7B-Base"
    )
    assert spec["compare_to"] == "gspo_x2" and spec["paper_delta"] is False and spec["avg"] is True
    files7, spec7 = p.table("table7")
    assert all(f.endswith("done.json") for f in files7)
    assert {r["method"] for r in spec7["rows"]} == {"gspo", "gspo_updates_x2", "gspo_x2", "hacpo"}


def test_evaluation_targets_round_trip():
    p = pipe("config")
    assert p.run_of_target("base/qwen") == (None, "qwen")
    run = Run("joint", "size", "hacpo", 42, p.results)
    assert p.run_of_target("joint/size/hacpo/seed42/big") == (run, "big")
    assert p.run_of_target("single/big/gspo/seed0") == (Run("single", "big", "gspo", 0, p.results), "big")
    assert p.eval_source("joint/size/hacpo/seed42/big") == {
        "run": "results/config/runs/joint/size/hacpo/seed42",
        "agent": "big",
    }
    assert p.eval_inputs("main", "base/qwen") == [
        "results/config/data/toy_test.jsonl",
        "results/config/data/toy_test_200.jsonl",
        "results/config/agents/qwen/agent.json",
    ]
    for bad in ("joint/size/hacpo/seed42", "base/Big", "single/big/gspo"):
        with pytest.raises(ValueError):
            p.run_of_target(bad)


def test_hub_models_need_no_build_and_paper_eval_settings_follow_the_protocol():
    p = pipe("paper")
    assert p.model_inputs("qwen3_4b_base") == [] and p.model_path("qwen3_4b_base") == "Qwen/Qwen3-4B-Base"
    s8, s4 = p.eval_settings("len8k"), p.eval_settings("len4k")
    assert (
        s8["max_new_tokens"] == 8196
        and s4["max_new_tokens"] == 4096
        and list(s4["benchmarks"]) == ["math500"]
    )
    assert len(s8["benchmarks"]) == 7
    aime = s8["benchmarks"]["aime2025"]
    assert (aime["metric"], aime["k"], aime["greedy"]) == ("avg@32", 32, False)
    assert s8["benchmarks"]["math500"]["greedy"] is True
    assert p.gpus(Run("joint", "q1p7b_q4b", "hacpo", 42, p.results)) == 8


def test_one_gpu_config_trains_on_cuda_and_evaluates_in_token_budgets():
    """config/one-gpu.yaml: every training and evaluation job asks for one GPU; the runs carry the real-size
    settings (bf16, checkpointing, micro-batches), and evaluation generates in KV-cache-sized batches."""
    p = pipe("one-gpu")
    assert {p.gpus(r) for r in p.runs} == {1}
    for run in p.runs:
        cfg = load_train_config(p.train_config(run))
        assert (cfg.device, cfg.precision, cfg.gradient_checkpointing) == ("cuda", "bf16", True)
        assert cfg.micro_batch_tokens == 16384 and cfg.max_new_tokens == 4096
    s = {**p.eval_settings("len4k"), **p.eval_runtime("len4k")}
    assert (s["batch_tokens"], s["precision"]) == (262144, "bf16")
    paper_len8k = {**pipe("paper").eval_settings("len8k"), **pipe("paper").eval_runtime("len8k")}
    assert not {"batch_tokens", "precision"} & set(paper_len8k)  # vLLM's own
    for key, value in (("batch_tokens", 1000), ("precision", "bf16")):
        bad = copy.deepcopy(CONFIGS["paper"])
        bad["eval_settings"]["len4k"][key] = value
        with pytest.raises(ConfigError, match=rf"eval_settings.len4k.{key}: a setting of the local engine"):
            Pipeline(bad)


def test_one_gpu_fits_80gb_with_lora_and_its_full_fine_tuning_variant_says_what_it_needs():
    """config/one-gpu.yaml trains rank-8 adapters (≈ 50–55 GB by arithmetic); the overlay named for its 94 GB
    trains every weight at the paper's lr, in its own folder."""
    lora = pipe("one-gpu")
    for run in lora.runs:
        cfg = load_train_config(lora.train_config(run))
        assert [a.adapter.lora.rank for a in cfg.agents] == [8] * len(cfg.agents) and cfg.lr == 3e-5
    files = [str(ROOT / "config" / f"{n}.yaml") for n in ("one-gpu", "one-gpu-full-ft-94gb")]
    merged = copy.deepcopy(CONFIGS["one-gpu"])
    overlay = yaml.safe_load((ROOT / "config" / "one-gpu-full-ft-94gb.yaml").read_text())
    merged["training"] |= overlay.pop("training")
    full = Pipeline(merged | overlay, base_dir=str(ROOT), config_files=files)
    assert full.results != lora.results
    for run in full.runs:
        cfg = load_train_config(full.train_config(run))
        assert cfg.adapter is None and {a.adapter for a in cfg.agents} == {None} and cfg.lr == 1e-6


def _bad(path: str, value):
    """A copy of the CI config with ``value`` set at the dotted ``path`` (None deletes the key)."""
    cfg = copy.deepcopy(CONFIGS["ci"])
    *parents, last = path.split(".")
    node = cfg
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    if value is None:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return cfg


BAD = [
    ("seeds", None, "seeds: Field required"),
    ("seeds", ["a"], "seeds.0: Input should be a valid integer"),
    ("engine", "deepspeed", "engine: Input should be 'local' or 'openrlhf'"),
    (
        "pairs.mixed.hacpo.cross_clip_low",
        0.2,
        "pairs.mixed.hacpo.cross_clip_low: cross_clip_low=0.2 is the lower clip bound 1−δ",
    ),
    ("pairs.mixed.agents", ["llama", "llama"], "pairs.mixed: a pair needs distinct models"),
    (
        "pairs.mixed.agents",
        ["llama", "mistral"],
        "pairs.mixed.agents.1: 'mistral' is not a known model; known: llama, qwen",
    ),
    (
        "pairs.mixed.heterogeneity",
        "sizes",
        "pairs.mixed.heterogeneity: Input should be 'state', 'size' or 'model'",
    ),
    ("training.learning_rate", 1e-3, "training: unknown training key(s) ['learning_rate']"),
    ("training.alpha", 2.0, "training: ['alpha']: HACPO's hyper-parameters are set per pair"),
    ("methods.fast", {"method": "naive", "train": {"alpha": 2.0}}, "method 'naive' does not read ['alpha']"),
    (
        "methods.fast",
        {"method": "hacpo", "train": {"alpha": -1}},
        "methods.fast: train.alpha: alpha=-1.0 must be ≥ 0",
    ),
    (
        "benchmarks.ci_test.sampling",
        {"greedy": True, "k": 4},
        "benchmarks.ci_test.sampling: greedy decoding gives one answer per problem",
    ),
    ("benchmarks.ci_test_k4.sampling.top_p", 1.5, "benchmarks.ci_test_k4.sampling: top_p must be in (0, 1]"),
    ("training.out_dir", "x", "training: unknown training key(s) ['out_dir']"),
    ("models.llama.hub", "meta-llama/Llama-3.2-1B", "models.llama: give exactly one of `hub:`"),
    ("models.Llama", {"hub": "x"}, "models.Llama.[key]: String should match pattern"),
    ("tables.table1.pairs", ["nope"], "tables.table1.pairs.0: 'nope' is not a known pair; known: mixed"),
    ("tables.table1.methods", ["base", "ppo"], "tables.table1.methods.1: 'ppo' is not a known method"),
    ("tables.table1.eval", "long", "tables.table1.eval: 'long' is not a known eval setting; known: main"),
    (
        "tables.table1.kind",
        "accuracies",
        "tables.table1: Input tag 'accuracies' found using 'kind' does not match",
    ),
    ("tables.table5.agent", "mistral", "tables.table5.agent: 'mistral' is not a known agent of pair 'mixed'"),
    (
        "tables.table5.method",
        "gspo",
        "tables.table5.method: 'gspo' trains on no peer rows, so it has no s_hete",
    ),
    (
        "tables.table6.benchmark",
        "gsm8k",
        "tables.table6.benchmark: 'gsm8k' is not a known benchmark of eval setting 'main'",
    ),
    (
        "benchmarks.ci_test_k4.metric",
        "avg@8",
        "benchmarks.ci_test_k4: metric avg@8 needs ≥ 8 samples per problem",
    ),
    (
        "benchmarks.ci_test.sampling",
        {"greedy": True, "k": 4},
        "benchmarks.ci_test.sampling: greedy decoding gives one",
    ),
    ("benchmarks.ci_test.dataset", "ci_tset", "benchmarks.ci_test.dataset: 'ci_tset' is not a known dataset"),
    (
        "datasets.ci_test",
        {"registry": "math500", "synthetic": {"split": "test"}},
        "datasets.ci_test: give exactly one of",
    ),
    ("datasets.ci_test.synthetic.families", ["add9"], "unknown synthetic families ['add9']"),
    ("methods", {"long": {"method": "hacpo_plus"}}, "methods.long.method: unknown method 'hacpo_plus'"),
    ("sft", None, "models.llama.warmup: warm-up models need an `sft:` section"),
    ("surprise", 1, "surprise: Extra inputs are not permitted"),
    (
        "figures.table1",
        {"kind": "curves", "pairs": ["mixed"], "methods": ["hacpo"]},
        "figures.table1: a table has this name too",
    ),
    (
        "figures.clip_by_update",
        {"kind": "updates", "pairs": ["mixed"], "methods": ["hacpo", "naive"]},
        "figures.clip_by_update.methods.1: 'naive' has no stepwise clip (a HACPO loss has)",
    ),
    ("training.minibatch_order", "by_agent", "training: minibatch_order: Input should be 'mixed', 'self_f"),
    ("training.fidelity", "released", "training: fidelity: Input should be 'paper' or 'as_released'"),
]


@pytest.mark.parametrize("path,value,message", BAD, ids=[b[0] + "-" + str(i) for i, b in enumerate(BAD)])
def test_bad_configs_are_rejected_naming_the_key(path, value, message):
    with pytest.raises(ConfigError) as err:
        Pipeline(_bad(path, value))
    text = str(err.value)
    assert message in text, text
    assert text.startswith("invalid workflow config") and "config/README.md" in text


def test_workflow_dataset_command_prepares_registry_data_with_paper_prompts(tmp_path, monkeypatch):
    """`hacpo data --spec` (the prepare_data rule) on a registry fixture: normalised records, the paper's
    prompt, a manifest entry with the pinned source; the canonical count holds unless the config opts out."""
    import json

    from hacpo.cli import main

    monkeypatch.chdir(tmp_path)
    fixture = ROOT / "tests" / "data" / "datasets" / "gsm8k_test.jsonl"
    spec = {"registry": "gsm8k", "file": str(fixture)}
    args = ["data", "--name", "gsm8k", "--out", "d/gsm8k.jsonl", "--manifest", "d/gsm8k.manifest.json"]
    assert main([*args, "--spec", json.dumps(spec), "--offline"]) == 2  # a fixture is not 1,319 problems
    assert not (tmp_path / "d" / "gsm8k.jsonl").exists()
    assert main([*args, "--spec", json.dumps({**spec, "check_count": False}), "--offline"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "d" / "gsm8k.jsonl").read_text().splitlines()]
    assert rows and all(
        r["prompt"]
        == r["problem"] + " Let's think step by step and output the final answer within \\boxed{}."
        for r in rows
    )
    assert all(r["answer"] and "," not in r["answer"] for r in rows)
    entry = json.loads((tmp_path / "d" / "gsm8k.manifest.json").read_text())
    assert entry["name"] == "gsm8k" and len(entry["revision"]) == 40 and entry["count"] == len(rows)


def test_the_train_rule_writes_where_runs_live_and_checks_its_wildcards():
    import re

    rule = (ROOT / "workflow" / "rules" / "train.smk").read_text()
    output = re.search(r'output:\n\s+"([^"]+)"', rule).group(1)
    p = pipe("config")
    r = Run("joint", "size", "hacpo", 42, p.results)
    path = output.replace("<results>", p.results)  # Snakemake's path variable (workflow/rules/common.smk)
    assert path.format(kind=r.kind, group=r.group, method=r.method, seed=r.seed) == r.done
    assert p.run_at("joint", "size", "hacpo", 42) == r
    with pytest.raises(ValueError, match="'small' is not a pair"):
        p.run_at("joint", "small", "hacpo", 42)
    with pytest.raises(ValueError, match="'hacpo' is joint: it has no single runs"):
        p.run_at("single", "small", "hacpo", 42)


def test_naive_rows_say_which_reading_made_them():
    """Tables 1 and 9 use the registry's Naive (spec §2.5's self_old); the Naive readings table shows both;
    every table with a Naive row says which reading produced it, and every Naive run names its reading."""
    p = pipe("config")
    for name in ("table1", "table9"):
        note = p.table(name)[1]["note"]
        assert "Naive: GSPO's clip on every row, cross-row ratios against the learner's own" in note, note
    note = p.table("naive_readings")[1]["note"]
    assert "(self_old" in note and "Naive (source):" in note and "generating agent's" in note
    assert "Naive" not in p.table("table2")[1]["note"]
    for method, reading in (("naive", "self_old"), ("naive_source", "source")):
        cfg = load_train_config(p.train_config(Run("joint", "size", method, 42, p.results)))
        assert cfg.naive_cross_ratio == cfg.resolved_method().naive_cross_ratio == reading
    paper = pipe("paper")
    assert [r.group for r in paper.runs if r.method == "naive_source"] == ["q1p7b_q4b", "q4b_l3b", "q4b_q4bi"]


def test_an_opt_in_view_is_built_only_when_named():
    """default: false (the toy order-sensitivity table): not in the default target, nor its runs in
    train_all and the profiles, but a named target with its own runs, whose captions say each row's preset."""
    p = pipe("config")
    targets = p.final_targets()
    assert "results/config/tables/order_sensitivity.md" not in targets
    assert "results/config/tables/table6.md" in targets
    assert "results/config/figures/order_clip_by_update.png" not in targets
    assert not any(r.method == "hacpo_agent_order" for r in p.runs)
    files, spec = p.table("order_sensitivity")
    assert len([f for f in files if "/hacpo_agent_order/" in f]) == 5 * 2  # 5 seeds × both agents' evals
    note = spec["note"]
    assert "HACPO (as released): the as_released preset (minibatch_order agent_order" in note
    assert "HACPO (self first): the paper preset, minibatch_order set against it" in note
    files, fig = p.figure("order_clip_by_update")
    lines = fig["panels"][0]["lines"]
    assert fig["kind"] == "updates" and len(lines) == 4
    assert lines[1]["updates"][0] == "results/config/runs/joint/size/hacpo_agent_order/seed0/updates.jsonl"


def test_every_view_kind_declares_the_names_it_refers_to():
    """A view kind whose keys name a pair, a method or an eval setting says so in its refs methods, which the
    config's cross-checks read: a new kind cannot slip a name past them."""
    from hacpo.pipeline import views_config as v

    kinds = [c for c in vars(v).values() if isinstance(c, type) and issubclass(c, v._View)]
    kinds = [c for c in kinds if "kind" in c.model_fields]
    assert len(kinds) >= 10
    refs = {"pair_refs": {"pair", "pairs"}, "method_refs": {"method", "methods", "compare_to"},
            "eval_refs": {"eval"}}  # fmt: skip
    for cls in kinds:
        for method, keys in refs.items():
            declared = getattr(cls, method) is not getattr(v._View, method)
            assert declared == bool(set(cls.model_fields) & keys), (cls.__name__, method)



def test_retention_releases_pretrained_runs_weights_after_every_evaluation_and_keeps_toy_ones(tmp_path):
    """`retention.weights` (docs/guide/watching.md, "Disk"): unset, pretrained models' runs release their
    weights and tiny agents' keep them. A released run's note waits for the run and every evaluation of it;
    an evaluation it has not had stops the DAG naming the run and the fix."""
    assert not pipe("config").cfg.release_weights and not pipe("config").release_targets(pipe("config").runs)
    assert pipe("config", retention={"weights": "after_eval"}).cfg.release_weights
    assert not pipe("real-claims", retention={"weights": "keep"}).cfg.release_weights
    p = pipe("real-claims", results_dir=str(tmp_path))
    notes = [f for f in p.final_targets() if f.endswith("/weights-released.json")]
    assert len(notes) == len(p.runs) == len(set(notes)) > 0
    run = Run("joint", "state", "hacpo", 0, str(tmp_path))
    target = "joint/state/hacpo/seed0/smollm2"
    summaries = [p.eval_summary("main", f"{target}{a}") for a in ("", "_warm")]
    assert p.release_inputs(run) == [run.done, *summaries]  # both agents' evaluations, no other setting
    assert p.runs_of([summaries[0], f"{tmp_path}/runs/single/smollm2/gspo/seed7/done.json", "x"]) == sorted(
        [run, Run("single", "smollm2", "gspo", 7, str(tmp_path))]
    )
    Path(run.dir).mkdir(parents=True)
    Path(p.release_marker(run)).write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"retention: \{weights: keep\}.*delete .*seed0"):
        p.eval_inputs("main", target)
    Path(summaries[0]).parent.mkdir(parents=True)
    Path(summaries[0]).write_text("{}")
    assert run.done in p.eval_inputs("main", target)  # written before the release: planned as it is
