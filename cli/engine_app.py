"""`engine`: generate, info, serve."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from cli.bench import (
    AttestOpt,
    EnginesOpt,
    InstallOpt,
    InstallVllmOpt,
    LlamaEnvOpt,
    PrefillOpt,
    RoundsOpt,
    StreamsOpt,
    TableOpt,
    VllmEnvOpt,
    VllmKvOpt,
    VllmOpt,
    bench_table,
)
from cli.checkpoint import checkpoint
from cli.clients import client_env
from cli.cutover import cutover
from cli.options import (
    BackendOpt,
    DeviceOpt,
    DtypeOpt,
    ModelOpt,
    QuantOpt,
    config_of,
)
from cli.options import (
    fail as _fail,
)
from cli.ranks import (
    KvOpt,
    TpOpt,
    kv_tokens,
    worker,
)
from cli.serve_options import SERVE, with_options
from engine.config import DEFAULTS
from engine.observability.stacks import dump_stacks_on_signal

app = typer.Typer(
    help="Attest serving engine. Start with `engine info` to see the model, then "
    '`engine generate "Hello"` for a one-shot completion, or `engine serve` for the HTTP API.',
    no_args_is_help=True,
    add_completion=False,
)


def default_log_file() -> str:
    import datetime

    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"logs/boot-{stamp}.jsonl"


@app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help="The prompt text.")],
    model: ModelOpt = DEFAULTS["model"],
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", "-n", help="New tokens at most.")
    ] = 128,
    temperature: Annotated[float, typer.Option(help="0 is greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass in (0, 1].")] = 1.0,
    top_k: Annotated[int, typer.Option(help="-1: off.")] = -1,
    min_p: Annotated[
        float, typer.Option(help="Drop tokens below min_p x the top probability.")
    ] = 0.0,
    seed: Annotated[int | None, typer.Option(help="Seed for a reproducible sample.")] = None,
    stop: Annotated[list[str] | None, typer.Option(help="Stop string (repeatable).")] = None,
    chat: Annotated[
        bool, typer.Option("--chat/--raw", help="Wrap the prompt in the model's chat template.")
    ] = True,
    dtype: DtypeOpt = DEFAULTS["dtype"],
    quant: QuantOpt = DEFAULTS["quant"],
    kv_tokens: KvOpt = "8192",
    attention_backend: BackendOpt = DEFAULTS["attention_backend"],
    device: DeviceOpt = DEFAULTS["device"],
    tp: TpOpt = DEFAULTS["tp"],
) -> None:
    """Generate one completion and stream it to the terminal."""
    from engine import LLM, SamplingParams

    try:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            seed=seed,
            stop=stop or None,
        )
        llm = LLM(
            model=model,
            dtype=dtype,
            quant=quant,
            kv_tokens=_kv(kv_tokens),
            max_running=1,
            attention_backend=attention_backend,
            device=device,
            tp=tp,
        )
        tok = llm.tokenizer
        ids = tok.encode_chat([{"role": "user", "content": prompt}]) if chat else tok.encode(prompt)
        for delta in llm.stream(ids, params):
            sys.stdout.write(delta)
            sys.stdout.flush()
        sys.stdout.write("\n")
        llm.close()  # with --tp, the other ranks stop with it
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))


@app.command()
def info(
    model: ModelOpt = DEFAULTS["model"],
    dtype: DtypeOpt = DEFAULTS["dtype"],
    quant: QuantOpt = DEFAULTS["quant"],
    kv_tokens: KvOpt = "8192",
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Show the model, its configuration, parameter count and KV bytes per token."""
    from engine.core.engine_core import EngineCore

    try:
        core = EngineCore(config_of(locals()))
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    d = core.describe()
    if as_json:
        print(json.dumps(d, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Attest engine", show_header=False)
    for k, v in d.items():
        t.add_row(k, f"{v:,}" if isinstance(v, int) else str(v))
    Console().print(t)


@app.command()
@with_options(SERVE)
def serve(**options: Any) -> None:
    """Serve the OpenAI API until SIGTERM or Ctrl-C (exit 0); a held port or boot log: exit 75."""
    raise typer.Exit(_serve(options | {"log_file": options["log_file"] or default_log_file()}))


def _serve(o: dict[str, Any]) -> int:
    """``engine serve`` with its options ``o``: the server's exit code, or a failed boot's."""
    from engine.server.boot_guard import BootRefused
    from engine.server.launch import BootFailed
    from engine.server.launch import serve as run_server

    try:
        return run_server(
            config_of(o),
            o["host"],
            o["port"],
            o["served_model_name"],
            o["api_key"],
            pid_file=o["pid_file"],
            drain_timeout=o["drain_timeout"],
            stall_timeout=o["stall_timeout"],
        )
    except (BootRefused, BootFailed) as e:  # the code a failed boot's log names, too
        _fail(str(e), e.code)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        _fail(str(e))


@app.command()
def bench(
    offline: Annotated[
        bool, typer.Option("--offline", help="Offline throughput (the default mode).")
    ] = True,
    model: ModelOpt = None,
    num_prompts: Annotated[int, typer.Option(help="Prompts in the batch.")] = 32,
    prompt_len: Annotated[int, typer.Option(help="Tokens per prompt.")] = 128,
    output_len: Annotated[int, typer.Option(help="Tokens generated per prompt.")] = 64,
    runs: Annotated[int, typer.Option(help="Timed runs per arm (median reported).")] = 3,
    dtype: DtypeOpt = "float32",
    baseline: Annotated[
        bool, typer.Option(help="Also time transformers' batched generate.")
    ] = True,
    tp: TpOpt = 1,
    table: TableOpt = False,
    rounds: RoundsOpt = 1,
    streams: StreamsOpt = "1,16,64",
    prefill: PrefillOpt = 512,
    engines: EnginesOpt = "attest,transformers,llamacpp",
    attest: AttestOpt = "exact,bf16,int8,int4",
    llamacpp_env: LlamaEnvOpt = "build/llamacpp-venv",
    install_llamacpp: InstallOpt = False,
    vllm: VllmOpt = "f32,bf16",
    vllm_env: VllmEnvOpt = "build/vllm-venv",
    vllm_kv_gib: VllmKvOpt = 2,
    install_vllm: InstallVllmOpt = False,
) -> None:
    """Offline throughput vs transformers' batched generate, and receipts on vs off, one run;
    --table: Attest's arms vs transformers, llama.cpp and vLLM (decode, end-to-end, prefill
    tok/s)."""
    if table or install_llamacpp or install_vllm:
        return bench_table(
            table=table,
            install_llamacpp=install_llamacpp,
            install_vllm=install_vllm,
            streams=streams,
            engines=engines,
            attest=attest,
            vllm=vllm,
            vllm_env=vllm_env,
            vllm_kv_gib=vllm_kv_gib,
            prefill=prefill,
            prompt_len=prompt_len,
            output_len=output_len,
            runs=runs,
            rounds=rounds,
            model=model,
            llamacpp_env=llamacpp_env,
            tp=tp,
        )
    from measure import run_offline

    res = run_offline(
        model,
        num_prompts,
        prompt_len,
        output_len,
        runs=runs,
        dtype=dtype,
        baseline=baseline,
        tp=tp,
    )
    typer.echo(
        f"{num_prompts} prompts x {prompt_len} tokens, {output_len} new tokens each, {dtype}, "
        f"tp {tp}, median of {runs}"
    )
    typer.echo(f"{'arm':<36} {'median s':>9} {'out tok/s':>10}  runs")
    for r in res:
        typer.echo(
            f"{r.name:<36} {r.median_s:>9.2f} {r.tok_s:>10.1f}  {[round(x, 2) for x in r.seconds]}"
        )
    on, off = res[0], res[1]
    typer.echo(f"receipts on / off throughput: {on.tok_s / off.tok_s:.3f}")
    if len(res) > 2:
        typer.echo(f"attest / transformers throughput: {on.tok_s / res[2].tok_s:.2f}x")


@app.command()
def window(
    name: Annotated[str, typer.Argument(help="A shipped window (audit specs) or a spec path.")],
    control: Annotated[
        bool, typer.Option(help="Also boot the control (the mechanism off) for control claims.")
    ] = False,
    model: ModelOpt = None,
    flag: Annotated[
        list[str] | None,
        typer.Option(help="An extra `engine serve` flag, e.g. --flag=--threads=2 (repeatable)."),
    ] = None,
    out_dir: Annotated[str, typer.Option(help="Where the boot logs go.")] = "logs",
) -> None:
    """Boot the engine with a window's recipe, drive its load, stop it, and give the window's
    verdict: exit 0 PASS, 1 FAIL, 2 UNDECIDED (64: no recipe; 69: the engine did not start)."""
    from pathlib import Path

    from rich.console import Console

    from audit.parse import SpecError
    from cli.window import WindowError, run_window

    extra = (["--model", model] if model else []) + [a for f in flag or [] for a in f.split("=", 1)]
    try:
        code = run_window(
            name, control, extra, Path(out_dir), Console(width=None if sys.stdout.isatty() else 140)
        )
    except SpecError as e:
        _fail(f"bad spec: {e}", 64)
    except WindowError as e:
        _fail(str(e), e.code)
    raise typer.Exit(code)


app.command()(cutover)
app.command()(checkpoint)
app.command("client-env")(client_env)
app.command()(worker)


def _kv(text: str | None) -> int | list[int] | None:
    try:
        return kv_tokens(text)
    except ValueError as e:
        _fail(str(e))
        raise


def main() -> None:
    dump_stacks_on_signal()
    app()


if __name__ == "__main__":
    main()
