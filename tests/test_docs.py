"""The front door (issue 46): the README's and the site's links and pictures resolve, every picture is a
workflow figure that `scripts/docs_figures.py` regenerates, and `mkdocs build --strict` passes (the `docs`
extra; CI requires it with ``HACPO_REQUIRE_DOCS=1``)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest
from required import missing

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"(!?)\[[^\]]*\]\(([^)\s]+)\)")


def _figures_script():
    spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "scripts" / "docs_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _links(page: Path) -> list[tuple[bool, str]]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # links in code blocks are code
    return [(bang == "!", target) for bang, target in LINK.findall(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_picture_resolves(page):
    for is_image, target in _links(page):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{page.relative_to(ROOT)} links {target}, which does not exist"
        if is_image:
            assert path.parent == ROOT / "docs" / "figures", f"{target}: pictures live in docs/figures/"


def test_every_picture_is_a_workflow_figure_and_embedded():
    listed = set(_figures_script().FIGURES)
    committed = {p.name for p in (ROOT / "docs" / "figures").glob("*.png")}
    embedded = {Path(t).name for page in PAGES for is_image, t in _links(page) if is_image}
    assert committed == listed, "docs/figures/ holds exactly the figures scripts/docs_figures.py regenerates"
    assert embedded == listed, f"embedded but not listed, or listed but not embedded: {embedded ^ listed}"
    for name in committed:  # a PNG, not a placeholder
        data = (ROOT / "docs" / "figures" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name


def test_docs_figures_names_what_is_missing(tmp_path, monkeypatch, capsys):
    script = _figures_script()
    monkeypatch.setattr(script, "ROOT", tmp_path)
    monkeypatch.setattr(script, "OUT", tmp_path / "docs" / "figures")
    src = tmp_path / "results" / "config" / "figures" / "figure2.png"
    src.parent.mkdir(parents=True)
    src.write_bytes(b"\x89PNG-figure2")
    assert script.main([]) == 1  # the others are missing
    assert (tmp_path / "docs" / "figures" / "figure2.png").read_bytes() == b"\x89PNG-figure2"
    err = capsys.readouterr().err
    assert "claims_full.png: results/config/figures/claims_full.png does not exist" in err
    assert "`snakemake claims_full`" in err and "  figure2.png" not in err


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The documentation site, built with ``mkdocs build --strict`` (a warning fails the build)."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        missing("HACPO_REQUIRE_DOCS", "the documentation site needs the docs extra",
                "EXTRAS=dev,docs bash scripts/setup_env.sh")  # fmt: skip
    where = tmp_path_factory.mktemp("site")
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(where)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return where


def test_mkdocs_build_strict(site):
    assert (site / "results" / "index.html").is_file()
    api = (site / "api" / "index.html").read_text()
    assert "joint_advantages" in api and "learner_rows" in api and "TrainConfig" in api


# what arithmatex (generic) leaves for the page's KaTeX to render
MATH = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)
KATEX_CHECK = """
const katex = require(process.argv[1]);
const items = JSON.parse(require("fs").readFileSync(0, "utf8"));
const bad = [];
for (const [page, tex, display] of items) {
  try { katex.renderToString(tex, {displayMode: display, throwOnError: true}); }
  catch (e) { bad.push(`${page}: ${e.message}`); }
}
console.log(JSON.stringify(bad));
"""


def test_the_site_reads_offline_and_katex_renders_every_equation(site):
    """No page loads a script, style or font from another site (the site is read offline), and every
    equation the pages carry is one that the KaTeX served with them renders (Node runs it)."""
    items = []
    for page in sorted(site.rglob("*.html")):
        html = page.read_text()
        remote = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?://[^"]+)"', html)
        assert not remote, (page, remote)
        for kind, body in MATH.findall(html):
            tex = unescape(body).strip()
            assert tex[:2] in ("\\(", "\\["), (page, tex[:40])
            items.append([str(page.relative_to(site)), tex[2:-2], kind == "div"])
    assert len(items) > 20  # the algorithm page's equations, at least
    node = shutil.which("node")
    if node is None:
        missing("HACPO_REQUIRE_DOCS", "node is not installed", "the equations' KaTeX check needs Node.js")
    katex = ROOT / "docs" / "javascripts" / "vendor" / "katex" / "katex.min.js"
    out = subprocess.run([node, "-e", KATEX_CHECK, str(katex)], input=json.dumps(items), capture_output=True,
                         text=True, timeout=120, check=True)  # fmt: skip
    assert json.loads(out.stdout) == []


def test_the_built_site_holds_no_history(site):
    """What the site renders from the code (the API reference's docstrings, the generated reference) speaks
    to users as the pages do: no issue numbers."""
    found = {str(p.relative_to(site)): HISTORY.findall(p.read_text()) for p in site.rglob("*.html")}
    assert not {k: v for k, v in found.items() if v}


def test_the_reference_pages_are_what_the_code_generates():
    """docs/reference/ is generated from the code (`python -m hacpo.reference --write docs/reference`): a
    config key, a flag or a default changed in the code and not regenerated fails here."""
    from hacpo import reference

    assert reference.main(["--check", str(ROOT / "docs" / "reference")]) == 0


def test_every_run_config_key_says_what_it_means_and_the_runtime_list_is_its_tags():
    from hacpo.config import RUNTIME_OPTIONS, TrainConfig

    page = (ROOT / "docs" / "reference" / "run-config.md").read_text()
    for name, field in TrainConfig.model_fields.items():
        assert field.description, f"{name}: no description (hacpo.config.option(help=...))"
        assert f"| `{name}` |" in page
    tagged = {n for n, f in TrainConfig.model_fields.items() if f.json_schema_extra.get("runtime")}
    assert set(RUNTIME_OPTIONS) == tagged and len(tagged) == 13
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    assert {r.split("`")[1] for r in rows if "| yes |" in r} == tagged


@pytest.mark.parametrize("page", sorted((ROOT / "docs" / "reference").glob("*.md")), ids=lambda p: p.name)
def test_every_key_and_flag_of_the_reference_says_what_it_means(page):
    """A config key or command-line flag whose meaning cell is empty: its model field needs a description
    (``Field(description=...)``) or its argparse argument a ``help=``."""
    empty = [line.split("`")[1] for line in page.read_text().splitlines()
             if line.startswith("| `") and line.rstrip().endswith("|  |")]  # fmt: skip
    assert not empty, f"{page.name}: no meaning for {empty}"


USER_PAGES = [ROOT / "README.md", ROOT / "config" / "README.md", ROOT / "profiles" / "README.md",
              ROOT / "results" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]  # fmt: skip
HISTORY = re.compile(r"\b[Ii]ssues? \d+|\bstops? \d+\b")
# places only the developers have (a clone has none)
PRIVATE = re.compile(
    r"developer machines?|beside the checkout|next to the repository|the build machine", re.I
)
HEX = re.compile(r"(?<![\w-])[0-9a-f]{7,40}(?![\w-])")
TOP = "config|docs|hacpo|scripts|tests|benchmarks|profiles|workflow|envs|spec|shared|notes|\\.ci"
REPO_PATH = re.compile(rf"(?<![\w./-])(?:\.\./)?(?:{TOP})/[^\s`)\]'\",;|]*")


# a page named in prose where a link belongs: "docs/x.md" outside code and outside a link's target
PLAIN_PAGE = re.compile(r"(?<![\[/`\w])(?<!\]\()docs/[\w/-]+\.md")


def _prose(text: str) -> str:
    """A Markdown page without its fenced code blocks and inline code spans."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))


@pytest.mark.parametrize("page", sorted((ROOT / "docs").rglob("*.md")), ids=lambda p: p.name)
def test_a_page_links_the_pages_it_names(page):
    """The site's pages link each other: a page named in plain text ("see docs/x.md") is a link."""
    assert not PLAIN_PAGE.findall(_prose(page.read_text()))


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_user_page_holds_no_history_and_names_only_files_a_clone_has(page):
    """User pages speak to users: no issue numbers, no "stop N", no commit hash of this repository (history
    lives in git); every repository path they name exists in a clone (no spec or notes it lacks); none is
    over 400 lines."""
    text = page.read_text()
    assert not HISTORY.findall(text), HISTORY.findall(text)
    assert not PRIVATE.findall(text), f"places a clone lacks: {PRIVATE.findall(text)}"
    commits = [h for h in set(HEX.findall(text))
               if subprocess.run(["git", "cat-file", "-e", f"{h}^{{commit}}"], cwd=ROOT,
                                 capture_output=True).returncode == 0]  # fmt: skip
    assert not commits, f"commit hashes in a user page: {commits}"
    missing = []
    for named in set(REPO_PATH.findall(text)):
        path, _, test = named.rstrip(".:").partition("::")  # tests/x.py::test_name: the test too
        path = path.split(":")[0].split("#")[0]  # toy.yaml:small, page.md#anchor: the file
        if any(c in path for c in "*<>{}") or path.endswith(("_", "-")) or path.rsplit("/", 1)[-1].isupper():
            continue  # a pattern or a placeholder, not a path
        where = ROOT / path if (ROOT / path).exists() else page.parent / path
        if not where.exists() or (test and f"def {test}(" not in where.read_text()):
            missing.append(named)
    assert not missing, f"paths a clone does not have: {sorted(missing)}"
    assert len(text.splitlines()) <= 400, "split the page: a reader finds nothing in a page this long"


# the developers' reference tree beside the checkout: spec/, notes/, shared/ (a clone has none of them)
CLONE_LACKS = re.compile(r"(?<![\w./-])(?:\.\./)*(?:spec|notes|shared)/[^\s`)\]'\",;|]*")


def _docstrings() -> list[tuple[str, str]]:
    """Every docstring of the package (module, class, function: what the API reference renders) and of the
    benchmarks (what their ``--help`` shows)."""
    found = []
    for path in sorted([*(ROOT / "hacpo").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                if text := ast.get_docstring(node):
                    found.append((f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)}", text))
    return found


def _config_comments() -> list[tuple[str, str]]:
    """Every comment of the shipped configs (``# ...`` at a line's start or after a space)."""
    found = []
    for path in sorted((ROOT / "config").rglob("*.yaml")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if comment := re.search(r"(?:^|\s)#(.*)$", line):
                found.append((f"{path.relative_to(ROOT)}:{number}", comment.group(1)))
    return found


def _code_comments() -> list[tuple[str, str]]:
    """Every ``#`` comment of the package, the workflow, the scripts and the benchmarks, and the scripts'
    docstrings (what their ``--help`` shows)."""
    found = []
    paths = [ROOT / "Snakefile", *(ROOT / "workflow").rglob("*.smk"), *(ROOT / "scripts").glob("*.sh")]
    paths += [p for d in ("hacpo", "scripts", "benchmarks") for p in (ROOT / d).rglob("*.py")]
    for path in sorted(paths):
        text = path.read_text()
        for number, line in enumerate(text.splitlines(), 1):
            if comment := re.search(r"(?:^|\s)#(?![!{'\"])(.*)$", line):
                found.append((f"{path.relative_to(ROOT)}:{number}", comment.group(1)))
        script = path.parent.name == "scripts" and path.suffix == ".py"
        if script and (doc := ast.get_docstring(ast.parse(text))):
            found.append((f"{path.relative_to(ROOT)}:1", doc))
    return found


def test_docstrings_and_code_comments_hold_no_issue_number():
    """Issue numbers are history (git holds it): a docstring, a config's or the code's comment keeps the sense
    of its sentence without them."""
    texts = _docstrings() + _config_comments() + _code_comments()
    assert len(texts) > 2000
    history = {where: found for where, text in texts if (found := re.findall(r"\b[Ii]ssues? \d+", text))}
    assert not history, f"issue numbers (say what the code does instead): {history}"


def test_docstrings_and_config_comments_name_only_files_a_clone_has():
    """The API reference renders the package's docstrings and users open the configs: like the pages, they
    name no file of the developers' own tree (spec/, notes/, shared/) nor place (a developer machine), and the
    comments no issue number.
    The maths is docs/algorithm.md, whose § marks the code cites."""
    texts = _docstrings() + _config_comments()
    assert len(texts) > 500
    found = {where: CLONE_LACKS.findall(text) + PRIVATE.findall(text) for where, text in texts}
    assert not {k: v for k, v in found.items() if v}, "files a clone lacks; name docs/ pages instead"
    history = {where: HISTORY.findall(text) for where, text in _config_comments()}
    assert not {k: v for k, v in history.items() if v}


def test_every_shipped_config_has_a_cost_and_a_reference_row():
    costs = (ROOT / "docs" / "performance.md").read_text()
    configs = (ROOT / "config" / "README.md").read_text()
    for path in sorted((ROOT / "config").glob("*.yaml")):
        assert f"| `{path.name}`" in costs, f"{path.name}: no row in docs/performance.md's cost table"
        assert f"`{path.name}`" in configs, f"{path.name}: not in config/README.md"


def test_the_cost_table_script_makes_a_row_from_snakemakes_benchmark_files(tmp_path):
    folder = tmp_path / "toy"
    bench = folder / "benchmarks" / "train"
    bench.mkdir(parents=True)
    head = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    (bench / "a.tsv").write_text(head + "100.0\t0:01:40\t900\t1\t1\t800\t0\t0\t0\t1\n")
    (bench / "b.tsv").write_text(head + "3500.0\t0:58:20\t2000\t1\t1\t1500\t0\t0\t0\t1\n")
    (folder / "runs" / "single" / "a" / "gspo" / "seed0").mkdir(parents=True)
    (folder / "runs" / "single" / "a" / "gspo" / "seed0" / "profile.json").write_text('{"peak_rss_mb": 4000}')
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "cost_table.py"), str(folder)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    row = out.splitlines()[-1]
    assert row.startswith("| `toy` | 2 | 1 h 0 min | 4.0 GB |"), row
    empty = subprocess.run([sys.executable, str(ROOT / "scripts" / "cost_table.py"), str(tmp_path)],
                           capture_output=True, text=True)  # fmt: skip
    assert empty.returncode == 2 and "no Snakemake benchmark files" in empty.stderr
