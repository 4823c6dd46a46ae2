"""How the command line prints rows: a table for people, JSON lines or CSV for scripts.

Pull results are printed whole (:func:`print_rows`); a push query's changes are printed one
at a time as they arrive (:class:`ChangePrinter`), so nothing waits for the stream to end.
Errors a user can fix get one sentence that says how (:func:`failure_message`). On a
terminal, progress goes to stderr: a spinner with the elapsed time while a pull query runs
long (:class:`Elapsed`), a bar per restoring partition in ``sparkiq status --watch``
(:func:`restore_bars`).
"""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import math
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any, Literal

from rich.console import Console, ConsoleOptions, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.spinner import Spinner
from rich.table import Table

from sparkiq.errors import AuthenticationError, NodeUnreachableError
from sparkiq.sql.change import Change
from sparkiq.wire.jsonapi import dumps

__all__ = [
    "FORMATS",
    "ChangePrinter",
    "Elapsed",
    "Format",
    "failure_message",
    "print_rows",
    "restore_bars",
    "restore_fraction",
    "text_of",
]

Format = Literal["table", "json", "csv"]
FORMATS: tuple[Format, ...] = ("table", "json", "csv")


def text_of(value: Any) -> str:
    """One value as a table or CSV cell shows it: NULL as empty, timestamps in ISO form,
    nested values as JSON."""
    if value is None:
        return ""
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat(sep=" ") if isinstance(value, dt.datetime) else value.isoformat()
    if isinstance(value, str | int | float | decimal.Decimal | bool):
        return str(value)
    return dumps(value).decode()


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | decimal.Decimal) and not isinstance(value, bool)


def print_rows(
    out: IO[str],
    columns: Sequence[str],
    rows: Sequence[dict[str, Any]],
    form: Format,
    *,
    console: Console | None = None,
) -> None:
    """``rows`` in ``form``: a table (on ``console``, else one writing to ``out``), one JSON
    object per line, or CSV with a header line."""
    if form == "json":
        for row in rows:
            out.write(dumps(row).decode() + "\n")
    elif form == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([text_of(row.get(c)) for c in columns])
    else:
        table = Table(header_style="bold")
        for column in columns:
            values = [row.get(column) for row in rows if row.get(column) is not None]
            numeric = bool(values) and all(_is_number(v) for v in values)
            table.add_column(column, justify="right" if numeric else "left")
        for row in rows:
            table.add_row(*(text_of(row.get(c)) for c in columns))
        if console is None:
            # piped: no terminal width to fit, so columns keep their values whole
            console = Console(file=out, width=None if out.isatty() else 10_000)
        console.print(table)
    out.flush()


class ChangePrinter:
    """Prints a push query's changes as they arrive.

    ``json``: the change as the REST stream gives it (key, row, batch_id, position,
    snapshot). ``csv`` and ``table``: ``batch``, then the row's columns (taken from the first
    row seen); a deleted key shows its key and ``deleted``.
    """

    def __init__(self, out: IO[str], form: Format) -> None:
        self._out, self._form = out, form
        self._columns: list[str] | None = None
        self._widths: list[int] = []
        self._csv = csv.writer(out, lineterminator="\n")

    def __call__(self, change: Change) -> None:
        if self._form == "json":
            doc = {
                "key": change.key,
                "row": change.row,
                "batch_id": change.batch_id,
                "position": change.position.to_token(),
                "snapshot": change.snapshot,
            }
            self._out.write(dumps(doc).decode() + "\n")
        else:
            if self._columns is None and change.row is not None:
                self._columns = list(change.row)
                self._header(["batch", *self._columns])
            if change.row is None:  # a deleted key (or one that stopped matching)
                cells = [str(change.batch_id), f"{text_of(change.key)} deleted"]
            else:
                columns = self._columns or []
                cells = [str(change.batch_id), *(text_of(change.row.get(c)) for c in columns)]
            if self._form == "csv":
                self._csv.writerow(cells)
            else:
                self._out.write(self._line(cells) + "\n")
        self._out.flush()

    def _header(self, names: list[str]) -> None:
        if self._form == "csv":
            self._csv.writerow(names)
            return
        # A stream has no end to measure widths at: each column gets room for its name and
        # a typical value, and a longer value pushes the rest of its line to the right.
        self._widths = [max(len(n), 12) for n in names]
        self._out.write(self._line(names) + "\n")
        self._out.write("-+-".join("-" * w for w in self._widths) + "\n")

    def _line(self, cells: list[str]) -> str:
        widths = self._widths or [12] * len(cells)
        return " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)).rstrip()


