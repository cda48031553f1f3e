"""Chat templates as Hugging Face renders them: the Jinja template of a tokenizer_config.json
(`chat_template`, or a chat_template.jinja beside it) applied to a list of messages.

    template = ChatTemplate.beside(tokenizer_json_path)      # None when there is none
    text = template.render(messages, add_generation_prompt=True)
    text, spans = template.assistant_spans(messages)         # [(start, end) of each reply]

The environment is transformers' own (`ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True)` with loop controls, `raise_exception`, `strftime_now` and a `tojson`
that keeps non-ASCII text), so a template renders the text transformers'
`apply_chat_template(messages, tokenize=False)` renders. The assistant's replies are found by
rendering the conversation up to each reply (with the generation prompt) and through it: the
characters between are the reply, its end-of-turn marker included (TRL's way, which needs no
`{% generation %}` markers in the template; where it has them they render their body).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from podkit.errors import ConfigError

ROLES = ("system", "user", "assistant", "tool")


def _token_text(value: Any) -> str | None:
    """A special token of tokenizer_config.json: a string, or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class ChatTemplate:
    """A Jinja chat template with the special tokens its tokenizer_config.json names."""

    def __init__(self, source: str, bos_token: str | None = None,
                 eos_token: str | None = None, origin: str = "the chat template") -> None:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox

        def raise_exception(message: str) -> None:
            raise ConfigError(f"{origin} refused the messages: {message}")

        def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
                   separators: Any = None, sort_keys: bool = False) -> str:
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                              separators=separators, sort_keys=sort_keys)

        def strftime_now(fmt: str) -> str:
            import datetime

            return datetime.datetime.now().strftime(fmt)

        class Generation(jinja2.ext.Extension):
            """`{% generation %}...{% endgeneration %}` (transformers' marker of the
            assistant's text) renders its body: the replies are found without it."""

            tags = {"generation"}

            def parse(self, parser: Any) -> Any:
                next(parser.stream)
                return parser.parse_statements(("name:endgeneration",), drop_needle=True)

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True,
            extensions=[jinja2.ext.loopcontrols, Generation])
        env.filters["tojson"] = tojson
        env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ConfigError(f"{origin} is not a valid Jinja template: {e}") from None
        self.source, self.origin = source, origin
        self.bos_token, self.eos_token = bos_token, eos_token

    @classmethod
    def beside(cls, tokenizer: str | os.PathLike, template: str | os.PathLike = ""
               ) -> ChatTemplate | None:
        """The template for a tokenizer.json: the file `template` names (a .jinja), else the
        `chat_template` of tokenizer_config.json beside it, else chat_template.jinja beside
        it; None when there is none. bos/eos tokens from tokenizer_config.json."""
        from podkit.datasets import tokenizer_files as files

        config: dict = {}
        config_path = files.beside(tokenizer, "tokenizer_config.json")
        if files.is_file(config_path):
            try:
                config = json.loads(files.read_text(config_path))
            except ValueError as e:
                raise ConfigError(f"{config_path} is not JSON ({e}).") from None
        bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
        if template:
            if not files.is_file(template):
                raise ConfigError(f"data.chat_template = {os.fspath(template)!r}: no such file "
                                  "(give a Jinja template, e.g. chat_template.jinja).")
            return cls(files.read_text(template), bos, eos, os.fspath(template))
        source = config.get("chat_template")
        if isinstance(source, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        if isinstance(source, str) and source:
            return cls(source, bos, eos, f"{config_path}'s chat_template")
        jinja = files.beside(tokenizer, "chat_template.jinja")
        if files.is_file(jinja):
            return cls(files.read_text(jinja), bos, eos, jinja)
        return None

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = False) -> str:
        """The conversation as the model reads it (transformers' apply_chat_template(...,
        tokenize=False))."""
        return self._template.render(messages=list(messages),
                                     add_generation_prompt=add_generation_prompt,
                                     bos_token=self.bos_token or "",
                                     eos_token=self.eos_token or "")

    def assistant_spans(self, messages: Sequence[dict]) -> tuple[str, list[tuple[int, int]]]:
        """(the rendered conversation, the character span of each assistant reply)."""
        text = self.render(messages)
        spans = []
        for i, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            before = self.render(messages[:i], add_generation_prompt=True)
            through = self.render(messages[:i + 1])
            if not (through.startswith(before) and text.startswith(through)):
                raise ConfigError(
                    f"{self.origin} does not render a conversation as the prefix of its "
                    f"continuation (message {i}, the assistant's), so the reply's tokens "
                    "cannot be told from the prompt's; use prompt/completion records, or a "
                    "template that renders each turn after the ones before it.")
            spans.append((len(before), len(through)))
        return text, spans


def check_messages(messages: Any, where: str) -> list[dict]:
    """`messages` of a JSONL record: a list of {"role", "content"} with an assistant reply."""
    if not isinstance(messages, list) or not messages:
        raise ConfigError(f"{where}: 'messages' must be a non-empty list of "
                          "{\"role\": ..., \"content\": ...}.")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or \
                not isinstance(m.get("content", ""), str):
            raise ConfigError(f"{where}: message {i} is {m!r}; each message is "
                              "{\"role\": \"user\" | \"assistant\" | \"system\", \"content\": "
                              "\"...\"}.")
    if not any(m["role"] == "assistant" for m in messages):
        raise ConfigError(f"{where}: no assistant message, so nothing to learn from; each "
                          "conversation needs at least one {\"role\": \"assistant\"} reply.")
    return messages
