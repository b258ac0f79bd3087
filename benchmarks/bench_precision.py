"""What bf16 does to old log-probs and s_homo on a real model: the π_old pass against the update's pass.

    python benchmarks/bench_precision.py results/models/gemma3 results/models/smollm2

For 4 prompts × 4 sampled answers (two-digit additions, the model's prompt format), the sequence-mean
log-probs of the no-grad π_old pass (rows in chunks of 1,024 tokens) and of the update's pass (every shared
prefix once, :class:`~hacpo.agents.lm.SharedPrefixes`) under bf16 autocast: their ratio is s_homo at the
first update, 1 in exact arithmetic. Also the π_old pass's distance to fp32. Numbers in
docs/performance.md ("Real models on a laptop").
"""

from __future__ import annotations

import sys

import torch

from hacpo.agents.lm import SharedPrefixes, generate, left_pad, token_logprobs_shared_prompt
from hacpo.agents.prompting import prompt_ids
from hacpo.agents.retokenize import stop_token_ids
from hacpo.data.synthetic import make_splits


def main(path: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    problems = make_splits(["add2"], seed=0, n_test=20, n_dev=4, n_train=4)["dev"][:4]
    ids, mask = left_pad([prompt_ids(tok, p, "paper") for p in problems], tok.pad_token_id)
    index = torch.arange(4).repeat_interleave(4)
    stops, sampler = stop_token_ids(tok, model), torch.Generator().manual_seed(0)
    gen = generate(model, ids, 24, eos_id=stops, pad_id=tok.pad_token_id, prompt_mask=mask, generator=sampler,
                   prompt_index=index)  # fmt: skip
    rows, masks = (ids, index, gen.tokens), {"prompt_mask": mask, "response_mask": gen.mask}

    def seq_mean(lp):
        return (lp * gen.mask).sum(1) / gen.mask.sum(1)

    with torch.no_grad():
        fp32 = seq_mean(token_logprobs_shared_prompt(model, *rows, **masks, max_tokens=1024))
        for precision in ("fp32", "bf16"):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                old = seq_mean(token_logprobs_shared_prompt(model, *rows, **masks, max_tokens=1024))
                new = seq_mean(SharedPrefixes(model, *rows, **masks).logprobs())
            s = (new - old).exp()
            print(f"{path}  {precision}: s_homo at the first update in [{s.min():.5f}, {s.max():.5f}], mean "
                  f"{s.mean():.5f}; π_old vs fp32: {(old - fp32).abs().mean():.4f} nats/token")  # fmt: skip


if __name__ == "__main__":
    torch.set_num_threads(2)
    for model_dir in sys.argv[1:]:
        main(model_dir)
