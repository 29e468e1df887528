"""Incremental detokenization: text deltas that never split a multi-byte character."""

from __future__ import annotations

from engine.model.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Decodes a growing list of ids into a growing string.

    Byte-level BPE can split one character over several tokens; a window that decodes to a
    trailing U+FFFD is held back until the next token completes it.
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

    def push(self, tid: int) -> str:
        """Add one id; return the newly completed text (possibly empty)."""
        self.ids.append(tid)
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
        full = self.tok.decode(self.ids[self._prefix :], self.skip)
        prefix_text = self.tok.decode(self.ids[self._prefix : self._read], self.skip)
        delta = full[len(prefix_text) :] if len(full) > len(prefix_text) else ""
        self._prefix = self._read = len(self.ids)
        self.text += delta
        return delta
