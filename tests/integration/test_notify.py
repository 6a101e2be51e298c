"""Issue 41: word when a queued session starts, through a real Hub and a real Chromium.

bo waits in the queue behind ann. When ann stops and bo's session starts, the start hook
POSTs to a local HTTP receiver on 127.0.0.1 (its URL template filled in with bo's names),
and both the spawn page and My sessions, open in bo's browser with notifications
allowed, raise a browser notification. ann, who never waited, gets no hook call.
"""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

from playwright.sync_api import Error as PlaywrightError

from harness.browser import shot
from harness.hub import PASSWORD, scheduler_lines, wait_for
from harness.nodes import ONE_GPU, local_gpu_node

RECORD_NOTIFICATIONS = """(() => {
  const Real = window.Notification;
  if (!Real) { return; }
  function Recorded(title, options) {
    const notes = JSON.parse(localStorage.getItem("budgethub-test-notes") || "[]");
    notes.push([title, (options && options.body) || ""]);
    localStorage.setItem("budgethub-test-notes", JSON.stringify(notes));
    return new Real(title, options);
  }
  Object.defineProperty(Recorded, "permission", { get: () => Real.permission });
  Recorded.requestPermission = (...args) => Real.requestPermission(...args);
  window.Notification = Recorded;
})();"""
"""Every notification a page raises is also written down in the origin's localStorage, which
outlives the page's reload (then it is shown for real)."""

READ_NOTES = "localStorage.getItem('budgethub-test-notes') || '[]'"


class Receiver(BaseHTTPRequestHandler):
    """A chat or mail gateway's stand-in: records each POST (path, JSON body)."""

    got: list[tuple[str, dict[str, Any]]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Receiver.got.append((self.path, json.loads(body)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_queued_session_that_starts_calls_the_hook_and_notifies_the_browser(
    make_hub, browser, tmp_path: Path
):
    shots = Path(os.environ.get("BUDGETHUB_SHOTS") or tmp_path)
    receiver = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    template = f"http://127.0.0.1:{receiver.server_port}/hook/{{user}}?server={{server}}"
    hub = make_hub(
        nodes=[local_gpu_node(gpus=1)],
        extra=scheduler_lines({"start_hook": template, "start_hook_after": 1.0}),
    )
    try:
        assert hub.spawn("ann", ONE_GPU).status_code in (201, 202)
        hub.wait_ready("ann")
        assert hub.spawn("bo", ONE_GPU).status_code == 202
        submitted = time.time()

        context = browser.new_context(viewport={"width": 1100, "height": 900})
        context.grant_permissions(["notifications"], origin=hub.url)
        context.add_init_script(RECORD_NOTIFICATIONS)
        console: list[str] = []
        context.on("console", lambda m: console.append(m.text))
        context.on("weberror", lambda e: console.append(str(e.error)))
        login = context.new_page()
        login.goto(f"{hub.url}/hub/login")
        login.fill("input[name=username]", "bo")
        login.fill("input[name=password]", PASSWORD)
        login.click("#login_submit")
        login.wait_for_load_state()
        login.goto(f"{hub.url}/hub/budgethub/sessions")  # it had landed on the spawn page
        pending = context.new_page()
        pending.goto(f"{hub.url}/hub/spawn-pending/bo")
        state = pending.locator("#budgethub-notify-state")
        state.wait_for(timeout=30_000)
        assert "You will be notified when it starts" in state.inner_text()
        shot(pending, "spawn-pending-notify.png", shots)
        mine = login
        assert "You will be notified" in mine.inner_text("#budgethub-notify-state")

        time.sleep(max(0.0, submitted + 1.5 - time.time()))  # past start_hook_after
        hub.stop_server("ann")
        hub.wait_ready("bo", timeout=120)
        wait_for(lambda: Receiver.got, 30, "the start hook's POST")
        path, facts = Receiver.got[0]
        assert path == "/hook/bo?server=", path
        assert facts["user"] == "bo" and facts["server"] == "" and facts["team"] == "vision"
        assert facts["node"] == "gpu-1" and facts["url"] == "/user/bo/", facts
        assert facts["waited_s"] >= 1.0 and facts["profile"] == "gpu-notebook", facts
        notes: list[tuple[str, str]] = []
        for _ in range(60):  # Playwright's own wait, so the pages' events are taken in
            try:
                notes = [tuple(n) for n in json.loads(mine.evaluate(READ_NOTES))]
            except PlaywrightError:  # My sessions reloads itself once the session runs
                mine.wait_for_load_state()
                continue
            if len({body.split(";")[0] for _, body in notes}) >= 2:  # both pages told
                break
            mine.wait_for_timeout(500)
        assert len(notes) == 2, (notes, console[-20:], pending.url, mine.url)  # once each
        titles = {title for title, _ in notes}
        assert titles == {"Your session started"}, notes
        bodies = " | ".join(body for _, body in notes)
        assert "Your server is ready" in bodies  # the spawn page
        assert "Your default server is running; open it from My sessions" in bodies, bodies
        time.sleep(1.0)
        assert [p for p, f in Receiver.got if f["user"] == "ann"] == []  # ann never waited
        context.close()
        hub.stop_server("bo")
    finally:
        receiver.shutdown()
        receiver.server_close()
