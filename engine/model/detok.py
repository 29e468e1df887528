"""Incremental detokenization: text deltas that never split a multi-byte character."""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

from engine.model.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Decodes a growing list of ids into a growing string.

    Byte-level BPE can split one character over several tokens; a window that decodes to a
    trailing U+FFFD is held back until the next token completes it. That window is the
    tokenizers library's ``DecodeStream`` (the same two decodes of a window a token, in the
    library, without a Python list of ids made for each); the windows here in Python serve
    where special tokens are shown without spaces between them, which it does not know.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self.tok = tokenizer
        self.skip = skip_special_tokens  # special tokens' text left out (as decode does)
        # vLLM's false, with special tokens shown: an added token right after another is its
        # own text, without the space a decoder (WordPiece, say) would put before it
        self._added = (
            {} if skip_special_tokens or spaces_between_special_tokens else (tokenizer.added_tokens)
        )
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0  # start of the window decoded for context
        self._read = 0  # ids before this are already in self.text
        self._stream = None if self._added else DecodeStream(skip_special_tokens=self.skip)

    def push(self, tid: int) -> str:
        """Add one id; return the newly completed text (possibly empty)."""
        self.ids.append(tid)
        if self._stream is not None:
            delta = self._stream.step(self.tok.backend, tid) or ""
            self.text += delta
            return delta
        prefix_text = self.tok.decode(self.ids[self._prefix : self._read], self.skip)
        full = self.tok.decode(self.ids[self._prefix :], self.skip)
        if full.endswith("\ufffd") or len(full) <= len(prefix_text):
            return ""
        delta = full[len(prefix_text) :]
        if tid in self._added and len(self.ids) > 1 and self.ids[-2] in self._added:
            delta = self._added[tid]
        self._prefix, self._read = self._read, len(self.ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of a request: whatever is still held back (a truly invalid byte sequence)."""
        if self._stream is not None:  # what the whole decodes to past the text shown
            whole = self.tok.decode(self.ids, self.skip)
            delta = whole[len(self.text) :] if whole.startswith(self.text) else ""
            self.text += delta
            return delta
        full = self.tok.decode(self.ids[self._prefix :], self.skip)
        prefix_text = self.tok.decode(self.ids[self._prefix : self._read], self.skip)
        delta = full[len(prefix_text) :] if len(full) > len(prefix_text) else ""
        self._prefix = self._read = len(self.ids)
        self.text += delta
        return delta
