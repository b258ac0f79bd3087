"""Every shell command the pages show works as written: each line of a ```bash/```sh/```shell/```console
block of README.md and docs/**/*.md is collected and checked, never executed.

A small collector, not pytest-markdown-docs, sybil or mktestdocs: those *run* the blocks, which here would
train models, submit SLURM jobs and install GPU wheels. The blocks are found with markdown-it-py (in every
lock already, through rich), each line (``\\`` continuations joined, ``$ `` prompts of console blocks
only) is shlex-split into simple commands (at ``&&``, ``||``, ``;``, ``|``), leading ``NAME=value``
assignments are the command's environment and a bare assignment (``R=results/x``) is expanded in the block's
later lines. Then, by program:

- ``snakemake`` (also ``.venv/bin/snakemake``): parsed by Snakemake's own argument parser; each config file
  must exist; then a dry run (``-n``) from the repository root with ``--directory`` a temporary folder (the
  checkout's tracked folders linked in, results/ empty as in a clone), so each config parses and each target
  has a job. A dry run with a SLURM profile (``snakemake -n --workflow-profile profiles/slurm``) plans and
  submits nothing: it is dry-run here without the profile. Commands with the same config files are one dry
  run of all their targets (option-only differences such as ``-c2`` or ``--report`` are dropped), the
  distinct ones in two processes that import Snakemake once each (about 25 s in all on 2 busy cores).
- ``hacpo`` (also ``.venv/bin/hacpo``, ``python -m hacpo``): parsed by ``hacpo.cli.build_parser()`` (parse
  only). Each relative path it names (an argument with a ``/`` or a file suffix; ``file.yaml:entry`` is the
  file) must exist in the checkout or be produced: a path under results/, or at or under a path that an
  earlier command on the same page named with ``--out``, ``--manifest`` or ``--cache``. Absolute and ``~``
  paths are the reader's own and are not checked.
- any other program (pip, bash, python scripts, pytest, tensorboard, mkdocs, tmux, cd, export, ...): each
  repository path it names (config/, scripts/, tests/, ...; results/ counts as produced) exists, a ``bash``
  script is a bash script, and a pytest run of named tests sets every ``HACPO_*_DIR`` those tests read (the
  folder of outputs they check; without it they skip).

A command that cannot run here (a SLURM submission or profile, a GPU install, ``nvidia-smi``, CUDA) sits in
a block marked in the page source, on the last line before the fence that is not blank, with an HTML
comment that mkdocs does not render: ``<!-- cmd: parse-only (needs a SLURM cluster) -->``. Such a block is
only parsed (the split, Snakemake's or hacpo's argument parse, each config file present); an unmarked one
fails.

One test collects and checks them all, prints ``checked N commands, parsed-only M`` and fails with the list
of what is wrong (page:line, the command, the problem)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELLS = {"bash", "sh", "shell", "console"}
MARK = re.compile(r"<!--\s*cmd:\s*parse-only\s*\(([^)]+)\)\s*-->")
ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SEPARATORS = {"&&", "||", ";", "|", "&"}
WRAPPERS = {"sudo", "nice", "time", "exec"}
OUT_FLAGS = {"--out", "--manifest", "--cache"}
TOP = ("config", "docs", "hacpo", "scripts", "tests", "benchmarks", "profiles", "workflow", "envs", ".ci")
SUFFIXES = (".yaml", ".yml", ".json", ".jsonl", ".gz", ".py", ".sh", ".md", ".tsv", ".csv")


@dataclass
class Command:
    page: Path
    line: int
    argv: list[str]
    env: dict[str, str]
    parse_only: str | None  # the marker's reason
    where: str = field(init=False)

    def __post_init__(self):
        self.where = f"{self.page.relative_to(ROOT)}:{self.line}"

    def __str__(self):
        return " ".join(shlex.quote(a) for a in self.argv)


def _logical_lines(content: str, console: bool, first: int):
    """(line number, text) of each command line of a block: continuations joined, console prompts only."""
    pending, start = "", None
    for i, raw in enumerate(content.splitlines()):
        if console and not pending:
            if not raw.startswith("$ "):
                continue
            raw = raw[2:]
        start = first + i if not pending else start
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        yield start, pending + raw
        pending = ""


def _split(text: str) -> list[list[str]]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    simple, current = [], []
    for token in lexer:
        if token in SEPARATORS:
            simple.append(current)
            current = []
        else:
            current.append(token)
    return [c for c in [*simple, current] if c]


def collect() -> list[Command]:
    commands = []
    md = MarkdownIt("commonmark")
    for page in PAGES:
        text = page.read_text()
        lines = text.splitlines()
        for tok in md.parse(text):
            lang = tok.info.split()[0] if tok.info.split() else ""
            if tok.type != "fence" or lang not in SHELLS:
                continue
            fence = tok.map[0]
            above = [line for line in lines[:fence] if line.strip()][-1:]
            mark = MARK.search(above[0]) if above else None
            variables: dict[str, str] = {}
            for number, line in _logical_lines(tok.content, lang == "console", fence + 2):
                for name, value in variables.items():
                    line = re.sub(rf"\$\{{{name}\}}|\${name}\b", value, line)
                for words in _split(line):
                    env = {}
                    while words and ASSIGN.match(words[0]):
                        name, _, value = words.pop(0).partition("=")
                        env[name] = value
                    if not words:
                        variables.update(env)
                        continue
                    while words and words[0] in WRAPPERS:
                        words.pop(0)
                    if words and words[0] == "timeout":  # timeout [-k N] DURATION command...
                        words = words[4:] if words[1] == "-k" else words[2:]
                    commands.append(Command(page, number, words, env, mark.group(1) if mark else None))
    return commands


def _program(argv: list[str]) -> tuple[str, list[str]]:
    """``("snakemake" | "hacpo" | "python-m <module>" | "python" | name, its arguments)``."""
    name = argv[0].rsplit("/", 1)[-1] if argv[0].startswith((".venv", "./.venv")) else argv[0]
    if re.fullmatch(r"python3?", name) and len(argv) > 2 and argv[1] == "-m":
        module = argv[2]
        if module in ("hacpo", "snakemake"):
            return module, argv[3:]
        return f"python-m {module}", argv[3:]
    return name, argv[1:]


def needs(cmd: Command) -> str | None:
    """What this command needs that a checkout on a CPU machine lacks, or None."""
    prog, args = _program(cmd.argv)
    dry = prog == "snakemake" and {"-n", "--dry-run", "--dryrun"} & set(args)  # a plan, no submission
    profiles = [
        args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--executor", "--profile", "--workflow-profile")
    ]
    if prog in ("sbatch", "srun", "salloc") or not dry and any("slurm" in p for p in profiles):
        return "a SLURM cluster"
    if prog == "nvidia-smi" or "gpu" in cmd.env.get("EXTRAS", "").split(",") or "cuda" in cmd.env.values():
        return "a GPU"
    if prog in ("curl", "wget") or cmd.argv[:2] == ["git", "clone"]:
        return "the network"
    return None


def _is_path(arg: str) -> bool:
    return not arg.startswith(("-", "/", "~", "$", "{", "http")) and ("/" in arg or arg.endswith(SUFFIXES))


def _file(arg: str) -> str:
    """``config/agents/toy.yaml:small`` → the file; ``tests/x.py::test`` → the file."""
    return re.sub(r"(\.ya?ml|\.py):.*$", r"\1", arg)


def _parse(parser, args: list[str]) -> tuple[object | None, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return parser.parse_args(args), ""
        except SystemExit:
            said = err.getvalue().strip().splitlines()
            return None, said[-1] if said else "does not parse"


def _repo_paths(args: list[str]) -> list[str]:
    return [_file(a) for a in args if a.split("/", 1)[0] in TOP and "/" in a]


def _hacpo_paths(args: list[str], produced: set[str]) -> list[str]:
    """The paths a hacpo command reads that are neither in the checkout nor produced; records its outputs."""
    missing = []
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if eq and flag.startswith("--"):
            prev, arg = flag, value
        else:
            prev = args[i - 1] if i else ""
        if not _is_path(arg):
            continue
        path = _file(arg).rstrip("/")
        if prev in OUT_FLAGS:
            produced.add(path)
        elif not ((ROOT / path).exists() or path.startswith("results/")
                  or any(path == p or path.startswith(p + "/") for p in produced)):  # fmt: skip
            missing.append(path)
    return missing


def _env_dirs(paths: list[str]) -> set[str]:
    """The ``HACPO_*_DIR`` variables the named tests read."""
    found = set()
    for p in paths:
        files = (ROOT / p).rglob("*.py") if (ROOT / p).is_dir() else [ROOT / p]
        for f in files:
            if f.is_file():
                found |= set(re.findall(r"environ(?:\.get)?\(?\[?\"(HACPO_\w*_DIR)\"", f.read_text()))
    return found


def check(commands: list[Command]) -> tuple[list[str], dict[tuple, list[Command]], int]:
    """Problems found without running anything; the Snakemake dry runs to make; how many are parse-only."""
    from snakemake.cli import get_argument_parser

    from hacpo.cli import build_parser

    problems, groups, parse_only = [], {}, 0
    produced: dict[Path, set[str]] = {}
    for cmd in commands:
        bad = []
        prog, args = _program(cmd.argv)
        need = needs(cmd)
        if need and not cmd.parse_only:
            bad.append(f"needs {need}: mark its block <!-- cmd: parse-only (needs {need}) -->")
        made = produced.setdefault(cmd.page, set())
        if prog == "snakemake":
            parsed, err = _parse(get_argument_parser(), args)
            if parsed is None:
                bad.append(f"snakemake's parser: {err}")
            else:
                configs = [str(c) for c in parsed.configfile or []]
                bad += [f"config file {c} does not exist" for c in configs if not (ROOT / c).is_file()]
                if not bad and not cmd.parse_only:  # config/config.yaml: the Snakefile's default
                    groups.setdefault(tuple(c for c in configs if c != "config/config.yaml"), []).append(cmd)
        elif prog == "hacpo":
            parsed, err = _parse(build_parser(), args)
            if parsed is None:
                bad.append(f"hacpo's parser: {err}")
            elif not cmd.parse_only:
                bad += [
                    f"{p} is not in a clone nor made before on the page" for p in _hacpo_paths(args, made)
                ]
        else:
            bad += [f"{p} does not exist" for p in _repo_paths(args) if not (ROOT / p).exists()]
            module = prog.removeprefix("python-m ")
            if module.startswith("hacpo.") and not any(
                (ROOT / module.replace(".", "/")).with_suffix(s).exists() for s in (".py", "")
            ):
                bad.append(f"no module {module}")
            if prog == "bash" and args and (ROOT / args[0]).is_file():
                head = (ROOT / args[0]).read_text().splitlines()[:1]
                if not args[0].endswith(".sh") and not (head and "bash" in head[0]):
                    bad.append(f"{args[0]} is not a bash script")
            if prog in ("python-m pytest", "pytest") and not cmd.parse_only:
                unset = _env_dirs(_repo_paths(args)) - set(cmd.env)
                bad += [
                    f"the tests read {v}: set it, or their checks of its outputs skip" for v in sorted(unset)
                ]
        parse_only += bool(cmd.parse_only)
        problems += [f"{cmd.where}: `{cmd}`: {b}" for b in bad]
    return problems, groups, parse_only


def _workdir(tmp: Path) -> Path:
    """A working folder holding the checkout's tracked folders and files (linked), results/ left empty."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    tmp.mkdir(parents=True)
    for top in sorted({line.split("/", 1)[0] for line in tracked.stdout.splitlines()} - {"results"}):
        if (ROOT / top).exists():
            (tmp / top).symlink_to(ROOT / top)
    return tmp


