"""Prompt formats: how a problem becomes an imported model's prompt, and which tokens end its answer.

Every engine renders prompts through the tokenizer's chat template (``apply_chat_template``: the local
engine, OpenRLHF's rollout actors, vLLM evaluation), so a format is written into the imported model's
tokenizer as its chat template, and its stop tokens into ``generation_config.json``'s ``eos_token_id``
list, which every engine stops at (:func:`hacpo.agents.retokenize.stop_token_ids`). A base model has no
chat template: a model entry names its format, or the import fails naming the key. Never a silent default.

A format is data (:class:`PromptFormat`, docs/guide/own-task.md "A prompt format"): its ``instruction``,
its few-shot ``examples`` (question/answer pairs), its answer convention (``final_answer``, e.g.
``\\boxed{}``), how one problem is written (``turn``, ``{problem}`` where the user turn goes) and its
``stops``. The prompt is the tokenizer's BOS text where its tokenizer adds one by itself (Gemma), then the
instruction, each example as ``turn`` + ``" "`` + its answer + ``"\\n\\n"``, then ``turn`` around the user
turn (:func:`hacpo.data.synthetic.user_message`). The built-ins are ``formats.yaml`` beside this module:

- ``chat``: the model's own chat template (an instruct model); stops: its EOS list.
- ``gemma_turn``: ``<start_of_turn>user\\n{problem}<end_of_turn>\\n<start_of_turn>model\\n``; stops also
  at ``<end_of_turn>``.
- ``completion``: ``Question: {problem}\\nAnswer:``; stops also at a newline (``\\n``, ``\\n\\n``): one
  line of answer, as a base model continues a document.
- ``few_shot``: :data:`FEW_SHOT` (two worked one-line answers ending in ``\\boxed{}``) then the
  ``completion`` text.

A model entry's ``prompt_format`` is a built-in's name, a YAML file of these fields or an inline mapping
(:func:`get_format`); a built-in enters the import cache by its name, any other format by its content
(:meth:`PromptFormat.identity`), so editing it imports the model again.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# What a warm-up teaches a model to write (hacpo.agents.warmup.ModelWarmup.answer): the worked one-line
# solution, or the few-shot examples' form (:func:`few_shot_answer`)
AnswerForm = Literal["solution", "few_shot"]
ANSWER_FORMS: tuple[str, ...] = get_args(AnswerForm)
SLOT = "{problem}"
SHAPE = (
    "a format is {instruction: TEXT, examples: [{question: Q, answer: A}, …], final_answer: '\\boxed{}', "
    "turn: 'Question: {problem}\\nAnswer:', stops: ['\\n']} (docs/guide/own-task.md, 'A prompt format')"
)


def few_shot_answer(work: str, answer: str) -> str:
    """The few-shot examples' answer form: work ``"12+68=80"``, answer ``"80"`` →
    ``"12 + 68 = 80. The answer is \\boxed{80}."`` (spaced operators, then the boxed answer in words), the
    form an imported model copies from :data:`FEW_SHOT`. Without work: ``"The answer is \\boxed{80}."``."""
    spaced = re.sub(r"\s*([+\-*=])\s*", r" \1 ", work).strip()
    return f"{spaced + '. ' if spaced else ''}The answer is \\boxed{{{answer}}}."


Text = Annotated[str, Field(min_length=1)]


class Example(BaseModel):
    """One worked example: a question, written like a problem, and its full answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    question: Text = Field(description="the example's problem, written as the dataset writes its problems")
    answer: Text = Field(description="its full answer, as the model should write one (final answer included)")


