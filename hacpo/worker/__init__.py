"""Warm worker: a fork server that keeps torch/transformers imported, so short ``hacpo`` jobs start in ms.

Why: Snakemake runs every job as its own ``hacpo ...`` process, and each pays ~4 s of ``import torch,
transformers`` before doing a fraction of a second of work. The server imports the heavy modules once, then
``fork()``s a child per request that runs ``hacpo.cli.main(argv)`` with the client's argv, cwd, environment
and stdin/stdout/stderr (the client's own file descriptors, passed over the socket), so output, exit codes and
relative paths behave exactly as an in-process run.

Modules: :mod:`.client` (:func:`delegate`, :func:`ping`, :func:`stop`, :func:`start_background`: standard
library only), :mod:`.server` (the fork server; it runs an *entry point* given by name, ``hacpo.cli:main`` by
default, so it imports nothing of the CLI that calls it), :mod:`.commands` (``hacpo worker ...``).

Client: :func:`delegate` (standard library only; the ``hacpo`` entry point calls it first). It delegates only
when ``$HACPO_WORKER`` names a live socket; otherwise it returns None and the caller runs in-process. The
``worker`` command itself is never delegated.

Protocol, one Unix stream connection per request, newline-terminated JSON:

- client → server ``{"argv", "cwd", "env"}`` with fds 0, 1, 2 attached (SCM_RIGHTS);
  server → client ``{"pid": child}`` once forked, then ``{"rc": exit code}`` when the child exits
  (a signal-killed child reports 128 + signal, as a shell does). Client EOF = job cancelled: the server
  SIGTERMs the child's process group, then SIGKILLs it 5 s later.
- ``{"op": "ping"}`` → ``{"pid": server}`` (readiness probe);
  ``{"op": "stop"}`` → ``{"pid": server}``, then EOF once the server has terminated its children and exited.

Fork safety: the server runs no torch op, tokenizer or CUDA call and starts no thread; the only native thread
after preloading is OpenBLAS's pool (started by ``import numpy``), which OpenBLAS itself shuts down in its
``pthread_atfork`` handler, so from the first fork on the server is single-threaded. It is one ``selectors``
loop over the listening socket, the client connections and each child's pidfd (Linux ≥ 5.3).
"""


from .client import ENV_VAR, delegate, ping, start_background, stop
from .commands import add_cli

__all__ = ["ENV_VAR", "add_cli", "delegate", "ping", "start_background", "stop"]
