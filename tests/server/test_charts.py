"""The console's charts (sparkiq.server.charts): SVGs drawn by pygal for no sample, one and
many, read back as a browser would get them; the gauge history they draw from; and
``GET /charts/{store}/{chart}`` on a real node, whose values must be ``GET /stats``' bucket
for bucket, and whose bad requests are refused with a 4xx that says why."""

from __future__ import annotations

import time
import urllib.parse
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from sparkiq import Node
from sparkiq.changelog import open_storage
from sparkiq.changelog.writer_status import WriterStatus, write_writer_status
from sparkiq.server.charts import NO_SAMPLES, render
from sparkiq.server.history import GaugeHistory
from tests import http_calls
from tests.changelog.helpers import make_table, write_batch
from tests.cluster.cluster_helpers import wait_until

SVG = "{http://www.w3.org/2000/svg}"


@dataclass
class Drawn:
    """What a chart shows, read from its SVG (independently of how it was made)."""

    title: str
    x_title: str
    y_title: str
    x_labels: list[str]  # the labelled ticks of the time axis
    y_labels: list[float]
    points: dict[str, float]  # bucket label -> value, as each dot carries it
    no_data: str | None


def read_chart(svg: str) -> Drawn:
    root = ET.fromstring(svg)

    def texts(xpath: str) -> list[str]:
        return ["".join(e.itertext()) for e in root.iterfind(xpath)]

    titles = root.find(f".//{SVG}g[@class='titles']")
    assert titles is not None, "no titles"
    heads = ["".join(t.itertext()) for t in titles]
    rotated = ["".join(t.itertext()) for t in titles if "rotate" in (t.get("transform") or "")]
    points = {}
    for dot in root.iter(f"{SVG}g"):
        if dot.get("class") != "dots":
            continue
        desc = {d.get("class"): d.text or "" for d in dot.iterfind(f"{SVG}desc")}
        points[desc["x_label"]] = float(desc["value"])
    no_data = texts(f".//{SVG}text[@class='no_data']")
    return Drawn(
        title=texts(f"{SVG}title")[0],
        x_title=next(h for h in heads[1:] if h not in rotated),
        y_title=" ".join(rotated),
        x_labels=[
            "".join(t.itertext())
            for g in root.iter(f"{SVG}g")
            if g.get("class") == "axis x"
            for t in g.iter(f"{SVG}text")
        ],
        y_labels=[
            float("".join(t.itertext()))
            for g in root.iter(f"{SVG}g")
            if (g.get("class") or "").startswith("axis y")
            for t in g.iter(f"{SVG}text")
        ],
        points=points,
        no_data=no_data[0] if no_data else None,
    )


#: Every chart image of the page loaded (drawn by the browser, so allowed by the page's
#: policy) at least once.
CHARTS_DRAWN = (
    "Number(document.getElementById('charts').dataset.drawn || 0) >= 1"
    " && [...document.querySelectorAll('#charts img')].length > 0"
    " && [...document.querySelectorAll('#charts img')]"
    ".every(i => i.complete && i.naturalWidth > 0 && i.src.startsWith('data:'))"
)


def page_chart(page: Any, element_id: str) -> tuple[str, Drawn]:
    """The SVG a console's chart image shows (its data: URL), and what it draws."""
    src = page.get_attribute(f"#{element_id}", "src") or ""
    head, _, body = src.partition(",")
    assert head == "data:image/svg+xml;charset=utf-8", src[:80]
    svg = urllib.parse.unquote(body)
    return svg, read_chart(svg)


def bucket_label(start: float, tz_offset: int = 0) -> str:
    """The time axis's label of a bucket starting at ``start``, ``tz_offset`` minutes east
    of UTC."""
    stamp = time.gmtime(start + tz_offset * 60)
    return time.strftime("%H:%M" if stamp.tm_sec == 0 else "%H:%M:%S", stamp)


END = 1_800_000_000.0  # a whole minute (and hour): 2027-01-15 08:00 UTC


