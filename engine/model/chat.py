"""Chat templates: the model's own Jinja template, rendered in a sandbox."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

# When a model ships no template, ChatML is the most common shape among small instruct models.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template raised (via raise_exception) or the messages are malformed; ``param``: the
    request field at fault."""

    def __init__(self, message: str, param: str = "messages") -> None:
        super().__init__(message)
        self.param = param


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


def tool_turns(messages: list[dict[str, Any]]) -> bool:
    """Whether a chat (as ``normalize_messages`` gives it) holds an earlier tool call or result:
    the turns a template needs translated (``engine.guided.tools.history``); without them the
    messages are rendered as they are."""
    return any(m["role"] == "tool" or "tool_calls" in m or "tool_call_id" in m for m in messages)


# What the template's own variables and functions are named: a request's extra variables
# (``chat_template_kwargs``) may not stand in for them.
RESERVED = (
    "messages",
    "tools",
    "add_generation_prompt",
    "continue_final_message",
    "bos_token",
    "eos_token",
    "raise_exception",
    "strftime_now",
)


@dataclass(frozen=True, slots=True)
class ChatRender:
    """How a chat is rendered besides its messages and tools (vLLM's fields): ``continue_final``,
    the last message left open to be continued; ``extra``, variables the template may read."""

    continue_final: bool = False
    extra: dict[str, Any] | None = None


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    tools: list[dict[str, Any]] | None = None,
    continue_final: bool = False,
    extra: dict[str, Any] | None = None,
) -> str:
    """The chat as the template writes it. ``continue_final``: the text ends where the last
    message's content does (the turn left open, to be continued); ``extra``: more variables
    the template may read (none of ``RESERVED``)."""
    messages = normalize_messages(messages)
    try:
        text = _compile(template).render(
            {
                **(extra or {}),
                "messages": messages,
                "add_generation_prompt": add_generation_prompt,
                "continue_final_message": continue_final,
                "bos_token": bos_token,
                "eos_token": eos_token,
                "tools": tools,
            }
        )
    except ChatTemplateError:
        raise
    except Exception as e:  # a template error is the caller's bad input, said plainly
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from e
    return left_open(text, messages[-1]["content"]) if continue_final else text


def left_open(text: str, content: str) -> str:
    """``text`` cut after its last occurrence of ``content`` (the last message's), so the turn
    it opened is not closed. A template may trim the content's ends: it is found by its
    stripped text, and kept whole where the template kept it whole."""
    body = content.strip()
    at = text.rfind(body) if body else -1
    if at < 0:
        raise ChatTemplateError(
            "continue_final_message: the last message's content must be non-empty text that "
            "the chat template writes (it is continued from where it ends)",
            "continue_final_message",
        )
    kept = content.lstrip()
    end = at + len(kept) if text.startswith(kept, at) else at + len(body)
    return text[:end]


def knows_tools(template: str | None) -> bool:
    """Whether a chat template renders tools the Hermes/Qwen way: it reads ``tools`` and has
    the model answer with ``<tool_call>`` blocks."""
    return bool(template) and "tools" in template and "<tool_call>" in template
