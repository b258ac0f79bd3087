"""``hacpo prefetch``: every model and dataset a workflow config reads from the Hugging Face Hub, fetched into
the caches its jobs read, on a node with internet (a cluster's login node), so that the jobs can run with
the Hub offline (``HF_HUB_OFFLINE=1``; docs/guide/slurm.md, "Before you submit").

- A ``models:`` entry that is a Hub id (``hub:`` with ``engine: openrlhf``, or ``source: {hub, revision}``)
  is fetched with huggingface_hub's ``snapshot_download`` into the Hugging Face cache (``HF_HUB_CACHE``,
  default ``$HF_HOME/hub``), without a repository's ``original/`` folder (Meta's own format, a second copy
  of the weights that no engine here reads); a pinned revision that does not resolve is named.
- A registry dataset (:mod:`hacpo.data.registry`) or a Hub dataset of your own has its pinned revision
  resolved on the Hub (``HfApi.dataset_info``), then is read as its prepare job reads it into the data cache
  (``HACPO_DATA_CACHE``, default ``~/.cache/hacpo/datasets``).

Then every file a job reads is looked up in the caches, as a job finds it offline. With ``HF_HUB_OFFLINE``
set nothing is fetched: the command only checks the caches (what a compute node sees). Every problem is
listed at once under its config key: a gated model without a token (the fix: a token and the licence), a
revision that does not resolve, a file missing from a cache. With the Hub offline, the workflow's jobs
stop before any job runs when something is missing (:func:`require_cached`), naming the file and this
command.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


def hub_offline() -> bool:
    from hacpo.data.prepare import _offline_env

    return _offline_env()


def hub_cache() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)  # HF_HUB_CACHE, else $HF_HOME/hub, as every job's library reads it


def _cached(repo: str, name: str, revision: str | None) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, name, revision=revision)
    return found if isinstance(found, str) else None


def missing_model_files(repo: str, revision: str | None = None) -> list[str]:
    """The files an engine reads of model ``repo`` at ``revision`` (None: ``main``) that the Hugging Face
    cache lacks: ``config.json``, ``tokenizer_config.json`` and the weights (every shard of an index)."""
    need = ["config.json", "tokenizer_config.json"]
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if path := _cached(repo, index, revision):
            need += sorted(set(json.loads(Path(path).read_text())["weight_map"].values()))
            break
    else:
        if not _cached(repo, "pytorch_model.bin", revision):
            need.append("model.safetensors")
    return [f for f in need if not _cached(repo, f, revision)]


@dataclass(frozen=True)
class Item:
    """One thing a config reads from the Hub: its config key, repository and revision (None: ``main``)."""

    key: str
    repo: str
    revision: str | None
    dataset: str | None = None  # the workflow dataset's name; None: a model

    @property
    def where(self) -> str:
        return f"{self.repo}@{self.revision[:12] if self.revision else 'main'}"

    @property
    def page(self) -> str:
        return f"https://huggingface.co/{'datasets/' if self.dataset else ''}{self.repo}"


def items(pipe) -> list[Item]:
    """What ``pipe``'s config reads from the Hub: models, then datasets, in config order."""
    from hacpo.data import registry

    out = []
    for name, m in pipe.cfg.models.items():
        if m.hub and pipe.cfg.engine != "local" and not os.path.isdir(m.hub):  # a directory: not the Hub's
            out.append(Item(f"models.{name}.hub", m.hub, None))
        elif m.source and "hub" in m.source:
            out.append(Item(f"models.{name}.source", m.source["hub"], m.source["revision"]))
    for name, d in pipe.cfg.datasets.items():
        if d.registry and not d.file:
            spec = registry.get(d.registry)
            out.append(Item(f"datasets.{name}.registry", spec.hub_id, spec.revision, name))
        elif d.hub:
            out.append(Item(f"datasets.{name}.hub", d.hub.repo, d.hub.revision, name))
    return out


def _data_file(pipe, item: Item) -> tuple[Path, bool]:
    """The data-cache file a dataset's prepare job reads, and whether it is there."""
    from hacpo.data import registry
    from hacpo.data.prepare import default_cache_dir

    cache, d = default_cache_dir(), pipe.cfg.datasets[item.dataset]
    if d.hub:
        return d.hub.cache_file(cache), d.hub.cache_file(cache).is_file()
    names = registry.get(d.registry).local_file_names
    found = [cache / f for f in names if (cache / f).is_file()]
    return (found or [cache / names[0]])[0], bool(found)


def missing(pipe, item: Item) -> str | None:
    """What a job would not find in the caches of ``item``, or None."""
    if item.dataset:
        path, there = _data_file(pipe, item)
        return None if there else f"{path} is missing"
    lacking = missing_model_files(item.repo, item.revision)
    return f"{item.where}: {', '.join(lacking)} missing from {hub_cache()}" if lacking else None