def test_a_chart_without_samples_says_so() -> None:
    drawn = read_chart(render("freshness", "orders", 5.0, END, (None,) * 120).decode())
    assert drawn.no_data == NO_SAMPLES
    assert drawn.points == {}
    assert drawn.title == "orders: freshness"
    assert drawn.x_title == "time (UTC)" and drawn.y_title == "seconds"
    assert drawn.y_labels == [0, 1]
    # the window's whole-minute ticks, every 2 minutes over 10 minutes
    assert drawn.x_labels == ["07:50", "07:52", "07:54", "07:56", "07:58"]


def test_one_sample_is_drawn_with_its_time() -> None:
    values = (None,) * 119 + (1234.5,)
    drawn = read_chart(render("input", "orders", 5.0, END, values).decode())
    assert drawn.no_data is None
    assert drawn.points == {bucket_label(END - 5): 1234.5} == {"07:59:55": 1234.5}
    assert drawn.title == "orders: writer input" and drawn.y_title == "rows/s"
    assert drawn.y_labels[0] == 0 and drawn.y_labels[-1] >= 1234.5
    assert len(drawn.y_labels) <= 6


def test_many_samples_gaps_and_a_time_zone() -> None:
    values: tuple[float | None, ...] = tuple(
        None if i % 10 == 3 else float(i % 7) for i in range(120)
    )
    drawn = read_chart(render("lag", "orders", 5.0, END, values, tz_offset=90).decode())
    want = {
        bucket_label(END - (120 - i) * 5 + 90 * 60): v
        for i, v in enumerate(values)
        if v is not None
    }
    assert drawn.points == want and len(want) == 108
    assert drawn.x_title == "time (UTC+01:30)" and drawn.y_title == "batches"
    assert drawn.x_labels == ["09:20", "09:22", "09:24", "09:26", "09:28"]
    # a count of batches has whole ticks
    assert drawn.y_labels == [0, 2, 4, 6]


def test_gauge_history_keeps_the_highest_sample_of_a_bucket() -> None:
    now = [1000.0]
    history = GaugeHistory(interval=5.0, buckets=4, clock=lambda: now[0], min_gap=1.0)
    assert history.record({"t": {"lag_seconds": 2.0}})
    now[0] = 1000.5  # within min_gap: dropped
    assert not history.record({"t": {"lag_seconds": 9.0}})
    now[0] = 1001.5
    assert history.record({"t": {"lag_seconds": 1.0, "lag_batches": 3.0}})
    now[0] = 1011.0  # two buckets on: the one between was never sampled
    assert history.record({"t": {"lag_seconds": 0.5}})
    doc = history.series(["t", "u"])
    assert doc["end"] == 1015.0 and doc["interval_seconds"] == 5.0
    assert doc["tables"]["t"] == {
        "lag_batches": [None, 3.0, None, None],
        "lag_seconds": [None, 2.0, None, 0.5],
        "input_rows_per_second": [None, None, None, None],
    }
    assert doc["tables"]["u"]["lag_seconds"] == [None] * 4
    now[0] = 1040.0  # everything left the window
    assert history.series(["t"])["tables"]["t"]["lag_seconds"] == [None] * 4
    with pytest.raises(ValueError):
        GaugeHistory(interval=0)


def get(node: Node, path: str) -> httpx.Response:
    return http_calls.get(f"{node.url}{path}", headers={"authorization": "Bearer tok"}, timeout=30)


def compare_with_stats(
    svg: str, series: list[float | None], end: float, step: float, tz_offset: int = 0
) -> int:
    """Assert every bucket both the chart and ``series`` (from /stats) have, but the newest
    of either (still filling), has the same value; returns how many were compared."""
    drawn = read_chart(svg)
    stats = {
        bucket_label(end - (len(series) - i) * step, tz_offset): v
        for i, v in enumerate(series)
        if v is not None
    }
    last = list(drawn.points)[-1:]  # the chart's newest bucket (labels sort only within a day)
    newest = {bucket_label(end - step, tz_offset), *last}
    common = (set(drawn.points) & set(stats)) - newest
    for label in common:
        assert drawn.points[label] == pytest.approx(stats[label], rel=1e-6), label
    return len(common)