# One process per core imports Snakemake and hacpo once (4 s of the 5 s a dry run takes) and dry-runs its
# share, each run framed in its output (stdout and stderr together, unbuffered): a failure comes with its log.
DRY_RUNS = """
import json, os, sys
from snakemake.cli import args_to_api, parse_args
for i, argv in enumerate(json.loads(sys.argv[1])):
    os.chdir(sys.argv[2])
    print(f"@@@ start {i}", flush=True)
    try:
        ok = args_to_api(parse_args(argv)[1], parse_args(argv)[0])
    except SystemExit as e:
        ok = e.code == 0
    except Exception as e:
        print(repr(e))
        ok = False
    print(f"@@@ done {i} {'ok' if ok else 'failed'}", flush=True)
"""


def _dry_run_args(configs: tuple, members: list[Command], work: Path) -> list[str]:
    from snakemake.cli import get_argument_parser

    targets = sorted(
        {t for c in members for t in get_argument_parser().parse_args(_program(c.argv)[1]).targets}
    )
    configs = [str(ROOT / c) for c in configs]
    return ["-n", "--quiet", "rules", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(work),
            *targets, *(["--configfile", *configs] if configs else [])]  # fmt: skip


def dry_runs(runs: list[list[str]]) -> list[str | None]:
    """Each run's log if it failed, else None."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    args = [sys.executable, "-u", "-c", DRY_RUNS, json.dumps(runs), str(ROOT)]
    out = subprocess.run(
        args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, env=env
    )
    logs = re.split(r"^@@@ start \d+$", out.stdout, flags=re.M)[1:]
    result = []
    for i in range(len(runs)):
        log = logs[i] if i < len(logs) else out.stdout
        result.append(None if f"@@@ done {i} ok" in log else log.split("@@@ done")[0])
    return result


def test_every_shell_command_of_the_pages_parses_and_its_files_exist(capsys):
    commands = collect()
    assert len(commands) > 40, "the collector finds the pages' commands"
    problems, groups, parse_only = check(commands)
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(2) as pool:
        items = [*groups.items()]
        runs = [_dry_run_args(k, v, _workdir(Path(tmp) / str(i))) for i, (k, v) in enumerate(items)]
        logs = [log for share in pool.map(dry_runs, [runs[0::2], runs[1::2]]) for log in share]
        for (configs, members), log in zip(items[0::2] + items[1::2], logs, strict=True):
            if log is not None:
                lines = [x for x in log.strip().splitlines() if not x.startswith("Using workflow specific")]
                first = next((i for i, x in enumerate(lines) if "Error" in x or "Exception" in x), -8)
                tail = "\n    ".join(lines[first:][:10])
                names = ", ".join(f"{c.where} `{c}`" for c in members)
                problems.append(
                    f"{names}: the dry run with {configs or 'the default config'} fails:\n    {tail}"
                )
    with capsys.disabled():
        print(f"\nchecked {len(commands) - parse_only} commands, parsed-only {parse_only} "
              f"({len(groups)} Snakemake dry runs)")  # fmt: skip
    assert not problems, "doc commands that fail as written:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "block, problem",
    [
        ("snakemake -c2 --configfile config/config.yaml results/x.json", "config file results/x.json"),
        ("hacpo train config/runs/nope.yaml", "config/runs/nope.yaml is not in a clone"),
        ("hacpo trian config/config.yaml", "hacpo's parser"),
        (
            "snakemake --workflow-profile profiles/slurm --configfile config/paper.yaml",
            "needs a SLURM cluster",
        ),
        ("EXTRAS=dev,gpu bash scripts/setup_env.sh", "needs a GPU"),
        ("bash scripts/nope.sh", "scripts/nope.sh does not exist"),
        ("hacpo unpack-results x.tar.gz results/b", "x.tar.gz is not in a clone"),
        ("python -m hacpo.eval.nope results/x", "no module hacpo.eval.nope"),
        (".venv-rehearsal/bin/python -m pytest -q tests/openrlhf", "HACPO_REHEARSAL_DIR"),
    ],
)
def test_the_checker_catches(tmp_path, block, problem):
    page = ROOT / "docs" / "x.md"
    problems, _, _ = check([Command(page, 1, argv, env, None) for argv, env in _envs(block)])
    assert any(problem in p for p in problems), problems


def test_a_marked_block_is_parse_only_and_outputs_count_as_made():
    page = ROOT / "docs" / "x.md"
    cmds = [Command(page, 1, ["hacpo", "pack-results", "results/a", "--out", "a.tar.gz"], {}, None),
            Command(page, 2, ["hacpo", "unpack-results", "a.tar.gz", "results/b"], {}, None),
            Command(page, 3, ["sbatch", "x.sh"], {}, "needs a SLURM cluster")]  # fmt: skip
    problems, groups, parse_only = check(cmds)
    assert (problems, groups, parse_only) == ([], {}, 1)


def _envs(line: str):
    for words in _split(line):
        env = {}
        while ASSIGN.match(words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        yield words, env
