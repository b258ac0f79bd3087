"""Every measured figure is written once, in docs/measurements.yaml: docs/performance.md's cost table and its
marked figures are rendered from it, and no other page restates a config's, the test suite's or CI's time or
size (they link to the table instead)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PAGE = ROOT / "docs" / "performance.md"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cost_table():
    return _script("cost_table")


def test_every_measurement_says_what_how_where_and_when():
    data = _cost_table().load()
    shipped = {p.name for p in (ROOT / "config").glob("*.yaml")}
    assert set(data["configs"]) == shipped, "a row of the cost table per shipped config"
    for m in data["measurements"]:
        assert {"id", "config", "quantity", "value", "command", "machine", "date"} <= set(m), m
        assert m["config"] in data["configs"] or m["config"] in ("tests", ".ci/run"), m
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(m["date"])), m


def test_the_cost_table_and_the_marked_figures_are_rendered_from_the_data_file():
    ct = _cost_table()
    text = PAGE.read_text()
    assert ct.render(text, ct.load()) == text, (
        "docs/performance.md differs from docs/measurements.yaml: edit the data file, then run "
        "`python scripts/cost_table.py --render`"
    )
    assert len(ct.FIGURE.findall(text)) >= 20  # the CI section's and the default's figures are marked
    # Markdown reads a line opening with a comment as an HTML block, which breaks the paragraph in two
    assert not re.findall(r"^<!-- m:.*", text, re.M), "a marked figure opens a line: join it up"


def test_a_marked_figure_the_data_file_lacks_is_named(tmp_path):
    ct = _cost_table()
    text = PAGE.read_text() + "\n<!-- m:no.such-figure -->1 min<!-- /m -->\n"
    with pytest.raises(ValueError, match=r"no\.such-figure"):
        ct.render(text, ct.load())


def test_record_writes_a_runs_figures_into_the_data_file(tmp_path):
    ct = _cost_table()
    data = tmp_path / "measurements.yaml"
    data.write_text(ct.DATA.read_text())
    folder = tmp_path / "rehearsal"
    (folder / "benchmarks").mkdir(parents=True)
    head = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    (folder / "benchmarks" / "a.tsv").write_text(head + "100.0\t0:01:40\t900\t1\t1\t2500\t0\t0\t0\t1\n")
    assert ct.record(folder, "rehearsal.yaml", "68 min 13 s", path=data) == [
        "rehearsal.jobs", "rehearsal.memory", "rehearsal.disk", "rehearsal.wall"]  # fmt: skip
    after = ct.load(data)
    assert data.read_text().startswith("# Every measured figure")  # the comments above the data stay
    assert not list(tmp_path.glob("*.tmp"))
    entry = {m["id"]: m for m in after["measurements"]}
    assert entry["rehearsal.memory"]["value"] == "2.5 GB" and entry["rehearsal.jobs"]["value"] == "1"
    assert [m["id"] for m in after["measurements"]].count("rehearsal.wall") == 1  # replaced, not added
    row = next(line for line in ct.cost_table(after).splitlines() if line.startswith("| `rehearsal.yaml`"))
    assert "1 jobs | 68 min 13 s | 2.5 GB | 0.0 GB |" in row, row
    with pytest.raises(ValueError, match="not a row"):
        ct.record(folder, "nonesuch.yaml", None, path=data)


# a duration in minutes or hours ("8 min", "10 min 38 s", "about 9 minutes", "1 h 55 min", "≈ 10 min") or a
# size ("14.6 GB"); a GPU's own size ("one 80 GB GPU", "8 GPUs (80 GB each)") and the RAM a machine needs are
# hardware, not a measurement
DURATION = re.compile(r"\b\d+(?:[.,]\d+)?(?:–\d+)?\s?(?:min(?:utes?)?|h|hours?)\b")
SIZE = re.compile(r"\b\d+(?:\.\d+)?(?:–\d+(?:\.\d+)?)?\s?(?:GB|GiB|TB)\b(?! GPU| each\)| of (?:host )?RAM)")
CONFIGS = "|".join(re.escape(p.stem) for p in sorted((ROOT / "config").glob("*.yaml")))
NAMES = re.compile(
    rf"(?<![\w-])(?:{CONFIGS})\.yaml\b|\bCI\b|\btest suite\b|\bthe suite\b|\bpytest\b"
    r"|\b(?:default|first|test) command\b"
)
GENERATED = re.compile(
    r"<!-- measurements:begin [\w-]+ -->.*?<!-- measurements:end -->|<!-- m:[^>]*-->.*?<!-- /m -->", re.S
)


def _sentences(text: str) -> list[str]:
    """A page's sentences: table rows, code lines and list items each on their own, prose split at its full
    stops."""
    out, paragraph, code = [], [], False

    def flush():
        if paragraph:
            out.extend(re.split(r"(?<=[.!?])\s+(?=[A-Z*`(\[])", " ".join(paragraph)))
            paragraph.clear()

    for line in text.splitlines():
        if line.startswith("```"):
            flush()
            code = not code
        elif code or line.startswith("|") or line.startswith("#"):
            flush()
            out.append(line)
        elif not line.strip() or re.match(r"\s*(?:[-*]|\d+\.) ", line):
            flush()
            paragraph.append(line)
        else:
            paragraph.append(line)
    flush()
    return out


def restated(text: str) -> list[str]:
    """The sentences of a page that name a shipped config, the test suite or CI and state a duration or a size
    outside the figures rendered from docs/measurements.yaml."""
    return [s.strip() for s in _sentences(GENERATED.sub("", text))
            if NAMES.search(s) and (DURATION.search(s) or SIZE.search(s))]  # fmt: skip


def test_the_restatement_check_finds_a_restated_figure():
    assert restated("On 2 cores `config/real.yaml` takes about 21 minutes. The rest.") == [
        "On 2 cores `config/real.yaml` takes about 21 minutes."]  # fmt: skip
    assert restated("CI's size takes ≈ 10 min.\n\nA toy job under 1 GB.") == ["CI's size takes ≈ 10 min."]
    assert restated("| `rehearsal-real.yaml` | 12.6 GB PSS |")
    assert restated("```\nsnakemake --configfile config/real-claims-state.yaml   # 82 min\n```")
    assert not restated("`config/one-gpu.yaml` fits one 80 GB GPU ([costs](performance.md)).")
    assert not restated("CI runs it: <!-- m:ci.total -->63 min<!-- /m -->.")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_links_to_the_cost_table_instead_of_restating_a_figure(page):
    text = page.read_text()
    if page != PAGE:
        assert not GENERATED.search(text), "rendered figures live in docs/performance.md; link to it"
    found = restated(text)
    assert not found, (
        f"{page.relative_to(ROOT)} states a measured time or size of a config, the suite or CI: put the "
        "figure in docs/measurements.yaml (python scripts/cost_table.py --record or by hand, with its "
        "machine and date) and link to docs/performance.md#what-each-config-costs instead:\n"
        + "\n".join(found)
    )


def test_disk_peak_sees_what_a_run_wrote_and_removed(tmp_path, capsys):
    """scripts/disk_peak.py: a file written then removed while the command runs is the peak, though the
    folder ends without it (a run's checkpoints that retention released); a hard link counts once."""
    disk_peak = _script("disk_peak")
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "kept").write_bytes(b"k" * 1000)
    (folder / "kept-link").hardlink_to(folder / "kept")
    ckpt = folder / "ckpt"
    run = f"import pathlib, time; p = pathlib.Path({str(ckpt)!r}); p.write_bytes(bytes(200_000)); "
    run += "time.sleep(1.0); p.unlink()"
    log = tmp_path / "disk.tsv"
    argv = [str(folder), "--every", "0.1", "--log", str(log), "--", sys.executable, "-c", run]
    assert disk_peak.main(argv) == 0
    assert "final 0.00 GB" in capsys.readouterr().out
    sizes = [int(line.split("\t")[1]) for line in log.read_text().splitlines()]
    assert max(sizes) == 201_000 and sizes[-1] == 1000  # the removed file seen, then gone; the link once
    assert disk_peak.main([str(folder), "--", sys.executable, "-c", "raise SystemExit(3)"]) == 3