def command(pipe) -> str:
    """The prefetch command of ``pipe``'s config files, relative to here where they are below here."""
    rel = [os.path.relpath(os.path.abspath(f)) for f in pipe.config_files]
    files = [r if not r.startswith("..") else os.path.abspath(r) for r in rel] or ["<your config files>"]
    return f"hacpo prefetch --configfile {' '.join(files)}"


def require_cached(pipe, key: str) -> None:
    """With the Hub offline (``HF_HUB_OFFLINE``), what config entry ``key`` (``models.X``, ``datasets.X``)
    reads from the Hub is in the caches, or a ``FileNotFoundError`` names the file and the command to run,
    when the workflow is planned, before any job runs."""
    if not hub_offline():
        return
    for item in items(pipe):
        if item.key.startswith(key + ".") and (lack := missing(pipe, item)):
            raise FileNotFoundError(
                f"{item.key}: {lack}, and HF_HUB_OFFLINE is set: run `{command(pipe)}` on a node with "
                "internet (the login node) first"
            )


def _explain(item: Item, err: Exception) -> str:
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(err, GatedRepoError):  # before RepositoryNotFoundError, its parent class
        return (
            f"{item.key}: {item.repo} is gated: set HF_TOKEN (or run `hf auth login`) with a token of an "
            f"account that has accepted its licence at {item.page}"
        )
    if isinstance(err, RevisionNotFoundError):
        return f"{item.key}: revision {item.revision} of {item.repo} does not resolve on the Hub: {item.page}"
    if isinstance(err, RepositoryNotFoundError):
        return f"{item.key}: {item.repo} is not on the Hub, or private (a token: HF_TOKEN or `hf auth login`)"
    return f"{item.key}: {item.where}: {type(err).__name__}: {err}"


def _size(path: Path) -> str:
    return f"{sum(f.stat().st_size for f in path.rglob('*') if f.is_file()) / 1e9:.2f} GB"


def _fetch(pipe, item: Item) -> str:
    """Fetch ``item`` into its cache (its revision resolved on the Hub first); what was fetched."""
    import huggingface_hub

    from hacpo.agents.sources import HUB_IGNORE

    if item.dataset is None:
        got = huggingface_hub.snapshot_download(item.repo, revision=item.revision, ignore_patterns=HUB_IGNORE)
        path = Path(got)
        return f"{item.repo}@{path.name[:12]}, {_size(path)}"
    huggingface_hub.HfApi().dataset_info(item.repo, revision=item.revision)  # the pinned commit resolves
    d = pipe.cfg.datasets[item.dataset]
    if d.hub:
        from hacpo.data import own

        own.hub_file(d.hub, f"datasets.{item.dataset}")
    else:
        from hacpo.data.prepare import load_raw

        load_raw(d.registry)  # the prepare job's own read: the cached copy, else the Hub at the revision
    return f"{item.where}, revision resolved on the Hub"


def prefetch(pipe) -> list[str]:
    """Fetch (unless the Hub is offline) and check every :func:`items` of ``pipe``; the lines of what was
    verified, or a ``ValueError`` listing every problem under its config key."""
    from hacpo.data.prepare import default_cache_dir

    offline, todo = hub_offline(), items(pipe)
    lines = [f"models: {hub_cache()} (HF_HUB_CACHE, else $HF_HOME/hub)",
             f"datasets: {default_cache_dir()} (HACPO_DATA_CACHE)"]  # fmt: skip
    if offline:
        lines.append("HF_HUB_OFFLINE is set: the caches are checked; nothing fetched, no revision resolved")
    problems = []
    for item in todo:
        try:
            got = item.where if offline else _fetch(pipe, item)
        except Exception as err:  # the Hub's errors, a network's, no `datasets` package: each named
            problems.append(_explain(item, err))
            continue
        if lack := missing(pipe, item):
            problems.append(f"{item.key}: {lack}")
        else:
            file = f" → {_data_file(pipe, item)[0]}" if item.dataset else ""
            lines.append(f"ok  {item.key}: {got}{file}")
    if problems:
        fix = f"\nRun `{command(pipe)}` on a node with internet (the login node)." if offline else ""
        raise ValueError(f"{len(problems)} of {len(todo)} not ready:\n  " + "\n  ".join(problems) + fix)
    lines.append(f"{len(todo)} model(s) and dataset(s) in the caches: jobs can run with HF_HUB_OFFLINE=1"
                 if todo else "nothing to fetch: this config reads nothing from the Hub")  # fmt: skip
    return lines
