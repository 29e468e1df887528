"""The offline API: ``LLM(...).generate`` and ``.chat`` over the scheduler core."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from engine.config import EngineConfig
from engine.core.group_boot import boot
from engine.model.sampling import SamplingParams
from engine.observability.tracing import Tracing
from engine.request.messages import Cutover, TokenLogprobs


@dataclass(slots=True)
class RequestOutput:
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int  # count, as in OpenAI's usage
    prompt_token_ids: list[int]
    # SamplingParams.logprobs asked: (token, logprob, the most likely (id, logprob)) per token
    logprobs: list[TokenLogprobs] | None = None
    prompt_logprobs: list[TokenLogprobs] | None = None  # asked: each prompt token's after the first
    prompt_ranks: list[int] | None = None  # ... and each one's rank among all tokens (1: first)


class LLM:
    """``LLM(model=None, **engine_config)``: ``model`` is a GGUF file or a Hugging Face folder;
    None loads the default model. Keyword options are EngineConfig's flat names, its
    sections' fields (``tp=2``: two ranks, this process rank 0); ``tracing``: request spans
    (``engine.observability.tracing``). A group that fails (a split, a rank lost) raises
    ``GroupFailure`` from ``generate`` once its receipts are written."""

    def __init__(
        self, model: str | None = None, *, tracing: Tracing | None = None, **config: Any
    ) -> None:
        self.config = EngineConfig.from_kwargs(model=model, **config)
        self.core = boot(self.config, tracing=tracing)  # with tp > 1, rank 0 of its group
        self.tokenizer = self.core.tokenizer

    def close(self, reason: str = "closed") -> None:
        """End the engine's boot: in-flight requests abort, ``boot.stop`` is written."""
        self.core.shutdown(reason)

    def cutover(
        self,
        kind: str,
        mode: str = "carry",
        path: str | None = None,
        kv_tokens: int | None = None,
        promises: str = "refuse",
        tp: int | None = None,
        pp: int | None = None,
    ) -> dict[str, Any]:
        """A live change of weights (``path``), pool size (``kv_tokens``) or a group's layout
        (``tp`` x ``pp``, the same ranks), ``mode`` drain or carry (``engine/core/cutover.py``); steps the engine until it has ended. ``promises``:
        ``"cap"`` lowers the max_tokens of promised requests a smaller pool would break
        (``"refuse"``: the cutover is refused). Returns its ``cutover.end`` fields; a refused
        cutover raises ValueError, one past ``cutover_timeout`` TimeoutError, a failed one
        RuntimeError, each with the reason (and changed nothing)."""
        ask = Cutover(
            kind=kind, mode=mode, path=path, kv_tokens=kv_tokens, promises=promises, tp=tp, pp=pp
        )
        fields = self.core.cutovers.run(ask)
        raises = {"rejected": ValueError, "timeout": TimeoutError, "failed": RuntimeError}
        if (error := raises.get(fields["outcome"])) is not None:
            raise error(fields["reason"])
        return fields

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(
        self,
        prompts: list[str] | list[list[int]] | str,
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        if isinstance(prompts, str):
            prompts = [prompts]
        ids = [p if isinstance(p, list) else self.tokenizer.encode(p) for p in prompts]
        return self._run(ids, params)

    def chat(
        self,
        conversations: list[list[dict[str, Any]]],
        params: SamplingParams | list[SamplingParams] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # one conversation given bare
        ids = [self.tokenizer.encode_chat(c, add_generation_prompt) for c in conversations]
        return self._run(ids, params)

    def checkpoint(
        self,
        prompt: list[int] | list[dict[str, Any]] | str,
        id: str | None = None,  # noqa: A002 (the API's own name)
    ) -> dict[str, Any]:
        """Pin a conversation's KV in the durable store (``--kv-store-dir``): ``prompt`` token
        ids, text, or a chat's messages (rendered without a generation prompt, so the next
        turn's prompt begins with them). Its prompt runs first (one token); then its whole
        pages are written and pinned. Returns ``{"id", "tokens", "pinned_bytes",
        "shared_bytes", ...}``; raises ``engine.tiers.checkpoints.CheckpointError``."""
        from engine.tiers import checkpoints

        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, True)
        elif prompt and isinstance(prompt[0], dict):
            ids = self.tokenizer.encode_chat(prompt, False)
        else:
            ids = list(prompt)  # type: ignore[arg-type]
        checkpoints.check_id(id)
        self._run([ids], checkpoints.prefill())
        return checkpoints.create(self.core, ids, id)

    def checkpoints(self) -> dict[str, Any]:
        """The store's checkpoints and its numbers (``used``, ``pinned``, ``reclaimable``)."""
        from engine.tiers import checkpoints

        return checkpoints.listing(self.core)

    def delete_checkpoint(self, id: str) -> dict[str, Any]:  # noqa: A002
        from engine.tiers import checkpoints

        return checkpoints.delete(self.core, id)

    def stream(self, prompt_ids: list[int], params: SamplingParams | None = None) -> Iterator[str]:
        """Text deltas of one request as they are generated."""
        sched = self.core.scheduler
        req = sched.add_request(prompt_ids, params or SamplingParams())
        while True:
            for out in self.core.step():
                if out.rid == req.rid:
                    if out.text_delta:
                        yield out.text_delta
                    if out.finished:
                        return

    def _run(
        self, ids: list[list[int]], params: SamplingParams | list[SamplingParams] | None
    ) -> list[RequestOutput]:
        if params is None:
            params = SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(ids)
        if len(plist) != len(ids):
            raise ValueError(f"{len(ids)} prompts but {len(plist)} sampling params")
        sched = self.core.scheduler
        reqs = []
        try:
            for p_ids, p in zip(ids, plist):
                reqs.append(sched.add_request(p_ids, p))
        except Exception:
            for r in reqs:
                sched.abort(r.rid)
            raise
        pending = {r.rid for r in reqs}
        logprobs: dict[str, list[TokenLogprobs]] = {r.rid: [] for r in reqs}
        prompt: dict[str, list[TokenLogprobs]] = {}
        ranks: dict[str, list[int] | None] = {}
        while pending:
            for out in self.core.step():
                if out.logprobs and out.rid in logprobs:
                    logprobs[out.rid] += out.logprobs
                if out.prompt_logprobs is not None:
                    prompt[out.rid] = out.prompt_logprobs
                    ranks[out.rid] = out.prompt_ranks
                if out.finished:
                    pending.discard(out.rid)
        return [
            RequestOutput(
                text=r.text,
                token_ids=list(r.output_ids),
                finish_reason=r.finish_reason or "abort",
                prompt_tokens=r.prompt_len,
                prompt_token_ids=list(r.prompt_ids),
                logprobs=logprobs[r.rid] if r.params.logprobs is not None else None,
                prompt_logprobs=prompt.get(r.rid),
                prompt_ranks=ranks.get(r.rid),
            )
            for r in reqs
        ]
