"""`audit`: read boot logs back. (Imports nothing from torch.)

Verdicts exit 0 PASS, 1 FAIL, 2 UNDECIDED. Anything else follows sysexits, never click's own:
64 usage or bad spec, 66 unreadable input, 69 an optional dependency missing (`audit report`
without plotly), 70 internal error, 73 a report file not writable.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from audit import __version__
from audit.diff import compare, diff_table
from audit.diff import to_json as diff_json
from audit.explain import detail, sparkline, summarize, timeline
from audit.inputs import NoLogs, expand_logs
from audit.parse import SpecError
from audit.reader import UnreadableLog
from audit.render import print_report, to_json, to_junit
from audit.report_data import collect
from audit.selftest import self_test
from audit.spec import acceptance_dir, load_spec, resolve, shipped
from audit.streams import spooled
from audit.verdict import evaluate

EX_USAGE, EX_NOINPUT, EX_SOFTWARE, EX_CANTCREAT = 64, 66, 70, 73
EX_UNAVAILABLE = 69
# click's UsageError (unknown command or option, bad value), reached through typer's public
# BadParameter whichever click typer ships
UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")

LOGS_HELP = (
    "boot logs (.jsonl, text, .gz): files, quoted glob patterns ('logs/boot-*.jsonl') or "
    "directories (their *.jsonl, *.log and *.gz files), or - for the standard input (a pipe: "
    "read once); rank logs: one file per rank"
)

app = typer.Typer(
    help="Attest auditor: turns boot logs into verdicts.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Attest auditor: turns boot logs into verdicts."""


class Fatal(Exception):
    """An error with its sysexits code and a message for the operator."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 140)


def _guard(fn):
    """Map the auditor's own errors to sysexits, with the message on stderr."""
    try:
        return fn()
    except SpecError as e:
        raise Fatal(EX_USAGE, f"bad spec: {e}") from None
    except NoLogs as e:
        raise Fatal(EX_USAGE, f"no logs: {e}") from None
    except UnreadableLog as e:
        raise Fatal(EX_NOINPUT, f"cannot read log: {e}") from None


@app.command()
def version() -> None:
    """Print the auditor's version."""
    print(__version__)