def test_charts_over_http_match_stats(tmp_path: Path) -> None:
    changelog = make_table(str(tmp_path), partitions=2)
    write_batch(changelog, 0, {f"k{i:02d}": i for i in range(20)})
    storage = open_storage(str(tmp_path))
    with Node(str(tmp_path), node_id="c0", listen="127.0.0.1:0", token="tok") as node:
        node.poll_once()

        # the writer's record, as a running driver rewrites it: its input rate is charted
        def writer_runs() -> None:
            now = time.time()
            status = WriterStatus("t", "running", now, batch_id=0, committed_at=now)
            write_writer_status(storage, replace(status, input_rows_per_second=42.5))

        writer_runs()
        wait_until(
            lambda: get(node, "/stats").json()["writers"][0]["state"] == "running",
            60,
            "the node never read the writer's record",
        )
        for i in range(7):
            assert get(node, f"/stores/t/keys/k{i:02d}").status_code == 200

        answer = get(node, "/charts/t/queries")
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "image/svg+xml"
        assert "script-src" not in answer.headers["content-security-policy"]
        assert answer.headers["content-security-policy"].startswith("default-src 'none'")
        stats = get(node, "/stats").json()
        step, end = stats["interval_seconds"], stats["end"]
        drawn = read_chart(answer.text)
        assert drawn.title == "t: query rate" and drawn.y_title == "queries/s"
        # 7 lookups, in the newest bucket or the one before it: per second of a bucket
        assert sum(v * step for v in drawn.points.values()) == pytest.approx(7)
        compare_with_stats(answer.text, [n / step for n in stats["queries"]["t"]], end, step)

        # the gauges: sampled by each read of /stats or a chart, at most once a second;
        # wait for a few buckets to close and compare them
        deadline = time.monotonic() + 120
        compared = 0
        while compared < 1:
            assert time.monotonic() < deadline, "no closed bucket in 2 minutes"
            charts = {c: get(node, f"/charts/t/{c}").text for c in ("lag", "freshness", "input")}
            stats = get(node, "/stats").json()
            gauges = stats["gauges"]["t"]
            step, end = stats["interval_seconds"], stats["end"]
            compared = min(
                compare_with_stats(charts["lag"], gauges["lag_batches"], end, step),
                compare_with_stats(charts["freshness"], gauges["lag_seconds"], end, step),
                compare_with_stats(charts["input"], gauges["input_rows_per_second"], end, step),
            )
            writer_runs()
            time.sleep(1.0)
        assert set(read_chart(charts["input"]).points.values()) == {42.5}
        assert set(read_chart(charts["lag"]).points.values()) == {0.0}  # all applied
        assert read_chart(get(node, "/charts/t/lag?minutes=1").text).x_labels  # a minute

        # refused, each with what to do
        refusals = {
            "/charts/nope/lag": (404, "unknown_store", "this node serves ['t']"),
            "/charts/t/speed": (404, "not_found", "lag, freshness, queries, input"),
            "/charts/t/lag?minutes=0": (400, "invalid_request", "from 1 to 10"),
            "/charts/t/lag?minutes=ten": (400, "invalid_request", "got 'ten'"),
            "/charts/t/lag?tz_offset=900": (400, "invalid_request", "minutes east of UTC"),
            "/charts/t/lag?width=9": (400, "invalid_request", "takes minutes and tz_offset"),
            "/charts/t/lag?minutes=1&minutes=2": (400, "invalid_request", "given twice"),
        }
        for path, (status, code, words) in refusals.items():
            answer = get(node, path)
            assert answer.status_code == status, (path, answer.text)
            error: dict[str, Any] = answer.json()["error"]
            assert error["code"] == code and words in error["message"], (path, error)
        assert http_calls.get(f"{node.url}/charts/t/lag", timeout=30).status_code == 401
