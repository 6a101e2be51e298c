"""Issue 41: how the Hub's own pages write waits and holdings, and the start hook's pieces
(its URL template checked like the configuration, filled in, and called)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from scheduler_core.model import Request
from spawner.hub.mysessions import holds
from spawner.hub.notify import FIELDS, call_hook, hook_url, template_fault
from spawner.profiles import human_duration
from spawner.profiles import rounded_duration as _waited
from spawner.readmodel.service import app

log = logging.getLogger("test")


@pytest.mark.parametrize("seconds", [0, 12.6, 45, 59.4, 60, 900, 3725.4, 5400, 3 * 3600 + 1000])
def test_the_admin_queue_writes_waits_as_the_rest_of_the_hub(seconds: float) -> None:
    assert _waited(seconds) == app.duration(seconds)


def test_waits_read_like_the_spawn_form() -> None:
    assert _waited(3725.4) == "62 min" and _waited(3 * 3600 + 1000) == "3 h"
    assert _waited(5400) == human_duration(5400) == "90 min"
    assert _waited(-3) == "0 s"  # a clock step back is no negative wait


def test_what_a_session_holds_reads_in_its_pools_units() -> None:
    whole = Request(id="a/b/c", user="a", team="t", pool="gpu", submit=0, gpus=2, cpus=2)
    assert holds(whole, "GPU") == "2 GPU, 2 CPU, 4 GiB"
    part = Request(id="a/b/c", user="a", team="t", pool="gpu", submit=0, gpu_milli=250)
    assert holds(part, "GPU") == "0.25 GPU, 1 CPU, 4 GiB"
    cpu = Request(id="a/b/c", user="a", team="t", pool="cpu", submit=0, cpus=2.5, memory_gib=3)
    assert holds(cpu, "CPU") == "2.5 CPU, 3 GiB"


def test_a_hook_template_must_be_http_and_use_known_names() -> None:
    assert template_fault("https://chat.example/h?u={user}&s={server}") is None
    assert "http(s)" in str(template_fault("mailto:me@example.org"))
    assert "{nope}" in str(template_fault("https://x/{nope}"))
    assert "not a valid template" in str(template_fault("https://x/{user"))
    facts = dict.fromkeys(FIELDS, "a b/c")
    assert hook_url("https://x/{user}", facts) == "https://x/a%20b%2Fc"


class _Receiver(BaseHTTPRequestHandler):
    got: list[tuple[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Receiver.got.append((self.path, json.loads(body)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_the_hook_posts_to_a_local_receiver_and_calls_a_callable() -> None:
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    facts = {name: f"v-{name}" for name in FIELDS}
    try:
        url = f"http://127.0.0.1:{server.server_port}/hook/{{user}}?server={{server}}"
        assert asyncio.run(call_hook(url, facts, 5.0, log))
        assert _Receiver.got == [("/hook/v-user?server=v-server", facts)]
        got: list[dict[str, Any]] = []

        async def coroutine(told: dict[str, Any]) -> None:
            got.append(told)

        assert asyncio.run(call_hook(got.append, facts, 5.0, log))
        assert asyncio.run(call_hook(coroutine, facts, 5.0, log))
        assert got == [facts, facts]
    finally:
        server.shutdown()
        server.server_close()
    # A receiver that is gone, or a hook that raises, is logged and never raises.
    assert not asyncio.run(call_hook(url, facts, 2.0, log))
    assert not asyncio.run(call_hook(lambda _f: 1 / 0, facts, 2.0, log))


def test_a_priority_an_admin_set_is_kept_in_the_store_the_hub_recovers_from() -> None:
    from scheduler_core.store import Store

    with Store.create("sqlite://") as store:
        request = Request(id="ann/two/abcd", user="ann", team="nlp", pool="gpu", submit=1.0)
        store.add_request(request)
        store.set_request_priority(request.id, 42)
        assert store.load_request(request.id).priority == 42
        assert [r.priority for r in store.pending_requests()] == [42]


@pytest.mark.parametrize("admin", [True, False])
def test_the_services_queue_page_sends_an_admin_to_the_hubs_queue_control(admin: bool) -> None:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    from spawner.readmodel.service.views import Viewer

    env = Environment(
        loader=FileSystemLoader(str(app.TEMPLATES)), autoescape=select_autoescape(["html"])
    )
    scopes = {"custom:budget:read"} | ({"custom:budget:admin"} if admin else set())
    viewer = Viewer(name="x", groups=frozenset(), scopes=frozenset(scopes))
    html = env.get_template("queue.html").render(
        prefix="/services/budget/",
        hub_prefix="/hub/",
        viewer=viewer,
        data={"pools": []},
        state=None,
        stamp=str,
        title="Queue",
    )
    assert ('href="/hub/admin"' in html and "queue-control" in html) is admin
