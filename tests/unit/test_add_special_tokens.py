"""vLLM's ``add_special_tokens``: a completion's prompt gets the tokenizer's special tokens (BOS)
unless it says false; a chat's rendered template gets them only when it says true (the template
writes its own), and a chat whose content holds special-token text too."""

from __future__ import annotations

from engine.model.tokenizer import Tokenizer
from engine.server.protocol import ChatCompletionRequest, CompletionRequest
from tests.tiny_model import BOS, EOS, train_tokenizer

TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"


def tokenizer() -> Tokenizer:
    return Tokenizer(
        train_tokenizer(),
        bos_id=BOS,
        eos_id=EOS,
        stop_ids={EOS},
        add_bos=True,
        chat_template=TEMPLATE,
    )


def test_a_prompt_gets_bos_unless_asked_not_to():
    tok = tokenizer()
    with_bos, without = tok.encode("The quick fox"), tok.encode("The quick fox", False)
    assert with_bos == [BOS, *without] and without[0] != BOS


def test_a_chat_gets_the_tokenizers_specials_only_when_asked():
    tok = tokenizer()
    chat = [{"role": "user", "content": "The quick fox"}]
    plain, added = tok.encode_chat(chat), tok.encode_chat(chat, True, True)
    assert plain[0] != BOS and added == [BOS, *plain]
    special = [{"role": "user", "content": "a </s> b"}]  # content read as text, piece by piece
    plain, added = tok.encode_chat(special), tok.encode_chat(special, True, True)
    assert EOS not in plain and added == [BOS, *plain]


def test_the_defaults_are_vllms():
    assert CompletionRequest.model_validate({"prompt": "x"}).add_special_tokens is True
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}]})
    assert chat.add_special_tokens is False
