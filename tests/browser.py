"""Debian's Chromium driven by Playwright, for the tests that read what a browser shows
(the console). Skipped where the machine has no Chromium (.ci/run installs it)."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: ``pytestmark`` of a module whose tests all need the browser.
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium on this machine (.ci/run installs it)"
)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (a Playwright ``Browser``), closed at the end."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def wait_until(page: Any, expression: str, timeout: float = 30.0) -> None:
    """Until ``expression`` is true in the page. Playwright's ``wait_for_function`` evaluates
    its text with ``eval`` inside the page, which the console's Content-Security-Policy
    forbids; ``evaluate`` comes from outside the page and is not subject to it."""
    deadline = time.monotonic() + timeout
    while not page.evaluate(f"() => Boolean({expression})"):
        assert time.monotonic() < deadline, f"never true: {expression}"
        time.sleep(0.05)


def set_token(page: Any, token: str) -> None:
    """Type ``token`` in the console's token field as a user does (the field's "change"
    makes the console use it and refresh)."""
    page.fill("#token", token)
    page.dispatch_event("#token", "change")


def open_first_table(page: Any, url: str) -> None:
    """Open the console at ``url`` and its first table's view, as a user clicks it."""
    page.goto(f"{url}/")
    page.wait_for_selector("#stores li")
    page.click("#stores li button.name")
