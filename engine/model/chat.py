"""Chat templates: the model's own Jinja template, rendered in a sandbox."""

from __future__ import annotations

import datetime
from functools import lru_cache
from typing import Any

# When a model ships no template, ChatML is the most common shape among small instruct models.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template raised (via raise_exception) or the messages are malformed."""


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


@lru_cache(maxsize=8)
def _compile(source: str) -> Any:
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # Same whitespace rules as the reference implementation, so prompts match token for token.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(source)


def normalize_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Check roles and flatten content given as a list of text parts (as OpenAI clients send)."""
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ChatTemplateError(f"messages[{i}] must be an object with a string 'role'")
        content = m.get("content", "")
        if content is None:
            content = ""
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if (
                    not isinstance(part, dict)
                    or part.get("type") != "text"
                    or not isinstance(part.get("text"), str)
                ):
                    raise ChatTemplateError(
                        f"messages[{i}].content[{j}] must be a text part "
                        '({"type": "text", "text": ...})'
                    )
                texts.append(part["text"])
            content = "".join(texts)
        elif not isinstance(content, str):
            raise ChatTemplateError(
                f"messages[{i}].content must be a string or a list of text parts"
            )
        out.append({**m, "content": content})
    return out


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    tools: list[dict[str, Any]] | None = None,
) -> str:
    try:
        return _compile(template).render(
            messages=normalize_messages(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            tools=tools,
        )
    except ChatTemplateError:
        raise
    except Exception as e:  # a template error is the caller's bad input, said plainly
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from e


def knows_tools(template: str | None) -> bool:
    """Whether a chat template renders tools the Hermes/Qwen way: it reads ``tools`` and has
    the model answer with ``<tool_call>`` blocks."""
    return bool(template) and "tools" in template and "<tool_call>" in template
