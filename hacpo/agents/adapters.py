"""LoRA adapters over a frozen base model, built on ``peft`` (one home for every engine and for evaluation).

A run with ``adapter: {lora: …}`` trains ΔW = (alpha / rank) · B A on the blocks' linear layers and keeps the
base frozen, once in memory (:func:`attach`). The KL reference is the same module with the adapter switched
off (:func:`reference`): no second copy of the model. A checkpoint is what trained: ``adapter_config.json``
(peft's, with the base's absolute path in ``base_model_name_or_path``) and ``adapter_model.safetensors``,
megabytes instead of gigabytes. Several agents may be adapters on one base (:func:`add`): the base once in
memory, one named adapter each, the one in use switched on (:func:`activate`). Everything that serves a
model (local evaluation, vLLM, ``hacpo export --merge``) reads an adapter checkpoint as base + merged
adapter (:func:`load_causal_lm`, :func:`servable`, :func:`export_merged`), so a plain Hugging Face
directory and an adapter checkpoint are interchangeable wherever a checkpoint is read.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
EXPORT_RECORD = "hacpo-export.json"  # what a merged export was made from


class LoraSpec(BaseModel):
    """A LoRA adapter over a frozen base (Hu et al. 2021), built with ``peft``: ΔW = (alpha / rank) · B A.

    Defaults follow Schulman et al. 2025 ("LoRA Without Regret"): alpha 32 at every rank, no dropout (a
    dropout would make π_old, sampled in eval mode, differ from the update's forward), every linear layer of
    the blocks (``all-linear``: peft's name for them, never the vocabulary head or the embedding)."""

    model_config = ConfigDict(extra="forbid")
    rank: int = Field(ge=1, description="the adapter's rank: the inner size of B A")
    alpha: float = Field(
        32.0, gt=0, description="the scale's numerator, ΔW = (alpha / rank) · B A; a whole number on OpenRLHF"
    )
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="the adapter's dropout in training; above 0 the update's forward differs from π_old's",
    )
    target_modules: Literal["all-linear"] | list[Annotated[str, Field(min_length=1)]] = Field(
        "all-linear",
        description=(
            "the layers that get an adapter: `all-linear` (every linear layer of the blocks) or a list of "
            "module names"
        ),
    )


def is_adapter(path: str | Path) -> bool:
    """True when ``path`` is an adapter checkpoint (peft's ``adapter_config.json``)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def lora_config(spec):
    """peft's ``LoraConfig`` of a :class:`LoraSpec`."""
    from peft import LoraConfig

    targets = spec.target_modules if isinstance(spec.target_modules, str) else list(spec.target_modules)
    return LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )


