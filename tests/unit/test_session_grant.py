"""budgethub_session.grant: what a session was granted, read from the environment the
spawner gives it (spawner/runtime/spec.py), for the JupyterLab launcher card and page."""

from __future__ import annotations

import json
from pathlib import Path

from budgethub_session.grant import NAME, grant_from, render, server_proxy_servers

from scheduler_core.model import NodeGrant, Slice, SliceKind
from spawner.runtime.spec import SessionIdentity, build_launch_spec

IDENTITY = SessionIdentity("ann", "", "ann//abcd", "nlp", "debug", "hub-a")


def env_of(*slices: Slice, nvidia: bool = False, funded: bool = True) -> dict[str, str]:
    spec = build_launch_spec(
        IDENTITY,
        "img",
        NodeGrant("gpu-1", slices, cpus=1, memory_gib=1),
        hub_env={},
        port=1,
        ip="127.0.0.1",
        nvidia=nvidia,
        extra_env={"BUDGETHUB_FUNDED": "1" if funded else "0", "BUDGETHUB_PROTECTED_UNTIL": "4e9"},
    )
    return dict(spec.environment)


def test_a_virtual_mig_grant_reads_as_such_from_the_spawners_environment():
    mig = Slice("GPU-a", SliceKind.MIG, mig_uuid="MIG-1", mig_profile="1g.10gb")
    grant = grant_from(env_of(mig))
    assert grant.virtual is True and grant.funded is True and grant.team == "nlp"
    assert grant.summary() == "1 MIG instance (0.143 of a GPU), virtual · nlp · funded"
    rows = dict(grant.rows(now=3e9))
    assert rows["GPU kind"].startswith("virtual")
    assert rows["Protected from preemption"].startswith("until ")
    assert (rows["Node"], rows["Profile"]) == ("gpu-1", "debug")
    page = render(grant, now=3e9)
    assert "What this session was granted" in page and "MIG-1" in page


def test_real_whole_gpus_unallocated_and_no_gpu():
    whole = [Slice("GPU-a", SliceKind.WHOLE), Slice("GPU-b", SliceKind.WHOLE)]
    grant = grant_from(env_of(*whole, nvidia=True, funded=False))
    assert grant.summary() == "2 GPUs, real · nlp · unallocated"
    assert dict(grant.rows())["Funding"].startswith("unallocated")
    assert grant_from(env_of()).summary() == "no GPU · nlp · funded"
    assert grant_from({}).summary() == "no GPU"  # outside budgethub: nothing said, no error
    assert grant_from({"BUDGETHUB_GPU_SLICES": "not json"}).slices == ()


def test_the_launcher_card_is_titled_with_the_grant_and_opens_in_lab():
    half = Slice("GPU-a", SliceKind.FRACTION, milli=250)
    servers = server_proxy_servers(env_of(half))
    entry = servers[NAME]
    assert entry["launcher_entry"]["title"] == "Your session: 0.25 of a GPU, virtual · nlp · funded"
    assert entry["new_browser_tab"] is False
    assert Path(entry["launcher_entry"]["icon_path"]).is_file()
    assert "{port}" in entry["command"]
    json.dumps(servers)  # plain data: it goes into the server's config
