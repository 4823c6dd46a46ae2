"""The console's query-rate charts per table and restore progress in the cluster view, in
headless Chromium against a node with real data; ``GET /stats`` checked against what the test
itself sent (query counts) and against the node's own status (restores)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from sparkiq import Node
from sparkiq.server.metrics import QueryRate
from tests import http_calls
from tests.browser import chromium, needs_chromium, set_token, wait_until
from tests.changelog.helpers import create_changelog, make_table, write_batch
from tests.server.test_charts import CHARTS_DRAWN, compare_with_stats, page_chart
from tests.server.test_console import VIEWPORT, screenshot

pytestmark = needs_chromium
TOKEN = "tok"


def rest(node: Node, method: str, path: str, **kwargs: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {TOKEN}"}
    return http_calls.request(method, f"{node.url}{path}", headers=headers, timeout=30, **kwargs)


def open_console(browser: Any, node: Node, timezone_id: str = "UTC") -> Any:
    page = browser.new_page(viewport=VIEWPORT, timezone_id=timezone_id)
    page.goto(f"{node.url}/")
    set_token(page, TOKEN)
    return page


def replay(status: int, doc: Any) -> Any:
    """A route handler answering with ``doc``, a document the node gave earlier."""

    def handle(route: Any) -> None:
        route.fulfill(status=status, content_type="application/json", json=doc)

    return handle


def test_query_rate_per_table(tmp_path: Path) -> None:
    t = make_table(str(tmp_path), "t")
    write_batch(t, 0, {f"k{i:02d}": i for i in range(20)})
    u = create_changelog(str(tmp_path), "u", t.manifest().schema.spark_json())
    write_batch(u, 0, {"a": 1})
    with Node(str(tmp_path), node_id="n0", listen="127.0.0.1:0", token=TOKEN) as node:
        node.poll_once()
        sent = {"t": 0, "u": 0}  # the ground truth: what this test asked, per table
        for i in range(5):
            assert rest(node, "GET", f"/stores/t/keys/k{i:02d}").status_code == 200
            sent["t"] += 1
        assert rest(node, "GET", "/stores/t/keys/nope").status_code == 404  # answered: counts
        sent["t"] += 1
        for sql in ("SELECT count(*) AS n FROM t", "SELECT n FROM t WHERE k = 'k03'"):
            assert rest(node, "POST", "/query", json={"sql": sql}).status_code == 200
            sent["t"] += 1
        join = "SELECT t.k, u.n FROM t JOIN u ON t.n = u.n"  # one statement, both tables
        assert rest(node, "POST", "/query", json={"sql": join}).json()["rows"] == [
            {"k": "k01", "n": 1}
        ]
        sent["t"] += 1
        sent["u"] += 1
        body = {"query": {"type": "range"}}
        assert rest(node, "POST", "/stores/t/query", json=body).status_code == 200
        sent["t"] += 1
        # refused before reading anything: not a query of the table
        assert rest(node, "POST", "/query", json={"sql": "SELECT nn FROM t"}).status_code == 400
        assert rest(node, "POST", "/query", json={"sql": "EXPLAIN SELECT * FROM t"}).is_success
        assert sent == {"t": 10, "u": 1}

        stats = rest(node, "GET", "/stats").json()
        assert stats["node_id"] == "n0" and stats["interval_seconds"] == 5.0
        assert {name: sum(c) for name, c in stats["queries"].items()} == sent
        assert all(len(c) == 120 for c in stats["queries"].values())
        assert stats["end"] >= time.time() - 1
        metrics = rest(node, "GET", "/metrics").text
        assert 'sparkiq_queries_total{store="t"} 10.0' in metrics
        assert 'sparkiq_queries_total{store="u"} 1.0' in metrics

        with chromium() as browser:
            # a zone east of UTC by a half hour: the time axis is the viewer's
            page = open_console(browser, node, "Asia/Kolkata")
            wait_until(page, CHARTS_DRAWN)
            # the page itself queries nothing in the cluster view: the totals stay ours
            for name, want in sent.items():
                svg, drawn = page_chart(page, f"chart-rate-{name}")
                assert drawn.title == f"{name}: query rate" and drawn.y_title == "queries/s"
                assert drawn.x_title == "time (UTC+05:30)"
                assert len(drawn.x_labels) >= 4  # a whole-minute tick every 2 minutes
                # the plotted value of a bucket is its count per second
                assert sum(drawn.points.values()) * 5 == pytest.approx(want)
                assert len(drawn.points) == 120
                queries = [n / 5 for n in stats["queries"][name]]
                assert compare_with_stats(svg, queries, stats["end"], 5.0, 330) >= 100
                # lag and freshness are sampled from the first /stats on: a few buckets
                _, lag = page_chart(page, f"chart-lag-{name}")
                assert lag.y_title == "batches" and set(lag.points.values()) == {0.0}
                _, fresh = page_chart(page, f"chart-fresh-{name}")
                assert fresh.y_title == "seconds" and fresh.points
                # no writer status record for these tables: nothing to draw, and it says so
                _, writer = page_chart(page, f"chart-input-{name}")
                assert writer.no_data == "no samples yet" and writer.y_title == "rows/s"
            # every chart keeps the size the page gave it: nothing moves when one arrives
            sizes = page.eval_on_selector_all(
                "#charts img", "imgs => imgs.map(i => [i.offsetWidth, i.offsetHeight])"
            )
            assert sizes == [[262, 172]] * 8
            screenshot(page, tmp_path, "charts")
            # more queries show up at the next refresh
            for _ in range(4):
                rest(node, "GET", "/stores/u/keys/a")
            deadline = time.monotonic() + 60
            while sum(page_chart(page, "chart-rate-u")[1].points.values()) * 5 < 4.5:
                assert time.monotonic() < deadline, "the new queries never showed"
                time.sleep(0.2)
            assert sum(page_chart(page, "chart-rate-u")[1].points.values()) * 5 == pytest.approx(5)
            assert sum(page_chart(page, "chart-rate-t")[1].points.values()) * 5 == pytest.approx(10)


def test_query_rate_buckets_move_with_the_clock() -> None:
    now = [1000.0]
    rate = QueryRate(interval=5.0, buckets=4, clock=lambda: now[0])
    rate.count(["t"])
    rate.count(["t", "u"])
    now[0] = 1007.0  # the next bucket
    rate.count(["t"])
    doc = rate.series(["t", "u", "v"])
    assert doc["queries"] == {"t": [0, 0, 2, 1], "u": [0, 0, 1, 0], "v": [0, 0, 0, 0]}
    assert doc["end"] == 1010.0
    assert rate.series(["u"])["queries"] == {"u": [0, 0, 1, 0]}  # only what was asked for
    now[0] = 1021.0  # the first bucket left the 20 s window
    assert rate.series()["queries"] == {"t": [1, 0, 0, 0]}
    now[0] = 1100.0
    assert rate.series()["queries"] == {}
    with pytest.raises(ValueError):
        QueryRate(interval=0)


def test_restore_progress_in_the_cluster_view(tmp_path: Path) -> None:
    """A node restoring a backlog: ``GET /stats`` and ``GET /metadata`` are read while the
    restore runs (a restore of a few hundred batches lasts less than one console refresh, so
    the test catches the documents the page fetches and hands exactly those to the page),
    then the rendered progress is checked against them."""
    t = make_table(str(tmp_path / "state"), "t")
    batches = 300
    for b in range(batches):
        write_batch(t, b, {f"k{(b * 37 + i) % 3000:04d}": b for i in range(100)})
    node = Node(
        str(tmp_path / "state"), node_id="n0", listen="127.0.0.1:0", peers=[], token=TOKEN
    ).start()
    try:
        stats = metadata = ready = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            doc = rest(node, "GET", "/stats").json()
            meta = rest(node, "GET", "/metadata").json()
            readyz = rest(node, "GET", "/readyz")
            restoring = [
                s for s in doc["partitions"] if s["state"] == "restoring" and s["eta_seconds"]
            ]
            hosted = meta["nodes"][0]["hosted"].get("t", {})
            if restoring and all(
                hosted.get(str(s["partition"]), {}).get("state") == "restoring" for s in restoring
            ):
                stats, metadata, ready = doc, meta, readyz
                break
            if doc["partitions"] and all(s["state"] == "live" for s in doc["partitions"]):
                pytest.fail("the restore ended before it could be observed")
        assert stats is not None and metadata is not None and ready is not None
        assert ready.status_code == 503  # restoring is not ready (its head is known at once)
        # the node's own view of a restore: rows applied so far, a known head, an ETA
        for s in stats["partitions"]:
            assert s["latest_batch_id"] == batches - 1
            if s["state"] == "restoring":
                assert s["lag_batches"] == batches - 1 - s["batch_id"] > 0
                # A partition may not have applied its first batch yet (no ETA then): on a
                # busy machine one was caught with 0 rows applied while another had an ETA.
                assert 0 <= s["restored_rows"] <= 100 * (s["batch_id"] + 1)
                if s["eta_seconds"]:  # from batches it applied, each with rows
                    assert s["restored_rows"] > 0
        assert node.wait_for("t", batches - 1, timeout=120)
        assert rest(node, "GET", "/readyz").status_code == 200

        with chromium() as browser:
            page = browser.new_page(viewport=VIEWPORT)
            fetched = {
                "/stats": (200, stats),
                "/metadata": (200, metadata),
                "/readyz": (503, ready.json()),
            }
            for path, (status, doc) in fetched.items():
                page.route(f"**{path}", replay(status, doc))
            page.goto(f"{node.url}/")
            set_token(page, TOKEN)
            page.wait_for_selector(".restore")
            shown = page.eval_on_selector_all(
                ".restore",
                "els => els.map(e => [Number(e.dataset.partition), e.textContent,"
                " e.querySelector('progress').value, e.querySelector('progress').max])",
            )
            hosted = metadata["nodes"][0]["hosted"]["t"]
            want = []
            for s in stats["partitions"]:
                state = hosted[str(s["partition"])]
                if state["state"] != "restoring":
                    continue
                latest = state["batch_id"] + state["lag_batches"]
                done = state["batch_id"] + 1
                eta = (
                    "ETA unknown"
                    if s["eta_seconds"] is None
                    else f"ETA {math.ceil(s['eta_seconds'])} s"
                )
                want.append(
                    [
                        s["partition"],
                        f"restoring {100 * done // (latest + 1)}% · batch "
                        f"{state['batch_id']} of {latest} · "
                        f"{s['restored_rows']:,} rows applied · {eta}",
                        done,
                        latest + 1,
                    ]
                )
            assert sorted(shown) == sorted(want) and want
            cells = page.eval_on_selector_all(
                "table.grid td.restoring", "els => els.map(e => e.firstChild.textContent)"
            )
            assert sorted(cells) == sorted(
                f"active · batch {hosted[str(w[0])]['batch_id']} · "
                f"lag {hosted[str(w[0])]['lag_batches']} · restoring"
                for w in want
            )
            assert page.inner_text("#ready").startswith("not ready: t/")
            screenshot(page, tmp_path, "cluster-restoring")
            for path in fetched:
                page.unroute(f"**{path}")
            # live again: the page shows the finished restore at its next refresh
            wait_until(page, "document.querySelectorAll('.restore').length === 0")
            wait_until(page, "document.getElementById('ready').textContent === 'ready'")
    finally:
        node.stop()
