"""Reliability: restarts, containers that end by themselves, Hubs sharing an engine,
a frozen engine, a store that cannot be read, and what a session can reach.

Each test drives the real Hub, the real proxy and real engines, the way an operator
of a busy Hub meets these faults.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker
import pytest

from harness.hub import (
    HUB_OWNERS,
    Hub,
    booked,
    containers,
    hub_kill,
    remove_containers,
    start_hub,
    wait_for,
)
from harness.nodes import NODE, ONE_GPU, cpu_node, local_gpu_node

SMALL = {
    "slug": "small",
    "display_name": "Small notebook",
    "description": "one GPU, half a GiB",
    "class": "interactive",
    "pool": "gpu",
    "image": "budgethub/gpu:latest",
    "gpus": [1],
    "cpus": 1,
    "memory_gib": 0.5,
    "min_runtime": "1h",
    "max_min_runtime": "8h",
}


def running(hub: Hub, engine: str | None = None) -> dict[str, Any]:
    """Running session containers of this Hub, by request id."""
    return {
        c.labels["org.budgethub.request"]: c
        for c in containers(hub.hub_name, engine)  # type: ignore[attr-defined]
        if c.status == "running"
    }


def in_container(container: Any, script: str) -> tuple[int, str]:
    code, output = container.exec_run(["sh", "-c", script], user="1000:100")
    return int(code), output.decode(errors="replace")


def spawn_all(hub: Hub, users: Iterable[str], options: dict[str, Any]) -> list[int]:
    with ThreadPoolExecutor(max_workers=10) as pool:
        return list(pool.map(lambda u: hub.spawn(u, options).status_code, users))


def pending(hub: Hub, user: str, server: str = "") -> bool:
    return (hub.server_model(user, server) or {}).get("pending") == "spawn"


# -- restarts -------------------------------------------------------------------------


@pytest.mark.slow
def test_restart_under_load_loses_nothing(make_hub):
    """20 running, 20 queued, a usage history with two overlapping sessions of one team;
    a SIGTERM and a SIGKILL restart; then 5 sessions stop and the 5 oldest queued start."""
    nlp = [f"r{i:02d}" for i in range(10)] + ["a00", "a01"]
    vision = [f"r{i:02d}" for i in range(10, 20)] + [f"q{i:02d}" for i in range(20)]
    hub = make_hub(
        nodes=[local_gpu_node(gpus=20, cpus=64, memory_gib=128)],
        groups={"nlp": nlp, "vision": vision},
        # The Hub answers a queued spawn's POST (202) after this; the 20 queued
        # spawns go one by one, so its default (10 s) cost 200 s of waiting.
        extra="c.JupyterHub.tornado_settings.update({'slow_spawn_timeout': 1})",
    )
    # Two funded sessions of one team that overlap in time, both ended: the store's
    # usage records that made the restarted scheduler raise and the Hub drop everything.
    spawn_all(hub, ["a00", "a01"], ONE_GPU)
    hub.wait_ready("a00")
    hub.wait_ready("a01")
    hub.stop_server("a00")
    hub.stop_server("a01")

    runners = [f"r{i:02d}" for i in range(20)]
    assert all(code in (201, 202) for code in spawn_all(hub, runners, ONE_GPU))
    for user in runners:
        hub.wait_ready(user, timeout=180)
    queued = [f"q{i:02d}" for i in range(20)]
    for user in queued:  # one by one, so their submit order is known
        assert hub.spawn(user, ONE_GPU).status_code == 202
        assert pending(hub, user)
    before = {rid: c.id for rid, c in running(hub).items()}
    assert len(before) == 20

    for restart in ("SIGTERM", "SIGKILL"):
        if restart == "SIGTERM":
            hub.stop()
        else:
            hub_kill(hub)
        began = time.monotonic()
        hub.start()
        for user in runners:
            wait_for(lambda u=user: (hub.server_model(u) or {}).get("ready"), 30, f"{user} back")
        wait_for(lambda: all(pending(hub, u) for u in queued), 30, f"the queue after {restart}")
        back = time.monotonic() - began
        print(f"after {restart}: 20 running and 20 queued back in {back:.1f} s")
        assert back <= 30, f"the queue took {back:.1f} s to come back after {restart}"
        now = {rid: c.id for rid, c in running(hub).items()}
        assert now == before, f"sessions changed across the {restart} restart"
        bookings = booked(hub)
        assert set(bookings) == set(now), "store bookings differ from running containers"
        slices = [s for held in bookings.values() for s in held]
        assert len(slices) == len(set(slices)) == 20
        assert hub.through_proxy("r00").status_code == 200

    for user in runners[:5]:
        hub.stop_server(user)
    for user in queued[:5]:
        hub.wait_ready(user, timeout=90)
    assert all(pending(hub, u) for u in queued[5:])
    users = [c.labels["org.budgethub.user"] for c in running(hub).values()]
    assert len(users) == len(set(users)) == 20  # no container twice
    assert len(booked(hub)) == 20


def test_a_store_that_cannot_be_read_keeps_running_sessions(make_hub):
    hub = make_hub(
        nodes=[local_gpu_node(gpus=2)],
        extra="c.BudgetScheduler.start_retry = 2.0\nc.Spawner.poll_interval = 2",
    )
    spawn_all(hub, ["ann", "cy"], ONE_GPU)
    hub.wait_ready("ann")
    hub.wait_ready("cy")
    by_user = {c.labels["org.budgethub.user"]: c for c in containers(hub.hub_name)}
    before = by_user["ann"]
    hub.stop()
    store = hub.directory / "budgethub.sqlite"
    files = [store.with_name(store.name + suffix) for suffix in ("", "-wal", "-shm")]
    kept = {f: f.read_bytes() for f in files if f.exists()}
    for f in files[1:]:
        f.unlink(missing_ok=True)
    store.write_bytes(b"this is not a database" * 100)

    hub.start()
    time.sleep(3)  # the Hub polls its servers at start; a failing poll made it forget them
    assert (hub.server_model("ann") or {}).get("ready")
    assert hub.through_proxy("ann").status_code == 200
    refused = hub.spawn("bo", ONE_GPU)
    assert refused.status_code == 503, refused.text
    assert "budget scheduler is not running" in refused.json()["message"]
    assert "not a database" in refused.json()["message"]
    assert "the embedded scheduler cannot start (" in hub.log_tail(400)
    # In safe mode the engine still answers the Hub's polls: a container that ends is
    # seen as ended (and its slices are released once the store can be read).
    by_user["cy"].kill()
    wait_for(lambda: hub.server_model("cy") is None, 30, "cy's server seen as stopped")
    assert (hub.server_model("ann") or {}).get("ready")

    for f in files[1:]:
        f.unlink(missing_ok=True)
    for f, data in kept.items():  # the operator repairs the store: the scheduler starts
        f.write_bytes(data)
    wait_for(lambda: hub.spawn("bo", ONE_GPU).status_code in (201, 202), 30, "bo's spawn")
    hub.wait_ready("bo")
    assert (hub.server_model("ann") or {}).get("ready")
    assert before.id in {c.id for c in containers(hub.hub_name)}
    assert set(booked(hub)) == set(running(hub)) and len(booked(hub)) == 2  # ann's and bo's


# -- containers that end by themselves -----------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("path", ["events", "poll"])
def test_a_container_that_ends_by_itself_gives_its_gpu_back(make_hub, path):
    """Killed, shut down from inside, out of memory: each time the queue head starts
    within 15 s of the container's end. ``events``: the engine's events (the Hub's own
    poll is an hour away); ``poll``: no events, the Hub's poll every 2 s."""
    if path == "events":
        extra = "c.Spawner.poll_interval = 3600"
    else:
        extra = "c.Spawner.poll_interval = 2\nc.BudgetScheduler.watch_events = False"
    # A queued spawn's POST is answered (202) after this, not after the default 10 s.
    extra += "\nc.JupyterHub.tornado_settings.update({'slow_spawn_timeout': 1})"
    hub = make_hub(
        nodes=[local_gpu_node(gpus=1)],
        profiles=[SMALL],
        groups={"nlp": ["u00", "u01"]},
        teams=[{"name": "nlp", "share": {"gpu": 1.0, "cpu": 1.0}}],
        extra=extra,
    )
    small = {"profile": "small"}
    hub.spawn("u00", small)
    hub.wait_ready("u00")
    assert hub.spawn("u01", small).status_code == 202

    def container_of(user: str) -> Any:
        [found] = [c for c in running(hub).values() if c.labels["org.budgethub.user"] == user]
        return found

    def kill(user: str) -> None:
        container_of(user).kill()

    def shut_down(user: str) -> None:
        response = hub.http.post(f"{hub.url}/user/{user}/api/shutdown", timeout=10)
        assert response.status_code in (200, 204), response.text

    def out_of_memory(user: str) -> None:
        # The server (pid 1) is made the OOM killer's choice, then 20 processes of 30 MiB
        # pass the session's 0.5 GiB: the kernel kills the server, the container ends.
        in_container(
            container_of(user),
            "echo 1000 > /proc/1/oom_score_adj; for i in $(seq 20); do "
            "python3 -c 'import time; b = bytearray(30 * 2**20); time.sleep(30)' & done; wait",
        )

    def ended(container: Any) -> bool:
        try:
            container.reload()
        except docker.errors.NotFound:
            return True
        return container.status != "running"

    ways = [("killed", kill), ("shut down", shut_down), ("out of memory", out_of_memory)]
    victim, waiting = "u00", "u01"
    for what, end in ways:
        dead = container_of(victim)
        end(victim)
        # The clock starts when the container has ended: how long the kernel takes to
        # start 20 processes and kill the server is the machine's time, not the Hub's.
        wait_for(lambda d=dead: ended(d), 60, f"{victim}'s container ended ({what})")
        started = time.monotonic()
        hub.wait_ready(waiting, timeout=15)
        took = time.monotonic() - started
        print(f"{path}: {what}: the queue head ran {took:.1f} s later")
        assert took <= 15, f"{what}: the queue head took {took:.1f} s"
        wait_for(lambda v=victim: hub.server_model(v) is None, 30, f"{victim} stopped ({what})")
        assert set(booked(hub)) == set(running(hub)), f"{what}: slices leaked"
        wait_for(lambda d=dead: d.id not in {c.id for c in containers(hub.hub_name)}, 30, "gone")
        victim, waiting = waiting, victim
        assert hub.spawn(waiting, small).status_code == 202
    log = hub.log_tail(3000)
    assert "ended by itself: was killed (exit code 137)" in log
    assert "ended by itself: exited (its server was shut down)" in log
    assert "ended by itself: ran out of memory and was killed (exit code 137)" in log