def attach(model, spec, base_path: str | Path, what: str = "adapter.lora", name: str = "default"):
    """Wrap ``model`` (loaded from ``base_path``) in a trainable LoRA adapter; returns peft's model.

    The Hugging Face model is changed in place (its target linears become LoRA layers, every base weight
    frozen), so code that walks the model (the vocabulary head, the KV-cache decoder) keeps working on
    ``peft_model.base_model.model`` (:func:`inner`). B starts at zero: before the first update the adapted
    model computes exactly the base's function."""
    from peft import get_peft_model

    try:
        peft_model = get_peft_model(model, lora_config(spec), adapter_name=name)
    except ValueError as err:  # peft: "Target modules {...} not found in the base model"
        names = sorted(
            {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        )
        raise ValueError(
            f"{what}.target_modules {spec.target_modules!r} does not fit {base_path}: {err}. Its linear "
            f"layers are named {names}; use all-linear (every linear layer of the blocks) or some of those"
        ) from None
    peft_model.peft_config[name].base_model_name_or_path = str(Path(base_path).resolve())
    return peft_model


def add(peft_model, spec, name: str, base_path: str | Path) -> None:
    """Another agent's adapter ``name`` on ``peft_model``'s base (held once for both): its own rank,
    alpha and targets; B at zero, so it too starts as the base's function."""
    peft_model.add_adapter(name, lora_config(spec))
    peft_model.peft_config[name].base_model_name_or_path = str(Path(base_path).resolve())


def activate(peft_model, name: str) -> None:
    """Switch adapter ``name`` on (the others off): forwards, sampling and gradients are its agent's."""
    if peft_model.active_adapter != name:
        peft_model.set_adapter(name)


def adapter_named_parameters(peft_model, name: str) -> list[tuple[str, torch.nn.Parameter]]:
    """Adapter ``name``'s weights with their names, in module order (not the base's, nor other adapters')."""
    return [(n, p) for n, p in peft_model.named_parameters() if "lora_" in n and f".{name}." in n]


def adapter_parameters(peft_model, name: str) -> list[torch.nn.Parameter]:
    """Adapter ``name``'s weights, in module order: its agent's optimizer holds these and nothing else."""
    return [p for _, p in adapter_named_parameters(peft_model, name)]


def inner(peft_model) -> torch.nn.Module:
    """The Hugging Face model inside peft's wrapper, LoRA layers in place."""
    return peft_model.base_model.model


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


@contextlib.contextmanager
def reference(peft_model):
    """The base model's function: the same module with every adapter layer switched off (the KL reference
    of an adapter run, as verl's ``no_lora_adapter``)."""
    with peft_model.disable_adapter():
        yield inner(peft_model)


def save(peft_model, out_dir: str | Path, name: str = "default") -> None:
    """Adapter ``name`` alone: ``adapter_config.json`` and ``adapter_model.safetensors``, the same files
    whether it shares its base or not (peft would put a named adapter in a subfolder)."""
    if name == "default":
        peft_model.save_pretrained(out_dir, safe_serialization=True)
    else:
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        state = get_peft_model_state_dict(peft_model, adapter_name=name)  # keys without the adapter's name
        tensors = {k: v.contiguous() for k, v in state.items()}
        save_file(tensors, Path(out_dir) / ADAPTER_WEIGHTS, metadata={"format": "pt"})
        peft_model.peft_config[name].save_pretrained(out_dir)
    _sort_set_fields(peft_model.peft_config[name], Path(out_dir) / ADAPTER_CONFIG)


def _sort_set_fields(config, path: Path) -> None:
    """peft writes a set field (``target_modules``) as a list in the set's iteration order, which string
    hashing makes differ between processes: sorted, a checkpoint's bytes are the same in every process (a
    resumed run's checkpoint equals the uninterrupted run's)."""
    sets = [k for k, v in vars(config).items() if isinstance(v, set)]
    if not sets:
        return
    data = json.loads(path.read_text())
    for key in sets:
        if isinstance(data.get(key), list):
            data[key] = sorted(data[key])
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def load_weights(peft_model, checkpoint: str | Path, name: str = "default") -> None:
    """Restore a saved adapter's weights into adapter ``name`` of ``peft_model`` (a resume, or a starting
    adapter), exactly as they were written."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(Path(checkpoint) / ADAPTER_WEIGHTS)
    result = set_peft_model_state_dict(peft_model, state, adapter_name=name)
    missing = [k for k in result.missing_keys if "lora_" in k and f".{name}." in k]
    if result.unexpected_keys or missing:
        raise ValueError(
            f"{checkpoint}: the adapter does not fit this run's model (unexpected "
            f"{result.unexpected_keys[:3]}, missing {missing[:3]}): was it trained with another rank or "
            "target_modules?"
        )


def fit_problems(checkpoint: str | Path, spec, what: str) -> list[str]:
    """How a starting adapter checkpoint differs from the adapter its agent declares (rank, alpha, target
    modules): its weights would not load, or would load into another scale. Read from its
    ``adapter_config.json`` before any model loads; ``[]`` when it fits."""
    saved = json.loads((Path(checkpoint) / ADAPTER_CONFIG).read_text())
    want = lora_config(spec)
    differ = [(key, saved.get(key), getattr(want, key)) for key in ("r", "lora_alpha") if saved.get(key) !=
              getattr(want, key)]  # fmt: skip
    targets, declared = saved.get("target_modules"), want.target_modules
    if spec.target_modules != "all-linear" and isinstance(targets, list) and set(targets) != set(declared):
        differ.append(("target_modules", sorted(targets), sorted(declared)))
    if not differ:
        return []
    names = {"r": "rank", "lora_alpha": "alpha", "target_modules": "target_modules"}
    plain = lambda v: int(v) if isinstance(v, float) and v.is_integer() else v  # noqa: E731 (alpha 8, not 8.0)
    found = ", ".join(f"{names[k]} {plain(got)!r}" for k, got, _ in differ)
    asked = ", ".join(f"{names[k]} {plain(w)!r}" for k, _, w in differ)
    return [f"{what}: the starting adapter {checkpoint} was trained with {found}, the run declares {asked}; "
            "declare the checkpoint's values, or start from the base model"]  # fmt: skip


def base_path(path: str | Path) -> Path:
    """The base weights ``path`` starts from: the base an adapter checkpoint records, else ``path`` itself."""
    return base_of(path) if is_adapter(path) else Path(path)


def base_of(checkpoint: str | Path, base: str | Path | None = None) -> Path:
    """The base model directory an adapter checkpoint was trained on (``base`` overrides the recorded one).

    peft records the base by its absolute path. Where that is not a model directory (the results folder was
    moved, copied, or pooled from another machine), the base is looked for at the same place relative to
    the adapter: the recorded path's last parts under the adapter's nearest folder that has them (a warm-up
    at ``<results>/models/w`` over ``/elsewhere/<results>/models/base`` finds ``<results>/models/base``),
    and stderr says which directory stands in for the recorded one."""
    recorded = json.loads((Path(checkpoint) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    path = Path(base or recorded or "")
    if not base and recorded and not (path / "config.json").is_file():
        moved = _relocated(Path(checkpoint).resolve(), Path(recorded))
        if moved is not None:
            print(f"hacpo: {checkpoint}: its base {recorded} is not here; using {moved}", file=sys.stderr)
            path = moved
    if not (path / "config.json").is_file():
        raise ValueError(
            f"{checkpoint} is a LoRA adapter over {recorded!r}, which is not a model directory here "
            "(moved, or trained on another machine): pass its base model with --base PATH"
        )
    return path


def _relocated(adapter: Path, recorded: Path) -> Path | None:
    """``recorded``'s last parts (two or more: a folder and the model's name) under the nearest ancestor of
    ``adapter`` where they name a model directory, longest first; None where none does."""
    parts = recorded.parts[1:] if recorded.is_absolute() else recorded.parts
    for ancestor in adapter.parents:
        for start in range(len(parts) - 1):
            candidate = ancestor.joinpath(*parts[start:])
            if (candidate / "config.json").is_file():
                return candidate
    return None


def load_causal_lm(path: str | Path, dtype: torch.dtype = torch.float32, base: str | Path | None = None):
    """A model to serve from ``path``: a plain Hugging Face directory as it is, or an adapter checkpoint as
    its base with the adapter merged in (in fp32, then cast to ``dtype``, as :func:`export_merged` writes
    it)."""
    from transformers import AutoModelForCausalLM

    if not is_adapter(path):
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    from peft import PeftModel

    model = AutoModelForCausalLM.from_pretrained(base_of(path, base), dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(path)).merge_and_unload()
    # as from_pretrained(dtype=...) loads a plain model: the weights cast, the buffers (RoPE's inverse
    # frequencies) kept in float32; `.to(dtype)` rounded those too, moving positions off the plain model's
    for p in merged.parameters():
        p.data = p.data.to(dtype)
    merged.config.dtype = dtype
    return merged


def export_merged(checkpoint: str | Path, out: str | Path, base: str | Path | None = None) -> Path:
    """Write ``checkpoint`` (an adapter, or already a plain directory) as a plain Hugging Face directory at
    ``out`` that transformers and vLLM read: merged weights, the tokenizer (with its chat template) and the
    generation config (every stop id). Atomic: ``out`` appears whole or not at all."""
    from transformers import AutoTokenizer

    from hacpo.runio import atomic_dir, atomic_write_json

    checkpoint = Path(checkpoint)
    if not (checkpoint / "config.json").is_file() and not is_adapter(checkpoint):
        raise ValueError(f"{checkpoint} is neither a model directory nor an adapter checkpoint")
    model = load_causal_lm(checkpoint, torch.float32, base)
    tok = AutoTokenizer.from_pretrained(checkpoint)
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        record = {"from": str(checkpoint.resolve()), "merged_adapter": is_adapter(checkpoint)}
        if is_adapter(checkpoint):
            record["base"] = str(base_of(checkpoint, base).resolve())
        atomic_write_json(tmp / EXPORT_RECORD, record)
    return Path(out)


@contextlib.contextmanager
def servable(path: str | Path, scratch: str | Path, base: str | Path | None = None):
    """A plain Hugging Face directory for ``path``: itself, or (an adapter checkpoint) its merged export in a
    temporary folder under ``scratch``, removed on exit (vLLM reads directories, not adapters over a base)."""
    import shutil
    import tempfile

    if not is_adapter(path):
        yield Path(path)
        return
    Path(scratch).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(dir=scratch, prefix=".merged.", suffix=".tmp"))
    try:
        yield export_merged(path, folder / "model", base)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
