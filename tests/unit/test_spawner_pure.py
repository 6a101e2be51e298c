"""The spawner's pure parts: profiles and the form, container specs, GPU inventory."""

from __future__ import annotations

import dataclasses
import json
import time
from types import SimpleNamespace

import pytest

from harness import builders
from scheduler_core.model import MILLI, NodeGrant, RequestClass, Slice, SliceKind
from scheduler_core.settings import Settings
from spawner.hub.config import ConfigError, parse_nodes
from spawner.hub.spawner import DEFAULT_PROFILES
from spawner.profiles import FormError, parse_profiles, render_form, resolve
from spawner.runtime.dockernodes import CpuPins, cpus_wanted, least_used, parse_cpuset
from spawner.runtime.inventory import nvml_gpus, virtual_gpus
from spawner.runtime.spec import (
    DEFAULT_PIDS_LIMIT,
    SessionIdentity,
    build_launch_spec,
    session_name,
    workspace_volume,
)

SETTINGS = Settings()
PROFILES = parse_profiles(DEFAULT_PROFILES, SETTINGS, ["gpu", "cpu"])


def test_default_profiles_parse_with_their_caps():
    by_slug = {p.slug: p for p in PROFILES}
    assert [s.gpus for s in by_slug["gpu-notebook"].slices] == [1, 2, 4, 8]
    debug = by_slug["debug"]
    assert debug.klass is RequestClass.DEBUG
    assert debug.max_min_runtime == 900
    assert debug.slices[0].gpu_milli == 250
    assert by_slug["dataprep"].storage == ("weka-a",)


def test_resolve_takes_form_lists_and_rest_values():
    spec = resolve({"profile": ["gpu-notebook"], "gpus": ["4"]}, PROFILES, ["nlp"])
    assert (spec.profile.slug, spec.slices.gpus, spec.team) == ("gpu-notebook", 4, "nlp")
    spec = resolve({"profile": "debug", "slices": "gpu-250m"}, PROFILES, ["nlp"])
    assert spec.slices.gpu_milli == 250
    assert spec.min_runtime == 900
    spec = resolve({"profile": "dataprep"}, PROFILES, ["nlp"])
    assert spec.labels["storage"] == "weka-a"


@pytest.mark.parametrize(
    ("options", "teams", "field"),
    [
        ({"profile": "bitcoin"}, ["nlp"], "profile"),
        ({"profile": "gpu-notebook", "gpus": 9999}, ["nlp"], "gpus"),
        ({"profile": "gpu-notebook", "gpus": "-1"}, ["nlp"], "gpus"),
        ({"profile": "gpu-notebook", "gpus": "many"}, ["nlp"], "gpus"),
        ({"profile": "gpu-notebook", "team": "vision"}, ["nlp"], "team"),
        ({"profile": "gpu-notebook"}, ["nlp", "vision"], "team"),
        ({"profile": "gpu-notebook"}, [], "team"),
        ({"profile": "gpu-notebook", "priority": -3}, ["nlp"], "priority"),
        ({"profile": "gpu-notebook", "priority": "1e9"}, ["nlp"], "priority"),
        ({"profile": "gpu-notebook", "min_runtime": "9h"}, ["nlp"], "min_runtime"),
        ({"profile": "debug", "min_runtime": "1h"}, ["nlp"], "min_runtime"),
        ({"profile": "debug", "min_runtime": "soon"}, ["nlp"], "min_runtime"),
        ({"profile": "dataprep", "storage": "/etc"}, ["nlp"], "storage"),
        ({"profile": "gpu-notebook", "image": "evil"}, ["nlp"], "image"),
        ({"profile": ["debug", "gpu-notebook"]}, ["nlp"], "profile"),
    ],
)
def test_forged_options_are_refused_naming_the_field(options, teams, field):
    with pytest.raises(FormError) as caught:
        resolve(options, PROFILES, teams)
    assert caught.value.field == field
    assert caught.value.reason


def test_profile_list_errors_name_the_key():
    with pytest.raises(FormError, match=r"profile_list\[0\]\.pool"):
        parse_profiles([{"slug": "x", "pool": "tpu", "image": "i"}], SETTINGS, ["gpu"])
    with pytest.raises(FormError, match="debug profile offers at most 2"):
        parse_profiles(
            [{"slug": "d", "class": "debug", "pool": "gpu", "image": "i", "gpus": [4]}],
            SETTINGS,
            ["gpu"],
        )