# -- two Hubs, one engine -------------------------------------------------------------


def test_two_hubs_on_one_engine_keep_their_own_sessions(make_hub, tmp_path):
    first = make_hub(nodes=[local_gpu_node(gpus=1)])
    directory = tmp_path / "second"
    directory.mkdir()
    second_name = f"{first.hub_name}-b"
    HUB_OWNERS[second_name] = HUB_OWNERS[first.hub_name]
    second = start_hub(
        directory,
        hub_name=second_name,
        nodes=[local_gpu_node(gpus=1)],
        teams=[{"name": "nlp", "share": {"gpu": 1.0, "cpu": 1.0}}],
        groups={"nlp": ["ann"]},
    )
    try:
        first.spawn("ann", ONE_GPU)
        first.wait_ready("ann")
        second.spawn("ann", ONE_GPU)  # the same user name on the other Hub
        second.wait_ready("ann")
        [mine] = containers(first.hub_name)  # type: ignore[attr-defined]
        [theirs] = containers(second_name)
        assert mine.name != theirs.name and mine.status == theirs.status == "running"
        assert first.through_proxy("ann").status_code == 200
        assert second.through_proxy("ann").status_code == 200

        second.stop()  # a restart of one Hub leaves the other's session alone
        second.start()
        wait_for(lambda: (second.server_model("ann") or {}).get("ready"), 30, "second's ann")
        first.stop_server("ann")
        [still] = containers(second_name)
        assert still.id == theirs.id and still.status == "running"
        assert second.through_proxy("ann").status_code == 200
        first.spawn("ann", ONE_GPU)
        first.wait_ready("ann")
        assert {c.id for c in containers(second_name)} == {theirs.id}
    finally:
        second.stop()
        remove_containers(second_name)


