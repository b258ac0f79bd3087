"""The commands of the README and the documentation work as typed: every ``hacpo`` line parses with the real
command-line parser, every repository file a command names exists, and the walk-through's steps fit together
(the run config it trains is the one it shows, and the checkpoint it evaluates is the one that run writes)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from hacpo.cli import build_parser
from hacpo.config import load_train_config

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PAGES = {p: p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]}
WALKTHROUGH = (ROOT / "docs" / "guide" / "python.md").read_text()
REPO_DIRS = ("config/", "tests/", "profiles/", "scripts/", "workflow/", "benchmarks/")


def commands() -> list[list[str]]:
    """Each command of the README's and the documentation's bash blocks as argv (comments dropped, ``&&``
    chains split)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", "\n".join(PAGES.values()), re.S):
        for line in block.replace("\\\n", " ").splitlines():  # a continued line is one command
            argv: list[str] = []
            for token in [*shlex.split(line, comments=True), "&&"]:
                if token != "&&":
                    argv.append(token)
                    continue
                while argv and "=" in argv[0] and not argv[0].startswith("-"):  # VAR=value prefixes
                    argv = argv[1:]
                if argv:
                    out.append(argv)
                argv = []
    return out


COMMANDS = commands()


def test_the_readme_has_its_two_commands_and_the_docs_the_rest():
    programs = {Path(a[0]).name for a in COMMANDS}
    assert {"hacpo", "snakemake", "bash", "source"} <= programs
    assert sum(a[0] == "hacpo" for a in COMMANDS) >= 8
    two = re.findall(r"```bash\n(.*?)```", README, re.S)[:2]
    setup = "bash scripts/setup_env.sh && "
    assert two == [
        setup + ".venv/bin/snakemake --report results/config/report.html --report-after-run\n",
        setup + ".venv/bin/python -m pytest -q\n",
    ]
    assert len(README.splitlines()) <= 150  # the front door: the depth is in docs/


@pytest.mark.parametrize("argv", [a for a in COMMANDS if a[0] == "hacpo"], ids=lambda a: " ".join(a[:2]))
def test_hacpo_commands_parse(argv):
    try:
        build_parser().parse_args(argv[1:])
    except SystemExit as err:
        pytest.fail(f"`{' '.join(argv)}` is rejected by hacpo's parser (exit {err.code})")


def test_named_repository_files_exist():
    for argv in COMMANDS:
        for token in argv:
            path = token.split(":")[0]  # config/agents/toy.yaml:small names an entry of a file
            if path.startswith(REPO_DIRS):
                assert (ROOT / path).exists(), f"`{' '.join(argv)}` names {path}, which does not exist"
    for name in re.findall(r"config/agents/toy\.yaml:(\w+)", "\n".join(PAGES.values())):
        assert name in yaml.safe_load((ROOT / "config/agents/toy.yaml").read_text()), name


def test_walkthrough_run_config_is_the_one_shown_and_its_checkpoint_is_evaluated():
    shown = re.search(r"```yaml\n(.*?)```", WALKTHROUGH, re.S).group(1)
    shipped = ROOT / "config/runs/hacpo-small-big.yaml"
    assert yaml.safe_load(shown) == yaml.safe_load(shipped.read_text())
    cfg = load_train_config(str(shipped))
    (evaluated,) = [a[a.index("--checkpoint") + 1] for a in COMMANDS if a[:2] == ["hacpo", "eval"]]
    assert evaluated == f"{cfg.out_dir}/checkpoints/{cfg.agents[0].name}/step-{cfg.steps}"
    built = {a[a.index("--out") + 1] for a in COMMANDS if a[:2] == ["hacpo", "build-agent"]}
    assert {a.path for a in cfg.agents} <= built
    (data,) = [a[a.index("--out") + 1] for a in COMMANDS if a[:2] == ["hacpo", "data"]]
    assert Path(cfg.train_file).parent == Path(cfg.val_file).parent == Path(data)


def test_shipped_run_configs_validate():
    """Every run config under config/runs/ is a valid TrainConfig (its model paths may not exist here)."""
    shipped = sorted((ROOT / "config" / "runs").glob("*.yaml"))
    assert len(shipped) >= 2
    for path in shipped:
        load_train_config(str(path))


def test_the_guides_python_snippet_runs_on_real_tensors():
    """docs/guide/python.md's "the maths alone" block, run as written on a small joint step (2 prompts, 2
    agents, G 4; the learner's mini-batch: its 8 own rows and 8 cross rows of 5 tokens)."""
    import torch

    block = re.search(r"```python\n(.*?)```", WALKTHROUGH, re.S)
    assert block, "docs/guide/python.md lost its Python block"
    gen = torch.Generator().manual_seed(0)
    R = torch.randint(0, 2, (2, 2, 4), generator=gen).float()
    rows = 16
    given = {
        "rewards_a": R[:, 0], "rewards_b": R[:, 1], "R": R, "m": 0,
        "logp": (-torch.rand(rows, 5, generator=gen)).requires_grad_(), "mask": torch.ones(rows, 5),
        "old_mean_logp": -torch.rand(rows, generator=gen), "is_own": torch.arange(rows) < 8,
        "omega_rows": torch.full((rows,), 0.5),
    }  # fmt: skip
    code = block.group(1).replace("adv_rows", "adv.flatten()[:16]")  # the 2 × 2 × 4 joint advantages
    scope = dict(given)
    exec(code, scope)  # noqa: S102 (the page's own code)
    assert scope["adv"].shape == (2, 2, 4)
    assert scope["loss"].dim() == 0 and torch.isfinite(scope["loss"])
    assert scope["logp"].grad is not None and isinstance(scope["logged"], dict)
    assert all(isinstance(v, float) for v in scope["logged"].values())