def test_form_offers_the_users_teams_and_escapes_text():
    html = render_form(PROFILES, ["nlp", "<b>x</b>"], {"nlp": "(gpu: 10% of budget used)"})
    assert 'value="gpu-notebook"' in html and 'name="team"' in html
    assert "10% of budget used" in html
    assert "<b>x</b>" not in html


def grant(*slices: Slice) -> NodeGrant:
    return NodeGrant("gpu-1", slices, cpus=2, memory_gib=4)


IDENTITY = SessionIdentity("ann", "", "ann//abcd", "nlp", "gpu-notebook", "hub-a")


def test_container_gets_exactly_the_granted_gpus_and_no_privilege():
    slices = (Slice("GPU-a", SliceKind.WHOLE), Slice("GPU-b", SliceKind.WHOLE))
    spec = build_launch_spec(
        IDENTITY,
        "img",
        grant(*slices),
        hub_env={"X": "1"},
        port=5000,
        ip="127.0.0.1",
        nvidia=True,
    )
    kwargs = spec.create_kwargs()
    assert kwargs["environment"]["NVIDIA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert kwargs["environment"]["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert kwargs["device_requests"][0]["device_ids"] == ["GPU-a", "GPU-b"]
    assert kwargs["privileged"] is False
    assert kwargs["user"] == "1000:100"
    assert kwargs["nano_cpus"] == 2 * 10**9 and kwargs["mem_limit"] == 4 * 2**30
    assert all("docker.sock" not in m["Source"] for m in kwargs["mounts"])
    assert kwargs["mounts"][0]["Target"] == "/home/jovyan"  # the whole home
    assert kwargs["mounts"][0]["Type"] == "volume"
    assert "--port=5000" in kwargs["command"]


def test_a_shared_home_is_bound_and_a_restore_is_read_only():
    spec = build_launch_spec(
        IDENTITY,
        "img",
        grant(),
        hub_env={},
        port=1,
        ip="127.0.0.1",
        nvidia=False,
        home="/srv/homes/hub/ann",
        restore_dir="/srv/snapshots/hub/ann/default/k/kernels",
    )
    home, restore = spec.create_kwargs()["mounts"]
    assert (home["Type"], home["Source"], home["Target"]) == (
        "bind",
        "/srv/homes/hub/ann",
        "/home/jovyan",
    )
    assert not home["ReadOnly"]
    assert restore["ReadOnly"] and restore["Target"] == "/var/lib/budgethub/restore"
    assert spec.environment["BUDGETHUB_RESTORE_DIR"] == "/var/lib/budgethub/restore"


def test_virtual_gpus_reach_the_environment_but_not_the_runtime():
    mig = Slice("GPU-a", SliceKind.MIG, mig_uuid="MIG-1", mig_profile="1g.10gb")
    spec = build_launch_spec(
        IDENTITY, "img", grant(mig), hub_env={}, port=1, ip="127.0.0.1", nvidia=False
    )
    kwargs = spec.create_kwargs()
    assert kwargs["environment"]["NVIDIA_VISIBLE_DEVICES"] == "MIG-1"
    assert "device_requests" not in kwargs
    [marked] = json.loads(spec.environment["BUDGETHUB_GPU_SLICES"])
    assert marked == {"uuid": "MIG-1", "kind": "mig", "weight": 0.1429, "virtual": True}
    real = build_launch_spec(
        IDENTITY, "img", grant(mig), hub_env={}, port=1, ip="127.0.0.1", nvidia=True
    )
    assert json.loads(real.environment["BUDGETHUB_GPU_SLICES"])[0]["virtual"] is False
    assert (spec.environment["BUDGETHUB_NODE"], spec.environment["BUDGETHUB_PROFILE"]) == (
        "gpu-1",
        "gpu-notebook",
    )
    half = Slice("GPU-a", SliceKind.FRACTION, milli=MILLI // 2)
    spec = build_launch_spec(
        IDENTITY, "img", grant(half), hub_env={}, port=1, ip="127.0.0.1", nvidia=False
    )
    assert spec.environment["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    cpu = build_launch_spec(
        IDENTITY,
        "img",
        grant(),
        hub_env={},
        port=1,
        ip="127.0.0.1",
        nvidia=False,
        storage=("weka-a", "/srv/weka-a"),
    )
    assert cpu.environment["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert cpu.mounts[1].source == "/srv/weka-a" and cpu.mounts[1].kind == "bind"


def test_session_names_are_safe_and_distinct():
    assert session_name("a.b@c", "") == "budgethub_a.b-40c_default"
    assert session_name("ann", "x") != session_name("ann", "y")


def test_session_names_and_homes_are_per_hub():
    """Two Hubs on one engine never share a container name or a home volume, even when
    their names and users' names are made to run together."""
    assert session_name("ann", "", "hub-a") != session_name("ann", "", "hub-b")
    assert session_name("b_c", "", "a") != session_name("c", "", "a_b")
    assert workspace_volume("ann", "hub-a") != workspace_volume("ann", "hub-b")
    assert workspace_volume("ann") == "budgethub-home-ann"  # the default Hub keeps its volumes


def test_sessions_have_a_pid_limit_and_no_swap():
    spec = build_launch_spec(
        IDENTITY, "img", grant(), hub_env={}, port=1, ip="127.0.0.1", nvidia=False
    )
    kwargs = spec.create_kwargs()
    assert kwargs["pids_limit"] == DEFAULT_PIDS_LIMIT
    assert kwargs["memswap_limit"] == kwargs["mem_limit"]
    unlimited = build_launch_spec(
        IDENTITY, "img", grant(), hub_env={}, port=1, ip="127.0.0.1", nvidia=False, pids_limit=0
    )
    assert "pids_limit" not in unlimited.create_kwargs()


class FakeNvml:
    """pynvml's functions for one machine with a whole H100 and a MIG-partitioned one."""

    def __init__(self) -> None:
        self.shut = False
        self.gpus = [
            {"uuid": b"GPU-0", "name": "NVIDIA H100", "mig": None},
            {"uuid": "GPU-1", "name": "NVIDIA H100", "mig": ["MIG-1a", None, "MIG-1c"]},
        ]

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        pass

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):  # noqa: N802
        return ("gpu", index)

    def nvmlDeviceGetUUID(self, handle):  # noqa: N802
        if handle[0] == "mig":
            return self.gpus[handle[1]]["mig"][handle[2]]
        return self.gpus[handle[1]]["uuid"]

    def nvmlDeviceGetName(self, handle):  # noqa: N802
        if handle[0] == "mig":
            return "NVIDIA H100 MIG 1g.10gb" if handle[2] == 0 else "NVIDIA H100 MIG"
        return self.gpus[handle[1]]["name"]

    def nvmlDeviceGetMemoryInfo(self, handle):  # noqa: N802
        return SimpleNamespace(total=80 * 2**30)

    def nvmlDeviceGetMigMode(self, handle):  # noqa: N802
        if self.gpus[handle[1]]["mig"] is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return (1, 1)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):  # noqa: N802
        return len(self.gpus[handle[1]]["mig"])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, slot):  # noqa: N802
        if self.gpus[handle[1]]["mig"][slot] is None:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return ("mig", handle[1], slot)

    def nvmlDeviceGetAttributes(self, handle):  # noqa: N802
        return SimpleNamespace(gpuInstanceSliceCount=2, memorySizeMB=20 * 1024)


