"""``hacpo prefetch`` (hacpo.pipeline.prefetch) on config/paper.yaml, without internet.

The stand-in for the Hub is a Hugging Face cache written by a fixture in huggingface_hub's own cache layout
(``models--org--name/{blobs,snapshots/<commit>,refs/main}``), read by the library's real cache lookup
(``try_to_load_from_cache``), with the data cache beside it. That layout is the contract every job reads
offline; a local HTTP server would instead re-implement the Hub's download protocol, which changes between
huggingface_hub versions (the two project venvs hold different major versions). The online calls
(``snapshot_download``, ``HfApi.dataset_info``) are monkeypatched where a test needs the Hub's answer: a
gated repository, a revision that does not resolve.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pytest
from huggingface_hub.errors import GatedRepoError, RevisionNotFoundError

from hacpo.cli import main
from hacpo.data import registry
from hacpo.pipeline import Pipeline

ROOT = Path(__file__).resolve().parents[1]
PAPER = str(ROOT / "config" / "paper.yaml")
COMMIT = "c0ffee" + "0" * 34
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def cache_repo(hub: Path, repo: str, files: dict[str, bytes]) -> Path:
    """``repo`` at COMMIT (refs/main) in huggingface_hub's cache layout: blobs, and a snapshot of links."""
    root = hub / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / COMMIT
    for name, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(COMMIT)
    return snapshot


@pytest.fixture
def caches(tmp_path, monkeypatch):
    """Every model of config/paper.yaml in a Hugging Face cache (sharded weights), every dataset in the data
    cache; both set as the jobs set them (the library's constant is read at its import)."""
    hub, data = tmp_path / "hub", tmp_path / "data"
    index = json.dumps({"weight_map": {"a": SHARDS[0], "b": SHARDS[1]}}).encode()
    for m in Pipeline.from_files([PAPER]).cfg.models.values():
        files = {"config.json": b"{}", "tokenizer_config.json": b"{}", "model.safetensors.index.json": index}
        cache_repo(hub, m.hub, files | {s: s.encode() for s in SHARDS})
    row = json.dumps({"problem": "1+1", "solution": "\\boxed{2}"}).encode() + b"\n"
    data.mkdir()
    for spec in registry.DATASETS.values():
        (data / spec.local_file).write_bytes(gzip.compress(row) if spec.local_file.endswith(".gz") else row)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HACPO_DATA_CACHE", str(data))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    return SimpleNamespace(hub=hub, data=data)


