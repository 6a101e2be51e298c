"""Debian's headless Chromium, driven by Playwright, and the Hub's login form."""

from __future__ import annotations

import shutil
from typing import Any

from harness.hub import PASSWORD, Hub

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def log_in(browser: Any, hub: Hub, user: str) -> Any:
    """A new browser context logged in as ``user``, on the spawn page."""
    page = browser.new_context().new_page()
    page.goto(f"{hub.url}/hub/login")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", PASSWORD)
    page.click("#login_submit")
    page.wait_for_url("**/hub/spawn**", timeout=30_000)
    return page