def test_nvml_inventory_reads_whole_gpus_and_mig_instances():
    fake = FakeNvml()
    gpus = nvml_gpus(fake)  # type: ignore[arg-type]
    assert [g.uuid for g in gpus] == ["GPU-0", "GPU-1"]
    assert gpus[0].mig == () and gpus[0].memory_mib == 80 * 1024 and not gpus[0].virtual
    assert [(m.uuid, m.profile) for m in gpus[1].mig] == [
        ("MIG-1a", "1g.10gb"),
        ("MIG-1c", "2g.20gb"),
    ]
    assert fake.shut


def test_nodes_config_virtual_gpus_and_errors_name_the_key():
    pools = builders.pools()
    nodes, engines = parse_nodes(
        [
            {"name": "g", "pool": "gpu", "gpus": 2, "mig": {"1": ["1g.10gb"] * 7}},
            {"name": "p", "pool": "cpu", "storage": {"weka-a": "/srv/a"}},
        ],
        pools,
    )
    assert all(g.virtual for g in nodes[0].gpus)
    assert len(nodes[0].gpus[1].mig) == 7
    assert nodes[1].labels["storage"] == "weka-a"
    assert engines["p"].storage == {"weka-a": "/srv/a"}
    assert virtual_gpus("g", 2)[0].uuid == nodes[0].gpus[0].uuid
    for bad, key in [
        ({"name": "x", "pool": "tpu"}, "nodes[0].pool"),
        ({"name": "x", "pool": "gpu", "gpus": -1}, "nodes[0].gpus"),
        ({"name": "x", "pool": "cpu", "gpus": 1}, "nodes[0].gpus"),
        ({"name": "x", "pool": "gpu", "cpus": 0}, "nodes[0].cpus"),
        ({"name": "x", "pool": "gpu", "colour": "red"}, "nodes[0].colour"),
    ]:
        with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
            parse_nodes([bad], pools)


