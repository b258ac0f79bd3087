"""The cross-references of a workflow config's views (:mod:`.views_config`) against the rest of the config:
every pair, method, eval setting and benchmark a table, figure or claim names must exist, and each claim must
be one the scorecard can test. Errors carry their key paths."""

from __future__ import annotations

from .views_config import CLAIM_METRICS, Claim, ClaimsTable, RatioTable, UpdatesFigure


class ViewChecks:
    """The views' cross-references against the rest of the config (pairs, methods, eval settings,
    benchmarks), as key-path errors: a mixin of :class:`~hacpo.pipeline.config.PipelineConfig`, whose
    lookups (``_missing``, ``method_names``, ``registry_method``, ``benchmarks_of``) it uses."""

    def _views(self) -> list[tuple[str, object]]:
        """Tables and figures under their key paths (a name used by both is refused in _view_problems)."""
        return [
            *((f"tables.{k}", t) for k, t in self.tables.items()),
            *((f"figures.{k}", f) for k, f in self.figures.items()),
        ]

    def _view_problems(self, path: str, t) -> list[str]:
        need, errs, methods = self._missing, [], self.method_names()
        name = path.split(".", 1)[1]
        if path.startswith("figures.") and name in self.tables:
            errs.append(f"{path}: a table has this name too; rename one (each name is a snakemake target)")
        for where, p in t.pair_refs().items():
            errs += need(f"{path}.{where}", p, self.pairs, "pair")
        for where, m in t.method_refs().items():  # "base", the untrained models, only in a list of methods
            known = {*methods, "base"} if where.startswith("methods.") else methods
            errs += need(f"{path}.{where}", m, known, "method")
        if (refs := t.eval_refs()) is not None:
            setting, wanted = refs
            errs += need(f"{path}.eval", setting, self.eval_settings, "eval setting")
            allowed = set(self.benchmarks_of(setting)) if setting in self.eval_settings else set()
            for b in wanted:
                errs += need(f"{path}.benchmark", b, allowed, f"benchmark of eval setting {setting!r}")
        if isinstance(t, RatioTable):
            if t.pair in self.pairs:
                errs += need(f"{path}.agent", t.agent, self.pairs[t.pair].agents, f"agent of pair {t.pair!r}")
            if t.method in methods and not self.registry_method(t.method).cross_rows:
                errs.append(f"{path}.method: {t.method!r} trains on no peer rows, so it has no s_hete")
        if isinstance(t, ClaimsTable):
            for cid, c in t.claims.items():
                errs += self._claim_problems(f"{path}.claims.{cid}", c)
        if isinstance(t, UpdatesFigure):
            for i, m in enumerate(t.methods):
                if m in methods and self.registry_method(m).loss != "hacpo":
                    errs.append(f"{path}.methods.{i}: {m!r} has no stepwise clip (a HACPO loss has)")
        return errs

    def _claim_problems(self, path: str, c: Claim) -> list[str]:
        """A claim's names (methods, pairs, agents, tables, eval setting, metric) against the config."""
        need, errs, methods = self._missing, [], {*self.method_names(), "base"}
        for key in ("a", "b"):
            if getattr(c, key) is not None:
                errs += need(f"{path}.{key}", getattr(c, key), methods, "method")
        for i, name in enumerate(c.tables):
            errs += need(f"{path}.tables.{i}", name, {**self.tables, **self.figures}, "table or figure")
        for i, p in enumerate(c.pairs or []):
            errs += need(f"{path}.pairs.{i}", p, self.pairs, "pair")
        if errs:
            return errs
        pairs = self.claim_pairs(c)
        if not pairs:
            errs.append(f"{path}: no pairs: give `pairs:`, or `tables:` naming tables or figures with pairs")
        for i, agent in enumerate(c.agents or []):
            for p in pairs:
                errs += need(f"{path}.agents.{i}", agent, self.pairs[p].agents, f"agent of pair {p!r}")
        eval_metric = c.metric == "avg" or c.metric in self.benchmarks
        if not eval_metric and c.metric not in CLAIM_METRICS:
            known = ", ".join([*CLAIM_METRICS, *self.benchmarks])
            errs.append(f"{path}.metric: {c.metric!r} is not a benchmark or a claim metric; known: {known}")
        setting = self.claim_eval(c)
        if eval_metric:
            if setting is None:
                errs.append(
                    f"{path}.eval: metric {c.metric!r} needs an eval setting (`eval:`, or `tables:` "
                    "naming a table with one)"
                )
            elif setting not in self.eval_settings:
                errs += need(f"{path}.eval", setting, self.eval_settings, "eval setting")
            elif c.metric != "avg":
                errs += need(
                    f"{path}.metric",
                    c.metric,
                    self.benchmarks_of(setting),
                    f"benchmark of eval setting {setting!r}",
                )
        sides = [m for m in (c.a, c.b) if m is not None]
        if c.metric in ("s_homo", "s_hete") and not self.registry_method(c.a).cross_rows:
            errs.append(f"{path}.a: {c.a!r} trains on no peer rows, so it has no {c.metric}")
        if not eval_metric and "base" in sides:
            errs.append(f"{path}: 'base' (the untrained model) has evaluations only, not {c.metric!r}")
        if c.metric == "val_last_third" and self.val_data is None:
            errs.append(f"{path}.metric: 'val_last_third' needs in-training validation (`val_data:`)")
        if c.metric == "wall_time" and (c.agents or c.average):
            errs.append(f"{path}: wall time is one number per pair and seed: drop `agents:` / `average:`")
        return errs

    def claim_pairs(self, c: Claim) -> list[str]:
        """A claim's pairs: its own, else those of the tables it names (in order, each once), so that a pair
        added to such a table brings the claim with it."""
        if c.pairs:
            return list(c.pairs)
        out: dict[str, None] = {}
        for name in c.tables:
            t = self.tables.get(name) or self.figures[name]
            out.update(dict.fromkeys(t.pair_refs().values()))
        return list(out)

    def claim_eval(self, c: Claim) -> str | None:
        """A claim's eval setting: its own, else that of the first table it names that has one."""
        if c.eval:
            return c.eval
        views = [self.tables.get(n) or self.figures[n] for n in c.tables]
        return next((refs[0] for v in views if (refs := v.eval_refs()) is not None), None)
