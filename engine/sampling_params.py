"""SamplingParams: what a request asks of the sampler, validated. Torch-free: the HTTP process
builds these and sends them to the scheduler process."""

from __future__ import annotations

from dataclasses import dataclass


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

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def need(ok: bool, field: str, rule: str, value: object) -> None:
            if not ok:
                raise ValueError(f"{field} must be {rule}, got {value!r}")

        def is_int(v: object) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def is_num(v: object) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v

        need(
            is_int(self.max_tokens) and self.max_tokens >= 1,
            "max_tokens",
            "an integer >= 1",
            self.max_tokens,
        )
        need(
            is_num(self.temperature) and self.temperature >= 0,
            "temperature",
            "a number >= 0",
            self.temperature,
        )
        need(is_num(self.top_p) and 0 < self.top_p <= 1, "top_p", "in (0, 1]", self.top_p)
        need(
            is_int(self.top_k) and (self.top_k >= 1 or self.top_k in (-1, 0)),
            "top_k",
            "-1, 0 (off) or an integer >= 1",
            self.top_k,
        )
        need(is_num(self.min_p) and 0 <= self.min_p <= 1, "min_p", "in [0, 1]", self.min_p)
        need(self.seed is None or is_int(self.seed), "seed", "an integer or None", self.seed)
        need(
            is_int(self.min_tokens) and 0 <= self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"an integer in [0, max_tokens={self.max_tokens}]",
            self.min_tokens,
        )
        need(isinstance(self.ignore_eos, bool), "ignore_eos", "a boolean", self.ignore_eos)
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        need(
            stops is None or (isinstance(stops, list) and all(isinstance(s, str) and s for s in stops)),
            "stop", "a non-empty string or a list of non-empty strings", self.stop,
        )  # fmt: skip
        ids = self.stop_token_ids
        need(
            ids is None or (isinstance(ids, list) and all(is_int(i) and i >= 0 for i in ids)),
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
