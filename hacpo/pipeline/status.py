"""``hacpo status``: where a workflow's runs stand while it runs, from their run directories only.

For every run a config asks for (or given run directories): its state (:mod:`hacpo.lifecycle`), step k of
N from ``metrics.jsonl``, the last validation accuracy of each agent, the wall time so far (its steps and
validations, resumes included; a complete run's profile) and the time left at its own mean step time; then
one line for the whole: runs complete, running and left, and the training time left. Runs not started are
estimated from complete runs of the same method (else of any). Nothing is locked or written, so it is safe
beside Snakemake, locally or on SLURM, on a partial results folder and on a config none of whose runs started.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from hacpo.lifecycle import moved_aside, run_inputs, standing
from hacpo.runio import Metric, MetricsLog, Validation

from .cli import add_configfile_argument

LEFT = ("planned", "running", "interrupted", "failed", "stale")  # states with training still to do
VERIFYING_NOTE = 0.5  # a run whose verifier takes this share of its step time says so


@dataclass
class RunStatus:
    run: str  # the run directory
    state: str
    why: str
    step: int
    steps: int | None
    val_acc: dict[str, float]  # each agent's last validation accuracy
    elapsed_s: float | None
    left_s: float | None
    moved_aside: int
    verifying: float | None = None  # share of the run's step time a custom verifier took

    @property
    def group(self) -> str:
        """kind/method of a workflow run directory (<results>/runs/<kind>/<group>/<method>/seed<seed>)."""
        parts = Path(self.run).parts
        return f"{parts[-4]}/{parts[-2]}" if len(parts) >= 4 else ""


def read_status(run_dir: str | Path, steps: int | None = None, config_hash: str | None = None,
                inputs: dict | None = None) -> RunStatus:  # fmt: skip
    """One run's status from its directory (a torn last log line is ignored, as a resume would)."""
    run_dir = Path(run_dir)
    now = standing(run_dir, config_hash, inputs)
    record = now.record
    if steps is None and record is not None:
        steps = record.config.get("steps")
    rows = MetricsLog(run_dir / "metrics.jsonl").read() if now.state != "stale" else []
    times = [float(r.get(Metric.STEP_S) or 0) + float(r.get(Metric.VALIDATE_S) or 0) for r in rows]
    val = {}
    for r in MetricsLog(run_dir / "validation.jsonl").read() if now.state != "stale" else []:
        val[r[Validation.AGENT]] = float(r[Validation.ACC])
    step = rows[-1][Metric.STEP] + 1 if rows else 0
    elapsed = sum(times) if rows else None
    if now.state == "complete" and record.profile:
        elapsed, step = float(record.profile.get("wall_s", elapsed or 0)), steps or step
    left = 0.0 if now.state == "complete" else None
    if left is None and rows and steps:
        left = max(steps - step, 0) * statistics.fmean(times)
    aside = len(moved_aside(run_dir))
    verifier_s = sum(float(r.get("verifier/seconds") or 0) for r in rows)
    verifying = verifier_s / sum(times) if rows and sum(times) > 0 else None
    return RunStatus(str(run_dir), now.state, now.why, step, steps, val, elapsed, left, aside, verifying)


def workflow_status(pipe) -> list[RunStatus]:
    """Every run of a workflow config (:attr:`hacpo.pipeline.Pipeline.runs`), against the spec and inputs
    the config asks for now: a run of another spec or other inputs is stale."""
    from hacpo.config import TrainConfig

    out, seen = [], {}
    for run in pipe.runs:
        cfg = TrainConfig.model_validate(pipe.train_config(run))
        inputs = None
        if (Path(run.dir) / "inputs.json").exists():  # only what a started run recorded is compared
            key = (cfg.train_file, cfg.val_file, *(a.path for a in cfg.agents))
            try:
                inputs = seen[key] if key in seen else seen.setdefault(key, run_inputs(cfg))
            except OSError:  # an input not built (yet): nothing to compare
                inputs = None
        out.append(read_status(run.dir, cfg.steps, cfg.config_hash(), inputs))
    return _estimate_planned(out)


