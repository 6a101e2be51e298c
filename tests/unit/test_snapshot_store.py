"""The Hub's side of snapshots on a real file system: the copy follows no link the user
made, a failed copy leaves nothing behind, and everything belongs to uid 1000, 0700/0600."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
from pathlib import Path

import pytest

from spawner.profiles import FormError, snapshot_choice
from spawner.runtime.snaprecord import _kernel_entries, snapshot_sentence
from spawner.runtime.snapshots import (
    SnapshotError,
    SnapshotLayout,
    capture,
    ensure_home,
    new_key,
    state_dir_in_home,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown to uid 1000 needs root")

STATE = state_dir_in_home("")


def layout(tmp_path: Path) -> SnapshotLayout:
    return SnapshotLayout("hub", tmp_path / "homes", tmp_path / "snapshots")


def home_with_state(tmp_path: Path) -> Path:
    home = layout(tmp_path).home("ann")
    assert home is not None
    ensure_home(home)
    notebook = home / STATE / "0123456789abcdef"
    notebook.mkdir(parents=True)
    manifest = {"notebook": "a.ipynb", "variables": {"x": {"file": "g0", "bytes": 3}}}
    (notebook / "manifest.json").write_text(json.dumps(manifest))
    (notebook / "g0").write_bytes(b"abc")
    return home


def test_a_new_home_is_the_users_and_private(tmp_path: Path) -> None:
    home = layout(tmp_path).home("ann")
    assert home == tmp_path / "homes" / "hub" / "ann"
    ensure_home(home)
    info = os.stat(home)
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (1000, 100, 0o700)
    assert (home / "work").is_dir()


def test_capture_copies_the_state_privately_with_its_manifests(tmp_path: Path) -> None:
    home = home_with_state(tmp_path)
    key = new_key()
    captured = capture(layout(tmp_path), "ann", "", key, home=home, state_relative=STATE)
    assert captured.path == tmp_path / "snapshots" / "hub" / "ann" / "default" / key
    assert (captured.path / "kernels" / "0123456789abcdef" / "g0").read_bytes() == b"abc"
    assert captured.manifests[0]["notebook"] == "a.ipynb"
    assert captured.kernel_bytes > 3
    for root, dirs, files in os.walk(tmp_path / "snapshots" / "hub" / "ann"):
        for name in dirs:
            info = os.stat(os.path.join(root, name))
            assert info.st_uid == 1000 and stat.S_IMODE(info.st_mode) == 0o700
        for name in files:
            info = os.stat(os.path.join(root, name))
            assert info.st_uid == 1000 and stat.S_IMODE(info.st_mode) == 0o600


def test_capture_follows_no_link_the_user_made(tmp_path: Path) -> None:
    home = home_with_state(tmp_path)
    secret = tmp_path / "hub-secret"
    secret.write_text("not for users")
    notebook = home / STATE / "0123456789abcdef"
    (notebook / "stolen").symlink_to(secret)
    captured = capture(layout(tmp_path), "ann", "", new_key(), home=home, state_relative=STATE)
    assert not (captured.path / "kernels" / "0123456789abcdef" / "stolen").exists()
    assert captured.skipped == ["0123456789abcdef/stolen"]
    # The state directory itself replaced by a link to a host directory: refused.
    kernels = home / STATE
    os.rename(kernels, home / "elsewhere")
    kernels.symlink_to(tmp_path)
    with pytest.raises(SnapshotError, match="is a link"):
        capture(layout(tmp_path), "ann", "", new_key(), home=home, state_relative=STATE)
    left = list((tmp_path / "snapshots" / "hub" / "ann" / "default").iterdir())
    assert len(left) == 1  # the first snapshot; no partial one left behind


def test_capture_from_a_container_archive(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in (("kernels/k1/manifest.json", b'{"notebook": "b.ipynb"}'),):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        evil = tarfile.TarInfo("kernels/../../escape")
        evil.size = 1
        tar.addfile(evil, io.BytesIO(b"x"))
    captured = capture(
        layout(tmp_path),
        "ann",
        "lab",
        new_key(),
        home=None,
        state_relative=STATE,
        archive=buffer.getvalue(),
    )
    assert captured.manifests[0]["notebook"] == "b.ipynb"
    assert not (tmp_path / "escape").exists() and not (tmp_path / "snapshots" / "escape").exists()


def test_a_bad_key_never_names_a_path(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError):
        layout(tmp_path).snapshot_dir("ann", "", "../../etc")


def test_restore_options_are_checked_for_their_form() -> None:
    assert snapshot_choice({}) == (None, False)
    assert snapshot_choice({"restore": ["20261201T121500-1f2e3d4c"], "fresh": "on"}) == (
        "20261201T121500-1f2e3d4c",
        True,
    )
    for options, field in (
        ({"restore": "../x"}, "restore"),
        ({"restore": 5}, "restore"),
        ({"fresh": "maybe"}, "fresh"),
    ):
        with pytest.raises(FormError) as refused:
            snapshot_choice(options)
        assert refused.value.field == field


def test_the_report_names_what_was_not_kept() -> None:
    checkpoint = {
        "kernels": [
            {
                "kernel_id": "k",
                "notebook": "a.ipynb",
                "state": "busy",
                "saved": ["x"],
                "unsaved": {"sock": "socket.socket: cannot pickle"},
                "error": None,
            }
        ],
        "notebooks": {},
    }
    manifests = [{"key": "k1", "notebook": "a.ipynb", "variables": {"x": {"bytes": 3}}}]
    [entry] = _kernel_entries(checkpoint, manifests)
    assert entry["variables"] == ["x"] and entry["state"] == "busy"
    report = {
        "key": "K",
        "kernels": [entry],
        "kernel_state": "partial",
        "why": "a.ipynb: busy",
        "unsaved": {"a.ipynb:sock": "socket.socket: cannot pickle"},
        "files": "kept in the home",
    }
    sentence = snapshot_sentence(report)
    assert "1 variable of 1 notebook come back" in sentence
    assert "last finished cell" in sentence
    assert "Not kept: a.ipynb:sock (socket.socket: cannot pickle)." in sentence


def test_the_restore_notice_lies_beside_the_kernel_state_and_is_the_users(
    tmp_path: Path,
) -> None:
    """What a restoring session's JupyterLab says came back (issue 42): written into the
    snapshot's kernels/ (mounted at $BUDGETHUB_RESTORE_DIR), even with no kernel state."""
    from spawner.runtime.snapshots import RESTORE_NOTICE, write_restore_notice

    home = layout(tmp_path).home("ann")
    assert home is not None
    ensure_home(home)  # no kernel state at all: kernels/ is made for the notice
    key = new_key()
    captured = capture(layout(tmp_path), "ann", "", key, home=home, state_relative=STATE)
    report = {
        "key": key,
        "time": 1796540400.0,
        "kernels": [{"notebook": "a.ipynb", "variables": ["x"], "state": "saved"}],
        "unsaved": {"a.ipynb:sock": "socket.socket: cannot pickle"},
        "notebooks": {"saved": ["a.ipynb"], "not_flushed": {}, "edits_saved": ["a.ipynb"]},
    }
    write_restore_notice(captured.path, report)
    path = captured.path / "kernels" / RESTORE_NOTICE
    info = os.stat(path)
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (1000, 0o600)
    assert json.loads(path.read_text()) == {
        "key": key,
        "time": 1796540400.0,
        "kernels": [{"notebook": "a.ipynb", "variables": ["x"]}],
        "unsaved": {"a.ipynb:sock": "socket.socket: cannot pickle"},
        "edits_saved": ["a.ipynb"],
        "files": None,
    }
    assert layout(tmp_path).kernels_dir("ann", "", key) == captured.path / "kernels"
    sentence = snapshot_sentence({**report, "files": "kept in the home"})
    assert "The edits you had not saved were saved from your open JupyterLab: a.ipynb." in (
        sentence
    )