# -- a frozen engine --------------------------------------------------------------------


@pytest.mark.slow
def test_a_frozen_engine_goes_unreachable_and_comes_back_with_nothing_lost(
    make_hub, second_engine, tmp_path
):
    storage = tmp_path / "weka-a"
    storage.mkdir()
    storage.chmod(0o777)
    hub = make_hub(
        nodes=[local_gpu_node(gpus=1), cpu_node(str(storage), engine=second_engine, cpus=4)],
        extra="\n".join(
            [
                "c.BudgetScheduler.ping_timeout = 2.0",
                "c.BudgetScheduler.engine_timeout = 5.0",
                "c.BudgetScheduler.node_down_grace = 600.0",
                "c.Spawner.poll_interval = 2",
            ]
        ),
    )
    prep = {"profile": "dataprep"}
    hub.spawn("ann", prep)
    hub.spawn("bo", prep)
    hub.wait_ready("ann")
    hub.wait_ready("bo")
    before = running(hub, second_engine)
    assert len(before) == 2
    pid = int(Path(f"/var/run/budgethub/{NODE}.pid").read_text().strip())
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: "node prep-1 is now unreachable" in hub.log_tail(400), 20, "unreachable")
        # Nothing new lands there: cy's data-prep spawn waits.
        assert hub.spawn("cy", prep).status_code == 202
        time.sleep(5)  # several polls of ann's and bo's servers while the engine is frozen
        assert (hub.server_model("ann") or {}).get("ready")
        assert hub.through_proxy("ann").status_code == 200  # the session itself still runs
        assert pending(hub, "cy")
        began = time.monotonic()
        response = hub.http.delete(hub.server_path("bo"), timeout=60)
        took = time.monotonic() - began
        print(f"DELETE of a session on the frozen engine answered in {took:.1f} s")
        assert response.status_code in (202, 204), response.text
        assert took < 15, f"DELETE on a frozen engine took {took:.1f} s"
        wait_for(lambda: hub.server_model("bo") is None, 30, "bo's server stopped")
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: "node prep-1 is now ready" in hub.log_tail(400), 30, "the node back")
    hub.wait_ready("cy", timeout=60)
    after = running(hub, second_engine)
    ann = next(rid for rid in before if rid.startswith("ann/"))
    bob = next(rid for rid in before if rid.startswith("bo/"))
    assert after[ann].id == before[ann].id  # the same session, never stopped
    assert bob not in after  # bo's container, stopped while the engine was frozen, is gone
    assert hub.through_proxy("ann").status_code == 200
    assert set(booked(hub)) == set(after)
    hub.stop_server("ann")
    hub.stop_server("cy")


