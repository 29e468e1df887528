"""The completion service: one /v1/completions or /v1/chat/completions request from its body to
its response (parse, prompt checks, tokenizing, the job in the scheduler, the response).

Nothing a request sends can hold the event loop: the body is read within a time limit, a prompt
too long for the context is refused on its character count before any tokenizing, and the work
that grows with what a request sends (its tools' and schema's checks, the chat template, the
tokenizer) runs in a worker thread within ``--check-timeout`` (``off_loop``), over guides bounded
in size (``engine.request.guide.MAX_GUIDE_BYTES``, checked before anything parses them further), so a
1 MB schema or a 4 MB prompt costs its own client its wait and nobody else a stall.

A thread, not a process: with the size bound the worst check measured is about 0.3 s
(BENCHMARKS.md), so a worker that cannot be killed still ends soon; the tokenizer releases the
GIL, and the schema's meta-schema check is Rust, so what holds the GIL is short slices of the
keyword walk and the template, which the loop shares every 5 ms (``sys.getswitchinterval``). A
process would add the schema's pickling both ways and a process of memory to every check.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from engine.guided.tools import ToolPlan, history, plan_of
from engine.model.chat import ChatTemplateError, normalize_messages, tool_turns
from engine.observability import tracing as tr
from engine.observability.metrics import ServerMetrics
from engine.request.guide import Guide, GuideError
from engine.request.messages import PrepareGuide, TokenLogprobs
from engine.request.prompt import PromptError, check_chars, check_prompt, longest_token_chars
from engine.request.sampling_params import SamplingParams
from engine.server.driver import EngineDriver
from engine.server.errors import ProtocolError, validation_error
from engine.server.job import Job, JobFailed
from engine.server.limits import HttpLimits, read_json
from engine.server.logprobs import LogprobsWriter, TokenTexts, prompt_logprobs
from engine.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelLimits,
    answer_guide,
    check_model,
    guide_of,
    refuse_unbuilt,
    sampling_params,
)
from engine.server.responses import completion_body, error_response, stream

DEFAULT_MAX_TOKENS = 256
T = TypeVar("T")


async def parse(
    request: Request, model: type[BaseModel], served_model_name: str, limits: HttpLimits
) -> Any:
    """The request body as ``model``; every fault is a ProtocolError naming the field."""
    data = await read_json(request, limits)
    try:
        req = model.model_validate(refuse_unbuilt(data, model))
    except ValidationError as e:
        raise validation_error(model, e) from e
    check_model(req.model, served_model_name)
    return req


def chat_chars(req: ChatCompletionRequest) -> int:
    """The characters of the messages' text and the tools' definitions: the rendered prompt
    holds at least these."""
    n = sum(len(orjson.dumps(t.model_dump(exclude_none=True))) for t in req.tools or ())
    n += len(orjson.dumps(req.chat_template_kwargs)) if req.chat_template_kwargs else 0
    for m in req.messages:
        parts = [m.content] if isinstance(m.content, str) else [p.text for p in m.content or ()]
        n += sum(len(p) for p in parts)
    return n


class CompletionService:
    """Runs completion requests against a started driver: prompt checks, the request's trace,
    the job in the scheduler, and the response. With tracing on, each request gets a SERVER
    span that continues an incoming ``traceparent``."""

    def __init__(
        self,
        driver: EngineDriver,
        metrics: ServerMetrics,
        served_name: str,
        tracing: tr.Tracing,
        limits: HttpLimits,
    ) -> None:
        self.driver = driver
        self.metrics = metrics
        self.served_name = served_name
        self.tracing = tracing
        self.http = limits
        self.token_texts = TokenTexts(driver.tokenizer)
        vocab = driver.tokenizer.backend.get_vocab(with_added_tokens=True)
        self.limits = ModelLimits(
            max_context=driver.max_context,
            kv_tokens=driver.kv_tokens,
            vocab_size=driver.vocab_size,
            token_chars=longest_token_chars(vocab),
        )

    def check_chars(self, chars: int, param: str) -> None:
        try:
            check_chars(
                chars,
                max_context=self.limits.max_context,
                token_chars=self.limits.token_chars,
                param=param,
            )
        except PromptError as e:
            raise ProtocolError(str(e), e.param) from e

    async def completions(self, request: Request) -> Response:
        t0 = time.time_ns()
        req = await parse(request, CompletionRequest, self.served_name, self.http)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ProtocolError("batched prompts are not supported; send one prompt", "prompt")
            prompt = prompt[0]
        tok = self.driver.tokenizer
        if isinstance(prompt, str):
            self.check_chars(len(prompt), "prompt")
            ids = await self.off_loop(tok.encode, prompt, req.add_special_tokens)
        else:
            ids = list(prompt)
        whole = len(ids)
        ids = req.truncated(ids, self.limits.max_context)
        self.check_prompt(ids)
        echo = ""
        if req.echo:  # the prompt that runs: the text as sent, unless it was cut or sent as ids
            echo = prompt if isinstance(prompt, str) and len(ids) == whole else tok.decode(ids)
        return await self.run(ids, req, "text", request, t0, echo)

    async def chat(self, request: Request) -> Response:
        t0 = time.time_ns()
        req = await parse(request, ChatCompletionRequest, self.served_name, self.http)
        plan, ids = await self.chat_turn(req)
        return await self.run(ids, req, "chat", request, t0, req.echoed(), plan)

    async def chat_turn(self, req: ChatCompletionRequest) -> tuple[ToolPlan | None, list[int]]:
        """A chat's prompt, checked: its characters, then (off the loop) its tools' plan and the
        template's tokens, cut as ``truncate_prompt_tokens`` asks and checked against the
        context. Every API that reads as a chat (Responses, Messages) comes this way."""
        self.check_chars(chat_chars(req), "messages")
        plan, ids = await self.off_loop(self.chat_prompt, req)
        ids = req.truncated(ids, self.limits.max_context)
        self.check_prompt(ids)
        return plan, ids

    def chat_prompt(self, req: ChatCompletionRequest) -> tuple[ToolPlan | None, list[int]]:
        """The chat's tools as a plan (their schemas checked) and its prompt: the template
        rendered and tokenized. Its cost grows with what the request sends: ``off_loop``."""
        tok = self.driver.tokenizer
        opened, render = req.render()
        plan = tool_plan(req, tok.knows_tools)
        try:
            messages = normalize_messages([m.model_dump(exclude_none=True) for m in req.messages])
            # an earlier turn's calls are kept even when this one sends no tools
            if plan is not None:
                messages = plan.messages(messages)
            elif tool_turns(messages):
                messages = history(messages, tok.knows_tools)
            ids = tok.encode_chat(
                messages,
                opened,
                req.add_special_tokens,
                plan.template_tools() if plan is not None else None,
                render,
            )
        except ChatTemplateError as e:
            raise ProtocolError(str(e), e.param) from e
        except GuideError as e:
            raise ProtocolError(str(e), e.param) from e
        return plan, ids

    async def off_loop(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` in a worker thread, the event loop free meanwhile; past
        ``--check-timeout`` a 503 (the threads are busy: the work is bounded in size, so only
        load makes it that slow), and the thread ends by itself."""
        limit = self.http.check_timeout
        try:
            return await asyncio.wait_for(asyncio.to_thread(work, *args), limit)
        except TimeoutError:
            raise ProtocolError(
                f"the request's checks did not finish within {limit:g} s (--check-timeout): "
                "the server is busy, try again",
                None,
                503,
                {"retry-after": "1"},
            ) from None

    def check_prompt(self, ids: list[int]) -> None:
        try:
            check_prompt(
                ids, vocab_size=self.limits.vocab_size, max_context=self.limits.max_context
            )
        except PromptError as e:
            raise ProtocolError(str(e), e.param) from e

    async def run(
        self,
        ids: list[int],
        req: Any,
        kind: str,
        request: Request,
        t0: int,
        echo: str = "",
        tools: ToolPlan | None = None,
    ) -> Response:
        """Submit and answer one checked request (``kind``: ``"text"`` or ``"chat"``);
        ``echo``: text each choice's output starts with; ``tools``: the output read for
        calls."""
        api = "completions" if kind == "text" else "chat.completions"
        prefix = "cmpl" if kind == "text" else "chatcmpl"
        try:
            job, params = await self.submit(ids, req, api, prefix, request, t0, tools)
        except JobFailed as e:
            return error_response(str(e), e.status)
        meta = {"id": job.rid, "created": int(time.time()), "model": self.served_name}
        writer = None  # each choice's logprobs, written as its API writes them
        if params.logprobs is not None:
            scored = ids if req.echo_scored() else None
            top = req.logprobs if kind == "text" else None
            as_ids = req.return_tokens_as_token_ids
            writer = LogprobsWriter(kind, self.token_texts, req.n, echo, scored, as_ids, top)
        if req.stream:
            opts = req.stream_options
            body = stream(
                job,
                kind,
                meta,
                bool(opts and opts.include_usage),
                echo,
                bool(opts and opts.continuous_usage_stats),
                writer,
                tools,
            )
            return StreamingResponse(body, media_type="text/event-stream")
        return await self.collect(
            job, kind, meta, request, echo, writer, tools, req.prompt_logprobs
        )

    async def submit(
        self,
        ids: list[int],
        req: Any,
        api: str,
        prefix: str,
        request: Request,
        t0: int,
        tools: ToolPlan | None = None,
    ) -> tuple[Job, SamplingParams]:
        """One checked request (its prompt ``ids``; ``req``: the fields of the chat or completion
        request it reads as) in the scheduler, by way of ``api``, its id ``prefix``-...: its
        guide compiled, its params, its job and its trace. Every API's route comes this way, so
        each writes the same receipts and spans; each writes its own answer. A ProtocolError for
        what cannot run, JobFailed when the scheduler could not take it."""
        # the pool as it is now (a cutover may have resized it); the scheduler checks again
        limits = dataclasses.replace(self.limits, kv_tokens=self.driver.kv_tokens)
        if req.priority and self.driver.config.scheduler.scheduling_policy != "priority":
            raise ProtocolError(
                "priority: this server schedules first come, first served (start it with "
                "--scheduling-policy priority; 0, the default, asks for nothing)",
                "priority",
            )
        guide, param = await self.off_loop(
            guide_of, req.response_format, req.structured_outputs, tools
        )
        params = sampling_params(req, len(ids), limits, DEFAULT_MAX_TOKENS, guide)
        if guide is not None:  # compiled before anything is submitted: a 400 on a stream too
            await self.prepare(guide, param)
        rid = f"{prefix}-{uuid.uuid4().hex[:24]}"
        deadline = self.http.request_timeout
        timings = self.driver.config.server.enable_per_request_metrics
        job = Job(self.driver, self.metrics, rid, ids, params, req.n, t0, deadline, api, timings)
        self.trace(job, request, api, req, params, t0)
        try:
            job.submit()
        except JobFailed as e:
            job.end_span(e.status, str(e))
            raise
        return job, params

    async def prepare(self, guide: Guide, param: str) -> None:
        """Have the scheduler process compile ``guide``; a ProtocolError when it does not
        compile, or not within its time limit (400), or no compile worker is free (503 with
        Retry-After); a 503 when the scheduler cannot answer."""
        try:
            asked = self.driver.ask(lambda ticket: PrepareGuide(guide=guide, ticket=ticket))
            ready = await asyncio.wrap_future(asked)
        except RuntimeError as e:  # stopping or dead
            raise ProtocolError(str(e), status=503) from e
        if ready.error is not None:
            later = {} if ready.retry_after is None else {"retry-after": str(ready.retry_after)}
            raise ProtocolError(f"{param}: {ready.error}", param, ready.status, later)

    async def collect(
        self,
        job: Job,
        kind: str,
        meta: dict[str, Any],
        request: Request,
        echo: str,
        writer: LogprobsWriter | None,
        tools: ToolPlan | None,
        prompt_k: int | None = None,
    ) -> Response:
        """The whole response at once, unless the client hangs up first (then 499, aborted);
        ``prompt_k``: vLLM's ``prompt_logprobs`` were asked, with this many top tokens."""
        n = len(job.subs)
        texts: list[list[str]] = [[] for _ in range(n)]
        entries: list[list[TokenLogprobs]] = [[] for _ in range(n)]
        scored: list[list[TokenLogprobs] | None] = [None] * n  # the prompt's, when asked
        ranks: list[list[int]] = [[] for _ in range(n)]  # ... and their ranks

        async def gather() -> None:
            async for i, out in job.events():
                texts[i].append(out.text_delta)
                entries[i] += out.logprobs or []
                if scored[i] is None and out.prompt_logprobs is not None:
                    scored[i], ranks[i] = out.prompt_logprobs, out.prompt_ranks or []

        if (instead := await gathered(job, gather(), request)) is not None:
            return instead
        logprobs = None
        if writer is not None:
            logprobs = [writer.of(i, e, scored[i]) for i, e in enumerate(entries)]
        prompts = None
        if prompt_k is not None:
            prompts = [
                prompt_logprobs(s or [], r, self.token_texts, prompt_k)
                for s, r in zip(scored, ranks)
            ]
        return JSONResponse(completion_body(job, kind, meta, texts, logprobs, tools, prompts, echo))

    def trace(self, job: Job, request: Request, api: str, req: Any, params: Any, t0: int) -> None:
        """The request's trace context: a server span (tracing on), else an incoming
        traceparent passed through so the receipts still name the caller's trace. ``api``: the
        HTTP API it came by (``attest.api``)."""
        headers, tracing, name = request.headers, self.tracing, self.served_name
        if not tracing.enabled:
            incoming = headers.get("traceparent")
            job.trace = incoming if tr.parse_traceparent(incoming) else None
            return
        try:
            op = tr.operation_of(api)
            attrs = tr.request_attributes(op, name, params, req.n, bool(req.stream))
            attrs.update(
                {
                    "gen_ai.response.id": job.rid,
                    "gen_ai.response.model": name,
                    "attest.rid": job.rid,
                    "attest.api": api,
                    "http.request.method": "POST",
                    "url.path": request.url.path,
                }
            )
            job.span = tracing.start_span(
                f"{op} {name}",
                parent=tracing.context_from(headers),
                kind="SERVER",
                start_ns=t0,
                attributes=attrs,
            )
            job.trace = tr.traceparent_of(job.span)
        except Exception:
            job.span = None  # tracing never fails a request


