"""The console's charts: ``GET /charts/{store}/{chart}``, one SVG drawn by the node with
pygal from its recent history (docs/design.md, "The console's charts: SVG drawn by the
node").

A chart is one series of one table over the node's window (10 minutes of 5-second buckets):

- ``lag``: batches behind, the most behind active partition of the table, cluster-wide;
- ``freshness``: seconds behind, the most behind partition this node hosts;
- ``queries``: queries per second this node was asked over HTTP for the table;
- ``input``: the rows per second the table's writer (its Spark query) read, while it runs.

The first, second and fourth are sampled gauges (:mod:`sparkiq.server.history`): a bucket
nobody sampled in is a gap. The third is :class:`~sparkiq.server.metrics.QueryRate`'s
counts divided by the bucket's length. ``GET /stats`` serves the same numbers as JSON
(``queries`` and ``gauges``), bucket for bucket.

Query parameters: ``minutes`` (the newest minutes shown, 1 to 10, default all 10) and
``tz_offset`` (the viewer's time zone, minutes east of UTC, -840 to 840, default 0: the
time axis is labelled in it). Anything else is refused with a 400 naming it.

Rendering costs a few milliseconds; the same table, series and buckets draw the same
chart, so it is cached (a console refreshing every 2 seconds re-renders a chart only when a bucket
changed). Each point of the line carries its value as pygal writes it for tooltips
(``<desc class="value">``), which is what the tests read back.
"""

from __future__ import annotations

import functools
import math
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import pygal
from pygal.style import Style

from sparkiq.error_codes import ErrorCode
from sparkiq.errors import UnknownStoreError
from sparkiq.principals import check_read
from sparkiq.server.http_errors import HttpError
from sparkiq.server.metrics import Metrics
from sparkiq.server.served import ServedNode

__all__ = ["CHARTS", "Chart", "chart_svg", "render"]


@dataclass(frozen=True, slots=True)
class Chart:
    """One kind of chart: its title after the table's name, the y axis's title (its
    unit), the gauge of :data:`~sparkiq.server.history.GAUGES` it draws (``None``: the
    query rate), and whether its values are whole numbers (integer y ticks)."""

    title: str
    y_title: str
    gauge: str | None
    whole: bool = False


#: The charts by the name their URL gives.
CHARTS: dict[str, Chart] = {
    "lag": Chart("lag", "batches", "lag_batches", whole=True),
    "freshness": Chart("freshness", "seconds", "lag_seconds"),
    "queries": Chart("query rate", "queries/s", None),
    "input": Chart("writer input", "rows/s", "input_rows_per_second"),
}

#: The console's colours (console.html's :root), so a chart looks part of the page.
_STYLE = Style(
    background="#ffffff",
    plot_background="#ffffff",
    foreground="#1d2330",
    foreground_strong="#1d2330",
    foreground_subtle="#d0d5dd",
    colors=("#d9480f",),
    font_family="system-ui, sans-serif",
    title_font_size=13,
    label_font_size=10,
    major_label_font_size=10,
    no_data_font_size=14,
    stroke_width=1.5,
)
#: Width and height of every chart, in CSS pixels (console.html gives its images the same,
#: so nothing moves when one arrives).
WIDTH, HEIGHT = 260, 170
#: What a chart says when its table has no value in the window.
NO_SAMPLES = "no samples yet"
_OFFSET_LIMIT = 14 * 60  # time zones span UTC-12:00 to UTC+14:00


def chart_svg(node: ServedNode, metrics: Metrics, store: str, chart: str, query: bytes) -> bytes:
    """The SVG of ``chart`` for ``store`` (see the module docstring). Raises
    :class:`~sparkiq.errors.UnknownStoreError` for a table the node does not serve, a
    ``ForbiddenError`` for one the caller may not read, and :class:`HttpError` for an
    unknown chart or a bad parameter."""
    if store not in node.tables:
        raise UnknownStoreError(
            f"unknown table {store!r}; this node serves {sorted(node.tables)}", store=store
        )
    check_read([store])
    kind = CHARTS.get(chart)
    if kind is None:
        raise HttpError(
            ErrorCode.NOT_FOUND,
            f"no chart {chart!r}; the charts of a table are {', '.join(CHARTS)}",
            "chart",
        )
    window = metrics.query_rate.buckets * metrics.query_rate.interval / 60
    minutes, offset = _parameters(query, int(window))
    metrics.sample()
    now = time.time()
    doc: dict[str, Any]
    if kind.gauge is None:
        doc = metrics.query_rate.series([store], now=now)
        step = float(doc["interval_seconds"])
        values: list[float | None] = [n / step for n in doc["queries"][store]]
    else:
        doc = metrics.gauges.series([store], now=now)
        values = doc["tables"][store][kind.gauge]
    interval, end = float(doc["interval_seconds"]), float(doc["end"])
    shown = min(len(values), max(1, round(minutes * 60 / interval)))
    return render(chart, store, interval, end, tuple(values[-shown:]), offset)


