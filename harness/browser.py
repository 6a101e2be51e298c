"""Debian's headless Chromium, driven by Playwright, and the Hub's login form."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import requests

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


MAIN_AREA_READY = """() => {
  const splash = document.getElementById('jupyterlab-splash');
  const main = document.getElementById('jp-main-dock-panel');
  return !splash && !!main && !!main.querySelector('.lm-Widget.jp-Launcher, .jp-MainAreaWidget')
    && main.getBoundingClientRect().width > 0;
}"""
"""JavaScript, true once JupyterLab's splash is gone and its main area shows a widget
(the launcher, or a restored document): what a user sees as a lab ready for work."""


async def async_log_in(browser: Any, hub: Hub, user: str, password: str = PASSWORD) -> Any:
    """`log_in` for Playwright's async API (several users at once in one event loop)."""
    context = await browser.new_context(viewport={"width": 1100, "height": 900})
    page = await context.new_page()
    await page.goto(f"{hub.url}/hub/login")
    await page.fill("input[name=username]", user)
    await page.fill("input[name=password]", password)
    await page.click("#login_submit")
    await page.wait_for_url("**/hub/spawn**", timeout=30_000)
    return page


def api_session(hub: Hub, user: str, password: str = PASSWORD) -> requests.Session:
    """A requests session logged in as ``user`` through the Hub's login form, sending the
    Hub's XSRF token as a browser page's script does (cookie-authenticated API calls)."""
    session = requests.Session()
    session.get(f"{hub.url}/hub/login", timeout=10)
    xsrf = session.cookies.get("_xsrf") or ""
    response = session.post(
        f"{hub.url}/hub/login",
        data={"username": user, "password": password, "_xsrf": xsrf},
        timeout=10,
        allow_redirects=False,
    )
    assert response.status_code == 302, response.text[:300]
    session.headers["X-XSRFToken"] = session.cookies.get("_xsrf") or xsrf
    return session
