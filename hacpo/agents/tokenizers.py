"""Locally built Hugging Face fast tokenizers for the toy agents (no downloads).

Two deliberately different tokenizers, so that a model-heterogeneous pair must exchange text, not ids:

- ``"char"``: one id per character of printable ASCII plus newline (a BPE model with no merges);
  specials ``<pad>`` (id 0), ``<s>`` (BOS), ``</s>`` (EOS), ``<unk>``. Chat template: ``<s>Q:{content}A:``.
- ``"word"``: a Unigram model whose vocabulary holds every character (fallback, so all charset text
  round-trips), the multi-character pieces ``\\boxed{`` and ``\\frac{``, and every word of the word-problem
  templates and of the paper's prompt phrase, each as one token; digits stay single tokens. Scores make
  any whole-piece match beat every split of it. A pre-tokenizer isolates spaces (each space is a token),
  and the decoder concatenates tokens, so ``decode(encode(x)) == x`` for charset text. Specials
  ``<|pad|>`` (id 0), ``<|endoftext|>`` (EOS), ``<|user|>``, ``<|assistant|>``, ``<|unk|>``; no BOS.
  Chat template: ``<|user|>{content}<|assistant|>``.

Neither tokenizer adds special tokens when encoding (no post-processor): the chat template holds BOS/role
markers, so encode templated prompts with ``add_special_tokens=False`` anyway, as everywhere else.
"""

from __future__ import annotations

import hashlib
import json

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from hacpo.data.synthetic import word_vocabulary

KINDS = ("char", "word")
CHARSET: tuple[str, ...] = tuple(chr(i) for i in range(32, 127)) + ("\n",)

CHAR_SPECIALS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
WORD_SPECIALS = {"pad_token": "<|pad|>", "eos_token": "<|endoftext|>", "unk_token": "<|unk|>"}
WORD_ROLE_TOKENS = ("<|user|>", "<|assistant|>")
WORD_PIECES = ("\\boxed{", "\\frac{")

# Jinja chat templates. Assistant turns (for rendering SFT conversations) end with EOS.
CHAR_CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}{{ bos_token }}Q:{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}A:{{ m['content'] }}{{ eos_token }}"
    "{% else %}{{ raise_exception('char template supports user/assistant turns only') }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)
WORD_CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<|assistant|>{{ m['content'] }}{{ eos_token }}"
    "{% else %}{{ raise_exception('word template supports user/assistant turns only') }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _specials(tok: Tokenizer, names: list[str]) -> None:
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in names])


def _char_backend() -> Tokenizer:
    specials = [CHAR_SPECIALS[k] for k in ("pad_token", "bos_token", "eos_token", "unk_token")]
    vocab = {t: i for i, t in enumerate(specials + list(CHARSET))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=CHAR_SPECIALS["unk_token"]))
    tok.decoder = decoders.Fuse()
    _specials(tok, specials)
    return tok


def _word_backend() -> Tokenizer:
    specials = [
        WORD_SPECIALS["pad_token"],
        WORD_SPECIALS["eos_token"],
        *WORD_ROLE_TOKENS,
        WORD_SPECIALS["unk_token"],
    ]
    words = [w for w in word_vocabulary() if len(w) > 1]
    assert not any(c.isdigit() for w in words for c in w), "digits must stay single tokens"
    pieces = list(WORD_PIECES) + words
    # Unigram log-probs: a whole piece (-1) beats every split of it into ≥ 2 tokens (sum ≤ -2).
    vocab = [(s, 0.0) for s in specials] + [(c, -2.0) for c in CHARSET] + [(p, -1.0) for p in pieces]
    unk_id = specials.index(WORD_SPECIALS["unk_token"])
    tok = Tokenizer(models.Unigram(vocab, unk_id=unk_id, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="isolated")
    tok.decoder = decoders.Fuse()
    _specials(tok, specials)
    return tok


def build_tokenizer(kind: str) -> PreTrainedTokenizerFast:
    """A fresh tokenizer of ``kind`` (``"char"`` or ``"word"``); save with ``save_pretrained``."""
    if kind == "char":
        return PreTrainedTokenizerFast(
            tokenizer_object=_char_backend(),
            chat_template=CHAR_CHAT_TEMPLATE,
            clean_up_tokenization_spaces=False,
            model_max_length=4096,
            **CHAR_SPECIALS,
        )
    if kind == "word":
        return PreTrainedTokenizerFast(
            tokenizer_object=_word_backend(),
            chat_template=WORD_CHAT_TEMPLATE,
            clean_up_tokenization_spaces=False,
            model_max_length=4096,
            additional_special_tokens=list(WORD_ROLE_TOKENS),
            **WORD_SPECIALS,
        )
    raise ValueError(f"unknown tokenizer kind {kind!r}; use one of {KINDS}")


def tokenizer_fingerprint(tok) -> str:
    """sha256 over the backend tokenizer (model incl. vocab/merges, normaliser, pre-tokenizer, post-processor,
    decoder, added tokens) and the special-token map. The chat template is excluded on purpose: two
    tokenizers that encode identically share a fingerprint even when their templates differ."""
    backend = json.loads(tok.backend_tokenizer.to_str())
    keep = ("model", "normalizer", "pre_tokenizer", "post_processor", "decoder", "added_tokens")
    payload = {k: backend.get(k) for k in keep}
    payload["special_tokens"] = {
        name: getattr(tok, name, None) for name in ("bos_token", "eos_token", "pad_token", "unk_token")
    }
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()
