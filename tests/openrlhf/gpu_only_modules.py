"""Stand-ins for the only two modules of OpenRLHF's import graph that cannot exist on a CPU machine: vLLM (a
CUDA build) and flash-attn's compiled kernels (``flash_attn_2_cuda``). Everything else the tests touch is the
real openrlhf==0.11.2, as OpenRLHF's own CPU tests do (they fake ``vllm`` and ``ray`` in ``sys.modules``).
Nothing here computes: a test that ended up calling into these stand-ins would fail on a MagicMock."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from unittest import mock

GPU_ONLY = ("vllm", "flash_attn_2_cuda")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in GPU_ONLY:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = mock.MagicMock(name=spec.name)
        module.__spec__ = spec
        module.__path__ = []
        module.__version__ = "0.29.0"
        return module

    def exec_module(self, module):
        pass


def install() -> None:
    """Idempotent: put the finder first on ``sys.meta_path``."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
