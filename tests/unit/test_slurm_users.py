"""Each researcher's Slurm job as their own Unix account (spawner.runtime.slurmusers):
the account of a Hub user, a user without one refused in words, ownership of the home
and the snapshot a session restores, and the job's --uid or exec prefix. The Slurm tests
run the same code against a real cluster."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest
from test_slurm_parsing import spec, whole

from spawner.runtime.dockernodes import EngineConfig
from spawner.runtime.slurm import (
    SlurmConfigError,
    SlurmGpu,
    SlurmPartition,
    SlurmRuntime,
    SlurmSettings,
    parse_home,
)
from spawner.runtime.slurmusers import (
    SESSION_GID,
    SESSION_UID,
    Account,
    NoAccount,
    account_name,
    give,
    lookup,
    submit_prefix,
)
from spawner.runtime.snapshots import (
    SnapshotLayout,
    capture,
    ensure_home,
    session_home,
    session_owner,
    write_report,
)

NOBODY = pwd.getpwnam("nobody")


def test_the_account_of_a_hub_user():
    assert account_name("{user}", "ann") == "ann"
    assert account_name("lab-{user}", "ann") == "lab-ann"
    assert account_name({"ann": "a.smith"}, "ann") == "a.smith"
    assert account_name({"ann": "a.smith"}, "bo") == "bo"
    assert account_name(lambda user: user.upper(), "ann") == "ANN"
    assert account_name("", "ann") is None
    assert lookup({"ann": "nobody"}, "ann") == Account("nobody", NOBODY.pw_uid, NOBODY.pw_gid)


def test_a_user_without_an_account_is_refused_saying_so():
    with pytest.raises(NoAccount) as error:
        lookup("{user}", "no-such-user-48")
    assert "the Hub user 'no-such-user-48' has no Unix account 'no-such-user-48'" in str(
        error.value
    )
    assert "c.BudgetScheduler.slurm_users" in str(error.value)
    with pytest.raises(NoAccount, match="root"):
        lookup({"ann": "root"}, "ann")


def test_the_exec_prefix_names_the_account():
    prefix = ("sudo", "-n", "-u", "{account}")
    assert submit_prefix(prefix, Account("lab-ann", 1001, 100)) == ["sudo", "-n", "-u", "lab-ann"]
    assert submit_prefix(prefix, None) == []


def runtime(**settings) -> SlurmRuntime:
    gpus = {"slurm:bhs2:1": SlurmGpu("gpu:g1:1", "gpu:g1:1", 1)}
    return SlurmRuntime(
        EngineConfig(node="bhs2", address="10.0.0.6"),
        SlurmPartition("gpu", SlurmSettings(**settings), "hub"),
        gpus,
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="sbatch --uid is a root Hub's")
def test_a_root_hub_submits_as_the_users_account():
    _, options = runtime(users={"ann": "nobody"}).job_script(spec(whole(1)))
    assert f"--uid={NOBODY.pw_uid}" in options and f"--gid={NOBODY.pw_gid}" in options
    _, options = runtime(users="").job_script(spec(whole(1)))
    assert f"--uid={SESSION_UID}" in options  # one account for everyone, as before
    _, options = runtime(users={"ann": "nobody"}, exec_prefix=("sudo",)).job_script(spec(whole(1)))
    assert not any(o.startswith("--uid") for o in options)  # sudo makes it the account's
    with pytest.raises(NoAccount):
        runtime(users="{user}-no-such-48").job_script(spec(whole(1)))


@pytest.mark.skipif(os.geteuid() != 0, reason="only root gives files away")
def test_the_home_and_the_snapshot_to_restore_become_the_accounts(tmp_path: Path):
    hub_dir = tmp_path / "snapshots" / "hub"
    hub_dir.mkdir(parents=True)
    os.chmod(hub_dir, 0o711)
    snapshot = hub_dir / "ann" / "default" / "k1"
    (snapshot / "kernels").mkdir(parents=True)
    (snapshot / "kernels" / "state.pkl").write_bytes(b"x")
    home = tmp_path / "homes" / "ann"
    (home / "work").mkdir(parents=True)
    (home / "work" / "notes.txt").write_text("mine")
    for path in (home, home / "work", home / "work" / "notes.txt", snapshot.parents[1]):
        os.chown(path, SESSION_UID, SESSION_GID)  # as the Hub writes them for Docker
    for path in (snapshot.parent, snapshot, snapshot / "kernels"):
        os.chown(path, SESSION_UID, SESSION_GID)
    account = Account("nobody", NOBODY.pw_uid, NOBODY.pw_gid)
    give(home, snapshot, account)
    for path in (home, home / "work" / "notes.txt", snapshot / "kernels" / "state.pkl"):
        assert os.stat(path).st_uid == NOBODY.pw_uid, path
    for path in (home, snapshot, snapshot.parent, hub_dir / "ann"):
        assert os.stat(path).st_mode & 0o777 == 0o700, path
    assert os.stat(hub_dir).st_uid == 0 and os.stat(hub_dir).st_mode & 0o777 == 0o711


@pytest.mark.skipif(os.geteuid() != 0, reason="only root gives files away")
def test_slurm_home_is_the_accounts_home_and_its_files_are_the_accounts(tmp_path: Path):
    settings = SlurmSettings(users={"ann": "nobody"}, home=f"{tmp_path}/{{account}}")
    partition = SlurmPartition("gpu", settings, "hub")
    runtime = SlurmRuntime(EngineConfig(node="n1"), partition, {})
    assert runtime.home_of("ann") == tmp_path / "nobody"
    assert runtime.owner_of("ann") == (NOBODY.pw_uid, NOBODY.pw_gid)
    other = SlurmRuntime(EngineConfig(node="n1"), SlurmPartition("gpu", SlurmSettings(), "h"), {})
    assert other.home_of("ann") is None and other.owner_of("ann") is None  # the layout's
    layout = SnapshotLayout("hub", tmp_path / "homes", tmp_path / "snapshots")
    home = session_home(runtime, layout, "ann")
    assert home == tmp_path / "nobody"
    ensure_home(home, session_owner(runtime, "ann"))
    assert os.stat(home).st_uid == NOBODY.pw_uid and os.stat(home).st_mode & 0o777 == 0o700
    captured = capture(
        layout,
        "ann",
        "",
        "20261207T010000-0a0b0c0d",
        home=home,
        state_relative="x",
        owner=session_owner(runtime, "ann"),
    )
    write_report(captured.path, {"key": "k"}, session_owner(runtime, "ann"))
    for path in (captured.path, captured.path / "report.json", layout.user_dir("ann")):
        assert os.stat(path).st_uid == NOBODY.pw_uid and os.stat(path).st_mode & 0o077 == 0


@pytest.mark.parametrize(
    ("template", "why"),
    [("home/{account}", "absolute"), ("/home/{name}", "only"), ("/x/../{user}", "absolute")],
)
def test_a_bad_slurm_home_names_the_field(template: str, why: str):
    with pytest.raises(SlurmConfigError) as raised:
        parse_home(template)
    assert raised.value.key == "slurm_home" and why in raised.value.reason
    assert parse_home("/home/{account}") == "/home/{account}" and parse_home("") == ""
