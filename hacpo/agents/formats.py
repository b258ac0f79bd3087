"""Prompt formats: how a problem becomes an imported model's prompt, and which tokens end its answer.

Every engine renders prompts through the tokenizer's chat template (``apply_chat_template``: the local
engine, OpenRLHF's rollout actors, vLLM evaluation), so a format is written into the imported model's
tokenizer as its chat template, and its stop tokens into ``generation_config.json``'s ``eos_token_id``
list, which every engine stops at (:func:`hacpo.agents.retokenize.stop_token_ids`). A base model has no
chat template: a model entry names its format, or the import fails naming the key. Never a silent default.

The formats, ``{content}`` being the user turn (:func:`hacpo.data.synthetic.user_message`) and ``<bos>``
the tokenizer's BOS text where its tokenizer adds one by itself (Gemma), nothing otherwise (SmolLM2):

- ``chat``: the model's own chat template (an instruct model); stops: its EOS list.
- ``gemma_turn``: ``<bos><start_of_turn>user\\n{content}<end_of_turn>\\n<start_of_turn>model\\n``; stops
  also at ``<end_of_turn>``.
- ``completion``: ``<bos>Question: {content}\\nAnswer:``; stops also at a newline (``\\n``, ``\\n\\n``):
  one line of answer, as a base model continues a document.
- ``few_shot``: :data:`FEW_SHOT` (two worked one-line answers ending in ``\\boxed{}``) then the
  ``completion`` text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

# What a warm-up teaches a model to write (hacpo.agents.warmup.ModelWarmup.answer): the worked one-line
# solution, or the few-shot examples' form (:func:`few_shot_answer`)
AnswerForm = Literal["solution", "few_shot"]
ANSWER_FORMS: tuple[str, ...] = get_args(AnswerForm)


def few_shot_answer(work: str, answer: str) -> str:
    """The few-shot examples' answer form: work ``"12+68=80"``, answer ``"80"`` →
    ``"12 + 68 = 80. The answer is \\boxed{80}."`` (spaced operators, then the boxed answer in words), the
    form an imported model copies from :data:`FEW_SHOT`. Without work: ``"The answer is \\boxed{80}."``."""
    spaced = re.sub(r"\s*([+\-*=])\s*", r" \1 ", work).strip()
    return f"{spaced + '. ' if spaced else ''}The answer is \\boxed{{{answer}}}."


FEW_SHOT = (
    f"Question: What is 12 + 68?\nAnswer: {few_shot_answer('12+68=80', '80')}\n\n"
    "Question: A box holds 3 rows of 4 eggs. How many eggs are in the box?\n"
    f"Answer: {few_shot_answer('3*4=12', '12')}\n\n"
)


@dataclass(frozen=True)
class PromptFormat:
    name: str
    before: str | None  # text before the user turn (None: the model's own chat template)
    after: str = ""  # text after it, up to where the model answers
    stops: tuple[str, ...] = ()  # texts that end an answer, each one token of the model's vocabulary

    def chat_template(self, bos: str) -> str | None:
        """A Jinja chat template rendering one user turn (None: keep the model's own)."""
        if self.before is None:
            return None
        lit = _jinja_literal
        return (
            "{%- for m in messages %}{%- if m['role'] == 'user' %}"
            f"{{{{ {lit(bos + self.before)} }}}}{{{{ m['content'] }}}}{{{{ {lit(self.after)} }}}}"
            "{%- else %}{{ raise_exception('prompt format "
            f"{self.name} renders one user turn') }}}}{{%- endif %}}{{%- endfor %}}"
        )


def _jinja_literal(text: str) -> str:
    """``text`` as a Jinja string literal (braces and backslashes of ``\\boxed{}`` stay literal)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


FORMATS = {
    "chat": PromptFormat("chat", None),
    "gemma_turn": PromptFormat(
        "gemma_turn",
        "<start_of_turn>user\n",
        "<end_of_turn>\n<start_of_turn>model\n",
        stops=("<end_of_turn>",),
    ),
    "completion": PromptFormat("completion", "Question: ", "\nAnswer:", stops=("\n", "\n\n")),
    "few_shot": PromptFormat("few_shot", FEW_SHOT + "Question: ", "\nAnswer:", stops=("\n", "\n\n")),
}


def get_format(name: str, key: str = "prompt_format") -> PromptFormat:
    if name not in FORMATS:
        raise ValueError(f"{key}: unknown prompt format {name!r}; use one of {', '.join(FORMATS)}")
    return FORMATS[name]