def _parameters(query: bytes, window: int) -> tuple[int, int]:
    """``minutes`` and ``tz_offset`` from a query string (see the module docstring)."""
    try:
        pairs = urllib.parse.parse_qsl(query.decode("ascii"), keep_blank_values=True)
    except (UnicodeDecodeError, ValueError):
        raise HttpError(
            ErrorCode.INVALID_REQUEST, "the query string is not ASCII", "query"
        ) from None
    found: dict[str, str] = {}
    for name, value in pairs:
        if name not in ("minutes", "tz_offset"):
            raise HttpError(
                ErrorCode.INVALID_REQUEST,
                f"unknown parameter {name[:60]!r}: a chart takes minutes and tz_offset",
                name[:60],
            )
        if name in found:
            raise HttpError(ErrorCode.INVALID_REQUEST, f"{name} is given twice", name)
        found[name] = value
    minutes = _integer(found, "minutes", 1, window, window, "the newest minutes shown")
    offset = _integer(found, "tz_offset", -_OFFSET_LIMIT, _OFFSET_LIMIT, 0, "minutes east of UTC")
    return minutes, offset


def _integer(found: dict[str, str], name: str, low: int, high: int, default: int, what: str) -> int:
    text = found.get(name)
    if text is None:
        return default
    try:
        value = int(text, 10)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise HttpError(
            ErrorCode.INVALID_REQUEST,
            f"{name} must be a whole number from {low} to {high} ({what}), got {text[:60]!r}",
            name,
        )
    return value


@functools.lru_cache(maxsize=128)
def render(
    chart: str,
    store: str,
    interval: float,
    end: float,
    values: tuple[float | None, ...],
    tz_offset: int = 0,
) -> bytes:
    """The SVG of ``values`` (one per ``interval``-second bucket, the last ending at ``end``,
    Unix seconds; ``None`` for a bucket without a sample) as chart ``chart`` of table
    ``store``, its time axis labelled in UTC plus ``tz_offset`` minutes. Cached: the same
    arguments give the same bytes without drawing again."""
    kind = CHARTS[chart]
    starts = [end - (len(values) - i) * interval + tz_offset * 60 for i in range(len(values))]
    labels = [_clock(t) for t in starts]
    # about five whole-minute ticks across the window, the others unlabelled
    span = len(values) * interval / 60
    every = next((m for m in (1, 2, 5, 10, 30, 60) if span / m <= 6), 60)
    major = [label for t, label in zip(starts, labels, strict=True) if t % (every * 60) == 0]
    present = [v for v in values if v is not None]
    top = max(present, default=0.0)
    config = dict(
        width=WIDTH,
        height=HEIGHT,
        style=_STYLE,
        title=f"{store}: {kind.title}",
        x_title=f"time ({_zone(tz_offset)})",
        y_title=kind.y_title,
        show_legend=False,
        show_minor_x_labels=False,
        x_labels_major=major,
        truncate_label=-1,
        allow_interruptions=True,
        dots_size=1.2,
        include_x_axis=True,
        no_data_text=NO_SAMPLES,
        disable_xml_declaration=True,
        js=(),  # no script from elsewhere; an <img> runs none anyway
        margin=6,
        spacing=6,
    )
    config["y_labels"] = _ticks(top, kind.whole)
    line = pygal.Line(**config)
    line.x_labels = labels
    line.add(kind.title, list(values) if present else [])
    return str(line.render()).encode()


def _ticks(top: float, whole: bool) -> list[float]:
    """Four or five evenly spaced y ticks from 0 to at least ``top``, at a step of 1, 2, 2.5
    or 5 times a power of ten (whole numbers for a series of whole numbers)."""
    if top <= 0:
        return [0, 1]
    rough = top / 4
    power = 10 ** math.floor(math.log10(rough))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= rough)
    if whole:
        step = max(1, math.ceil(step))
    return [round(i * step, 9) for i in range(math.ceil(top / step - 1e-9) + 1)]


def _clock(t: float) -> str:
    """``HH:MM`` on a whole minute, else ``HH:MM:SS`` (labels stay distinct)."""
    return time.strftime("%H:%M" if t % 60 == 0 else "%H:%M:%S", time.gmtime(t))


def _zone(offset: int) -> str:
    if offset == 0:
        return "UTC"
    sign = "+" if offset > 0 else "-"
    return f"UTC{sign}{abs(offset) // 60:02d}:{abs(offset) % 60:02d}"
