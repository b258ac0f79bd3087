"""Local generation backend (transformers, CPU or one CUDA GPU) for evaluation."""

from __future__ import annotations

import torch

from hacpo.agents.adapters import load_causal_lm
from hacpo.agents.lm import generate, left_pad, rows_per_batch
from hacpo.agents.prompting import prompt_ids
from hacpo.agents.retokenize import pad_token_id, response_text, stop_token_ids
from hacpo.data.synthetic import as_problem
from hacpo.hardware import keep_freed_memory, resolve_precision


class LocalGenerator:
    """``generate(problems, sampling) → list[list[str]]`` (k responses per problem) for one checkpoint."""

    def __init__(
        self,
        path: str,
        device: str = "auto",
        threads: int = 1,
        batch_tokens: int | None = None,
        precision: str = "fp32",
        base: str | None = None,
    ):
        from transformers import AutoTokenizer

        torch.set_num_threads(threads)
        keep_freed_memory()
        self.device = torch.device(
            "cuda"
            if device == "auto" and torch.cuda.is_available()
            else ("cpu" if device == "auto" else device)
        )
        self.tok = AutoTokenizer.from_pretrained(path)
        if precision not in ("fp32", "bf16", "auto"):
            raise ValueError(f"precision must be fp32, bf16 or auto, got {precision!r}")
        self.precision = resolve_precision(precision, self.device.type)
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32  # weights and KV cache, as vLLM
        # a plain directory, or an adapter checkpoint served as its base with the adapter merged in
        self.model = load_causal_lm(path, dtype, base).to(self.device).eval()
        self.batch_tokens = batch_tokens  # KV-cache budget per generation batch (None: 256 problems)
        self.stops = stop_token_ids(self.tok, self.model)  # as vLLM: every eos id of the generation config
        self.pad = pad_token_id(self.tok, self.stops)

    @torch.no_grad()
    def generate(self, problems: list[dict], sampling, batch_size: int = 256) -> list[list[str]]:
        gen = torch.Generator(device=self.device).manual_seed(sampling.seed)
        out: list[list[str]] = []
        prompts = [prompt_ids(self.tok, as_problem(p), sampling.prompt_style) for p in problems]
        if self.batch_tokens is not None:  # problems per batch: their k rows fit the token budget
            per_row = max((len(x) for x in prompts), default=0) + sampling.max_new_tokens
            rows = rows_per_batch(self.batch_tokens, per_row, batch_size * sampling.k)
            batch_size = max(1, rows // sampling.k)
        for start in range(0, len(problems), batch_size):
            seqs = prompts[start : start + batch_size]
            ids, mask = left_pad(seqs, self.pad)
            rows = torch.arange(len(seqs), device=self.device).repeat_interleave(sampling.k)
            res = generate(
                self.model,
                ids.to(self.device),
                sampling.max_new_tokens,
                eos_id=self.stops,
                pad_id=self.pad,
                prompt_mask=mask.to(self.device),
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                greedy=sampling.greedy,
                generator=gen,
                prompt_index=rows,  # the k samples of a problem share one prefill
            )
            texts = [response_text(self.tok, row, stops=self.stops) for row in res.tokens.cpu()]
            out.extend(texts[i : i + sampling.k] for i in range(0, len(texts), sampling.k))
        return out
