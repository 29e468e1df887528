"""The engines' table of `engine bench --table`: what it measures (``TableSpec``, validated
once), what each arm measured (``ArmFigures``), and the arithmetic and text of the table: medians
per arm, and each Attest arm's ratio over each peer's arm (transformers, llama.cpp, vLLM's
float32 and bfloat16). Pure: no engine here.

The arms run one after the other, so a machine whose speed drifts between minutes (this machine
kind's moved one arm by 1.5x between sittings minutes apart) moves one arm's figures and not
another's. ``rounds`` repeats the whole sequence of arms, each round in a rotated order, and a
ratio is the median over rounds of the ratio within each round: both arms of a ratio measured
minutes apart, each round's drift shared by the two.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

ENGINES = ("attest", "transformers", "llamacpp", "vllm")
# what runs when --engines is not given: vLLM is named, not assumed (its arms add an environment
# of their own and minutes of compiling per batch shape on first use)
DEFAULT_ENGINES = ("attest", "transformers", "llamacpp")
# Attest's arms: a name for a set of LLM(...) keyword arguments; speculative decoding off (it
# is measured against its own baseline by bench/speculation.py, not against the other engines)
ATTEST_ARMS: dict[str, dict[str, Any]] = {
    "exact": {"dtype": "float32", "speculative": "off"},
    "bf16": {"dtype": "bfloat16", "speculative": "off"},
    "int8": {"quant": "int8", "speculative": "off"},
    "int4": {"quant": "int4", "speculative": "off"},
}
# each arm again with the next step planned while its forward runs (--overlap-schedule)
ATTEST_ARMS |= {f"{k}+overlap": v | {"overlap_schedule": True} for k, v in ATTEST_ARMS.items()}
BASELINES = {"transformers": "transformers", "llamacpp": "llama.cpp", "vllm": "vLLM"}
VLLM_ARMS = {"f32": "float32", "bf16": "bfloat16"}  # vLLM's arms: a name for its dtype


def peer_row(engine: str, arm: str | None = None) -> str:
    """A peer's row name: the engine's, and its arm where it has several (``vLLM bf16``)."""
    return f"{BASELINES[engine]} {arm}" if arm else BASELINES[engine]


def parse_counts(text: str, flag: str) -> list[int]:
    """``"1,16,64"`` -> [1, 16, 64]; anything else raises ValueError naming the value."""
    try:
        counts = [int(s) for s in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise ValueError(f"{flag} {text!r}: give distinct integers >= 1, comma-separated (1,16,64)")
    return counts


def parse_names(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names or len(set(names)) != len(names):
        raise ValueError(
            f"{flag} {text!r}: give distinct names from {', '.join(allowed)}, comma-separated"
            + (f" ({', '.join(map(repr, bad))} is not one)" if bad else "")
        )
    return names


@dataclass(slots=True)
class TableSpec:
    """What the table measures. ``prefill`` 0: no prefill column."""

    streams: list[int] = field(default_factory=lambda: [1, 16, 64])
    prompt_len: int = 128
    output_len: int = 64
    prefill: int = 512
    runs: int = 3
    rounds: int = 1  # the arms' sequence this many times, each round's order rotated by one
    engines: list[str] = field(default_factory=lambda: list(DEFAULT_ENGINES))
    attest: list[str] = field(default_factory=lambda: ["exact", "bf16", "int8", "int4"])
    vllm: list[str] = field(default_factory=lambda: list(VLLM_ARMS))
    model: str | None = None
    llamacpp_env: str = "build/llamacpp-venv"
    vllm_env: str = "build/vllm-venv"
    vllm_kv_gib: int = 2
    seed: int = 0

    @classmethod
    def from_text(
        cls, streams: str, engines: str, attest: str, vllm: str = "f32,bf16", **rest: Any
    ) -> TableSpec:
        """From the CLI's comma-separated lists; any bad value raises ValueError naming it."""
        return cls(
            streams=parse_counts(streams, "--streams"),
            engines=parse_names(engines, ENGINES, "--engines"),
            attest=parse_names(attest, tuple(ATTEST_ARMS), "--attest"),
            vllm=parse_names(vllm, tuple(VLLM_ARMS), "--vllm"),
            **rest,
        )

    def __post_init__(self) -> None:
        lows = (
            ("prompt_len", 2),
            ("output_len", 1),
            ("prefill", 0),
            ("runs", 1),
            ("rounds", 1),
            ("vllm_kv_gib", 1),
        )
        for name, low in lows:
            v = getattr(self, name)
            if not isinstance(v, int) or v < low:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be an integer >= {low}, got {v!r}"
                )

    def kv_tokens(self) -> int:
        """Attest's pool: every stream's prompt and output at the largest count, or the prefill."""
        most = max(self.streams) * (self.prompt_len + self.output_len + 8)
        return max(most, self.prefill + 8) + 64

    def longest(self) -> int:
        """The longest sequence any arm holds: a prompt and its output, or the prefill's prompt
        and its one token (vLLM's max_model_len)."""
        return max(self.prompt_len + self.output_len + 1, self.prefill + 1)


@dataclass(slots=True)
class ArmFigures:
    """One arm's runs: per stream count, (decode tok/s, end-to-end output tok/s) per run; and
    prefill tok/s per run."""

    name: str
    engine: str  # one of ENGINES
    decode: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    prefill: list[float] = field(default_factory=list)

    def medians(self, streams: list[int]) -> list[float | None]:
        """The table's row: decode and e2e per stream count, then prefill."""
        row: list[float | None] = []
        for n in streams:
            runs = self.decode.get(n)
            row += (
                [statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)]
                if runs
                else [None, None]
            )
        return row + [statistics.median(self.prefill) if self.prefill else None]


