"""The online comparison's arithmetic and text (`bench/serve_vs.py`): one guidellm run per server
and concurrency, what its JSON report says, and the table with a ratio per row.

Throughput is the run's output tokens over the span from its first request's start to its last
request's end (what a user of the server saw), not guidellm's mean of per-request rates; TTFT and
ITL are guidellm's percentiles over the successful requests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Level:
    server: str
    concurrency: int
    requests: int  # successful
    errors: int  # errored or incomplete
    out_tok_s: float
    ttft_ms: tuple[float, float]  # p50, p99
    itl_ms: tuple[float, float]


def guidellm_command(
    exe: str | Path,
    target: str,
    concurrency: int,
    requests: int,
    prompt_tokens: int,
    output_tokens: int,
    tokenizer: str | Path,
    report: str | Path,
    seed: int = 0,
) -> list[str]:
    """One guidellm run: ``concurrency`` streams, ``requests`` text completions of synthetic
    prompts (the same ones for every server: the same seed and tokenizer), streamed."""
    return [
        str(exe),
        "run",
        "--backend",
        f"kind=openai_http,target={target},request_format=/v1/completions",
        "--profile",
        f"kind=concurrent,streams={concurrency}",
        "--constraint",
        f"kind=max_requests,count={requests}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={prompt_tokens},output_tokens={output_tokens}",
        "--tokenizer",
        f"kind=huggingface_auto,model={tokenizer}",
        "--seed",
        f"kind=static,value={seed}",
        "--output",
        f"kind=json,path={report}",
        "--disable-console-interactive",
    ]


def _pcts(metric: dict) -> tuple[float, float]:
    p = metric["successful"]["percentiles"]
    return p["p50"], p["p99"]


def read_report(path: str | Path, server: str, concurrency: int) -> Level:
    bench = json.loads(Path(path).read_text())["benchmarks"][0]
    reqs, metrics = bench["requests"], bench["metrics"]
    ok = reqs["successful"]
    tokens = sum(r["output_tokens"] or 0 for r in ok)
    span = (
        max(r["request_end_time"] for r in ok) - min(r["request_start_time"] for r in ok)
        if ok
        else 0.0
    )
    return Level(
        server,
        concurrency,
        len(ok),
        len(reqs["errored"]) + len(reqs["incomplete"]),
        tokens / span if span > 0 else 0.0,
        _pcts(metrics["time_to_first_token_ms"]),
        _pcts(metrics["inter_token_latency_ms"]),
    )


def table(levels: list[Level], ours: str, peer: str) -> str:
    """One row per server and concurrency; each of ``ours``'s rows with its ratios over the
    peer's at the same concurrency (throughput: higher is better; TTFT p50: lower is)."""
    by = {(lv.server, lv.concurrency): lv for lv in levels}
    lines = [
        "| server | conc | ok / errors | out tok/s | TTFT ms p50 / p99 | ITL ms p50 / p99 "
        f"| tok/s vs {peer} | TTFT p50 vs {peer} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted({lv.concurrency for lv in levels}):
        for name in (peer, ours):
            lv = by.get((name, c))
            if lv is None:
                continue
            other = by.get((peer, c)) if name == ours else None
            ratio = f"{lv.out_tok_s / other.out_tok_s:.2f}x" if other and other.out_tok_s else ""
            ttft = f"{lv.ttft_ms[0] / other.ttft_ms[0]:.2f}x" if other and other.ttft_ms[0] else ""
            lines.append(
                f"| {name} | {c} | {lv.requests} / {lv.errors} | {lv.out_tok_s:.1f} | "
                f"{lv.ttft_ms[0]:.0f} / {lv.ttft_ms[1]:.0f} | {lv.itl_ms[0]:.1f} / "
                f"{lv.itl_ms[1]:.1f} | {ratio} | {ttft} |"
            )
    return "\n".join(lines)
