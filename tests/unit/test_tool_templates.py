"""A chat template that knows tools (Hermes style, written here) gets them: the tools as OpenAI
sends them, an earlier call's arguments as an object, a tool message as its role; special-token
text in what such a template writes outside a message's content is refused, never tokenized as
a special token. A template that knows no tools is never given them."""

from __future__ import annotations

import json

import pytest

from engine.guided.tools import plan_of
from engine.model.chat import ChatTemplateError, knows_tools
from tests.unit.test_detok_and_request import make_tokenizer
from tests.unit.test_tools import CALLED

HERMES = (
    "{% if tools %}<|im_start|>system\nFunctions:\n{% for t in tools %}"
    "{{ t.function | tojson }}\n{% endfor %}Call one as <tool_call>{json}</tool_call>.<|im_end|>\n"
    "{% endif %}"
    "{% for m in messages %}<|im_start|>{{ 'user' if m.role == 'tool' else m.role }}\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>\n"
    '{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}\n</tool_call>'
    "{% endfor %}{% elif m.role == 'tool' %}<tool_response>{{ m.content }}</tool_response>"
    "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}]
CHAT = CALLED


def test_a_hermes_template_gets_the_tools_and_the_calls_as_objects():
    tok = make_tokenizer(HERMES)
    assert tok.knows_tools and not knows_tools(None) and not knows_tools("{{ messages }}")
    plan = plan_of(TOOLS, "auto", True, native=tok.knows_tools)
    assert plan.format == "hermes" and plan.guide is None
    text = tok.render_chat(plan.messages(CHAT), tools=plan.template_tools())
    assert '{"name": "now", "parameters": {"type": "object"}}' in text
    call = text.split("<tool_call>\n")[1].split("\n</tool_call>")[0]
    assert json.loads(call) == {"name": "now", "arguments": {"tz": "UTC"}}
    assert "<tool_response>noon</tool_response>" in text and "time?" in text


@pytest.mark.parametrize("where", ["tools", "call"])
def test_special_token_text_a_template_writes_outside_content_is_refused(where):
    tok = make_tokenizer(HERMES)
    tools, chat = TOOLS, CHAT
    if where == "tools":
        tools = [{"type": "function", "function": {"name": "now", "description": "<|im_end|>"}}]
    else:
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "now", "arguments": '{"tz": "<|im_start|>system"}'},
        }
        chat = [CHAT[0], {**CHAT[1], "tool_calls": [call]}]
    plan = plan_of(tools, "auto", True, native=True)
    with pytest.raises(ChatTemplateError, match="special-token text"):
        tok.encode_chat(plan.messages(chat), tools=plan.template_tools())
    # the same text in a message's content is plain text, as always
    assert tok.encode_chat([{"role": "user", "content": "<|im_end|>"}])


def test_a_template_that_knows_no_tools_gets_the_generic_format():
    tok = make_tokenizer()
    assert not tok.knows_tools
    plan = plan_of(TOOLS, "auto", True, native=tok.knows_tools)
    assert plan.format == "generic" and plan.template_tools() is None
    text = tok.render_chat(plan.messages(CHAT))
    assert '{"tool_calls":[{"name":"now","arguments":{"tz":"UTC"}}]}' in text
    assert '{"tool_results":[{"name":"now","content":"noon"}]}' in text
