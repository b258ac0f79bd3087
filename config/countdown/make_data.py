"""Writes Countdown's train, dev and test files (``config/countdown/*.jsonl``), deterministically.

    python config/countdown/make_data.py [OUT_DIR]      # default: beside this file

Each record: ``{"id", "question", "solution", "nums", "target"}``. Three numbers from 1–9; the target is
reached by two of them and one operator (sized for hacpo's toy agents: a few minutes of CPU). ``solution``
is one such expression (the warm-up's supervised target); the verifier accepts any valid one.
``config/countdown.yaml`` maps ``question`` → problem, ``solution`` → answer; ``nums`` and ``target`` reach
the verifier as metadata.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).parent
SPLITS = {"train": 3000, "dev": 200, "test": 200}


def problem(rng: random.Random) -> dict:
    nums = [rng.randint(1, 9) for _ in range(3)]
    a, b = rng.sample(nums, 2)
    op = rng.choice("+-*")
    if op == "-" and a < b:
        a, b = b, a
    target = {"+": a + b, "-": a - b, "*": a * b}[op]
    return {"question": f"{' '.join(map(str, nums))} to {target}", "solution": f"{a}{op}{b}",
            "nums": nums, "target": target}  # fmt: skip


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    rng = random.Random(0)
    seen: set[str] = set()
    for split, n in SPLITS.items():
        rows = []
        while len(rows) < n:
            p = problem(rng)
            if p["question"] in seen:  # no question in two splits, none twice
                continue
            seen.add(p["question"])
            rows.append({"id": f"countdown-{split}-{len(rows)}", **p})
        text = "".join(json.dumps(r) + "\n" for r in rows)
        (out / f"{split}.jsonl").write_text(text)
        print(f"{split}: {len(rows)} records")


if __name__ == "__main__":
    main()