def test_everything_cached_passes_offline_and_lists_what_it_verified(caches):
    """As on a compute node: the environment variables alone point the command at the caches."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "hacpo", "prefetch", "--configfile", PAPER], env=env,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"models: {caches.hub}" in out.stdout and f"datasets: {caches.data}" in out.stdout
    assert "HF_HUB_OFFLINE is set" in out.stdout
    ok = [line for line in out.stdout.splitlines() if line.startswith("ok  ")]
    assert len(ok) == 7 + 8, out.stdout  # paper.yaml: seven models, eight datasets
    assert "ok  models.llama3p2_3b_instruct.hub: meta-llama/Llama-3.2-3B-Instruct@main" in out.stdout
    assert f"ok  datasets.math500.registry: HuggingFaceH4/MATH-500@6e4ed1a2a79a → {caches.data}" in out.stdout
    assert "15 model(s) and dataset(s) in the caches" in out.stdout


def test_a_missing_file_is_named_with_the_command_by_prefetch_and_by_the_workflow(
    caches, tmp_path, monkeypatch, capsys
):
    snapshot = caches.hub / "models--meta-llama--Llama-3.2-3B-Instruct" / "snapshots" / COMMIT
    (snapshot / SHARDS[1]).unlink()
    (caches.data / "math500.jsonl").unlink()
    assert main(["prefetch", "--configfile", PAPER]) == 2
    err = capsys.readouterr().err
    where = "models.llama3p2_3b_instruct.hub: meta-llama/Llama-3.2-3B-Instruct@main"
    assert f"{where}: {SHARDS[1]} missing from {caches.hub}" in err
    assert f"datasets.math500.registry: {caches.data / 'math500.jsonl'} is missing" in err
    assert "2 of 15 not ready" in err and "hacpo prefetch --configfile" in err
    # the workflow, offline, when it plans the jobs (train and evaluate read model_inputs; prepare_data
    # dataset_inputs): the file and the command, before any job
    monkeypatch.chdir(tmp_path)  # no results/paper/data here: the datasets are still to prepare
    pipe = Pipeline.from_files([PAPER])
    assert pipe.model_inputs("qwen3_4b") == [] and pipe.dataset_inputs("gsm8k") == []
    with pytest.raises(FileNotFoundError, match=rf"{SHARDS[1]} missing .*HF_HUB_OFFLINE is set: run `hacpo "
                       r"prefetch --configfile \S*config/paper.yaml`"):  # fmt: skip
        pipe.model_inputs("llama3p2_3b_instruct")
    with pytest.raises(FileNotFoundError, match=r"datasets.math500.registry: .*math500.jsonl is missing"):
        pipe.dataset_inputs("math500")
    monkeypatch.delenv("HF_HUB_OFFLINE")  # online, the jobs fetch for themselves: nothing is refused
    assert pipe.model_inputs("llama3p2_3b_instruct") == [] and pipe.dataset_inputs("math500") == []


def _http_error(kind, message):
    return kind(message, response=SimpleNamespace(headers={}, request=None))


def test_online_it_resolves_each_revision_and_explains_a_gated_model(caches, monkeypatch, capsys):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    calls, gated, bad = [], {"meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-3B-Instruct"}, set()

    def snapshot_download(repo, *, revision=None, ignore_patterns=None):
        calls.append((repo, revision, ignore_patterns))
        if repo in gated:  # what the Hub answers without a token that accepted the licence
            raise _http_error(GatedRepoError, f"403 Client Error: access to {repo} is restricted")
        return str(caches.hub / f"models--{repo.replace('/', '--')}" / "snapshots" / COMMIT)

    def dataset_info(self, repo, *, revision=None):
        calls.append((repo, revision, None))
        if (repo, revision) in bad:
            raise _http_error(RevisionNotFoundError, f"404 Client Error: Revision Not Found for {repo}")
        return SimpleNamespace(sha=revision)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", dataset_info)
    math500 = registry.get("math500")
    bad.add((math500.hub_id, math500.revision))
    assert main(["prefetch", "--configfile", PAPER]) == 2
    err = capsys.readouterr().err
    for repo in sorted(gated):
        assert (f"{repo} is gated: set HF_TOKEN (or run `hf auth login`) with a token of an account that has "
                f"accepted its licence at https://huggingface.co/{repo}") in err  # fmt: skip
    assert (f"datasets.math500.registry: revision {math500.revision} of HuggingFaceH4/MATH-500 does not "
            "resolve on the Hub: https://huggingface.co/datasets/HuggingFaceH4/MATH-500") in err  # fmt: skip
    assert "3 of 15 not ready" in err and "qwen" not in err
    assert ("Qwen/Qwen3-4B", None, ("original/*",)) in calls  # Meta's copy of the weights left out
    assert {(s.hub_id, s.revision) for s in registry.DATASETS.values()} <= {c[:2] for c in calls}

    gated.clear(), bad.clear()  # a token, the licence accepted, every revision resolving
    assert main(["prefetch", "--configfile", PAPER]) == 0
    out = capsys.readouterr().out
    assert f"ok  models.qwen3_4b.hub: Qwen/Qwen3-4B@{COMMIT[:12]}, 0.00 GB" in out
    assert out.count("revision resolved on the Hub") == 8 and "HF_HUB_OFFLINE" in out.splitlines()[-1]