class PromptFormat(BaseModel):
    """A prompt format as data: what the imported model's chat template writes, and where answers end."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field("custom", pattern=r"^[\w.-]+$", description="its name in manifests and errors")
    instruction: str = Field("", description="text before everything else (the task, said once)")
    examples: tuple[Example, ...] = Field((), description="few-shot question/answer pairs, in order")
    final_answer: str | None = Field(
        None,
        description="the answer convention, `{}` where the final answer goes (e.g. `\\boxed{}`, what the "
        "built-in verifiers read): every example's answer must show it",
    )
    turn: str | None = Field(
        None,
        description="one problem written out up to where the model answers, `{problem}` where it goes "
        "(e.g. `Question: {problem}\\nAnswer:`); unset: the model's own chat template",
    )
    stops: tuple[Text, ...] = Field((), description="texts that end an answer, each one token of the model")

    @model_validator(mode="after")
    def _consistent(self):
        if self.turn is None:
            if self.instruction or self.examples:
                raise ValueError(
                    f"turn: needed with an instruction or examples, e.g. 'Question: {SLOT}\\nAnswer:'"
                )
            return self
        if self.turn.count(SLOT) != 1:
            raise ValueError(
                f"turn: {self.turn!r} needs exactly one {SLOT} (where the problem goes), e.g. "
                f"'Question: {SLOT}\\nAnswer:'"
            )
        if self.final_answer is not None:
            if self.final_answer.count("{}") != 1:
                raise ValueError(
                    f"final_answer: {self.final_answer!r} needs one `{{}}` where the answer goes"
                )
            pre, post = self.final_answer.split("{}")
            shown = re.compile(re.escape(pre) + r".+?" + re.escape(post), re.S)
            for i, ex in enumerate(self.examples):
                if not shown.search(ex.answer):
                    raise ValueError(
                        f"examples.{i}.answer: {ex.answer!r} does not give its final answer as "
                        f"final_answer {self.final_answer!r} says: write it so (the verifier reads it there)"
                    )
        return self

    @property
    def shots(self) -> str:
        """The instruction and the worked examples, as the prompt starts."""
        one = self.turn or ""
        return self.instruction + "".join(
            f"{one.replace(SLOT, e.question)} {e.answer}\n\n" for e in self.examples
        )

    @property
    def before(self) -> str | None:
        """Text before the user turn (None: the model's own chat template)."""
        return None if self.turn is None else self.shots + self.turn.split(SLOT)[0]

    @property
    def after(self) -> str:
        """Text after the user turn, up to where the model answers."""
        return "" if self.turn is None else self.turn.split(SLOT)[1]

    def identity(self) -> str | dict:
        """What the import cache and the manifest record: a built-in's name, else every field."""
        return self.name if FORMATS.get(self.name) == self else self.model_dump(mode="json")

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


def _validate(data: Any, key: str, name: str, file: str = "") -> PromptFormat:
    where = f"in {file}; " if file else ""
    if not isinstance(data, dict):
        raise ValueError(f"{key}: {data!r} is not a mapping ({where}{SHAPE})")
    try:
        return PromptFormat.model_validate({"name": name, **data})
    except ValidationError as err:
        lines = []
        for e in err.errors():
            msg = e["msg"].removeprefix("Value error, ")
            loc = [str(p) for p in e["loc"]]
            if not loc and (field := re.match(r"([\w.]+): ", msg)):  # the check's own field: into the path
                loc, msg = [field.group(1)], msg[field.end() :]
            lines.append(f"{'.'.join([key, *loc])}: {msg}")
        raise ValueError("\n".join(lines) + f"\n({where}{SHAPE})") from None


FORMATS: dict[str, PromptFormat] = {}
FORMATS.update(
    {n: _validate(d, f"formats.yaml {n}", n) for n, d in
     yaml.safe_load((Path(__file__).with_name("formats.yaml")).read_text()).items()}
)  # fmt: skip
FEW_SHOT = FORMATS["few_shot"].shots


def is_format_file(spec: Any) -> bool:
    """A ``prompt_format`` that names a YAML file of a format's fields."""
    return isinstance(spec, str) and spec.endswith((".yaml", ".yml"))


def get_format(spec: str | dict | PromptFormat, key: str = "prompt_format") -> PromptFormat:
    """``spec``: a built-in's name, a YAML file of the fields (its name: the file's stem unless it gives
    one), a mapping of them, or a recorded :meth:`PromptFormat.identity`. A bad one raises ValueError
    naming ``key`` and the fix."""
    if isinstance(spec, PromptFormat):
        return spec
    if isinstance(spec, dict):
        return _validate(spec, key, spec.get("name", "custom"))
    if is_format_file(spec):
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"{key}: {spec}: no such file; give a YAML file of a format's fields ({SHAPE})")
        data = yaml.safe_load(path.read_text())
        name = data.get("name", path.stem) if isinstance(data, dict) else ""
        return _validate(data, key, name, file=spec)
    if spec not in FORMATS:
        raise ValueError(
            f"{key}: unknown prompt format {spec!r}; use one of {', '.join(FORMATS)}, a YAML file of a "
            f"format's fields or a mapping of them ({SHAPE})"
        )
    return FORMATS[spec]
