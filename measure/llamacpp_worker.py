"""llama.cpp's arm of `engine bench --table`, run as a script by the interpreter of its own
environment (build/llamacpp-venv: llama-cpp-python and numpy, no torch, no Attest). The engine
never imports it; measure/llamacpp.py starts it and speaks to it one JSON object a line:
stdin carries requests, stdout their answers.

    {"op": "load", "model": PATH, "threads": N, "flash_attn": true}  ->  {"vocab": N, ...}
    {"op": "generate", "prompts": [[ids], ...], "new": N}  ->  {"seconds": s, "tokens": [[ids]]}
    {"op": "lookup", "prompt": [ids], "new": N, "draft": K}  ->  {"seconds": s, "tokens": [ids]}
    {"op": "quit"}

It drives llama.cpp's batched low-level API the way a serving engine would: one sequence id per
stream, the KV cache split into one stream per sequence (``kv_unified`` off, so a sequence's
attention reads its own cells, not every stream's), each prompt prefilled by its own
``llama_decode`` (logits for its last token only), then one ``llama_decode`` per step carrying one
token per stream, the next token the argmax of that stream's logits row. ``seconds`` times
exactly that, from the first prefill to the last argmax; clearing the KV cache comes before.

``lookup`` is llama-cpp-python's own speculative path, one stream: its high-level ``Llama`` with
``LlamaPromptLookupDecoding`` as the draft model (``draft`` tokens proposed a step, its default
bigram match; 0: no draft model), greedy, until the model's end of text or ``new`` tokens.
``seconds`` times the decode only: from the first token out to the last, so a rate is
(tokens - 1) / seconds, as the engine's own receipts give it.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time

import llama_cpp as ll
import numpy as np

PREFILL = "per stream: one llama_decode per prompt, logits for its last token only"
KV = "one KV stream per sequence (kv_unified off)"


@ll.llama_log_callback
def _errors_only(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    if level == 3:  # GGML_LOG_LEVEL_ERROR; llama.cpp's info lines would bury the answer
        sys.stderr.write(text.decode("utf-8", "replace"))


class Runner:
    """The model once; a context per shape (streams, cells per stream), rebuilt when it changes,
    so the KV cache holds every stream in full and nothing else."""

    def __init__(self, model: str, threads: int, flash_attn: bool) -> None:
        ll.llama_log_set(_errors_only, ctypes.c_void_p(0))
        ll.llama_backend_init()
        self.model = ll.llama_model_load_from_file(model.encode(), ll.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {model}")
        self.vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(self.model))
        self.threads, self.flash_attn = threads, flash_attn
        self.ctx, self.batch, self.shape = None, None, (0, 0, 0)
        self.path, self.high = model, {}  # lookup's Llama objects, by draft tokens

    def lookup(self, prompt: list[int], new: int, draft: int) -> tuple[float, list[int]]:
        if draft not in self.high:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            drafter = LlamaPromptLookupDecoding(num_pred_tokens=draft) if draft else None
            self.high[draft] = ll.Llama(
                self.path,
                n_ctx=4096,
                n_threads=self.threads,
                n_threads_batch=self.threads,
                draft_model=drafter,
                flash_attn=self.flash_attn,
                verbose=False,
            )
        llm = self.high[draft]
        out: list[int] = []
        first = last = 0.0
        for tok in llm.generate(prompt, temp=0.0, reset=True):
            if tok == llm.token_eos():
                break
            last = time.perf_counter()
            first = first or last
            out.append(tok)
            if len(out) == new:
                break
        return last - first, out

    def _context(self, streams: int, cells: int, batch: int) -> None:
        shape = (streams, cells, batch)
        if self.ctx is not None and shape == self.shape:
            ll.llama_memory_clear(ll.llama_get_memory(self.ctx), True)
            return
        self._free()
        p = ll.llama_context_default_params()
        p.n_seq_max, p.n_ctx = streams, streams * cells
        p.n_batch = p.n_ubatch = batch  # a whole prompt, or a whole step, in one pass
        p.n_threads = p.n_threads_batch = self.threads
        p.kv_unified = False
        p.flash_attn_type = (
            ll.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if self.flash_attn
            else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        p.no_perf = True
        self.ctx = ll.llama_init_from_model(self.model, p)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not make a context of {streams} x {cells} cells")
        self.batch, self.shape = ll.llama_batch_init(batch, 0, 1), shape

    def _free(self) -> None:
        if self.ctx is not None:
            ll.llama_batch_free(self.batch)
            ll.llama_free(self.ctx)
            self.ctx = None

    def _decode(self, rows: list[tuple[int, int, int, bool]]) -> np.ndarray:
        """One llama_decode of (token, position, sequence, wants logits) rows; the argmax of
        each logits row asked for, in the order asked."""
        b = self.batch
        for k, (tok, pos, seq, out) in enumerate(rows):
            b.token[k], b.pos[k], b.n_seq_id[k], b.logits[k] = tok, pos, 1, out
            b.seq_id[k][0] = seq
        b.n_tokens = len(rows)
        rc = ll.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} for {len(rows)} tokens")
        wanted = sum(r[3] for r in rows)
        logits = np.ctypeslib.as_array(ll.llama_get_logits(self.ctx), shape=(wanted, self.vocab))
        return logits.argmax(axis=1)

    def generate(self, prompts: list[list[int]], new: int) -> tuple[float, list[list[int]]]:
        n, longest = len(prompts), max(map(len, prompts))
        cells = -(-(longest + new) // 256) * 256  # fixed steps: warm-up and runs share a context
        self._context(n, cells, max(n, longest))
        t = time.perf_counter()
        nxt = [
            int(self._decode([(tok, i, s, i == len(p) - 1) for i, tok in enumerate(p)])[0])
            for s, p in enumerate(prompts)
        ]
        out = [[tok] for tok in nxt]
        for step in range(new - 1):
            rows = [(nxt[s], len(p) + step, s, True) for s, p in enumerate(prompts)]
            nxt = self._decode(rows).tolist()
            for s, tok in enumerate(nxt):
                out[s].append(tok)
        return time.perf_counter() - t, out


def main() -> None:
    runner = None
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "load":
            runner = Runner(req["model"], req["threads"], req["flash_attn"])
            ans = {
                "version": ll.__version__,
                "prefill": PREFILL,
                "kv": KV,
                "vocab": runner.vocab,
                "system": ll.llama_print_system_info().decode().strip(),
            }
        elif req["op"] == "generate":
            seconds, tokens = runner.generate(req["prompts"], req["new"])
            ans = {"seconds": seconds, "tokens": tokens}
        elif req["op"] == "lookup":
            seconds, tokens = runner.lookup(req["prompt"], req["new"], req["draft"])
            ans = {"seconds": seconds, "tokens": tokens}
        else:
            break
        sys.stdout.write(json.dumps(ans) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
