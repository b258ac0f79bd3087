"""``python -m hacpo.worker {serve,start,stop}`` (how :func:`.client.start_background` starts a server)."""

import argparse
import sys

from .commands import _add_actions, _cmd_worker

_parser = argparse.ArgumentParser(prog="python -m hacpo.worker", description="hacpo's warm worker")
_add_actions(_parser)
sys.exit(_cmd_worker(_parser.parse_args()))
