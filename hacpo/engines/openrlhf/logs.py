"""OpenRLHF's logged scalars → the run-directory contract (``metrics.jsonl``, ``validation.jsonl``, profile).

OpenRLHF logs each step's status dict through its ``TensorboardLogger`` (tags ``train/<key>`` at its global
step, 1-based; ``eval/<key>`` for in-training evaluation). We read those event files, not its console: the
keys are typed there and a resumed run's repeated steps are told apart by file order (later files win, so a
step redone after a kill keeps its redone values).

Keys mapped to the local engine's names (``docs/design.md``), everything else kept as ``openrlhf/<key>``:

=================================  ==============================  =========================================
local engine                       OpenRLHF                        meaning
=================================  ==============================  =========================================
``<agent>/reward``                 ``rollout/reward_mean``         mean 0/1 reward = accuracy of the rollouts
``<agent>/response_tokens``        ``rollout/response_length_mean``
``<agent>/own_clip_frac``          ``ppo_clip_ratio``              clipped fraction (tokens, or sequences)
``<agent>/kl``                     ``kl``                          k3 KL to the reference (the loss term)
``<agent>/loss``                   ``policy_loss``
``time/generate_s``                ``timing/generation``           vLLM rollouts, reward included
``time/logprobs_s``                ``timing/make_experience``      old / reference log-probs, advantages
``time/update_s``                  ``timing/ppo_train``
``time/sync_s``                    ``timing/broadcast``            weights → vLLM
``time/step_s``                    ``timing/step_total``
=================================  ==============================  =========================================
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from hacpo.runio import Validation

AGENT_KEYS = {
    "rollout/reward_mean": "reward",
    "rollout/response_length_mean": "response_tokens",
    "rollout/truncated_rate": "truncated",
    "ppo_clip_ratio": "own_clip_frac",
    "kl": "kl",
    "policy_loss": "loss",
    "actor_grad_norm": "grad_norm",
    "actor_lr": "lr",
}
PHASES = {
    "timing/generation": "generate",
    "timing/make_experience": "logprobs",
    "timing/ppo_train": "update",
    "timing/broadcast": "sync",
}
NOT_PHASES = {"time/step_s", "time/tokens_per_s"}  # per-step totals and rates, not phases
VALIDATION_SOURCE = "validation"  # the datasource of the validation file: eval/eval_validation_pass1
VALIDATION_TAG = f"eval/eval_{VALIDATION_SOURCE}_pass1"


def read_scalars(tensorboard_dir: str | Path) -> dict[str, dict[int, float]]:
    """``tag → {step: value}`` from every event file below ``tensorboard_dir``; a step logged again (a
    resumed run redoing steps after its last checkpoint) keeps the value of the newest file."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    files = sorted(Path(tensorboard_dir).rglob("events.out.tfevents.*"), key=_event_file_order)
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for path in files:
        try:
            for event in EventFileLoader(str(path)).Load():
                for v in event.summary.value:
                    kind = v.WhichOneof("value")
                    if kind == "simple_value":
                        out[v.tag][int(event.step)] = float(v.simple_value)
                    elif kind == "tensor" and v.metadata.plugin_data.plugin_name == "scalars":
                        out[v.tag][int(event.step)] = float(tensor_util.make_ndarray(v.tensor))
        except Exception:  # noqa: BLE001 -- a file torn by a kill: keep what was read before the tear
            continue
    return dict(out)


def _event_file_order(path: Path) -> tuple[float, str]:
    """``events.out.tfevents.<unix time>.<host>...``: writing order, across restarts and directories."""
    parts = path.name.split(".")
    try:
        return float(parts[3]), str(path)
    except (IndexError, ValueError):
        return path.stat().st_mtime, str(path)


def metrics_rows(scalars: dict[str, dict[int, float]], agent: str) -> list[dict]:
    """One ``metrics.jsonl`` row per training step (0-based ``step``: OpenRLHF's global step − 1)."""
    by_step: dict[int, dict] = defaultdict(dict)
    for tag, series in scalars.items():
        if not tag.startswith("train/"):
            continue
        key = tag[len("train/") :]
        for global_step, value in series.items():
            row = by_step[global_step - 1]
            row[f"openrlhf/{key}"] = value
            if key in AGENT_KEYS:
                row[f"{agent}/{AGENT_KEYS[key]}"] = value
            elif key in PHASES:
                row[f"time/{PHASES[key]}_s"] = value
            elif key == "timing/step_total":
                row["time/step_s"] = value
    return [{"step": s, **by_step[s]} for s in sorted(by_step) if s >= 0]


def validation_rows(scalars: dict[str, dict[int, float]], agent: str, n: int) -> list[dict]:
    """``validation.jsonl`` rows (greedy pass@1 on the validation file after ``step`` steps)."""
    series = scalars.get(VALIDATION_TAG, {})
    return [Validation.row(s, agent, series[s], n) for s in sorted(series)]


def phase_totals(rows: list[dict]) -> dict[str, float]:
    """Seconds per phase over a run's steps (profile.json's ``phase_s``): every ``time/<phase>_s`` of the
    rows (OpenRLHF's four timings for single-agent runs; the joint controller's, retokenize included)."""
    total: dict[str, float] = defaultdict(float)
    for name in PHASES.values():
        total[name] = 0.0
    for row in rows:
        for key, value in row.items():
            if key.startswith("time/") and key.endswith("_s") and key not in NOT_PHASES:
                total[key[len("time/") : -len("_s")]] += value
    return dict(total)



_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RAY_PREFIX = re.compile(r"^\((?P<actor>[\w.:]+) pid=(?P<pid>\d+)(?:, ip=[\d.]+)?\)\s?")  # Ray's worker lines
_ERROR = re.compile(r"^(?:[\w.]+(?:Error|Exception|Exit|Interrupt)\b|ray\.exceptions\.)")


def failure_report(log: Path, rc: int, resumable_step: int, context_lines: int = 12) -> str:
    """Why an OpenRLHF program failed, from its log: the last Python error (Ray prefixes each worker's
    lines with ``(ActorName pid=N)``, which names the failing actor), the lines before it, the log's path,
    and where the rerun resumes."""
    raw = Path(log).read_text(errors="replace").splitlines() if Path(log).is_file() else []
    lines = [_ANSI.sub("", x).strip() for x in raw]
    error_at = next(
        (i for i in range(len(lines) - 1, -1, -1) if _ERROR.match(_RAY_PREFIX.sub("", lines[i]))), None
    )
    if error_at is None:
        where, error, excerpt = "the driver", f"exit status {rc}", lines[-context_lines:]
    else:
        prefix = _RAY_PREFIX.match(lines[error_at])
        where = f"Ray actor {prefix['actor']} (pid {prefix['pid']})" if prefix else "the driver"
        error = _RAY_PREFIX.sub("", lines[error_at])
        excerpt = lines[max(0, error_at - context_lines) : error_at + 1]
    body = "\n".join("    " + x for x in excerpt)
    resume = f"resumes from step {resumable_step}" if resumable_step else "starts from step 0"
    return (
        f"OpenRLHF failed in {where}: {error}\n{body}\n"
        f"full log: {log}; run.json is 'failed' and a rerun {resume} (its checkpoints are kept)"
    )
