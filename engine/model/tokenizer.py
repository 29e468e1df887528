"""Tokenizer: Hugging Face `tokenizers`, from tokenizer.json or built from GGUF metadata."""

from __future__ import annotations

import json
import re
from functools import cached_property
from pathlib import Path
from typing import Any

from engine.model.chat import (
    CHATML_TEMPLATE,
    ChatRender,
    ChatTemplateError,
    knows_tools,
    normalize_messages,
    render_chat,
)

# Token texts that end a turn in common chat templates; each is a stop token when the model's
# vocabulary has it *and* its template uses it.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>")

# Pre-tokenizer split rules by GGUF `tokenizer.ggml.pre`, as llama.cpp defines them.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# pre type -> list of split regexes applied in order (each isolates its matches)
_PRE_SPLITS: dict[str, list[str]] = {
    "default": [_GPT2_SPLIT],
    "gpt-2": [_GPT2_SPLIT],
    "gpt2": [_GPT2_SPLIT],
    # starcoder-lineage vocabularies (SmolLM among them) split every digit on its own first
    "smollm": [r"\p{N}", _GPT2_SPLIT],
    "starcoder": [r"\p{N}", _GPT2_SPLIT],
    "refact": [r"\p{N}", _GPT2_SPLIT],
    "llama-bpe": [_LLAMA3_SPLIT],
    "llama3": [_LLAMA3_SPLIT],
    "smaug-bpe": [_LLAMA3_SPLIT],
    "qwen2": [_QWEN2_SPLIT],
}