Rounds = list[list[ArmFigures]]  # per round, its arms' figures in the spec's order


def merged(rounds: Rounds) -> list[ArmFigures]:
    """Each arm's runs from every round together, in the spec's order."""
    out = [ArmFigures(a.name, a.engine) for a in rounds[0]]
    for arms in rounds:
        for into, a in zip(out, arms, strict=True):
            for n, runs in a.decode.items():
                into.decode.setdefault(n, []).extend(runs)
            into.prefill.extend(a.prefill)
    return out


def _ratios(ours: ArmFigures, base: ArmFigures, streams: list[int]) -> list[float | None]:
    mine, theirs = ours.medians(streams), base.medians(streams)
    return [m / t if m is not None and t else None for m, t in zip(mine, theirs)]


def round_ratios(rounds: Rounds, streams: list[int]) -> list[tuple[str, list[list[float | None]]]]:
    """Each Attest arm over each baseline, column by column: per round, its medians' ratio."""
    first = rounds[0]
    pairs = [
        (i, j)
        for i, ours in enumerate(first)
        if ours.engine == "attest"
        for j, base in enumerate(first)
        if base.engine in BASELINES
    ]
    return [
        (
            f"{first[i].name} / {first[j].name}",
            [_ratios(arms[i], arms[j], streams) for arms in rounds],
        )
        for i, j in pairs
    ]


def ratio_rows(rounds: Rounds, streams: list[int]) -> list[tuple[str, list[float | None]]]:
    """Each Attest arm over each baseline, column by column: the median over rounds of each
    round's ratio of medians (with one round, the ratio of the arms' medians)."""
    rows = []
    for name, per_round in round_ratios(rounds, streams):
        cells = []
        for column in zip(*per_round):
            known = [c for c in column if c is not None]
            cells.append(statistics.median(known) if known else None)
        rows.append((name, cells))
    return rows


def columns(spec: TableSpec) -> list[str]:
    """The table's column heads, in the order of ``ArmFigures.medians``."""
    head = [h for n in spec.streams for h in (f"decode {n}", f"e2e {n}")]
    return head + [f"prefill {spec.prefill}" if spec.prefill else "prefill"]


def format_table(rounds: Rounds, spec: TableSpec) -> str:
    """A Markdown table: arms' medians (tok/s) over every round's runs, then the ratios (x)."""
    head = columns(spec)
    lines = [
        "| arm | " + " | ".join(head) + " |",
        "|---|" + "---:|" * len(head),
    ]

    def row(name: str, cells: list[float | None], fmt: str) -> str:
        return (
            f"| {name} | " + " | ".join("-" if c is None else fmt.format(c) for c in cells) + " |"
        )

    lines += [row(a.name, a.medians(spec.streams), "{:.1f}") for a in merged(rounds)]
    lines += [row(name, cells, "{:.2f}x") for name, cells in ratio_rows(rounds, spec.streams)]
    return "\n".join(lines)


def format_runs(rounds: Rounds, spec: TableSpec) -> str:
    """Every run's figures, for the reader who wants the spread behind a median; with several
    rounds, each round's runs apart and each round's ratios."""
    out = []
    for r, arms in enumerate(rounds):
        if len(rounds) > 1:
            out.append(f"  round {r + 1}:")
        for a in arms:
            for n, runs in a.decode.items():
                out.append(
                    f"  {a.name}, {n} streams: decode {[round(x[0], 1) for x in runs]}, "
                    f"e2e {[round(x[1], 1) for x in runs]}"
                )
            if a.prefill:
                out.append(f"  {a.name}, prefill: {[round(p, 1) for p in a.prefill]}")
    if len(rounds) > 1:
        out.append("  ratios per round:")
        for name, per_round in round_ratios(rounds, spec.streams):
            for head, column in zip(columns(spec), zip(*per_round)):
                if any(c is not None for c in column):
                    cells = ", ".join("-" if c is None else f"{c:.2f}" for c in column)
                    out.append(f"  {name}, {head}: {cells}")
    return "\n".join(out)


def format_report(rounds: Rounds, spec: TableSpec, notes: list[str]) -> str:
    """The whole printout: the method, what ran and where, the table, every run."""
    runs = spec.runs * spec.rounds
    method = [
        f"{spec.prompt_len}-token random prompts, {spec.output_len} new tokens, greedy, EOS "
        f"ignored; tok/s, median of {runs} runs"
        + (f" ({spec.runs} in each of {spec.rounds} rounds)" if spec.rounds > 1 else ""),
        f"decode N = N x {spec.output_len} / (t({spec.output_len + 1} tokens) - t(1 token)); "
        f"e2e N = N x {spec.output_len + 1} / t({spec.output_len + 1} tokens), prefill included; "
        f"prefill = one unseen {spec.prefill}-token prompt / t(first token)",
        "every prompt's first token is new to its engine; every Attest request asserted "
        "cached_tokens == 0",
    ]
    if spec.rounds > 1:
        method.append(
            f"{spec.rounds} rounds of every arm, each round's order rotated by one arm; a ratio "
            "is the median over rounds of the ratio of the two arms' medians in that round"
        )
    return "\n".join(
        [
            *method,
            *notes,
            "",
            format_table(rounds, spec),
            "",
            "runs (tok/s):",
            format_runs(rounds, spec),
        ]
    )
