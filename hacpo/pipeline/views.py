"""The table and figure specs of a workflow config (docs/extending.md: a table kind's workflow place): which
evaluation summaries, run logs and profiles each table or figure reads, its rows, labels, paper keys and
caption notes, validated through :mod:`hacpo.specs`. The runs they need are noted on the
:class:`~hacpo.pipeline.targets.Pipeline` (``Pipeline.runs``)."""

from __future__ import annotations

import os
from functools import cached_property
from typing import TYPE_CHECKING

from hacpo.config import describe_fidelity
from hacpo.report.claims import row_key
from hacpo.report.paper import paper_values
from hacpo.runio import Metric, Validation
from hacpo.specs import LINE_LOGS, FigureSpec, TableSpec, checked

from .config import Claim, alpha_variant
from .runs import Run


def claim_row_key(claim: str, pair: str, agent: str) -> str:
    """A scorecard row's name in a sequential look's record (:func:`hacpo.report.claims.row_key`)."""
    return row_key({"claim": claim, "pair": pair, "agent": agent})


if TYPE_CHECKING:
    from .targets import Pipeline

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
    "xgrpo": "XGRPO",
    "xgrpo_capability": "XGRPO (capability μ)",
    "sgt": "SGT",
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
KIND_TITLES = {"claims": "Scorecard — do the paper's claims hold here?"}
PAPER_BENCHMARK = {"alpha_ablation": "acc", "table7": "runtime_minutes"}  # the paper's key where it has one


