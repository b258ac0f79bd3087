"""The table and figure specs of a workflow config (docs/extending.md: a table kind's workflow place): which
evaluation summaries, run logs and profiles each table or figure reads, its rows, labels, paper keys and
caption notes, validated through :mod:`hacpo.specs`. The runs they need are noted on the
:class:`~hacpo.pipeline.targets.Pipeline` (``Pipeline.runs``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hacpo.config import describe_fidelity
from hacpo.specs import LINE_LOGS, FigureSpec, TableSpec, checked

from .claim_views import ClaimViews
from .config import alpha_variant
from .runs import Run

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


class Views(ClaimViews):
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
        """What a table's (or an updates figure's) caption says of how its runs trained: the
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