@app.command()
def verdict(
    logs: list[str] = typer.Argument(..., metavar="LOG...", help=LOGS_HELP),
    spec: list[str] = typer.Option(
        [],
        "--spec",
        help="a shipped window's name or a spec path (repeatable); "
        "default: every shipped window whose regime applies",
    ),
    control: str = typer.Option(None, "--control", help="a control log for `control` claims"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
    junit: str = typer.Option(None, "--junit", help="also write a JUnit XML report here"),
    live: bool = typer.Option(
        False,
        "--live",
        help="the logs are a server's still running: judge them as a window that ends at their "
        "last line (claims about the end of the run are decided as of there; requests in "
        "flight there stay UNDECIDED)",
    ),
    jobs: int = typer.Option(
        0,
        "--jobs",
        min=0,
        help="processes that read the logs, each for a share of the windows; 0: one per core "
        "for logs of 64 MB or more, else one",
    ),
) -> int:
    """PASS / FAIL / UNDECIDED per claim; exit 0 / 1 / 2."""

    def run():
        files = expand_logs(logs)
        if spec:
            specs = [resolve(s) for s in spec]
        else:
            specs = [load_spec(p) for p in shipped()]
            if not specs:
                raise Fatal(EX_USAGE, f"no shipped specs under {acceptance_dir()}; pass --spec")
        return evaluate(specs, files, control, only_applicable=not spec, live=live, jobs=jobs)

    report = _guard(run)
    if junit:
        try:
            Path(junit).write_text(to_junit(report), encoding="utf-8")
        except OSError as e:
            raise Fatal(EX_CANTCREAT, f"cannot write {junit}: {e.strerror or e}") from None
    if as_json:
        print(to_json(report))
    else:
        print_report(report, _console())
        if not report.specs:
            print("no spec applies to these logs: nothing was decided (UNDECIDED)")
    return report.status.exit_code


@app.command("self-test")
def self_test_cmd(
    spec: str = typer.Argument(None, help="one window's name or spec path; default: all"),
) -> int:
    """Run every spec's cases; fail if any disagrees or a claim lacks a FAIL/UNDECIDED case."""

    def run():
        specs = [resolve(spec)] if spec else [load_spec(p) for p in shipped()]
        return [self_test(s) for s in specs]

    results = _guard(run)
    console = _console()
    bad = 0
    for r in results:
        console.print(f"{r.spec}: {'ok' if r.ok else 'FAILED'} ({len(r.cases)} cases)")
        for c in r.cases:
            for p in c.problems:
                console.print(f"  case {c.name}: {p}", markup=False)
        for p in r.coverage:
            console.print(f"  coverage: {p}", markup=False)
        bad += not r.ok
    if not results:
        raise Fatal(EX_USAGE, "no specs to self-test")
    return 1 if bad else 0


@app.command()
def specs() -> None:
    """List the shipped acceptance windows and their claims."""
    console = _console()
    for p in shipped():
        s = _guard(lambda p=p: load_spec(p))
        console.print(f"[bold]{s.name}[/bold]: {s.description}")
        for c in s.claims:
            console.print(f"  {c.id} ({c.kind}): {c.description}", markup=False)


@app.command()
def explain(
    logs: list[str] = typer.Argument(..., metavar="LOG...", help=LOGS_HELP),
    rid: str = typer.Option(..., "--rid", help="the request id"),
) -> int:
    """One request's receipts as a timeline."""
    found, _ = _guard(lambda: timeline(expand_logs(logs), rid))
    if not found:
        print(f"no receipt names {rid}")
        return 1
    t0 = found[0].get("ts") or 0
    table = Table(title=f"{rid}: {len(found)} receipts")
    for col in ("+s", "rank", "iter", "seq", "event", "fields"):
        table.add_column(col)
    for r in found:
        ts = r.get("ts")
        dt = f"{ts - t0:.3f}" if isinstance(ts, int | float) else "?"
        table.add_row(dt, str(r["rank"]), str(r.get("iter")), str(r["seq"]), r["event"], detail(r))
    _console().print(table)
    return 0


@app.command()
def summary(logs: list[str] = typer.Argument(..., metavar="LOG...", help=LOGS_HELP)) -> int:
    """Receipts per kind and rank; pool usage over time."""
    s = _guard(lambda: summarize(expand_logs(logs)))
    console = _console()
    by_kind = s.kinds_by_rank()
    ranks = sorted(s.stats.ranks)
    table = Table(title="receipts per kind and rank")
    table.add_column("kind")
    for r in ranks:
        table.add_column(f"rank {r}", justify="right")
    for kind, per in by_kind.items():
        table.add_row(kind, *(str(per.get(r, 0)) for r in ranks))
    console.print(table)
    for rank, series in sorted(s.usage.items()):
        use = [u for _, u in series]
        span = series[-1][0] - series[0][0]
        console.print(
            f"rank {rank} pool usage over {span:.1f} s ({len(use)} iteration receipts, "
            f"peak {max(use):.0%}): {sparkline(use)}"
        )
    st = s.stats
    console.print(
        f"{st.lines} lines: {st.receipts} receipts, {st.text} text, {st.foreign_json} foreign "
        f"JSON, {st.garbage} garbage, {st.truncated} truncated, {st.malformed} malformed"
    )
    incomplete = st.incomplete()
    if incomplete:
        console.print(f"incomplete ({incomplete[0]}): {incomplete[1]}", markup=False)
    return 0


@app.command()
def diff(
    a: str = typer.Argument(..., metavar="A", help="the first boot log (the baseline)"),
    b: str = typer.Argument(..., metavar="B", help="the boot log to compare with it"),
    spec: list[str] = typer.Option(
        [], "--spec", help="a window's name or a spec path (repeatable); default: every shipped one"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the comparison as JSON"),
) -> int:
    """Two boot logs side by side: receipts per kind, verdicts, latency, pool peaks; exit 0."""

    def run():
        with spooled([a, b]) as (read_a, read_b):  # each log is read twice: a stream copied
            d = compare(read_a, read_b, spec)
        for side, name in ((d.a, a), (d.b, b)):
            side.log, side.report.logs = name, [name]
        return d

    d = _guard(run)
    if as_json:
        print(diff_json(d))
    else:
        _console().print(diff_table(d))
    return 0


@app.command()
def report(
    logs: list[str] = typer.Argument(..., metavar="LOG...", help=LOGS_HELP),
    output: str = typer.Option("report.html", "-o", "--output", help="the HTML file to write"),
    spec: list[str] = typer.Option(
        [], "--spec", help="a window or spec path (repeatable); default: shipped ones that apply"
    ),
) -> int:
    """One offline HTML page: verdicts, pool usage, pressure events, queue, latency; exit 0."""
    try:  # plotly is the `audit` extra: the base install stays light
        from audit.report import render
    except ModuleNotFoundError as e:
        if (e.name or "").partition(".")[0] != "plotly":
            raise
        raise Fatal(
            EX_UNAVAILABLE, "`audit report` needs plotly: pip install 'attest[audit]'"
        ) from None

    def run():
        files = expand_logs(logs)
        specs = [resolve(s) for s in spec] if spec else [load_spec(p) for p in shipped()]
        with spooled(files) as read:  # each log is read twice: a stream copied first
            data, verdicts = collect(read), evaluate(specs, read, only_applicable=not spec)
        verdicts.logs = files
        return data, verdicts

    data, verdicts = _guard(run)
    try:
        Path(output).write_text(render(data, verdicts), encoding="utf-8")
    except OSError as e:
        raise Fatal(EX_CANTCREAT, f"cannot write {output}: {e.strerror or e}") from None
    print(f"wrote {output} ({data.stats.receipts} receipts; verdict {verdicts.status.value})")
    return 0


def main(argv: list[str] | None = None) -> None:
    try:
        rv = app(args=argv, standalone_mode=False)
    except UsageError as e:  # unknown command or option, bad value: 64, with the reason
        e.show()
        sys.exit(EX_USAGE)
    except Fatal as e:
        print(f"audit: {e}", file=sys.stderr)
        sys.exit(e.code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.exit(130)
    except Exception as e:  # never a traceback instead of a verdict: 70, with the reason
        print(f"audit: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(EX_SOFTWARE)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
