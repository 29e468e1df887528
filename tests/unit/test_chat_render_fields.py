"""vLLM's chat render fields, torch-free: ``continue_final_message`` leaves the last message's
turn open (the prompt ends with its text, also where the template trims it, and where its
content holds special-token text and is tokenized as text); ``chat_template_kwargs`` are
variables the template reads, never the template's own; the two generation-prompt fields
conflict as vLLM has it. And the logprobs' ``token_id:N`` names and vLLM's prompt_logprobs."""

from __future__ import annotations

import pytest

from engine.model.chat import ChatRender, ChatTemplateError, render_chat
from engine.server.errors import ProtocolError
from engine.server.logprobs import LogprobsWriter, prompt_logprobs
from engine.server.protocol import ChatCompletionRequest
from tests.unit.test_detok_and_request import make_tokenizer
from tests.unit.test_logprobs_shapes import ENTRIES, Texts

CHAT = [{"role": "user", "content": "Tell a tale."}, {"role": "assistant", "content": "Once upon"}]
STRIPS = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] | trim }}</s>{% endfor %}"


def test_a_continued_message_ends_the_prompt_with_its_text():
    tok = make_tokenizer()
    closed = tok.render_chat(CHAT, False)
    left = tok.render_chat(CHAT, False, None, ChatRender(continue_final=True))
    assert closed.startswith(left) and left.endswith("Once upon") and closed != left
    trimmed = [CHAT[0], {"role": "assistant", "content": "  Once upon  "}]
    text = render_chat(STRIPS, trimmed, continue_final=True)
    assert text.endswith("[assistant] Once upon")  # the template trimmed it: cut where it ends
    special = [CHAT[0], {"role": "assistant", "content": "Once <|im_end|> upon"}]
    ids = tok.encode_chat(special, False, False, None, ChatRender(continue_final=True))
    assert tok.decode(ids, skip_special_tokens=False).endswith("Once <|im_end|> upon")
    with pytest.raises(ChatTemplateError) as e:
        render_chat(STRIPS, [{"role": "assistant", "content": " "}], continue_final=True)
    assert e.value.param == "continue_final_message"


def test_template_kwargs_are_variables_the_template_reads():
    template = "{{ messages[0]['content'] }}|{{ mood | default('none') }}"
    assert render_chat(template, CHAT, extra={"mood": "glad"}) == "Tell a tale.|glad"
    assert render_chat(template, CHAT) == "Tell a tale.|none"


@pytest.mark.parametrize("name", ["messages", "tools", "add_generation_prompt", "bos_token"])
def test_template_kwargs_may_not_stand_in_for_the_templates_own(name):
    req = ChatCompletionRequest(messages=CHAT, chat_template_kwargs={name: 1})
    with pytest.raises(ProtocolError) as e:
        req.render()
    assert e.value.param == f"chat_template_kwargs.{name}"


def test_continue_final_message_opens_no_turn_and_conflicts_with_one_asked():
    opened, render = ChatCompletionRequest(messages=CHAT, continue_final_message=True).render()
    assert not opened and render.continue_final
    both = ChatCompletionRequest(
        messages=CHAT, continue_final_message=True, add_generation_prompt=True
    )
    with pytest.raises(ProtocolError) as e:
        both.render()
    assert e.value.param == "continue_final_message"


def test_echo_is_the_last_message_when_it_is_the_assistants():
    assert ChatCompletionRequest(messages=CHAT, echo=True).echoed() == "Once upon"
    assert ChatCompletionRequest(messages=CHAT[:1], echo=True).echoed() == ""
    assert ChatCompletionRequest(messages=CHAT).echoed() == ""


def test_tokens_as_token_ids_in_both_apis():
    chat = LogprobsWriter("chat", Texts(), 1, as_ids=True).of(0, ENTRIES)["content"]
    assert [c["token"] for c in chat] == ["token_id:1", "token_id:4"]
    assert chat[0]["bytes"] == list(b"Hel")  # the token's text's bytes, as vLLM keeps them
    assert [t["token"] for t in chat[1]["top_logprobs"]] == ["token_id:3", "token_id:4"]
    text = LogprobsWriter("text", Texts(), 1, as_ids=True).of(0, ENTRIES)
    assert text["tokens"] == ["token_id:1", "token_id:4"] and text["text_offset"] == [0, 3]
    assert list(text["top_logprobs"][0]) == ["token_id:1", "token_id:2"]


def test_prompt_logprobs_as_vllm_writes_them():
    out = prompt_logprobs(ENTRIES, [1, 7], Texts(), 1)
    assert out[0] is None and len(out) == 3
    assert out[1] == {"1": {"logprob": -0.5, "rank": 1, "decoded_token": "Hel"}}
    assert out[2]["4"] == {"logprob": -9999.0, "rank": 7, "decoded_token": "\ufffd"}
    assert out[2]["3"]["rank"] == 1
    assert prompt_logprobs(ENTRIES, [1, 7], Texts(), 0)[2] == {"4": out[2]["4"]}


def test_an_echo_keeps_its_own_count_when_prompt_logprobs_ask_for_more():
    w = LogprobsWriter("text", Texts(), 1, prompt=[1, 2], top=1)
    obj = w.of(0, [], [(2, -1.5, ((1, -0.7), (2, -1.5), (3, -2.0)))])  # scored with 3
    assert obj["top_logprobs"] == [None, {"Hel": -0.7}]
