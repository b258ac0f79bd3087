"""A second device on a CPU-only machine, to test tensor placement where CI has no GPU.

On a GPU, a tensor created without ``device=`` lands on the host and the first op that mixes it with the
run's tensors fails ("Expected all tensors to be on the same device ... index is on cpu"). A CPU run cannot
see those bugs: host and device are the same. :class:`VirtualDevice` makes them differ. The run is given
``DEVICE = torch.device("cpu", 0)``, which torch accepts as a CPU device, and the mode follows placement the
way CUDA would: a tensor is *on the device* when it was moved there (``.to(DEVICE)``, ``.to(other)``),
created there (``device=DEVICE``, or ``device=t.device`` of a device tensor, whose ``.device`` the mode
reports as ``DEVICE``), derived from device tensors (any op's output), or is a parameter, gradient or
buffer of a module moved there. Everything else is on the host. The mode records, as CUDA would raise:

- an op that mixes device tensors with host tensors of one or more dimensions (0-dim host tensors are
  scalars, which CUDA kernels accept), except writes into a tensor (``copy_``, ``__setitem__``) and
  indexing a device tensor with host indices, which CUDA allows;
- ``.numpy()`` of a device tensor;
- a random draw whose generator lives elsewhere than the tensor it fills (``torch.Generator(device=...)`` is
  followed while the mode is active).

It follows torch's Python-level calls (``__torch_function__``), so it sees the project's code, Hugging Face
modelling code and torch.optim; work that autograd does in C++ (gradients) is not seen, which is why
``.grad`` of a device parameter counts as a device tensor.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

DEVICE = torch.device("cpu", 0)
PACKAGE = str(Path(__file__).resolve().parent.parent / "hacpo")

# creation functions: their ``device=`` (or, for *_like / new_*, the source tensor's) decides placement
_FACTORIES = {
    "tensor", "as_tensor", "asarray", "zeros", "ones", "full", "empty", "arange", "range", "linspace",
    "logspace", "eye", "rand", "randn", "randint", "randperm", "empty_strided", "scalar_tensor", "from_numpy",
}  # fmt: skip
_LIKE = {"zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like", "randint_like"}
_NEW = {"new_tensor", "new_zeros", "new_ones", "new_full", "new_empty", "new_empty_strided"}
_WRITES = {"copy_", "__setitem__", "index_put_", "index_put"}  # CUDA copies host values into device tensors
_QUERIES = {"_has_compatible_shallow_copy_type"}  # metadata, no kernel (nn.Module.to asks it)


@dataclass(frozen=True)
class Violation:
    op: str
    where: str  # the innermost frame in hacpo/, else the innermost frame outside torch
    problem: str

    def __str__(self) -> str:
        return f"{self.where}: {self.op} {self.problem}"


def _name(func) -> str:
    owner = getattr(func, "__self__", None)  # getset_descriptor.__get__ -> the attribute's name
    if owner is not None and type(owner).__name__ == "getset_descriptor":
        return f"{owner.__name__}.{func.__name__}"
    return getattr(func, "__name__", str(func))


def _where() -> str:
    frames = traceback.extract_stack()[:-3]
    ours = [f for f in frames if f.filename.startswith(PACKAGE)]
    outside = [f for f in frames if "/torch/" not in f.filename and not f.filename.endswith(__file__)]
    f = (ours or outside or frames)[-1]
    return f"{Path(f.filename).name}:{f.lineno} ({f.name})"


class VirtualDevice(TorchFunctionMode):
    """Within ``with VirtualDevice() as vd:``, ``vd.violations`` collects the placement errors CUDA raises;
    ``strict=True`` raises at the first, as CUDA does, with the whole traceback (for debugging)."""

    def __init__(self, strict: bool = False) -> None:
        super().__init__()
        self.strict = strict
        self._on: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.violations: list[Violation] = []
        self._generator = torch.Generator

    def __enter__(self):
        mode, real = self, self._generator

        class Generator(real):  # remembers whether it was made for the run's device
            def __init__(self, device="cpu"):  # torch's __new__ makes the generator on `device`
                self.on_device = bool(mode._target(device))

        torch.Generator = Generator
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Generator = self._generator
        return super().__exit__(*exc)

    # ------------------------------------------------------------------ placement
    def on_device(self, t) -> bool:
        return isinstance(t, torch.Tensor) and (t in self._on)

    def _mark(self, out, on: bool):
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                if on:
                    self._on[t] = True
                else:
                    self._on.pop(t, None)
        return out

    def _target(self, value) -> bool | None:
        """Whether a ``device=``/``.to()`` argument means the run's device; None if it names no device."""
        if isinstance(value, torch.Tensor):
            return self.on_device(value)
        if isinstance(value, str):
            try:
                value = torch.device(value)
            except RuntimeError:
                return None
        if isinstance(value, torch.device):
            if value.type == "cpu":
                return value.index is not None
            return True if value.type == "cuda" else None  # meta and others are not simulated
        if isinstance(value, int) and not isinstance(value, bool):
            return True  # a CUDA ordinal
        return None

    # ------------------------------------------------------------------ the mode
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        if name == "device.__get__":
            real = func(*args, **kwargs)
            return DEVICE if real.type == "cpu" and self.on_device(args[0]) else real
        if name in ("grad.__get__", "data.__get__"):
            return self._mark(func(*args, **kwargs), self.on_device(args[0]))
        if name == "data.__set__":
            out = func(*args, **kwargs)
            self._mark(args[0], self.on_device(args[1]))
            return out
        if name.endswith(("__get__", "__set__")):
            return func(*args, **kwargs)
        if name == "to":
            targets = [self._target(a) for a in (*args[1:], kwargs.get("device"), kwargs.get("other"))]
            target = next((t for t in targets if t is not None), None)
            on = self.on_device(args[0]) if target is None else target
            return self._mark(self._moved(func, args, kwargs, on), on)
        if name == "cpu":
            return self._mark(self._moved(func, args, kwargs, False), False)
        if name == "cuda":
            return self._mark(func(*args, **kwargs), True)
        if name in _FACTORIES or name in _LIKE or name in _NEW:
            target = self._target(kwargs.get("device"))
            if target is None and name in _LIKE | _NEW:
                target = self.on_device(args[0])
            elif target is None and name == "as_tensor":
                target = self.on_device(args[0])
            self._check_generator(name, kwargs, bool(target))
            return self._mark(func(*args, **kwargs), bool(target))
        if name == "numpy" and self.on_device(args[0]):
            self._record(name, "of a device tensor (CUDA tensors have no numpy view)")
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        on = [t for t in tensors if self.on_device(t)]
        host = [t for t in tensors if not self.on_device(t) and t.dim() > 0]
        if name == "__getitem__":
            if not self.on_device(args[0]) and on:
                self._record(name, "indexes a host tensor with device indices")
            return self._mark(func(*args, **kwargs), self.on_device(args[0]))
        self._check_generator(name, kwargs, bool(on))
        if on and host and name not in _WRITES | _QUERIES:
            shapes = ", ".join(f"host {tuple(t.shape)}" for t in host[:3])
            self._record(name, f"mixes {len(on)} device tensor(s) with {shapes}")
        out = func(*args, **kwargs)
        return self._mark(out, True) if on else out

    def _check_generator(self, op: str, kwargs: dict, on: bool) -> None:
        gen = kwargs.get("generator")
        if gen is not None and getattr(gen, "on_device", False) != on:
            kinds = ("a device", "host") if on else ("a host", "device")
            self._record(op, f"draws {kinds[0]} tensor with a {kinds[1]} generator")

    def _moved(self, func, args, kwargs, on: bool):
        """A move between host and device: a new tensor, as on a GPU (on one CPU, torch returns the source
        itself, and marking it would move the source too)."""
        out = func(*args, **kwargs)
        return out.clone() if out is args[0] and self.on_device(out) != on else out

    def _record(self, op: str, problem: str) -> None:
        self.violations.append(Violation(op, _where(), problem))
        if self.strict:
            raise RuntimeError(f"virtual device: {self.violations[-1]}")

    def report(self) -> str:
        """The distinct violations, one per line, with their counts."""
        counts: dict[str, int] = {}
        for v in self.violations:
            counts[str(v)] = counts.get(str(v), 0) + 1
        return "\n".join(f"{n} x {v}" for v, n in counts.items())
