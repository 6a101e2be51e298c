"""Take the README's screenshots (docs/screenshots/) from a running `make demo`.

    make demo                                   # in one terminal
    .venv/bin/python scripts/demo_screenshots.py [http://127.0.0.1:8000]

In headless Chromium (Debian's, driven by Playwright), as the demo's users: ann and
bo (nlp) start a GPU notebook each, eve's spawn form and ann's home page are taken,
cy (vision) takes the third whole GPU, di (robotics) queues (his home page and the
admin page's queue are taken), then di leaves the queue. ann's, bo's and cy's
notebooks stay running; stop them from the Hub.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

OUT = Path(__file__).resolve().parents[1] / "docs" / "screenshots"
PASSWORD = "budgethub"
ADMIN_PASSWORD = "budgethub-admin-demo-password-0001"
FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def main(url: str = "http://127.0.0.1:8000") -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=FLAGS)

        def login(user: str, password: str = PASSWORD) -> Any:
            page = chromium.new_context(viewport={"width": 1100, "height": 900}).new_page()
            page.goto(f"{url}/hub/login")
            page.fill("input[name=username]", user)
            page.fill("input[name=password]", password)
            page.click("#login_submit")
            page.wait_for_load_state()
            return page

        def start(user: str) -> Any:
            page = login(user)
            page.goto(f"{url}/hub/spawn/{user}")
            page.click("#spawn_form button[type=submit]")
            return page

        for user in ("ann", "bo"):
            start(user).wait_for_url("**/user/**/lab**", timeout=120_000)
        eve = login("eve")
        eve.goto(f"{url}/hub/spawn/eve")
        eve.screenshot(path=str(OUT / "spawn-form.png"), full_page=True)
        ann = login("ann")
        ann.goto(f"{url}/hub/home")
        ann.screenshot(path=str(OUT / "home-banner.png"), full_page=True)
        start("cy").wait_for_url("**/user/**/lab**", timeout=120_000)
        di = start("di")
        di.wait_for_url("**/spawn-pending/**", timeout=60_000)
        di.wait_for_function("document.body.innerText.includes('Queued: position')")
        di.goto(f"{url}/hub/home")
        di.screenshot(path=str(OUT / "home-queued.png"), full_page=True)
        admin = login("admin", ADMIN_PASSWORD)
        admin.goto(f"{url}/hub/admin")
        admin.wait_for_selector(".budgethub-admin-queue")
        admin.screenshot(path=str(OUT / "admin-queue.png"), full_page=True)
        di.goto(f"{url}/hub/spawn-pending/di")
        di.wait_for_function("document.body.innerText.includes('Queued: position')")
        di.click("#stop-server-btn")
        di.wait_for_url("**/hub/spawn/di", timeout=30_000)
        chromium.close()
    print(f"screenshots in {OUT}")


if __name__ == "__main__":
    main(*sys.argv[1:])
