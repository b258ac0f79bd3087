"""Datasets of your own (hacpo.data.own): JSONL, Parquet and CSV with a field mapping, checked before any
job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from hacpo.data import own
from hacpo.data.synthetic import Problem, read_jsonl
from hacpo.pipeline import Pipeline

ROOT = Path(__file__).resolve().parents[1]
ROWS = [
    {"uid": "q1", "question": "Reach 10 with [2, 5]", "target": 10, "nums": [2, 5]},
    {"uid": "q2", "question": "Reach 7 with [3, 4]", "target": 7, "nums": [3, 4]},
]
FIELDS = {"problem": "question", "answer": "target", "id": "uid"}


def write(path: Path, rows: list[dict]) -> Path:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".parquet":
        pd.DataFrame(rows).to_parquet(path)
    else:
        pd.DataFrame(rows).to_csv(path, index=False)
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".csv"])
def test_each_format_normalises_to_the_records_every_engine_reads(tmp_path, suffix):
    if suffix == ".parquet":
        pytest.importorskip("pyarrow", reason="Parquet needs pyarrow (the dev and data extras)")
    rows = own.load(write(tmp_path / f"d{suffix}", ROWS), FIELDS, "mine", "datasets.mine")
    assert [(r["id"], r["problem"], r["answer"], r["family"]) for r in rows] == [
        ("q1", "Reach 10 with [2, 5]", "10", "mine"),
        ("q2", "Reach 7 with [3, 4]", "7", "mine"),
    ]
    nums = rows[0]["metadata"]["nums"]  # every field not mapped is kept (CSV keeps text)
    assert nums == ([2, 5] if suffix != ".csv" else "[2, 5]")
    problem = Problem.from_dict(rows[0])
    assert problem.metadata == rows[0]["metadata"] and problem.to_dict()["metadata"] == rows[0]["metadata"]


def test_without_an_id_field_ids_are_hashes_and_a_records_metadata_object_is_merged(tmp_path):
    path = write(tmp_path / "d.jsonl", [{"problem": "1+1", "answer": "2", "metadata": {"a": 1}, "b": 2}])
    (row,) = own.load(path, None, "mine", "datasets.mine")
    assert row["id"].startswith("mine-") and row["metadata"] == {"a": 1, "b": 2}


@pytest.mark.parametrize(
    ("rows", "fields", "message"),
    [
        ([], FIELDS, r"datasets\.mine: the file holds no records"),
        ([{"question": "x", "uid": "1"}], FIELDS, r"mine\.fields\.answer: record 0 has no 'target'"),
        ([{"q": "x", "target": 1, "uid": "1"}], FIELDS, r"fields\.problem: record 0 has no 'question'"),
        ([ROWS[0], {**ROWS[1], "uid": "q1"}], FIELDS, r"mine: records 0 and 1 have the same id 'q1'"),
        ([ROWS[0], ROWS[0]], {**FIELDS, "id": None}, r"the same problem text; map `fields.id`"),
        ([{"question": "x", "target": 1}], FIELDS, r"datasets\.mine\.fields\.id: record 0 has no 'uid'"),
    ],
)
def test_bad_records_are_named_with_their_key_path(tmp_path, rows, fields, message):
    with pytest.raises(own.DatasetError, match=message):
        own.load(write(tmp_path / "d.jsonl", rows), fields, "mine", "datasets.mine")


def test_bad_files_are_named(tmp_path):
    with pytest.raises(own.DatasetError, match=r"datasets\.mine: no file"):
        own.load(tmp_path / "missing.jsonl", None, "mine", "datasets.mine")
    with pytest.raises(own.DatasetError, match="unknown format"):
        own.load(tmp_path / "d.txt", None, "mine", "datasets.mine")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "x", "answer": 1}\n{not json\n')
    with pytest.raises(own.DatasetError, match=r"datasets\.mine: .*bad\.jsonl:2: not valid JSON"):
        own.load(bad, None, "mine", "datasets.mine")


def _ci_config(tmp_path, **dataset) -> dict:
    cfg = yaml.safe_load((ROOT / "config" / "ci.yaml").read_text())
    cfg["datasets"]["mine"] = dataset
    return cfg


def test_a_workflow_dataset_of_your_own_is_checked_before_any_job_and_written_by_hacpo_data(tmp_path):
    path = write(tmp_path / "d.jsonl", ROWS)
    pipe = Pipeline(_ci_config(tmp_path, local=str(path), fields=FIELDS, limit=1))
    pipe.check_own_datasets()
    assert pipe.dataset_inputs("mine") == [str(path)]  # an edit prepares it again
    out = tmp_path / "out" / "mine.jsonl"
    manifest = tmp_path / "out" / "mine.manifest.json"
    subprocess.run([sys.executable, "-m", "hacpo.cli", "data", "--name", "mine", "--spec",
                    pipe.dataset_params("mine"), "--out", str(out), "--manifest", str(manifest)],
                   check=True, cwd=ROOT)  # fmt: skip
    assert [r["id"] for r in read_jsonl(out)] == ["q1"]  # limit: the first record
    assert json.loads(manifest.read_text())["kind"] == "local"
    write(path, [ROWS[0], {**ROWS[1], "uid": "q1"}])
    with pytest.raises(ValueError, match=r"datasets\.mine: records 0 and 1 have the same id"):
        Pipeline(_ci_config(tmp_path, local=str(path), fields=FIELDS)).check_own_datasets()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"local": "d.jsonl", "registry": "gsm8k"}, "exactly one of"),
        ({"synthetic": {"families": ["add2"], "split": "train"}, "fields": FIELDS}, "`fields:` maps"),
        ({"local": "d.jsonl", "fields": {"question": "q"}}, "Extra inputs"),
        ({"local": "d.jsonl", "file": "x.jsonl"}, "`file:` only applies"),
        ({"hub": {"repo": "org/name", "revision": "main", "split": "test"}}, r"hub\.revision"),
        ({"hub": {"repo": "no-slash", "revision": "a" * 40}}, r"hub\.repo"),
    ],
)
def test_a_dataset_entry_is_checked(tmp_path, entry, message):
    with pytest.raises(ValueError, match=message):
        Pipeline(_ci_config(tmp_path, **entry))


REVISION = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """``datasets`` as ``hacpo.data.own`` calls it: ``load_dataset(repo, config, split=, revision=)``."""

    def __init__(self, rows):
        self.rows, self.calls = rows, []

    def load_dataset(self, repo, config, *, split, revision):
        self.calls.append((repo, config, split, revision))
        if revision != REVISION:
            raise FileNotFoundError(f"Revision {revision} not found")
        return list(self.rows)


def test_a_hub_dataset_of_your_own_is_read_at_its_commit_once_then_from_the_data_cache(tmp_path, monkeypatch):
    """``hub: {repo, revision, split, config}``: read with ``datasets.load_dataset`` at the pinned commit
    before any job, kept as JSONL in the data cache, normalised like a local file (metadata kept); offline,
    the cached copy is read, and without one the error names the key and where to put it. The Hub itself is
    not reachable here: ``datasets`` is replaced by a stand-in that checks the call."""
    hub = FakeHub(ROWS)
    monkeypatch.setitem(sys.modules, "datasets", hub)
    monkeypatch.setenv("HACPO_DATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    entry = {"repo": "org/countdown", "revision": REVISION, "split": "test", "config": "small"}
    pipe = Pipeline(_ci_config(tmp_path, hub=entry, fields=FIELDS))
    pipe.check_own_datasets()
    assert hub.calls == [("org/countdown", "small", "test", REVISION)]
    cached = tmp_path / "cache" / "own" / f"org__countdown@{REVISION}-small-test.jsonl"
    assert read_jsonl(cached) == ROWS and pipe.dataset_inputs("mine") == []
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # the cached copy serves offline, without a call
    rows, path = own.load_entry({"hub": entry, "fields": FIELDS}, "mine", "datasets.mine")
    assert path == cached and len(hub.calls) == 1
    got = [(r["id"], r["answer"], r["metadata"]["nums"]) for r in rows]
    assert got == [("q1", "10", [2, 5]), ("q2", "7", [3, 4])]
    assert json.loads(pipe.dataset_params("mine"))["hub"]["revision"] == REVISION  # a new commit reruns prep
    out, manifest = tmp_path / "out" / "mine.jsonl", tmp_path / "out" / "mine.manifest.json"
    subprocess.run([sys.executable, "-m", "hacpo.cli", "data", "--name", "mine", "--spec",
                    pipe.dataset_params("mine"), "--out", str(out), "--manifest", str(manifest)],
                   check=True, cwd=ROOT)  # fmt: skip  (the prepare_data job: offline, from the cache)
    assert read_jsonl(out) == rows and json.loads(manifest.read_text())["kind"] == "hub"
    missing = {**entry, "split": "train"}
    offline = r"datasets\.mine\.hub: org/countdown@0123456789ab \(train\) is not in the data cache "
    fix = r".*run `hacpo prefetch .* put its records at .*-small-train\.jsonl"
    with pytest.raises(own.DatasetError, match=offline + fix):
        own.load_entry({"hub": missing}, "mine", "datasets.mine")
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    other = {**entry, "revision": "f" * 40}
    with pytest.raises(ValueError, match=r"datasets\.mine\.hub: .* could not be read: FileNotFoundError"):
        Pipeline(_ci_config(tmp_path, hub=other, fields=FIELDS)).check_own_datasets()