def _estimate_planned(runs: list[RunStatus]) -> list[RunStatus]:
    """Time left of runs with no steps yet: the median wall time of complete runs of the same kind and method
    (else of any complete run); None where none finished."""
    done = [r for r in runs if r.state == "complete" and r.elapsed_s]
    for r in runs:
        if r.left_s is None and r.state in LEFT:
            like = [d.elapsed_s for d in done if d.group == r.group] or [d.elapsed_s for d in done]
            if like:
                r.left_s = statistics.median(like) * (1 - r.step / r.steps if r.steps else 1)
    return runs


def summary(runs: list[RunStatus]) -> dict:
    counts = {s: sum(r.state == s for r in runs) for s in ("complete", *LEFT)}
    known = [r.left_s for r in runs if r.state in LEFT and r.left_s is not None]
    return {
        "runs": len(runs),
        **counts,
        "left": sum(counts[s] for s in LEFT),
        "left_s": sum(known) if known else (0.0 if not any(r.state in LEFT for r in runs) else None),
        "left_s_unknown": sum(r.state in LEFT and r.left_s is None for r in runs),
    }


def _dur(s: float | None) -> str:
    if s is None:
        return "—"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def render(runs: list[RunStatus], tty: bool = False) -> str:
    """The table, the total line and (on a terminal) a bar of complete runs."""
    width = max([len(r.run) for r in runs] + [3])
    lines = [f"{'run':{width}s}  {'state':12s} {'step':>9s}  {'val acc':16s} {'elapsed':>8s} {'left':>8s}"]
    for r in runs:
        state = r.state + (f" ({r.why})" if r.why else "")
        state += f" +{r.moved_aside} aside" if r.moved_aside else ""
        if r.verifying is not None and r.verifying >= VERIFYING_NOTE:  # a slow verifier, not a slow model
            state += f" (verifying {r.verifying:.0%} of the time)"
        step = f"{r.step}/{r.steps if r.steps is not None else '?'}"
        acc = " ".join(f"{v:.3f}" for v in r.val_acc.values()) or "—"
        lines.append(f"{r.run:{width}s}  {state:12s} {step:>9s}  {acc:16s} {_dur(r.elapsed_s):>8s} "
                     f"{_dur(r.left_s):>8s}")  # fmt: skip
    t = summary(runs)
    parts = [f"{t[s]} {s}" for s in ("running", "interrupted", "failed", "stale", "planned") if t[s]]
    total = f"{t['runs']} runs: {t['complete']} complete, {t['left']} left" + (f" ({', '.join(parts)})"
                                                                                if parts else "")  # fmt: skip
    if t["left"]:
        unknown = f", {t['left_s_unknown']} runs not estimated" if t["left_s_unknown"] else ""
        total += f"; ≈ {_dur(t['left_s'])} of training left, one job at a time{unknown}"
    lines.append(total)
    if tty and t["runs"]:
        filled = round(40 * t["complete"] / t["runs"])
        lines.append(f"[{'#' * filled}{'.' * (40 - filled)}] {t['complete']}/{t['runs']} complete")
    return "\n".join(lines)


def cmd_status(args) -> int:
    """``hacpo status [RUN_DIR …] [--configfile F] [--json]``."""
    if args.run_dirs:
        runs = _estimate_planned([read_status(d) for d in args.run_dirs])
    else:
        from hacpo.pipeline import Pipeline

        runs = workflow_status(Pipeline.from_files(args.configfile))
    if args.json:
        print(json.dumps({"runs": [asdict(r) for r in runs], "total": summary(runs)}, indent=1))
    else:
        print(render(runs, tty=sys.stdout.isatty()))
    return 0


def add_cli(sub) -> None:
    s = sub.add_parser("status", help="where a workflow's runs stand: state, step k of N, time left")
    s.add_argument("run_dirs", nargs="*", help="run directories (default: every run of --configfile)")
    add_configfile_argument(s)
    s.add_argument("--json", action="store_true", help="one JSON object: every run and the total")
    s.set_defaults(func=cmd_status)