def failure_message(exc: Exception, url: str, token: str | None) -> str | None:
    """What to tell a user whose call to the node at ``url`` (made with ``token``) failed in
    a way they can fix: the node is not there, a token is missing or wrong. None for any
    other failure."""
    if isinstance(exc, NodeUnreachableError):
        if "CERTIFICATE_VERIFY_FAILED" in str(exc):
            return (
                f"the certificate of {url} could not be verified: pass the CA that signed it "
                "with --ca or SPARKIQ_TLS_CA"
            )
        # A node serving HTTPS hangs up on plain HTTP: connected, then no answer.
        spoke_tls = url.startswith("http://") and "refused" not in str(exc).lower()
        hint = " (a node started with --tls-cert needs an https:// URL)" if spoke_tls else ""
        return f"cannot reach {url}: is `sparkiq serve` running? set --url or SPARKIQ_URL{hint}"
    if isinstance(exc, AuthenticationError):
        if token:
            return "the node refused the token: check --token or SPARKIQ_TOKEN"
        return "the node needs a token: pass --token or SPARKIQ_TOKEN"
    return None


class Elapsed:
    """``with Elapsed(sys.stderr, "running query"):`` around a blocking call: once the call
    has taken ``after`` seconds, and only when ``stream`` is a terminal, a spinner with the
    elapsed time is drawn on ``stream`` until the call ends; then it is erased, so nothing of
    it stays in the output. Piped, it writes nothing.

    A timer thread starts the display and the caller's thread stops it: ``_lock`` guards
    ``_live`` and ``_done``, so a call ending just as the timer fires leaves no spinner behind.
    """

    def __init__(self, stream: IO[str], label: str, after: float = 1.0) -> None:
        self._stream, self._label, self._after = stream, label, after
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._done = False
        self._timer: threading.Timer | None = None
        self._started = 0.0

    def __enter__(self) -> Elapsed:
        self._started = time.monotonic()
        if self._stream.isatty():
            self._timer = threading.Timer(self._after, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def _show(self) -> None:
        with self._lock:
            if self._done:
                return
            console = Console(file=self._stream)
            self._live = Live(
                _Ticking(self._label, self._started),
                console=console,
                transient=True,
                refresh_per_second=8,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._done = True
            if self._timer is not None:
                self._timer.cancel()
            if self._live is not None:
                self._live.stop()


class _Ticking:
    """A spinner whose text is the time since ``started`` (recomputed at every redraw)."""

    def __init__(self, label: str, started: float) -> None:
        self._label, self._started = label, started
        self._spinner = Spinner("dots", style="cyan")

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Spinner]:
        elapsed = time.monotonic() - self._started
        self._spinner.update(text=f"{self._label}: {elapsed:.1f} s (Ctrl-C stops)")
        yield self._spinner


def restore_bars(partitions: Sequence[Mapping[str, Any]], width: int = 20) -> RenderableType | None:
    """A bar per restoring partition (``status.json``'s partition entries; others are
    skipped): how far it is through its table's batches, the rows applied so far and the
    ETA, in 80 columns. None when nothing is restoring."""
    restoring = [p for p in partitions if p.get("state") == "restoring"]
    if not restoring:
        return None
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(width=width)
    grid.add_column(overflow="fold")
    for p in restoring:
        done, total = restore_fraction(p)
        eta = p.get("eta_seconds")
        words = (
            f"{100 * done // total:>3}% · batch {p['batch_id']}/{p['latest_batch_id']} · "
            f"{p.get('restored_rows', 0):,} rows · "
            + ("ETA unknown" if eta is None else f"ETA {math.ceil(eta)} s")
        )
        label = f"restoring {p['table']}[{p['partition']}]"
        grid.columns[0].min_width = max(grid.columns[0].min_width or 0, len(label))
        grid.add_row(
            label,
            ProgressBar(total=total, completed=done, width=width),
            words,
        )
    return grid


def restore_fraction(partition: Mapping[str, Any]) -> tuple[int, int]:
    """(batches applied, batches to apply) of a partition: how far through its table's batch
    clock it is, the measure the console's bars use too."""
    latest = max(int(partition["latest_batch_id"]), int(partition["batch_id"]), 0)
    return max(0, int(partition["batch_id"]) + 1), latest + 1