# -- what a session can reach -----------------------------------------------------------


def test_a_session_has_a_pid_limit_and_cannot_use_the_hub_or_proxy_apis(make_hub):
    hub = make_hub(nodes=[local_gpu_node(gpus=1)], extra="c.BudgetSpawner.pids_limit = 64")
    hub.spawn("ann", ONE_GPU)
    hub.wait_ready("ann")
    [container] = containers(hub.hub_name)
    assert container.attrs["HostConfig"]["PidsLimit"] == 64
    code, output = in_container(
        container,
        'python3 -c "import threading, time\n'
        "n = 0\n"
        "try:\n"
        "    for _ in range(200):\n"
        "        threading.Thread(target=time.sleep, args=(5,), daemon=True).start(); n += 1\n"
        "except RuntimeError as error:\n"
        "    print('refused after', n, error)\n\"",
    )
    assert "refused after" in output, output
    assert int(re.search(r"refused after (\d+)", output).group(1)) < 64

    config = hub.config_path.read_text()
    hub_port = re.search(r"hub_port = (\d+)", config).group(1)
    proxy_port = re.search(r"api_url = 'http://127.0.0.1:(\d+)'", config).group(1)
    probe = (
        'python3 -c "import urllib.request, urllib.error, sys\n'
        "for url in sys.argv[1:]:\n"
        "    try:\n"
        "        print(url, urllib.request.urlopen(url, timeout=5).status)\n"
        "    except urllib.error.HTTPError as error:\n"
        '        print(url, error.code)\n" '
        f"http://127.0.0.1:{hub_port}/hub/api/users http://127.0.0.1:{proxy_port}/api/routes"
    )
    code, output = in_container(container, probe)
    answers = dict(line.split() for line in output.strip().splitlines())
    assert answers[f"http://127.0.0.1:{hub_port}/hub/api/users"] == "403", output
    assert answers[f"http://127.0.0.1:{proxy_port}/api/routes"] in ("401", "403"), output


# -- queue positions that say they can move ------------------------------------------------


def test_a_position_that_moves_back_says_why(make_hub):
    hub = make_hub(nodes=[local_gpu_node(gpus=1)])
    hub.spawn("bo", ONE_GPU)  # vision uses the one GPU: it is above nlp now
    hub.wait_ready("bo")
    assert hub.spawn("bo", ONE_GPU, server="second").status_code == 202
    events: list[dict[str, Any]] = []
    stop = threading.Event()

    def watch() -> None:
        try:
            for event in hub.progress("bo", server="second", limit=60):
                events.append(event)
                if stop.is_set():
                    return
        except Exception as error:
            events.append({"error": str(error)})

    watcher = threading.Thread(target=watch)
    watcher.start()
    wait_for(lambda: any("queue" in e for e in events), 20, "bo's position")
    assert [e for e in events if "queue" in e][-1]["queue"]["position"] == 1
    assert hub.spawn("ann", ONE_GPU).status_code == 202  # nlp has used nothing: it goes first
    wait_for(
        lambda: any("moved back from 1" in e.get("message", "") for e in events),
        20,
        f"bo's message to say he moved back: {events}",
    )
    message = next(e["message"] for e in events if "moved back from 1" in e.get("message", ""))
    assert "position 2 of 2 in the pool (moved back from 1), " in message
    assert message.endswith("Teams furthest under their share go first, so positions can move")
    stop.set()
    hub.stop_server("ann")
    hub.stop_server("bo", server="second")
    watcher.join(timeout=30)