def test_every_core_setting_is_a_trait_of_the_embedded_scheduler():
    from scheduler_core.settings import SETTING_NAMES
    from spawner.hub.embedded import BudgetScheduler

    baseline_only = {n for n in SETTING_NAMES if n.startswith(("fairshare_", "legacy_"))}
    scheduler = BudgetScheduler(guaranteed_share=0.5, funded_burst=0.0, lookback=86400.0)
    missing = [n for n in SETTING_NAMES if n not in baseline_only | {"name"}]
    assert [n for n in missing if not scheduler.has_trait(n)] == []
    settings = scheduler.core_settings()
    assert (settings.guaranteed_share, settings.funded_burst, settings.lookback) == (
        0.5,
        0.0,
        86400.0,
    )
    with pytest.raises(ConfigError, match="funded_burst"):
        BudgetScheduler(funded_burst=-1.0).core_settings()
    # Left alone, the Hub runs the core's own defaults.
    assert BudgetScheduler().core_settings() == Settings()


def test_queue_message_says_why_a_request_would_run_unallocated():
    from scheduler_core import verdict
    from spawner.hub.embedded import QueueStatus
    from spawner.hub.spawner import BudgetSpawner

    common = dict(position=2, waiting=3, team_position=1, team_waiting=1, estimated_start=None)
    funded = QueueStatus(funded=True, protected_s=3600, **common)
    assert "funded by your team's budget, protected for 1 h" in (  # human_duration
        BudgetSpawner._queue_message(None, funded)
    )
    over = QueueStatus(
        funded=False,
        protected_s=0.0,
        team_funded=12.0,
        team_share=8.0,
        budget_used=0.42,
        window_days=7.0,
        **common,
    )
    message = BudgetSpawner._queue_message(None, over)
    unweighed = verdict.MESSAGES[verdict.NOT_WEIGHED]  # no verdict codes: NOT_WEIGHED's words
    assert message == (
        f"Queued: position 2 of 3 in the pool, 1 of 1 in your team; {unweighed} (its funded "
        "sessions hold 12 GPU, its share is 8 GPU; 42% of its 7-day budget used): it will run "
        "unallocated (preemptible); no start time can be promised: it starts when running "
        "sessions end"
    )
    timed = QueueStatus(funded=True, protected_s=900, **{**common, "estimated_start": 4e9})
    clock = time.strftime("%H:%M", time.localtime(4e9))
    assert f"estimated start about {clock} (" in BudgetSpawner._queue_message(None, timed)
    rests = dataclasses.replace(timed, basis="running sessions end when their protection ends")
    assert f"about {clock}, if running sessions end when their protection ends" in (
        BudgetSpawner._queue_message(None, rests)
    )
    now = dataclasses.replace(timed, starts_now=True)
    assert BudgetSpawner._queue_message(None, now).endswith("protected for 15 min; starts now")


def test_stop_notices_are_rebuilt_from_the_event_log():
    from scheduler_core.store import EventRecord
    from spawner.readmodel.status import notices_from

    def event(i: int, kind: str, **payload: object) -> EventRecord:
        return EventRecord(id=i, time=float(i), kind=kind, payload=payload)

    stopped = "Your session was stopped at 10:00: its node is being drained."
    log = [
        event(1, "submit", request="ann//a1"),
        event(2, "submit", request="bo/gpu/b1"),
        event(3, "preempt", request="ann//a1", reason="drain", message=stopped),
        event(4, "preempt", request="bo/gpu/b1", reason="funded", message="bo's notice"),
        event(5, "submit", request="bo/gpu/b2"),  # bo started again: his notice is read
        event(6, "node", node="n1", state="down"),
        event(7, "preempt", request="not-a-request-id", message="ignored"),
        event(8, "preempt", request="cy//c1", reason="drain"),  # logged before messages were
    ]
    assert notices_from(log) == {("ann", ""): stopped}