def tool_plan(req: ChatCompletionRequest, native: bool) -> ToolPlan | None:
    """How the request's tools are served (None: it names none); a ProtocolError naming the
    field that cannot be honoured."""
    choice = req.tool_choice
    tools = [t.model_dump(exclude_none=True) for t in req.tools or ()] or None
    if tools is None and choice in (None, "none"):
        return None
    answer = answer_guide(req.response_format, req.structured_outputs)
    try:
        return plan_of(
            tools,
            choice.model_dump() if isinstance(choice, BaseModel) else choice,
            req.parallel_tool_calls,
            native,
            answer,
        )
    except GuideError as e:
        raise ProtocolError(str(e), e.param) from e


async def gathered(
    job: Job,
    work: Awaitable[None],
    request: Request,
    failed: Callable[[str, int], Response] = error_response,
) -> Response | None:
    """Run ``work`` (it reads the job's outputs) to its end for a whole answer. None when it
    ended, the span closed 200; else the answer to give instead: 499 when the client hung up
    first (the request is aborted), ``failed(message, status)`` (the API's error shape) when
    the job failed. The job is closed either way: nothing, unless the client went away."""
    try:
        if not await unless_disconnected(work, request):
            job.end_span(499, "the client went away")
            return Response(status_code=499)  # nobody reads it; the request is aborted
    except JobFailed as e:
        job.end_span(e.status, str(e))
        return failed(str(e), e.status)
    except BaseException:
        job.end_span(499, "the client went away")
        raise
    finally:
        job.close()
    job.end_span(200)
    return None


async def unless_disconnected(work: Awaitable[None], request: Request) -> bool:
    """Run ``work`` unless the client hangs up first (the body is already read, so the next
    message can only be the disconnect). False when it hung up; the caller aborts."""
    task = asyncio.ensure_future(work)

    async def hangup() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(hangup())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        watch.cancel()
    if task.done():
        task.result()  # re-raise what the work raised
        return True
    task.cancel()
    return False
