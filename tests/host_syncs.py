"""Host syncs counted on a CPU-only machine: what would make the host wait for a GPU.

``torch.cuda.set_sync_debug_mode`` needs CUDA. :class:`HostSyncs` finds the same waits on the CPU: it is a
:class:`~virtual_device.VirtualDevice` (which tensors are on the run's device, ``cpu:0``) plus a dispatch
mode that sees every aten op, C++ autograd's included. A sync is recorded, with the innermost frame in
``hacpo/``, where a device tensor is

- read on the host: ``item``/``bool``/``int``/``float`` (``aten._local_scalar_dense``), ``tolist``,
  ``numpy``, ``equal``;
- the input of an op whose output shape depends on its values, which CUDA learns by waiting: ``nonzero``
  (``torch.where(c)``, ``argwhere``), ``masked_select``, indexing with a boolean mask (read or write),
  ``unique``, ``repeat_interleave`` without ``output_size``, ``bincount``;
- copied to the host (``.cpu()``, ``.to("cpu")``), or written from a host tensor, or made from one by a
  blocking ``.to(device)`` (a blocking copy waits for the stream; ``non_blocking=True`` from the host does
  not).

With ``everything_on_device=True`` every tensor counts as a device tensor but those copied to the host (for
the maths, whose inputs all live on the run's device). Placement that only torch's C++ decides is not
followed: ``clip_grad_norm_`` groups gradients by their real device, ``cpu``, and its ``.to(that device)``
reads as a copy to the host here, where CUDA would keep it on the GPU.
"""

from __future__ import annotations

import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary
from virtual_device import PACKAGE, VirtualDevice, _name

_HELPERS = ("virtual_device.py", "host_syncs.py")

aten = torch.ops.aten
_READS = {aten._local_scalar_dense, aten.equal}
_SHAPE_FROM_VALUES = {
    aten.nonzero, aten.masked_select, aten._unique, aten._unique2, aten.unique_dim, aten.unique_consecutive,
    aten.unique_dim_consecutive, aten.bincount,
}  # fmt: skip
_INDEXED = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}


@dataclass(frozen=True)
class Sync:
    op: str
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ({self.function}): {self.op}"


def _bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


class _DataDependent(TorchDispatchMode):
    """The aten half: ops that read device values on the host; marks each device op's outputs."""

    def __init__(self, owner: HostSyncs) -> None:
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        on = any(self.owner.on_device(t) for t in tree_leaves((args, kwargs)))
        packet = func.overloadpacket
        if on and (
            packet in _READS
            or packet in _SHAPE_FROM_VALUES
            or (packet in _INDEXED and _bool_index(args))
            or (func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None)
        ):
            self.owner.record(str(packet).removeprefix("aten."))
        out = func(*args, **kwargs)
        return self.owner._mark(out, True) if on else out


class HostSyncs(VirtualDevice):
    """``with HostSyncs() as hs: ...``; ``hs.syncs`` lists them, ``hs.counts()`` by place and op."""

    def __init__(self, everything_on_device: bool = False) -> None:
        super().__init__()
        self.everything = everything_on_device
        self.syncs: list[Sync] = []
        self._host: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._aten = _DataDependent(self)

    def on_device(self, t) -> bool:
        if self.everything:  # but what was copied to the host
            return isinstance(t, torch.Tensor) and t not in self._host
        return super().on_device(t)

    def _mark(self, out, on: bool):
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and on:
                self._host.pop(t, None)
            elif isinstance(t, torch.Tensor):
                self._host[t] = True
        return super()._mark(out, on)

    def __enter__(self):
        self._aten.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        out = super().__exit__(*exc)
        self._aten.__exit__(*exc)
        return out

    def record(self, op: str) -> None:
        frames = traceback.extract_stack()
        ours = [f for f in frames if f.filename.startswith(PACKAGE)]
        outside = [f for f in frames if "/torch/" not in f.filename and Path(f.filename).name not in _HELPERS]
        f = (ours or outside or frames)[-1]
        self.syncs.append(Sync(op, Path(f.filename).name, f.lineno, f.name))

    def counts(self) -> Counter:
        """Syncs by place: ``{(file, function, op): n}`` (no line numbers, which move with every edit)."""
        return Counter((s.file, s.function, s.op) for s in self.syncs)

    def report(self) -> str:
        return "\n".join(f"{n} x {s}" for s, n in Counter(map(str, self.syncs)).items()) or "no host syncs"

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        src = args[0] if args else None
        if name in ("tolist", "numpy") and self.on_device(src):
            self.record(name)
        elif name == "cpu" and self.on_device(src):
            self.record("copy to host")
        elif name == "to" and isinstance(src, torch.Tensor):
            targets = [self._target(a) for a in (*args[1:], kwargs.get("device"), kwargs.get("other"))]
            target = next((t for t in targets if t is not None), None)
            if target is False and self.on_device(src):
                self.record("copy to host")
            elif target and not self.on_device(src) and not kwargs.get("non_blocking"):
                self.record("blocking copy to the device")
        elif name in ("copy_", "__setitem__") and self.on_device(src):
            value = args[-1]
            if isinstance(value, torch.Tensor) and not self.on_device(value):
                self.record("blocking copy to the device")
        return super().__torch_function__(func, types, args, kwargs)
