"""SamplingParams: what a request asks of the sampler, validated. Torch-free: the HTTP process
builds these and sends them to the scheduler process."""

from __future__ import annotations

from dataclasses import dataclass

from engine.request.guide import Guide

SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # a signed 64-bit seed, as OpenAI and vLLM take it
PENALTY_LIMIT = 2.0  # presence and frequency penalties lie in [-2, 2], as OpenAI defines them
BIAS_LIMIT = 100.0  # a logit bias lies in [-100, 100]
# a repetition penalty lies in [1/100, 100]: vLLM asks only > 0, but a logit divided by 1e-300
# is inf in float32, that row's softmax NaN, and its draw would fail the whole batch's step
REPETITION_LIMIT = 100.0
LOGPROBS_LIMIT = 20  # most likely tokens returned per token, as OpenAI's top_logprobs allows


def _need(ok: bool, field: str, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{field} must be {rule}, got {value!r}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


# the boolean fields
_FLAGS = (
    "ignore_eos",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
)


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0): no top-k
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    # OpenAI's penalties over the tokens generated so far: each logit loses
    # frequency_penalty x (its count) + presence_penalty x (whether it occurred)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    # vLLM's: the stop string that ended the text stays in it; special tokens' text is shown
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # vLLM's: false puts no space between two special tokens shown one after the other
    spaces_between_special_tokens: bool = True
    # vLLM's repetition penalty over the prompt's and the output's tokens: a seen token's logit
    # is divided by it where positive, multiplied where negative (1: off)
    repetition_penalty: float = 1.0
    # what the output must match (JSON, a schema, a pattern, ...): a grammar masks each step
    guide: Guide | None = None
    # each sampled token's log-probability and the ``logprobs`` most likely tokens' (None: off)
    logprobs: int | None = None
    # each prompt token's log-probability after the first (and the most likely tokens') under
    # the model, computed in the prefill (such a request takes no prefix from the cache)
    prompt_logprobs: int | None = None
    # vLLM's scheduling priority (the lower value waits less), under the priority policy
    priority: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        most, temp = self.max_tokens, self.temperature
        _need(_is_int(most) and most >= 1, "max_tokens", "an integer >= 1", most)
        _need(_is_num(temp) and temp >= 0, "temperature", "a number >= 0", temp)
        _need(_is_num(self.top_p) and 0 < self.top_p <= 1, "top_p", "in (0, 1]", self.top_p)
        _need(
            _is_int(self.top_k) and (self.top_k >= 1 or self.top_k in (-1, 0)),
            "top_k",
            "-1, 0 (off) or an integer >= 1",
            self.top_k,
        )
        _need(_is_num(self.min_p) and 0 <= self.min_p <= 1, "min_p", "in [0, 1]", self.min_p)
        _need(self.seed is None or _is_int(self.seed), "seed", "an integer or None", self.seed)
        _need(
            self.seed is None or SEED_MIN <= self.seed <= SEED_MAX,
            "seed",
            "a signed 64-bit integer, in [-2**63, 2**63 - 1]",
            self.seed,
        )
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            _need(_is_num(v) and abs(v) <= PENALTY_LIMIT, name, "a number in [-2, 2]", v)
        rep = self.repetition_penalty
        _need(
            _is_num(rep) and 1 / REPETITION_LIMIT <= rep <= REPETITION_LIMIT,
            "repetition_penalty",
            f"a number in [{1 / REPETITION_LIMIT}, {REPETITION_LIMIT:g}]",
            rep,
        )
        bias = self.logit_bias
        _need(
            bias is None
            or (
                isinstance(bias, dict)
                and all(
                    _is_int(t) and t >= 0 and _is_num(b) and abs(b) <= BIAS_LIMIT
                    for t, b in bias.items()
                )
            ),
            "logit_bias",
            "a map of token ids to numbers in [-100, 100]",
            bias,
        )
        _need(
            _is_int(self.min_tokens) and 0 <= self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"an integer in [0, max_tokens={self.max_tokens}]",
            self.min_tokens,
        )
        for name in _FLAGS:
            _need(isinstance(getattr(self, name), bool), name, "a boolean", getattr(self, name))
        _need(
            _is_int(self.priority) and SEED_MIN <= self.priority <= SEED_MAX,
            "priority",
            "a signed 64-bit integer",
            self.priority,
        )
        for name in ("logprobs", "prompt_logprobs"):
            lp = getattr(self, name)
            _need(
                lp is None or (_is_int(lp) and 0 <= lp <= LOGPROBS_LIMIT),
                name,
                f"None or an integer in [0, {LOGPROBS_LIMIT}]",
                lp,
            )
        _need(self.guide is None or isinstance(self.guide, Guide), "guide", "a Guide", self.guide)
        if self.guide is not None:  # the grammar decides where the output ends
            _need(
                not self.ignore_eos,
                "ignore_eos",
                "false with a guide (response_format)",
                self.ignore_eos,
            )
            _need(
                self.min_tokens == 0,
                "min_tokens",
                "0 with a guide (response_format)",
                self.min_tokens,
            )
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        _need(
            stops is None
            or (isinstance(stops, list) and all(isinstance(s, str) and s for s in stops)),
            "stop",
            "a non-empty string or a list of non-empty strings",
            self.stop,
        )
        ids = self.stop_token_ids
        _need(
            ids is None or (isinstance(ids, list) and all(_is_int(i) and i >= 0 for i in ids)),
            "stop_token_ids",
            "a list of token ids",
            ids,
        )

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def adjusts_logits(self) -> bool:
        """Whether the sampler must change this request's logits before it picks a token."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.logit_bias
            or self.repetition_penalty != 1.0
        )
