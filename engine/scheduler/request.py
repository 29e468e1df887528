"""Request: one generation, from received to finished, and its stop conditions."""

from __future__ import annotations

import array
import enum
import hashlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine.model.detok import IncrementalDetokenizer
from engine.model.sampling import SamplingParams, make_generator, prompt_logprobs, target_ranks
from engine.observability.tracing import split_trace
from engine.request.messages import StepOutput, TokenLogprobs
from engine.speculative.pace import Pace

if TYPE_CHECKING:
    from engine.guided.masks import Guided
    from engine.memory.radix import TreeNode
    from engine.model.tokenizer import Tokenizer
    from engine.speculative.propose import NgramIndex


class State(enum.Enum):
    WAITING = "waiting"  # in line: holds no memory (a retracted request comes back here)
    RUNNING = "running"  # holds a request row and KV (prefilling or decoding)
    PARKED = "parked"  # mid-prefill, holds its KV, got zero tokens this round; retried next
    FINISHED = "finished"


@dataclass(slots=True)
class Request:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    detok: IncrementalDetokenizer
    stop_ids: frozenset[int]  # tokens that end generation unless ignore_eos
    max_context: int  # prompt + output may not exceed this
    generator: torch.Generator | None = None
    trace_id: str | None = None  # the 32-hex trace id receipts carry
    trace_parent: str | None = None  # W3C traceparent of the span this request's spans go under
    output_ids: list[int] = field(default_factory=list)
    state: State = State.WAITING
    row: int | None = None
    kv_len: int = 0  # tokens whose K/V are in the pool: [0, kv_len)
    cached_len: int = 0  # [0, cached_len) are owned by the prefix cache, locked by this request
    prefix_node: TreeNode | None = None  # the locked node covering [0, cached_len)
    prefill_target: int = 0  # prefill runs until kv_len reaches this (set at admission)
    # positions at the end of [0, kv_len) planned ahead (overlap), their slots taken, not yet run
    ahead: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (first admission)
    parks: int = 0
    retractions: int = 0
    finish_reason: str | None = None
    stop_sequence: str | None = None  # the stop string that ended it (finish "stop"), if one did
    abort_reason: str | None = None  # why the engine or the caller ended it (finish "abort")
    promised: int | None = None  # prompt + max_tokens, checked against the pool up front
    text: str = ""  # output text, stop string removed
    emitted: int = 0  # characters of `text` handed to the caller so far
    arrival: float = field(default_factory=time.monotonic)
    admitted_at: float | None = None
    first_token_time: float | None = None
    guided: Guided | None = None  # its grammar's state, when its output is constrained
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # not yet handed out
    # asked for (``params.prompt_logprobs``): each prompt token's after the first, by position
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    prompt_ranks: list[int | None] | None = None  # each one's rank among all tokens
    prompt_sent: bool = False
    spec: NgramIndex | None = None  # prompt lookup over its text, when it is drafted for
    spec_proposed: int = 0  # drafts funded for it, and those the model kept
    spec_accepted: int = 0
    pace: Pace = field(default_factory=Pace)  # whether its drafts pay

    @classmethod
    def create(
        cls,
        rid: str,
        prompt_ids: list[int],
        params: SamplingParams,
        tokenizer: Tokenizer,
        max_context: int,
        trace: str | None = None,
    ) -> Request:
        """A new request. ``trace``: a W3C traceparent (its spans go under that span; receipts
        carry its trace id) or a bare trace id."""
        trace_id, trace_parent = split_trace(trace)
        return cls(
            rid=rid,
            prompt_ids=list(prompt_ids),
            params=params,
            detok=IncrementalDetokenizer(
                tokenizer, params.skip_special_tokens, params.spaces_between_special_tokens
            ),
            stop_ids=tokenizer.stop_ids,
            max_context=max_context,
            generator=make_generator(params.seed),
            trace_id=trace_id,
            trace_parent=trace_parent,
        )

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def fill_ids(self) -> list[int]:
        """Every token whose K/V the request needs: prompt, then what it generated."""
        return self.prompt_ids + self.output_ids

    @property
    def prefilling(self) -> bool:
        return self.kv_len < self.prefill_target

    def output_hash(self) -> int:
        """Its output tokens as a 32-bit number (blake2b): two boots' answers to the same
        requests compare by the sums of these (a window's control claim)."""
        raw = array.array("q", self.output_ids).tobytes()
        return int.from_bytes(hashlib.blake2b(raw, digest_size=4).digest(), "little")

    def banned_stops(self, ahead: int = 0) -> list[int]:
        """Stop tokens it may not sample yet (``ahead``: after that many more tokens): none may
        end it before ``min_tokens``."""
        p = self.params
        if len(self.output_ids) + ahead >= p.min_tokens or p.ignore_eos:
            return []
        return sorted(set(self.stop_ids) | set(p.stop_token_ids or ()))

    def last_ahead(self) -> bool:
        """Whether the token the forward in flight samples for it is its last for certain (its
        ``max_tokens``, or the context's end), so no step is planned for it beside that one."""
        made = len(self.output_ids) + 1
        return made >= self.params.max_tokens or self.prompt_len + made >= self.max_context

    def append_token(self, tid: int) -> None:
        """Record one sampled token and decide whether the request is done."""
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        self.output_ids.append(tid)
        p = self.params
        is_stop = tid in self.stop_ids or (p.stop_token_ids is not None and tid in p.stop_token_ids)
        if is_stop and not p.ignore_eos:
            self.detok.flush()
            self.text = self.detok.text
            self.finish_reason = "stop"
            return
        before = len(self.text)
        self.detok.push(tid)
        self.text = self.detok.text
        stops = p.stop_strings
        # like stop tokens, stop strings cannot end a request before min_tokens
        if stops and len(self.output_ids) >= p.min_tokens:
            # only a stop string that ends in the text this token added can be new
            hits = [
                (i, s) for s in stops if (i := self.text.find(s, max(0, before - len(s) + 1))) >= 0
            ]
            if hits:
                i, s = min(hits, key=lambda h: h[0])  # the earliest (the first listed of a tie)
                self.text = self.text[: i + len(s) if p.include_stop_str_in_output else i]
                self.finish_reason, self.stop_sequence = "stop", s
                return
        if (
            len(self.output_ids) >= p.max_tokens
            or self.prompt_len + len(self.output_ids) >= self.max_context
        ):
            self.detok.flush()
            self.text = self.detok.text
            self.finish_reason = "length"

    def output(self, tokens: list[int]) -> StepOutput:
        """This step's output: ``tokens`` and the text they made showable. A finished request's
        output is its final one, with its finish reason, parks and retractions."""
        done = self.state is State.FINISHED
        scored = self.take_prompt_logprobs()
        return StepOutput(
            rid=self.rid,
            new_token_ids=tokens,
            text_delta=self.take_text_delta(),
            finished=done,
            finish_reason=self.finish_reason if done else None,
            stop_sequence=self.stop_sequence if done else None,
            cached_tokens=self.cached_tokens,
            abort_reason=self.abort_reason if done else None,
            parks=self.parks if done else 0,
            retractions=self.retractions if done else 0,
            logprobs=self.take_logprobs(),
            prompt_logprobs=None if scored is None else scored[0],
            prompt_ranks=None if scored is None else scored[1],
        )

    def scores_prompt(self, start: int) -> bool:
        """Whether a chunk from position ``start`` needs its logits at every position: the
        prompt's logprobs were asked for, and it predicts prompt tokens (position p predicts
        token p + 1)."""
        wanted = self.params.prompt_logprobs is not None and not self.prompt_sent
        return wanted and start < self.prompt_len - 1

    def score_prompt(self, start: int, logits: torch.Tensor) -> None:
        """Keep the logprobs of the prompt tokens that ``logits`` (a chunk's, from position
        ``start``) predict; a chunk computed again (after a retraction) writes the same."""
        if self.prompt_logprobs is None or self.prompt_ranks is None:
            self.prompt_logprobs = [None] * (self.prompt_len - 1)
            self.prompt_ranks = [None] * (self.prompt_len - 1)
        end = min(start + len(logits), self.prompt_len - 1)
        targets = self.prompt_ids[start + 1 : end + 1]
        rows = logits[: end - start]
        scored = prompt_logprobs(rows, targets, self.params.prompt_logprobs or 0)
        self.prompt_logprobs[start:end] = scored
        self.prompt_ranks[start:end] = target_ranks(rows, targets)

    def take_prompt_logprobs(self) -> tuple[list[TokenLogprobs], list[int]] | None:
        """The prompt's logprobs and their ranks, once, with the first output that follows."""
        if self.params.prompt_logprobs is None or self.prompt_sent or not self.output_ids:
            return None
        self.prompt_sent = True
        ranks = [r for r in self.prompt_ranks or () if r is not None]
        return [e for e in self.prompt_logprobs or () if e is not None], ranks

    def take_logprobs(self) -> list[TokenLogprobs] | None:
        if self.params.logprobs is None:
            return None
        out, self.logprobs = self.logprobs, []
        return out

    def timing(self, now: float) -> dict[str, float | None]:
        """Seconds in line, to the first token, and end to end, as the ending receipt has them."""
        first = self.first_token_time
        return {
            "queue_s": round((self.admitted_at or now) - self.arrival, 6),
            "ttft_s": None if first is None else round(first - self.arrival, 6),
            "e2e_s": round(now - self.arrival, 6),
        }

    def take_text_delta(self) -> str:
        """Text that can be shown now. While running, a tail that could still become a stop
        string is held back, so a streamed stop string is never half-shown."""
        hold = 0
        if self.finish_reason is None and self.params.stop_strings:
            hold = max(len(s) for s in self.params.stop_strings) - 1
        end = max(self.emitted, len(self.text) - hold)
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta
