"""Start time in the browser: from a click on Start to JupyterLab's main area, ready.

A real Hub (BudgetSpawner, the default profiles, a local node of four virtual GPUs) and
Debian's headless Chromium. Each user logs in, lands on the spawn form (the GPU
notebook, one GPU: the form's default) and clicks Start; the clock stops when
JupyterLab's splash is gone and its main area shows a widget (the launcher). Measured
for one user alone (``--rounds`` times) and for ``--users`` users clicking at once.

Where the time goes, per start (from the page's main-frame navigations):

* ``post``: the click until the Hub answers the form's POST (its redirect arrives);
* ``server``: then until the browser leaves the spawn-pending page (the server is up
  and the Hub said so), 0 where the POST went straight to the server;
* ``login``: then until JupyterLab's page is asked for (the session's OAuth round trips
  through the Hub);
* ``lab``: then until the main area is ready (JupyterLab loads and starts).

With ``--against IMAGE`` a second Hub runs the same profiles on IMAGE and the lone
starts alternate between the two (a change to the image, judged at the same load).
The machine's load average is printed first and last: on a shared machine it moves
these figures more than anything here does.

Run: ``python -m bench.browser_start [--rounds N] [--users N] [--against IMAGE]`` (needs
the engine, the images of ``make images`` and Chromium).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.browser import CHROMIUM, FLAGS, MAIN_AREA_READY, async_log_in
from harness.hub import Hub, remove_containers, start_hub
from harness.nodes import local_gpu_node
from spawner.hub.spawner import DEFAULT_PROFILES

FIGURES = ("browser_start.alone_s", "browser_start.together_s")
"""The figures ``collect`` returns (bench/bars.toml)."""
PHASES = ("post", "server", "login", "lab")
START = "form input[type=submit], form button[type=submit]"


@dataclass
class Start:
    """One click on Start, timed from the moment the browser sends the form (the click's
    own dispatch by Playwright is not counted)."""

    user: str
    marks: list[tuple[float, str]] = field(default_factory=list)
    """(clock, URL) of each main-frame navigation request, the form's POST first."""
    ready: float = float("nan")
    """The clock when the main area was ready."""

    @property
    def total(self) -> float:
        return self.ready - self.marks[0][0]

    def phases(self) -> dict[str, float]:
        """Seconds in each of PHASES (they sum to ``total``)."""
        sent = self.marks[0][0]
        lab = f"/user/{self.user}/lab"

        def first(test: Any, default: float) -> float:
            return next((t - sent for t, url in self.marks[1:] if test(url)), default)

        answered = first(lambda url: True, 0.0)
        left = first(lambda url: "/hub/" not in url, answered)
        # The last request for the lab's page: the one after the OAuth round trips.
        lab_at = max((t - sent for t, url in self.marks if lab in url), default=left)
        return {
            "post": answered,
            "server": left - answered,
            "login": lab_at - left,
            "lab": self.total - lab_at,
        }


async def timed_start(browser: Any, hub: Hub, user: str, go: asyncio.Barrier) -> Start:
    """Log ``user`` in, wait for the others (``go``), click Start and time it to the
    main area."""
    page = await async_log_in(browser, hub, user)
    start = Start(user)

    def mark(request: Any) -> None:
        if request.is_navigation_request() and request.frame == page.main_frame:
            start.marks.append((time.perf_counter(), request.url))

    await go.wait()
    page.on("request", mark)
    await page.click(START)
    await page.wait_for_url(f"**/user/{user}/lab**", timeout=180_000)
    await page.wait_for_function(MAIN_AREA_READY, timeout=180_000, polling=50)
    start.ready = time.perf_counter()
    await page.context.close()
    if not start.marks or "/hub/spawn" not in start.marks[0][1]:
        raise RuntimeError(f"{user}: the first navigation was not the form's POST: {start.marks}")
    return start


async def starts(hub: Hub, users: list[str]) -> list[Start]:
    """``users`` click Start at the same moment (each logged in first)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            go = asyncio.Barrier(len(users))
            return list(await asyncio.gather(*(timed_start(browser, hub, u, go) for u in users)))
        finally:
            await browser.close()


def stop_all(hub: Hub, users: list[str]) -> None:
    for user in users:
        if hub.server_model(user) is not None:
            hub.stop_server(user)


def summary(label: str, runs: list[Start]) -> str:
    totals = [r.total for r in runs]
    parts = {p: statistics.median(r.phases()[p] for r in runs) for p in PHASES}
    split = ", ".join(f"{p} {parts[p]:.2f}" for p in PHASES)
    return (
        f"{label}: median {statistics.median(totals):.2f} s, max {max(totals):.2f} s "
        f"(n={len(runs)}; median s per phase: {split})"
    )


def say(line: str) -> None:
    print(line, flush=True)


def load() -> str:
    """The machine's load averages (1, 5, 15 min) and cores: what the figures ran beside."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} {five:.1f} {fifteen:.1f} on {os.cpu_count()} cores"


def open_hub(work: Path, name: str, users: list[str], image: str | None) -> Hub:
    """A Hub with the default profiles (their image replaced by ``image`` if given)."""
    home = work / name
    home.mkdir()
    profiles = None
    if image is not None:
        profiles = [{**p, "image": image} for p in DEFAULT_PROFILES]
    return start_hub(
        home,
        hub_name=name,
        nodes=[local_gpu_node(gpus=4)],
        teams=[{"name": "bench", "share": {"gpu": 1.0, "cpu": 1.0}}],
        groups={"bench": users},
        profiles=profiles,
        extra="c.JupyterHub.log_level = 'INFO'\n",
    )


def start_once(hub: Hub, users: list[str]) -> list[Start]:
    runs = asyncio.run(starts(hub, users))
    stop_all(hub, users)
    return runs


def phase_text(run: Start) -> str:
    return ", ".join(f"{p} {s:.2f}" for p, s in run.phases().items())


def measure(hubs: dict[str, Hub], users: list[str], rounds: int) -> dict[str, Any]:
    """A warm-up start per Hub, ``rounds`` lone starts on each in turn, then ``users`` at
    once on the first."""
    for name, hub in hubs.items():
        say(f"warm-up start, {name}: {start_once(hub, users[:1])[0].total:.2f} s (not counted)")
    alone: dict[str, list[Start]] = {name: [] for name in hubs}
    for i in range(rounds):
        for name, hub in hubs.items():
            alone[name].extend(start_once(hub, users[:1]))
            run = alone[name][-1]
            say(f"alone {i + 1}/{rounds}, {name}: {run.total:.2f} s ({phase_text(run)})")
    first = next(iter(hubs))
    together = start_once(hubs[first], users)
    for run in together:
        say(f"together, {run.user}: {run.total:.2f} s ({phase_text(run)})")
    for name, runs in alone.items():
        say(summary(f"one user alone, {name}: Start sent -> JupyterLab ready", runs))
    say(summary(f"{len(users)} users at once, {first}: Start sent -> JupyterLab ready", together))
    return {"alone": [r.total for r in alone[first]], "together": [r.total for r in together]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.browser_start")
    parser.add_argument("--rounds", type=int, default=5, help="starts of one user alone")
    parser.add_argument("--users", type=int, default=4, help="users who click Start at once")
    parser.add_argument(
        "--against",
        metavar="IMAGE",
        help="a second Hub whose profiles run IMAGE; the lone starts alternate between them",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds: must be at least 1")
    if not 2 <= args.users <= 4:
        parser.error("--users: must be between 2 and 4 (the node has four GPUs)")
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"bench.browser_start: no Chromium at {CHROMIUM} (make setup)")
    users = [f"b{i}" for i in range(args.users)]
    work = Path(tempfile.gettempdir()) / "budgethub-bench-browser"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    say(f"bench.browser_start: {load()}")
    hubs: dict[str, Hub] = {}
    try:
        hubs["budgethub/gpu:latest"] = open_hub(work, "bench-browser", users, None)
        if args.against:
            hubs[args.against] = open_hub(work, "bench-browser-b", users, args.against)
        results = measure(hubs, users, args.rounds)
    finally:
        for hub in hubs.values():
            hub.stop()
            remove_containers(hub.hub_name)
    say(f"bench.browser_start: done, {load()}")
    return results


def figures(results: dict[str, Any]) -> dict[str, float]:
    return {
        "browser_start.alone_s": statistics.median(results["alone"]),
        "browser_start.together_s": max(results["together"]),
    }


def collect(argv: list[str] | None = None) -> dict[str, float]:
    """Run as ``main`` does, printing the same; the figures (FIGURES)."""
    return figures(main(argv))


if __name__ == "__main__":
    main()
