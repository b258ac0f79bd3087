"""hacpo pack-results / unpack-results: a results folder without its weights, continued or pooled elsewhere
(the workflow end to end: tests/test_workflow.py, the CI config's sequential scorecard)."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from hacpo.pipeline import packs
from hacpo.provenance import machine

RUN = "runs/single/m/gspo/seed0"
IN_FLIGHT = "runs/single/m/gspo/seed1"
EVAL = "eval/main/single/m/gspo/seed0"


def _write(path: Path, text: str, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))


def _model(root: Path, weights: str = "weights", mtime: float = 1000.0) -> None:
    _write(root / "models/m/model.safetensors", weights, mtime)
    _write(root / "models/m/hacpo-model.json", "{}", mtime)


def _results(root: Path) -> Path:
    """A results folder as the workflow leaves it: a model, a finished run and its evaluation, a run in
    flight, a table, logs, a lock."""
    _write(root / "hacpo-results.json", json.dumps({"configs": ["config/x.yaml"]}), 900)
    _write(root / "data/train.jsonl", '{"q": 1}\n', 950)
    _model(root)
    _write(root / "logs/models/m.log", "built m", 1000)
    record = {"status": "complete", "machine": machine()}
    _write(root / RUN / "run.json", json.dumps(record), 1100)
    _write(root / RUN / "checkpoints/m/step-4/model.safetensors", "w4", 1100)
    _write(root / RUN / ".lock", "", 1100)
    _write(root / RUN / "done.json", "{}", 1101)
    _write(root / "logs/train/single/m/gspo/seed0.log", "trained", 1101)
    _write(root / IN_FLIGHT / "run.json", json.dumps({**record, "status": "running"}), 1150)
    _write(root / EVAL / "test.samples.jsonl", "{}\n", 1200)
    _write(root / EVAL / "summary.json", '{"acc": 0.5}', 1201)
    _write(root / "tables/claims.md", "# card", 1300)
    return root


@pytest.fixture
def packed(tmp_path):
    src = _results(tmp_path / "src")
    out = tmp_path / "p.tar.gz"
    return src, out, packs.pack(src, out)


def test_a_pack_carries_finished_jobs_and_no_weights(packed):
    src, out, p = packed
    with tarfile.open(out) as tar:
        names = tar.getnames()
    assert names[0] == packs.MANIFEST
    assert set(names[1:]) == {
        "hacpo-results.json", "data/train.jsonl", f"{RUN}/run.json", f"{RUN}/done.json",
        "logs/train/single/m/gspo/seed0.log", f"{EVAL}/test.samples.jsonl", f"{EVAL}/summary.json",
        "tables/claims.md",
    }  # fmt: skip
    assert p.left_out == [IN_FLIGHT] and p.files == len(names) - 1
    with tarfile.open(out) as tar:
        manifest = packs.read_manifest(tar, str(out))
    assert manifest["starting_points"] == {"models/m": {"model.safetensors": packs.sha256_file(
        src / "models/m/model.safetensors")}}  # fmt: skip
    assert manifest["files"][0] == "hacpo-results.json" and manifest["files"][-1] == "tables/claims.md"


def test_a_trained_run_awaiting_the_evaluation_its_other_seeds_have_is_left_out(tmp_path):
    src = _results(tmp_path / "src")
    record = {"status": "complete", "machine": machine(), "final_checkpoints": {"m": "ckpt"}}
    for seed in (0, 2, 3):  # seeds 0 and 3 evaluated, seed2 trained and waiting for its evaluation
        _write(src / f"runs/single/m/gspo/seed{seed}/run.json", json.dumps(record), 1100)
        _write(src / f"runs/single/m/gspo/seed{seed}/done.json", "{}", 1101)
    _write(src / "eval/main/single/m/gspo/seed3/summary.json", "{}", 1200)
    joint = {**record, "final_checkpoints": {"m": "c1", "n": "c2"}}
    for seed in (0, 1, 2):  # a joint run's agents are evaluated one by one: seed2's n is still to come
        _write(src / f"runs/joint/mn/hacpo/seed{seed}/run.json", json.dumps(joint), 1100)
        _write(src / f"runs/joint/mn/hacpo/seed{seed}/done.json", "{}", 1101)
        _write(src / f"eval/main/joint/mn/hacpo/seed{seed}/m/summary.json", "{}", 1200)
        if seed < 2:
            _write(src / f"eval/main/joint/mn/hacpo/seed{seed}/n/summary.json", "{}", 1200)
    for seed in (0, 1):  # two seeds, the first evaluated at a second setting too (Table 1 at 8k tokens)
        _write(src / f"runs/single/n/gspo/seed{seed}/run.json", json.dumps(record), 1100)
        _write(src / f"runs/single/n/gspo/seed{seed}/done.json", "{}", 1101)
        _write(src / f"eval/main/single/n/gspo/seed{seed}/summary.json", "{}", 1200)
    _write(src / "eval/long/single/n/gspo/seed0/summary.json", "{}", 1200)
    for seed in (0, 1, 2):  # seed 0 alone evaluated at a second setting too, as Table 1 at 8k tokens: fine
        _write(src / f"runs/single/m/hacpo/seed{seed}/run.json", json.dumps(record), 1100)
        _write(src / f"runs/single/m/hacpo/seed{seed}/done.json", "{}", 1101)
        _write(src / f"eval/main/single/m/hacpo/seed{seed}/summary.json", "{}", 1200)
    _write(src / "eval/long/single/m/hacpo/seed0/summary.json", "{}", 1200)
    timing_only = "runs/single/m/gspo_updates_x2/seed0"  # no seed of it is evaluated: nothing awaits
    _write(src / timing_only / "run.json", json.dumps(record), 1100)
    _write(src / timing_only / "done.json", "{}", 1101)
    p = packs.pack(src, tmp_path / "p.tar.gz")
    assert p.left_out == ["runs/joint/mn/hacpo/seed2", IN_FLIGHT, "runs/single/m/gspo/seed2"]
    with tarfile.open(tmp_path / "p.tar.gz") as tar:
        names = set(tar.getnames())
    assert f"{timing_only}/done.json" in names and f"{RUN}/done.json" in names
    assert "runs/single/m/hacpo/seed1/done.json" in names and "runs/single/n/gspo/seed1/done.json" in names
    assert "eval/main/joint/mn/hacpo/seed2/m/summary.json" in names  # redone after the retrained run


def test_unpacking_needs_the_starting_points_built_here_from_the_same_weights(packed, tmp_path):
    _src, out, _ = packed
    dest = tmp_path / "dest"
    with pytest.raises(ValueError, match=r"lacks the models .*models/m.*snakemake -c2 --configfile"):
        packs.unpack(out, dest)
    _model(dest, weights="other weights")
    with pytest.raises(ValueError, match="not the ones the runs .* started from: models/m"):
        packs.unpack(out, dest)
    assert sorted(p.name for p in dest.rglob("*") if p.is_file()) == ["hacpo-model.json", "model.safetensors"]


def test_unpacked_jobs_are_newer_than_the_models_and_keep_their_order(packed, tmp_path):
    src, out, _ = packed
    dest = tmp_path / "dest"
    _model(dest)
    _write(dest / "hacpo-results.json", json.dumps({"configs": ["config/y.yaml"]}), 1000)
    _write(dest / "logs/train/single/m/gspo/seed0.log", "this machine's log", 1000)  # kept, not a conflict
    new = packs.unpack(out, dest)
    assert f"{RUN}/done.json" in new and "logs/train/single/m/gspo/seed0.log" not in new
    for rel in (f"{RUN}/done.json", f"{EVAL}/summary.json", "tables/claims.md"):
        assert (dest / rel).read_bytes() == (src / rel).read_bytes()
    mtime = {rel: (dest / rel).stat().st_mtime for rel in new}
    assert min(mtime.values()) > (dest / "models/m/hacpo-model.json").stat().st_mtime
    assert mtime[f"{RUN}/run.json"] < mtime[f"{RUN}/done.json"] < mtime[f"{EVAL}/summary.json"]
    assert json.loads((dest / "hacpo-results.json").read_text())["configs"] == [
        "config/y.yaml",
        "config/x.yaml",
    ]
    assert not (dest / IN_FLIGHT).exists() and not list(dest.glob(".unpack-*"))
    assert packs.unpack(out, dest) == ["hacpo-results.json"]  # again: every file is already here


def test_a_different_file_refuses_the_whole_unpack(packed, tmp_path):
    _src, out, _ = packed
    dest = tmp_path / "dest"
    _model(dest)
    _write(dest / "tables/claims.md", "# another card", 1000)
    with pytest.raises(ValueError, match=r"other versions of 1 of the pack's files \(tables/claims.md\)"):
        packs.unpack(out, dest)
    assert not (dest / RUN).exists()


def test_another_machine_type_is_pooled_not_continued(packed, tmp_path, monkeypatch):
    _src, out, _ = packed
    monkeypatch.setattr(packs, "machine", lambda: {"cpu": "Other CPU", "flags": ["avx2"]})
    dest = tmp_path / "theirs"
    with pytest.raises(ValueError, match="this machine is Other CPU .*--other-machine.*results_from"):
        packs.unpack(out, dest)
    assert f"{RUN}/done.json" in packs.unpack(out, dest, other_machine=True)  # no models needed to read them
    mine = tmp_path / "mine"
    _write(mine / "runs/single/m/grpo/seed0/run.json", json.dumps({"machine": {"cpu": "Other CPU"}}), 1000)
    with pytest.raises(ValueError, match="a folder of its own"):
        packs.unpack(out, mine, other_machine=True)


def test_other_package_versions_code_and_cpu_generations_are_named(tmp_path, monkeypatch):
    src = _results(tmp_path / "src")
    versions = {"hacpo": "0.1.0", "torch": "2.13.0", "hacpo_commit": "0123456789ab"}
    record = {"status": "complete", "machine": machine(), "versions": versions}
    _write(src / RUN / "run.json", json.dumps(record), 1100)
    packs.pack(src, tmp_path / "p.tar.gz")
    monkeypatch.setattr("hacpo.provenance.versions", lambda: {**versions, "torch": "2.14.0"})
    assert packs.drift(tmp_path / "p.tar.gz") == ["torch 2.13.0 in the pack, 2.14.0 here"]
    record["machine"] = {**machine(), "cpu_id": "family 6 model 143 stepping 8"}
    record["versions"] = {**versions, "torch": "2.14.0", "hacpo_commit": "ba9876543210+dirty"}
    _write(src / RUN / "run.json", json.dumps(record), 1200)
    packs.pack(src, tmp_path / "p.tar.gz")
    notes = packs.drift(tmp_path / "p.tar.gz")
    assert notes[0] == "hacpo_commit ba9876543210+dirty in the pack, 0123456789ab here"
    assert notes[1].startswith("CPU family 6 model 143 stepping 8 in the pack, ") and len(notes) == 2


def test_what_is_not_a_results_folder_or_a_pack_is_named(tmp_path):
    with pytest.raises(ValueError, match="not a hacpo results folder"):
        packs.pack(tmp_path, tmp_path / "p.tar.gz")
    with tarfile.open(tmp_path / "not.tar.gz", "w:gz") as tar:
        tar.add(__file__, arcname="x.py")
    with pytest.raises(ValueError, match="not a hacpo results pack"):
        packs.unpack(tmp_path / "not.tar.gz", tmp_path / "dest")


SHIPPED = sorted((Path(__file__).resolve().parents[1] / "results" / "packs").glob("*.tar.gz"))


@pytest.mark.parametrize("pack_file", SHIPPED, ids=[p.name for p in SHIPPED])
def test_the_projects_packed_runs_are_whole(pack_file):
    """results/packs/: each pack names its machine type and starting points, and every run it carries
    finished (its record complete, on that machine type)."""
    with tarfile.open(pack_file) as tar:
        manifest = packs.read_manifest(tar, str(pack_file))
        runs = {
            f.rsplit("/", 1)[0] for f in manifest["files"] if f.startswith("runs/") and f.endswith("run.json")
        }
        assert runs and manifest["starting_points"] and len(manifest["machine_types"]) == 1
        for run in runs:
            assert f"{run}/done.json" in manifest["files"], run
            record = json.load(tar.extractfile(f"{run}/run.json"))
            assert (
                record["status"] == "complete"
                and packs.machine_type(record["machine"]) in manifest["machine_types"]
            )
