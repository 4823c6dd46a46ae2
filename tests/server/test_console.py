"""The web console in a real browser (headless Chromium): tables listed, a pull query's
rows shown, an error located, a push query's changes streamed as they are committed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparkiq import Node
from tests.changelog.helpers import make_table, write_batch

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium on this machine (.ci/run installs it)"
)


def test_console_runs_pull_and_push_queries(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    changelog = make_table(str(tmp_path), partitions=4)
    write_batch(changelog, 0, {f"k{i:02d}": i for i in range(30)})
    with Node(str(tmp_path), node_id="console", listen="127.0.0.1:0", token="tok") as node:
        node.poll_once()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page()
                page.goto(f"{node.url}/")
                page.fill("#token", "tok")
                page.dispatch_event("#token", "change")
                page.wait_for_selector("#stores li")
                assert "4 partitions" in page.inner_text("#stores")
                assert "console" in page.inner_text("#nodes")

                page.click("#stores li")  # fills in a query for the table
                page.click("#run")
                page.wait_for_selector("#result table")
                assert page.locator("#result tbody tr").count() == 30

                page.fill("#sql", "SELECT k, n FROM t WHERE nn > 3")
                page.click("#run")
                page.wait_for_function("document.getElementById('error').textContent.length > 0")
                error = page.inner_text("#error")
                assert "unknown column 'nn'" in error and "line 1, column 26" in error

                page.fill("#sql", "SELECT k, n FROM t WHERE n >= 100 EMIT CHANGES")
                page.click("#run")
                page.wait_for_function(
                    "document.getElementById('status').textContent.includes('streaming')"
                )
                write_batch(changelog, 1, {"k01": 101, "k02": 5, "zz": 500})
                page.wait_for_function(
                    "document.getElementById('status').textContent === '2 changes'"
                )
                rows = page.inner_text("#result tbody")
                assert '"n":101' in rows and '"n":500' in rows and '"n":5}' not in rows
                page.click("#stop")
            finally:
                browser.close()
