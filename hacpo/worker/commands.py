"""``hacpo worker {serve,start,stop}`` and ``python -m hacpo.worker``."""

from __future__ import annotations

import argparse
import os
import sys

from .client import ENV_VAR, start_background, stop
from .server import DEFAULT_ENTRY, serve


def _add_actions(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    default = os.environ.get(ENV_VAR)
    sock = dict(default=default, required=not default, help=f"socket path (default: ${ENV_VAR})")
    s = sub.add_parser("serve", help="run the server in the foreground")
    t = sub.add_parser("start", help="start a detached server and wait until it is ready")
    for p in (s, t):
        p.add_argument("--socket", **sock)
        p.add_argument("--idle-timeout", type=float, default=600, help="exit after this many idle seconds")
        p.add_argument("--parent-pid", type=int, default=None, help="exit when this process exits")
    s.add_argument("--no-preload", action="store_true", help="do not import torch etc. up front")
    s.add_argument("--entry", default=DEFAULT_ENTRY, help="MODULE:FUNCTION each request runs with its argv")
    t.add_argument("--log", default=None, help="server log (default: <socket>.log)")
    sub.add_parser("stop", help="stop the server and its running jobs").add_argument("--socket", **sock)


def _cmd_worker(args) -> int:
    if args.action == "serve":
        try:
            serve(
                args.socket,
                preload=not args.no_preload,
                idle_timeout_s=args.idle_timeout,
                parent_pid=args.parent_pid,
                entry=args.entry,
            )
        except RuntimeError as err:
            print(f"hacpo worker: error: {err}", file=sys.stderr)
            return 1
        return 0
    if args.action == "start":
        log = args.log or args.socket + ".log"
        try:
            pid = start_background(
                args.socket, log, idle_timeout_s=args.idle_timeout, parent_pid=args.parent_pid
            )
        except RuntimeError as err:
            print(f"hacpo worker: error: {err}", file=sys.stderr)
            return 1
        print(f"hacpo worker {pid} serving on {args.socket} (log: {log}); export {ENV_VAR}={args.socket}")
        return 0
    if stop(args.socket):
        return 0
    print(f"hacpo worker: no server on {args.socket}", file=sys.stderr)
    return 1


def add_cli(subparsers) -> None:
    """Register ``hacpo worker {serve,start,stop}`` on the CLI's subparsers."""
    w = subparsers.add_parser("worker", help="warm worker: serve hacpo commands from preloaded forks")
    _add_actions(w)
    w.set_defaults(func=_cmd_worker)