class Views:
    """Table and figure specs over a :class:`~hacpo.pipeline.targets.Pipeline` (runs, targets, files)."""

    def __init__(self, pipe: Pipeline):
        self.pipe, self.cfg = pipe, pipe.cfg

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
            "title": spec.title or TABLE_TITLES.get(name) or KIND_TITLES.get(kind, name),
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
        if spec.kind not in ("hyperparams", "claims"):
            notes.append(self.recipe_note(spec))
        common["note"] = " ".join([common["note"], *notes]).strip()
        return sorted(set(files)), checked(TableSpec, {**common, **out})

    def recipe_note(self, spec) -> str:
        """What a table's (or an updates figure's) caption says of how its runs trained (issue 25): the
        fidelity preset and its choices (mini-batch order, cross EOS, identical tokenizers, reward), per group
        of rows where they differ."""
        pairs = getattr(spec, "pairs", None) or [spec.pair]
        methods = getattr(spec, "methods", None) or [getattr(spec, "method", None) or "hacpo"]
        groups: dict[str, dict[str, None]] = {}
        for method in (m for m in methods if m != "base"):
            for pair in pairs:
                run = self.pipe.run(method, pair, self.cfg.pairs[pair].agents[0], 0)
                how = describe_fidelity(self.pipe.train_settings(run))
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
                        self.pipe.target(method, pair, model, s)
                        for s in (seeds[:1] if method == "base" else seeds)
                    ]
                    files += [self.pipe.eval_summary(t.eval, x) for x in targets]
                    evals = {b: [self.pipe.eval_file(t.eval, x, b) for x in targets] for b in benches}
                    rows.append(self._model_row(pair, model, evals, method))
        extra = {"compare_to": t.compare_to} if t.compare_to else {}
        extra |= {"figure": True} if t.figure else {}
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
        runs = [Run("joint", t.pair, t.method, s, self.pipe.results) for s in self.seeds(t)]
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
        return [self.pipe._needed(r).done for r in runs], {"rows": rows}

    def _table_seeds(self, t) -> tuple[list[str], dict]:
        files, rows = [], []
        for model in self.cfg.pairs[t.pair].agents:
            for method in t.methods:
                targets = {s: self.pipe.target(method, t.pair, model, s) for s in t.seeds}
                files += [self.pipe.eval_summary(t.eval, x) for x in targets.values()]
                evals = {str(s): [self.pipe.eval_file(t.eval, x, t.benchmark)] for s, x in targets.items()}
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
                    targets = [self.pipe.target(method, pair, model, s) for s in seeds]
                    files += [self.pipe.eval_summary(t.eval, x) for x in targets]
                    evals[f"{a:g}"] = [self.pipe.eval_file(t.eval, x, t.benchmark) for x in targets]
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
            if self.pipe.is_joint(method):
                runs = [Run("joint", pair, method, s, self.pipe.results) for s in seeds]
                row["overall"] = [r.profile for r in runs]
            else:
                runs = [Run("single", a, method, s, self.pipe.results) for a in agents for s in seeds]
                row["profiles"] = {a: [r.profile for r in runs if r.group == a] for a in agents}
            files += [self.pipe._needed(r).done for r in runs]
            rows.append(row)
        cols = [
            {"key": a, "label": self.cfg.models[a].label or a, "paper_model": self._paper_model(pair, a)}
            for a in agents
        ]
        cols.append({"key": "total", "label": "total", "paper_model": "total"})
        return files, {"columns": cols, "rows": rows, "paper_block": self._block(pair)["paper_block"]}

    _table_memory = _table_runtime

    # ------------------------------------------------------------------------------------------ claims
    def _table_claims(self, t, sizes: dict[str, int] | None = None) -> tuple[list[str], dict]:
        """The scorecard (issue 30): one row per claim × pair × agent (and mean rows), each side's files per
        seed. ``t.seeds`` unset: a row takes the seeds whose files the default target's other tables and
        figures already read (at least the config's first seed), so the default command trains nothing for
        it; set: every row trains and evaluates those seeds. ``sizes``: a sequential look's seeds per row
        (:func:`claim_row_key` → how many of :meth:`ClaimsTable.seed_order`); rows it leaves out are not
        at this look. ``results_from``: each other folder's files of the same seeds join the row."""
        files, rows = [], []
        for cid, c in t.claims.items():
            setting = self.cfg.claim_eval(c)
            for pair, agent, members in self._claim_groups(c):
                key = claim_row_key(cid, pair, agent)
                if sizes is not None and key not in sizes:
                    continue
                seeds = (
                    t.seed_order()[: sizes[key]]
                    if sizes is not None
                    else self._claim_seeds(t, c, setting, members)
                )
                a = self._claim_side(c, c.a, setting, members, seeds)
                if c.threshold is not None:  # a statistic of a's run: say which
                    stat = f"{c.metric}[{a['side']['label']}]"
                    a["side"]["label"] = stat if c.center is None else f"abs({stat} − {c.center:g})"
                    b = {"side": {"label": f"{c.threshold:g}", "value": c.threshold, "paper": c.threshold}}
                else:
                    b = self._claim_side(c, c.b, setting, members, seeds)
                runs = {str(s): [f"{r.dir}/run.json" for r in rs] for s, rs in a.get("seed_runs", {}).items()}
                for s, rs in b.get("seed_runs", {}).items():
                    runs[str(s)] = runs.get(str(s), []) + [f"{r.dir}/run.json" for r in rs]
                for side in (a, b):
                    files += side.get("files", [])
                    for r in side.get("runs", []):
                        self.pipe._needed(r)
                origins = {}
                for k, folder in enumerate(t.results_from):  # other machines' seeds: the same files there
                    for side in (a, b):
                        for s in seeds if "seeds" in side["side"] else []:
                            side["side"]["seeds"][f"{k}:{s}"] = [
                                {**src, "file": self._elsewhere(src["file"], folder)}
                                for src in side["side"]["seeds"][str(s)]
                            ]
                    for s in seeds:
                        runs[f"{k}:{s}"] = [self._elsewhere(f, folder) for f in runs.get(str(s), [])]
                        origins[f"{k}:{s}"] = folder
                    files += [self._elsewhere(f, folder) for side in (a, b) for f in side.get("files", [])]
                one_seed = len(seeds) < 2
                test = {
                    "claim": cid,
                    "source": c.source,
                    "quote": c.quote,
                    "direction": c.direction,
                    "metric": c.metric,
                    "ratio": c.ratio,
                    "a": a["side"] | ({"center": c.center} if c.center is not None else {}),
                    "b": b["side"],
                    "paper_table": a.get("paper_table"),
                    "stated": c.paper.stated if self._claim_headline_row(c, pair, agent) else None,
                    "decide": self._decide_command(t) if one_seed else None,
                    "margin": t.margin(c),
                    "runs": runs,
                    "origins": origins,
                    "order": [str(s) for s in seeds] + list(origins),
                }
                label = self.cfg.models[agent].label or agent if agent in self.cfg.models else agent
                row = {"block": pair, "model": agent, "model_label": label, "label": cid, "claim": test}
                rows.append(row)
        q = t.sequential
        sequential = q and {
            "start": len(t.seeds), "block": q.block, "max": q.max, "spending": q.spending,
            "max_hours": q.max_hours,
        }  # fmt: skip
        return files, {"rows": rows, "sequential": sequential if sizes is not None else None}

    def claim_row_keys(self, name: str) -> list[str]:
        """Every row of scorecard ``name`` (:func:`claim_row_key`), in the card's order, without its files."""
        t = self.cfg.tables[name]
        return [claim_row_key(cid, pair, agent) for cid, c in t.claims.items()
                for pair, agent, _ in self._claim_groups(c)]  # fmt: skip

    def claims_look(self, name: str, sizes: dict[str, int]) -> tuple[list[str], dict]:
        """``(input files, spec)`` of one look of a sequential scorecard: each open row at its seeds."""
        t = self.cfg.tables[name]
        files, out = self._table_claims(t, sizes)
        return sorted(set(files)), checked(TableSpec, {**self._common(name, t, "claims"), **out})

    def _elsewhere(self, path: str, folder: str) -> str:
        """``path`` under this config's results folder, read from another machine's ``folder`` instead."""
        rel = os.path.relpath(path, self.pipe.results)
        if rel.startswith(".."):
            raise ValueError(f"{path} is not under {self.pipe.results}: it cannot be read from {folder}")
        return f"{self.pipe.config_path(folder) if not os.path.isabs(folder) else folder}/{rel}"

    def _claim_headline_row(self, c: Claim, pair: str, agent: str) -> bool:
        """The row a claim's sentence speaks of: the mean over all its agents when it averages, else each."""
        if not c.average:
            return True
        return agent == "mean" and (pair == "all" or len(self.cfg.claim_pairs(c)) == 1)

    def _claim_groups(self, c: Claim) -> list[tuple[str, str, list[tuple[str, str | None]]]]:
        """(pair, agent, members) of each row: one per agent of each pair, a pair's mean over its agents and
        the mean over all pairs' agents (``average``); wall time: one per pair."""
        groups, pairs = [], self.cfg.claim_pairs(c)
        for pair in pairs:
            if c.metric == "wall_time":
                groups.append((pair, "all agents", [(pair, None)]))
                continue
            agents = c.agents or self.cfg.pairs[pair].agents
            groups += [(pair, a, [(pair, a)]) for a in agents]
            if c.average:
                groups.append((pair, "mean", [(pair, a) for a in agents]))
        if c.average and len(pairs) > 1:
            groups.append(("all", "mean", [m for g in groups if g[1] == "mean" for m in g[2]]))
        return groups

    def _claim_side(self, c: Claim, method: str, setting, members, seeds) -> dict:
        """One side's sources per seed, the files and runs they need, and the paper's value of that side."""
        per_seed, files, runs, seed_runs = {}, [], [], {}
        for s in seeds:
            per_seed[str(s)] = []
            for pair, agent in members:
                sources, f, r = self._claim_sources(c, method, setting, pair, agent, s)
                per_seed[str(s)] += sources
                files += f
                runs += r
                seed_runs.setdefault(s, []).extend(r)
        (paper, columns_mean), table = self._paper_side(c, method, members)
        side = {
            "label": self.label(method),
            "method": method,
            "seeds": per_seed,
            "combine": "sum" if c.metric == "wall_time" else "mean",
            "paper": paper,
            "paper_columns_mean": columns_mean,
        }
        return {"side": side, "files": files, "runs": runs, "paper_table": table, "seed_runs": seed_runs}

    def _claim_sources(self, c: Claim, method: str, setting, pair: str, agent, seed: int):
        """``(sources, files, runs)`` of ``method``'s value for ``agent`` of ``pair`` on one seed."""
        cfg, pipe = self.cfg, self.pipe
        if c.metric == "avg" or c.metric in cfg.benchmarks:
            benches = cfg.benchmarks_of(setting) if c.metric == "avg" else [c.metric]
            run = None if method == "base" else pipe.run(method, pair, agent, seed)
            target = f"base/{agent}" if run is None else pipe.target_of(run, agent)
            sources = [{"file": pipe.eval_file(setting, target, b), "key": cfg.benchmarks[b].metric}
                       for b in benches]  # fmt: skip
            return sources, [pipe.eval_summary(setting, target)], [run] if run else []
        if c.metric == "wall_time":
            agents = [None] if pipe.is_joint(method) else cfg.pairs[pair].agents
            runs = [pipe.run(method, pair, a, seed) for a in agents]
            return [{"file": r.profile, "key": "wall_s"} for r in runs], [r.done for r in runs], runs
        run = pipe.run(method, pair, agent, seed)
        if c.metric == "val_last_third":
            source = {"file": f"{run.dir}/validation.jsonl", "key": Validation.ACC, "agent": agent}
            source["tail"] = 1 / 3
        else:  # s_homo, s_hete: each step's mean over the agent's own / cross rows (Table 5)
            source = {"file": f"{run.dir}/metrics.jsonl", "key": Metric.of(agent, f"{c.metric}_mean")}
        return [source], [run.done], [run]

    def _claim_seeds(self, t, c: Claim, setting, members) -> list[int]:
        """The row's seeds: the table's, or those whose files the default target already reads."""
        if t.seeds:
            return list(t.seeds)
        runs = self._default_runs  # a trained run's own files count, whichever table asked for it
        have = self._default_inputs | {f for r in runs for f in (r.done, r.profile)}
        candidates = sorted({r.seed for r in runs} | {self.cfg.seeds[0]})
        sides = [m for m in (c.a, c.b) if m is not None]

        def present(seed: int) -> bool:
            return all(
                set(self._claim_sources(c, m, setting, pair, agent, seed)[1]) <= have
                for m in sides
                for pair, agent in members
            )

        return [s for s in candidates if present(s)] or [self.cfg.seeds[0]]

    @cached_property
    def _default_files_and_runs(self) -> tuple[frozenset[str], frozenset[Run]]:
        """The files and runs the default target's tables and figures other than scorecards read."""
        saved, self.pipe._noted, files = self.pipe._noted, set(), set()
        try:
            for name in self.pipe.defaults("tables"):
                if self.cfg.tables[name].kind != "claims":
                    files |= set(self.table(name)[0])
            for name in self.pipe.defaults("figures"):
                files |= set(self.figure(name)[0])
            return frozenset(files), frozenset(self.pipe._noted)
        finally:
            self.pipe._noted = saved

    @property
    def _default_inputs(self) -> frozenset[str]:
        return self._default_files_and_runs[0]

    @property
    def _default_runs(self) -> frozenset[Run]:
        return self._default_files_and_runs[1]

    def _decide_command(self, t) -> str:
        """What trains the seeds a one-seed row lacks: a scorecard of the same claims (and maybe more) over
        several seeds."""
        for name, other in self.cfg.tables.items():
            same = other.kind == "claims" and all(other.claims.get(k) == c for k, c in t.claims.items())
            if same and len(other.seeds or []) > 1:
                return f"snakemake {name}"
        name = next(n for n, x in self.cfg.tables.items() if x is t)
        return f"set tables.{name}.seeds (e.g. [0, 1, 42, 1337, 3407]) and run snakemake {name}"

    def _paper_side(self, c: Claim, method: str, members) -> tuple[tuple, str | None]:
        """``((value, columns mean), table)``: the paper's value of one side, its printed numbers combined as
        ours are, from the first of the claim's paper tables that prints every member's number. AVG: the
        printed AVG column, and beside it the mean of the table's benchmark columns (they disagree in 10
        rows of the paper)."""
        values, none = paper_values(), ((None, None), None)
        got, columns, tables = [], [], {}
        for pair, agent in members:
            paper = self.cfg.pairs[pair].paper
            found = None
            for table in c.paper.tables if paper else []:
                model, paper_method, bench = self._paper_key(c, table, method, pair, agent)
                key = (table, paper.block, model, paper_method)
                if (*key, bench) in values:
                    found = table
                    got.append(values[(*key, bench)])
                    cols = [v for k, v in values.items() if k[:4] == key and k[4] != "avg"]
                    columns.append(sum(cols) / len(cols) if bench == "avg" and cols else None)
                    break
            if found is None:
                return none
            tables[found] = None
        combine = sum if c.metric == "wall_time" else (lambda v: sum(v) / len(v))
        mean_cols = combine(columns) if None not in columns else None
        return (combine(got), mean_cols), ", ".join(tables)

    def _paper_key(self, c: Claim, table: str, method: str, pair: str, agent) -> tuple[str, str, str]:
        """(model, method, benchmark) of one paper number."""
        p = self.cfg.pairs[pair]
        if c.metric == "wall_time":
            joint = self.pipe.is_joint(method)
            return ("overall" if joint else "total"), self.paper_method(method), PAPER_BENCHMARK[table]
        model = p.paper.models[p.agents.index(agent)]
        if c.metric in ("s_homo", "s_hete"):
            return model, self.paper_method(method), f"{c.metric}_mean"
        hacpo_loss = method != "base" and self.cfg.registry_method(method).loss == "hacpo"
        if table == "alpha_ablation" and hacpo_loss:
            alpha = self.pipe.train_settings(self.pipe.run(method, pair, agent, 0))["alpha"]
            return model, alpha_variant(alpha), PAPER_BENCHMARK[table]
        bench = "avg" if c.metric == "avg" else (self.cfg.benchmarks[c.metric].paper or c.metric)
        return model, self.paper_method(method), bench

    def figure(self, name: str) -> tuple[list[str], dict]:
        f = self.cfg.figures[name]
        seeds, files, panels = self.seeds(f), [], []
        key, log = LINE_LOGS[f.kind]  # the spec key that lists each line's run logs, and the log's file
        fields = f.metrics if f.kind == "steps" else [None]
        for pair in f.pairs:
            for model in self.cfg.pairs[pair].agents:
                if f.kind == "steps" and f.agents and model not in f.agents:
                    continue
                lines = []
                for method in f.methods:
                    runs = [self.pipe.run(method, pair, model, s) for s in seeds]
                    files += [self.pipe._needed(r).done for r in runs]
                    logs = [f"{r.dir}/{log}" for r in runs]
                    lines.append({"label": self.label(method), "method": method, key: logs})
                title = f"{self.cfg.models[model].label or model} ({pair} pair)"
                for field in fields:  # steps: a panel per field, every line reading it
                    panel = {"title": title, "agent": model, "lines": lines}
                    if field is not None:
                        panel = {**panel, "title": f"{title}: {field}", "y_label": field,
                                 "lines": [{**line, "metric": field} for line in lines]}  # fmt: skip
                    panels.append(panel)
        val = self.cfg.val_data or "validation"
        spec = {
            "figure": name,
            "kind": f.kind,
            "title": f.title or TABLE_TITLES.get(name, name),
            "y_label": {"curves": f"greedy accuracy on {val}", "steps": "per step"}.get(
                f.kind, "cross rows inside [lo_m, 1] (share)"
            ),
            "panels": panels,
        }
        if f.kind == "updates":
            spec["note"] = self.recipe_note(f)
        return sorted(set(files)), checked(FigureSpec, spec)


# Table kind → the Views method that lists its input files and writes its spec (docs/extending.md: one of
# the four places of a table kind, beside the config schema, hacpo.specs and hacpo.report.tables.KINDS).
TABLE_SPECS = {
    "accuracy": Views._table_accuracy,
    "hyperparams": Views._table_hyperparams,
    "ratio_stats": Views._table_ratio_stats,
    "seeds": Views._table_seeds,
    "alpha": Views._table_alpha,
    "runtime": Views._table_runtime,
    "memory": Views._table_memory,
    "claims": Views._table_claims,
}