class Tokenizer:
    def __init__(
        self,
        backend: Any,
        *,
        bos_id: int | None,
        eos_id: int | None,
        stop_ids: set[int],
        add_bos: bool,
        chat_template: str | None,
        post_processor_specials: bool = False,
    ) -> None:
        self.backend = backend
        # tokenizer.json files add BOS (and friends) in their own post-processor
        self.post_processor_specials = post_processor_specials
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.stop_ids = frozenset(stop_ids)
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)

    def token_text(self, tid: int | None) -> str:
        return "" if tid is None else (self.backend.id_to_token(tid) or "")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # encode_batch, unlike encode, releases the GIL: the server tokenizes in a worker thread
        ids = self.backend.encode_batch(
            [text], add_special_tokens=add_special_tokens and self.post_processor_specials
        )[0].ids
        if add_special_tokens and self.add_bos and self.bos_id is not None:
            if not ids or ids[0] != self.bos_id:
                ids = [self.bos_id, *ids]
        return ids

    @cached_property
    def added_tokens(self) -> dict[int, str]:
        """The added tokens (the special ones among them), id -> text."""
        return {i: t.content for i, t in self.backend.get_added_tokens_decoder().items()}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        render: ChatRender | None = None,
    ) -> str:
        render = render or ChatRender()
        return render_chat(
            self.chat_template or CHATML_TEMPLATE,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.token_text(self.bos_id),
            eos_token=self.token_text(self.eos_id),
            tools=tools,
            continue_final=render.continue_final,
            extra=render.extra,
        )

    @property
    def knows_tools(self) -> bool:
        """Whether the model's template renders tools (Hermes/Qwen ``<tool_call>`` blocks)."""
        return knows_tools(self.chat_template)

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        add_special_tokens: bool = False,
        tools: list[dict[str, Any]] | None = None,
        render: ChatRender | None = None,
    ) -> list[int]:
        """The chat's token ids. Only the template makes special tokens: a message's content is
        text, and special-token text in it is tokenized as the plain characters it is (it can
        never close a turn or open a system one). The template writes BOS itself when the model
        wants one; ``add_special_tokens`` (vLLM's) adds the tokenizer's own on top of it;
        ``render``: the last message left open, the template's extra variables."""
        messages = normalize_messages(messages)
        text = self.render_chat(messages, add_generation_prompt, tools, render)
        # what a template writes besides content (tools, earlier calls) has no way to be plain
        for i, m in enumerate(messages):
            if m.get("tool_calls") and self._special_text(
                json.dumps(m["tool_calls"], ensure_ascii=False)
            ):
                raise ChatTemplateError(f"messages[{i}].tool_calls holds special-token text")
        if tools and self._special_text(json.dumps(tools, ensure_ascii=False)):
            raise ChatTemplateError("tools hold special-token text")
        if not any(self._special_text(m["content"]) for m in messages):
            return self.encode(text, add_special_tokens)  # the common case, unchanged
        ids = self._encode_content_as_text(messages, add_generation_prompt, text, tools, render)
        if add_special_tokens and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id, *ids] if not ids or ids[0] != self.bos_id else ids
        return ids

    @cached_property
    def _specials(self) -> re.Pattern[str] | None:
        """The special tokens' texts, as one pattern (None: the vocabulary has none)."""
        texts = [t.content for t in self.backend.get_added_tokens_decoder().values() if t.special]
        texts.sort(key=len, reverse=True)
        return re.compile("|".join(map(re.escape, texts))) if texts else None

    @cached_property
    def _as_text(self) -> Any:
        """A copy of the backend that reads special-token text as plain characters."""
        from tokenizers import Tokenizer as HFTokenizer

        plain = HFTokenizer.from_str(self.backend.to_str())
        plain.encode_special_tokens = True
        return plain

    def _special_text(self, text: str) -> bool:
        return self._specials is not None and self._specials.search(text) is not None

    def _encode_content_as_text(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        text: str,
        tools: list[dict[str, Any]] | None = None,
        render: ChatRender | None = None,
    ) -> list[int]:
        """The template rendered with a marker for each message's content; the template's own
        text is tokenized with its special tokens, each content as plain text. A template that
        does not take content verbatim cannot be split so: refused, naming the message."""
        for i, m in enumerate(messages):
            if self._special_text(m["role"]):
                raise ChatTemplateError(f"messages[{i}].role holds special-token text")
        marked = [{**m, "content": f"\ue000{i}\ue001"} for i, m in enumerate(messages)]
        pieces = re.split(
            "\ue000(\\d+)\ue001", self.render_chat(marked, add_generation_prompt, tools, render)
        )
        contents = [messages[int(k)]["content"] for k in pieces[1::2]]
        if "".join(p for pair in zip(pieces[::2], [*contents, ""]) for p in pair) != text:
            first = next(i for i, m in enumerate(messages) if self._special_text(m["content"]))
            raise ChatTemplateError(
                f"messages[{first}].content holds special-token text, and this model's chat "
                "template does not take message content verbatim: send it without them"
            )
        ids: list[int] = []
        for j, piece in enumerate(pieces):
            if j % 2:
                ids += self._as_text.encode(contents[j // 2], add_special_tokens=False).ids
            elif piece:
                ids += self.encode(piece, add_special_tokens=False)
        return ids

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any]) -> Tokenizer:
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(
                f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2'); "
                "load the model from a Hugging Face folder with tokenizer.json instead"
            )
        tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
        types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
        vocab = {t: i for i, t in enumerate(tokens)}
        tk = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        pre = str(meta.get("tokenizer.ggml.pre", "default"))
        splits = _PRE_SPLITS.get(pre)
        if splits is None:
            raise ValueError(
                f"GGUF pre-tokenizer {pre!r} is not known; known: {', '.join(sorted(_PRE_SPLITS))}"
            )
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(s), behavior="isolated") for s in splits]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        tk.decoder = decoders.ByteLevel()
        # 3 = CONTROL (special, skipped on decode), 4 = USER_DEFINED (matched whole, kept).
        tk.add_special_tokens(
            [
                AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types)
                if ty == 3
            ]
        )
        tk.add_tokens(
            [
                AddedToken(t, special=False, normalized=False)
                for t, ty in zip(tokens, types)
                if ty == 4
            ]
        )
        template = meta.get("tokenizer.chat_template")
        bos = meta.get("tokenizer.ggml.bos_token_id")
        eos = meta.get("tokenizer.ggml.eos_token_id")
        stops = {int(eos)} if eos is not None else set()
        for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
            if meta.get(key) is not None:
                stops.add(int(meta[key]))
        stops |= _template_stop_ids(template, vocab)
        return cls(
            tk,
            bos_id=None if bos is None else int(bos),
            eos_id=None if eos is None else int(eos),
            stop_ids=stops,
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            chat_template=template,
        )

    @classmethod
    def from_hf_folder(cls, folder: str | Path) -> Tokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{folder} has no tokenizer.json")
        tk = HFTokenizer.from_file(str(path))
        tk.no_padding()
        tk.no_truncation()
        conf = _read_json(folder / "tokenizer_config.json")
        gen = _read_json(folder / "generation_config.json")
        model_conf = _read_json(folder / "config.json")
        template = conf.get("chat_template")
        if (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text()
        if isinstance(template, list):  # named templates: take the default
            template = next((t["template"] for t in template if t.get("name") == "default"), None)

        def token_id(key: str, *fallbacks: Any) -> int | None:
            val = conf.get(key)
            if isinstance(val, dict):
                val = val.get("content")
            if isinstance(val, str):
                tid = tk.token_to_id(val)
                if tid is not None:
                    return tid
            for f in fallbacks:
                if isinstance(f, list):
                    f = f[0] if f else None
                if isinstance(f, int):
                    return f
            return None

        bos = token_id("bos_token", gen.get("bos_token_id"), model_conf.get("bos_token_id"))
        eos = token_id("eos_token", gen.get("eos_token_id"), model_conf.get("eos_token_id"))
        stops = {eos} if eos is not None else set()
        for src in (gen.get("eos_token_id"), model_conf.get("eos_token_id")):
            if isinstance(src, int):
                stops.add(src)
            elif isinstance(src, list):
                stops |= {int(x) for x in src}
        stops |= _template_stop_ids(template, tk.get_vocab(with_added_tokens=True))
        return cls(
            tk,
            bos_id=bos,
            eos_id=eos,
            stop_ids=stops,
            add_bos=False,
            chat_template=template,
            post_processor_specials=True,
        )


def _template_stop_ids(template: str | None, vocab: dict[str, int]) -> set[int]:
    if not template:
        return set()
    return {vocab[t] for t in END_OF_TURN_TOKENS if t in template and t in vocab}


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}
