"""The peak disk of a results folder while a command runs: what a machine needs free, where the folder's final
size (``cost_table.py``'s disk) hides the checkpoints a run held and its retention removed.

    python scripts/disk_peak.py results/real-claims --log /tmp/disk.tsv -- \
        .venv/bin/snakemake -c2 --configfile config/real-claims.yaml config/real-claims-model.yaml

Samples the folder's size (files' apparent bytes, a hard link once, symlinks not followed) every ``--every``
seconds while the command runs, appends each sample to ``--log`` (seconds, bytes), and prints the peak, when
it came, and the folder's largest subfolders at that moment. Exits with the command's status; an interrupt
(Ctrl-C) stops the command, and the peak so far is still printed.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def folder_bytes(root: Path) -> tuple[int, dict[str, int]]:
    """Total apparent size of the files under ``root``, a hard-linked file once (an imported model is the
    per-machine cache's file), and the size under each of its run folders (``runs/<kind>/<group>/<method>/
    <seed>``, else the first two levels)."""
    total, parts, seen = 0, {}, set()
    for dirpath, _dirs, files in os.walk(root):
        rel = Path(dirpath).relative_to(root).parts
        key = "/".join(rel[:5] if rel[:1] == ("runs",) else rel[:2]) or "."
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:  # removed while we walked (a checkpoint pruned, weights released)
                continue
            if st.st_nlink > 1 and (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
            parts[key] = parts.get(key, 0) + st.st_size
    return total, parts


def main(argv: list[str] | None = None) -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--log", type=Path, help="append 'seconds<TAB>bytes' per sample")
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    if not command:
        parser.error("no command: give it after --, e.g. -- snakemake -c2 --configfile config/real.yaml")
    start = time.monotonic()
    proc = subprocess.Popen(command)
    # Ctrl-C reaches the command (its process group's); this keeps sampling until the command has stopped
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    peak, peak_at, peak_parts = -1, 0.0, {}
    log = args.log.open("a") if args.log else None
    while True:
        done = proc.poll() is not None
        size, parts = folder_bytes(args.folder) if args.folder.exists() else (0, {})
        now = time.monotonic() - start
        if log:
            log.write(f"{now:.0f}\t{size}\n")
            log.flush()
        if size > peak:
            peak, peak_at, peak_parts = size, now, parts
        if done:
            break
        time.sleep(args.every)
    largest = sorted(peak_parts.items(), key=lambda kv: -kv[1])[:8]
    when = f"at {peak_at / 60:.1f} min of {now / 60:.1f} min"
    print(f"peak {peak / 1e9:.2f} GB {when}; final {size / 1e9:.2f} GB")
    for key, n in largest:
        print(f"  {n / 1e9:7.2f} GB  {key}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
