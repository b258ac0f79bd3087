"""The scorecard's specs (a ``claims`` table of a workflow config, docs/statistics.md): one row per claim ×
pair × agent and mean rows, each side's sources per seed, the seeds a row reads (its own, the default
target's, or a sequential look's), other machines' folders (``results_from``) and the paper's side.
:class:`ClaimViews` is a part of :class:`hacpo.pipeline.views.Views`, which it extends."""

from __future__ import annotations

import os
from functools import cached_property
from typing import TYPE_CHECKING

from hacpo.report.claims import row_key
from hacpo.report.paper import paper_values
from hacpo.runio import Metric, Validation
from hacpo.specs import TableSpec, checked

from .config import Claim, alpha_variant
from .runs import Run

if TYPE_CHECKING:
    from .targets import Pipeline

PAPER_BENCHMARK = {"alpha_ablation": "acc", "table7": "runtime_minutes"}  # the paper's key where it has one


def claim_row_key(claim: str, pair: str, agent: str) -> str:
    """A scorecard row's name in a sequential look's record (:func:`hacpo.report.claims.row_key`)."""
    return row_key({"claim": claim, "pair": pair, "agent": agent})


class ClaimViews:
    """The scorecard's part of :class:`~hacpo.pipeline.views.Views` (it uses the views' labels, paper keys and
    the common fields of a table spec)."""

    pipe: Pipeline
    def _table_claims(self, t, sizes: dict[str, int] | None = None) -> tuple[list[str], dict]:
        """The scorecard: one row per claim × pair × agent (and mean rows), each side's files per
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