def test_queue_message_says_positions_can_move_and_why_one_moved_back():
    from spawner.hub.embedded import QueueStatus
    from spawner.hub.spawner import BudgetSpawner

    funded = dict(funded=True, protected_s=900, estimated_start=None)
    alone = QueueStatus(position=1, waiting=2, team_position=1, team_waiting=2, **funded)
    assert "positions can move" not in BudgetSpawner._queue_message(None, alone)
    mixed = QueueStatus(
        position=3, waiting=5, team_position=1, team_waiting=1, other_teams=True, **funded
    )
    moved = " (moved back from 1)"
    message = BudgetSpawner._queue_message(None, mixed, moved)
    assert message.startswith(f"Queued: position 3 of 5 in the pool{moved}, 1 of 1 in your team")
    assert message.endswith("Teams furthest under their share go first, so positions can move")


def test_the_hub_and_a_scenario_parse_nodes_alike():
    """One node parser: the same defaults, and the same field and reason for a bad node,
    whether it comes from a scenario or from ``c.BudgetScheduler.nodes``."""
    from scheduler_core.errors import InputError
    from scheduler_core.scenario import parse_scenario

    pools = builders.pools()
    [live], _engines = parse_nodes([{"name": "n", "pool": "gpu", "gpus": 2}], pools)
    scenario = {
        "name": "s",
        "horizon": 60,
        "pools": [{"name": "gpu", "kind": "gpu"}, {"name": "cpu", "kind": "cpu"}],
        "teams": [{"name": "t", "share": 1.0}],
        "requests": [],
    }
    [simulated] = parse_scenario(
        {**scenario, "nodes": [{"name": "n", "pool": "gpu", "gpus": 2}]}
    ).nodes
    assert (live.cpus, live.memory_gib) == (simulated.cpus, simulated.memory_gib) == (64, 512)
    assert [g.uuid for g in live.gpus] == [g.uuid for g in simulated.gpus]
    for bad in (
        {"name": "n", "pool": "gpu", "state": "broken"},
        {"name": "n", "pool": "gpu", "cpus": -1},
        {"name": "n", "pool": "gpu", "mig": {"9": ["1g.10gb"]}},
    ):
        with pytest.raises(InputError) as from_scenario:
            parse_scenario({**scenario, "nodes": [bad]})
        with pytest.raises(ConfigError) as from_hub:
            parse_nodes([bad], pools)
        assert str(from_hub.value) == f"c.BudgetScheduler.{from_scenario.value}"


def test_state_from_an_earlier_hub_loads_and_is_saved_under_the_new_key():
    """JupyterHub keeps get_state() in its database: a Hub that ran the version before
    the rename stored the runtime's id as "container_id"."""
    from spawner.hub.spawner import BudgetSpawner

    spawner = BudgetSpawner()
    spawner.load_state({"request_id": "r-1", "node": "gpu-1", "container_id": "c0ffee"})
    assert spawner.runtime_id == "c0ffee" and spawner.launched
    state = spawner.get_state()
    assert state["runtime_id"] == "c0ffee" and "container_id" not in state
    assert state["request_id"] == "r-1" and state["node"] == "gpu-1"

    again = BudgetSpawner()
    again.load_state(state)
    assert again.runtime_id == "c0ffee" and again.get_state() == state
    again.load_state({"runtime_id": "4242", "container_id": "stale"})
    assert again.runtime_id == "4242"


def test_sessions_are_pinned_to_as_many_cpus_as_granted_spread_over_the_node():
    """nproc in a 1-CPU session said the node's 2 (issue 50): each session gets a cpuset
    of its granted CPUs (rounded up), the ones fewest sessions hold."""
    assert [cpus_wanted(n) for n in (10**9, 5 * 10**8, 25 * 10**8, 2 * 10**9)] == [1, 1, 3, 2]
    assert least_used(1, 4, []) == (0,)
    assert least_used(2, 4, [(0,), (1,)]) == (2, 3)
    assert least_used(1, 2, [(0, 1), (0,)]) == (1,)
    assert least_used(4, 2, []) == (0, 1)  # more than the node has: all of it
    assert parse_cpuset("0-2,5") == (0, 1, 2, 5)
    assert parse_cpuset("") == () and parse_cpuset("x") == ()

    pins = CpuPins()
    pins.total = 4
    assert [pins.claim(f"s{i}", 10**9) for i in range(5)] == ["0", "1", "2", "3", "0"]
    pins.release("s1")
    assert pins.claim("s5", 10**9) == "1"  # the CPU s1 left
    assert pins.claim("big", 4 * 10**9) == ""  # granted the whole node: not pinned
    pins.adopt("old", "2-3")  # a session an earlier Hub started, found again
    assert pins.claim("s6", 2 * 10**9) == "0,1"  # CPU 1 holds one session, 0 two
