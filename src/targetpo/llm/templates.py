"""Prompt templates: how a problem becomes model input, what a correct completion looks like, and how the
answer is read back out of a completion.

- ``plain`` (tiny models): the prompt is the question followed by the model's turn, e.g. ``"12 + 7 ="``; the
  model answers with the bare answer and stops: completion ``" 19<eos>"``. The answer is the completion text.
- ``chat`` (instruction-tuned models): the tokenizer's chat template with reasoning-gym's default system prompt
  (think, then ``<answer>…</answer>``) and the question as the user turn. The answer is the text inside the
  last ``<answer>`` tag; a completion without one has no answer (reward 0).
"""

from __future__ import annotations

from dataclasses import dataclass

TEMPLATES = ("plain", "chat")


def system_prompt() -> str:
    """reasoning-gym's default system prompt (the one its RL recipes use)."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    return SYSTEM_PROMPTS["default"]


def extract_tagged_answer(completion: str) -> str | None:
    """The text inside the last ``<answer>…</answer>`` (reasoning-gym's extractor), or None without a tag."""
    from reasoning_gym.utils import extract_answer

    return extract_answer(completion)


@dataclass(frozen=True)
class Template:
    """name: "plain" or "chat" (see the module docstring)."""

    name: str = "plain"

    def __post_init__(self):
        if self.name not in TEMPLATES:
            raise ValueError(f"template must be one of {TEMPLATES}, got {self.name!r}")

    def prompt(self, question: str, tokenizer) -> str:
        """The text the model continues (for `chat`, the rendered chat template with the generation prompt)."""
        if self.name == "plain":
            return question
        messages = [{"role": "system", "content": system_prompt()}, {"role": "user", "content": question}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def target(self, answer: str) -> str:
        """A correct completion for the gold answer (what the supervised warm start teaches; EOS is added by
        the caller). `plain` answers after one space; `chat` answers inside the tags with no reasoning."""
        return f" {answer}" if self.name == "plain" else f"<answer>{answer}</answer>"

    def extract(self, completion: str) -> str | None:
        """The answer inside a decoded completion (special tokens already removed), or None."""
        if self.name == "plain":
            return completion.strip()
        found = extract_tagged_answer(completion)
        return None if found is None else found.strip()
