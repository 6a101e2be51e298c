"""Debian's headless Chromium, driven by Playwright, and the Hub's login form."""

from __future__ import annotations

import shutil
from pathlib import Path
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


ADMIN_PASSWORD = "budgethub-test-admin-password-0123456789"
ADMIN = (
    "c.Authenticator.admin_users = {'admin'}\n"
    f"c.SharedPasswordAuthenticator.admin_password = {ADMIN_PASSWORD!r}\n"
)
"""Hub configuration lines: an ``admin`` user who logs in with ADMIN_PASSWORD."""


def open_hub(chromium: Any, hub: Hub, user: str, password: str = PASSWORD) -> Any:
    """A new page logged in as ``user``, wherever the Hub lands it."""
    page = chromium.new_context(viewport={"width": 1100, "height": 900}).new_page()
    page.goto(f"{hub.url}/hub/login")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.click("#login_submit")
    page.wait_for_load_state()
    return page


def shot(page: Any, name: str, directory: Path) -> None:
    """A full-page screenshot in ``directory`` (a test's), to look at after a run (the
    README's come from the demo: scripts/demo_screenshots.py)."""
    page.screenshot(path=str(directory / name), full_page=True)


def log_in(browser: Any, hub: Hub, user: str) -> Any:
    """A new browser context logged in as ``user``, on the spawn page."""
    page = browser.new_context().new_page()
    page.goto(f"{hub.url}/hub/login")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", PASSWORD)
    page.click("#login_submit")
    page.wait_for_url("**/hub/spawn**", timeout=30_000)
    return page
