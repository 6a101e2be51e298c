"""The session images' kernel checkpoints, for real: a Jupyter Server with the
budgethub extensions on 127.0.0.1 (budgethub_session.localserver), real IPython kernels
driven over the server's websocket, the agent's checkpoint, and a restore into
fresh kernels of a second server (as a new container would start with the snapshot
mounted at $BUDGETHUB_RESTORE_DIR)."""

from __future__ import annotations

import ast
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ipykernel")
pytest.importorskip("jupyter_server")

from budgethub_session import notebook_key  # noqa: E402
from budgethub_session.checkpoint import Checkpointer, load_namespace, read_group  # noqa: E402
from budgethub_session.localserver import LocalKernel, LocalServer  # noqa: E402

NOTEBOOKS = ("work/a.ipynb", "work/b.ipynb")
EMPTY_NOTEBOOK = {
    "cells": [],
    "metadata": {},
    "nbformat": 4,
    "nbformat_minor": 5,
}

CELLS_A = [
    "import numpy as np, pandas as pd, socket\n"
    "n = 42\nf = 2.5\nz = 1 - 2j\nbig = 2**100\nwho = 'notebook a'\nblob = b'\\x00\\xff'",
    "nested = {'list': [1, [2, 3], {'t': (4, 5)}], 'set': {6, 7}, 'none': None}",
    "df = pd.DataFrame({'x': range(5), 'y': list('abcde')})\narr = np.arange(12.0).reshape(3, 4)",
    "class Point:\n"
    "    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
    "    def norm1(self):\n        return abs(self.x) + abs(self.y) + n\n"
    "p = Point(3, -4)",
    "sq = lambda v: v * v + n\ndef uses_global():\n    return who.upper()",
    "shared = [1, 2]\nholder = {'k': shared}\nview = arr[1]",
    "sock = socket.socket()",
]
CELLS_B = [
    "n = 7\nwho = 'notebook b'\nitems = [n, who]",
]
# What each kernel prints before the checkpoint and after the restore: equal.
PROBE_A = (
    "{'n': n, 'f': f, 'z': [z.real, z.imag], 'big': str(big), 'who': who, 'blob': list(blob),"
    " 'nested': repr(nested), 'df': df.to_json(), 'arr': arr.tolist(),"
    " 'p': [type(p).__name__, p.x, p.y, p.norm1(), isinstance(p, Point)],"
    " 'sq': sq(3), 'uses_global': uses_global(),"
    " 'holder_shares': holder['k'] is shared, 'view_shares': bool(np.shares_memory(view, arr)),"
    " 'np': np.__name__, 'pd': pd.__name__}"
)
PROBE_B = "{'n': n, 'who': who, 'items': items}"


def put_notebook(server: LocalServer, path: str) -> None:
    parent = path.rsplit("/", 1)[0]
    server.api("PUT", f"/api/contents/{parent}", {"type": "directory"})
    status, _ = server.api(
        "PUT", f"/api/contents/{path}", {"type": "notebook", "content": EMPTY_NOTEBOOK}
    )
    assert status in (200, 201), status


def settle(kernel: LocalKernel) -> list[str]:
    """Wait for the background save of the last cell; the names it (re)wrote."""
    expr = (
        "(lambda a: (a.worker.wait_idle(60),"
        " sorted(a.worker.last.written) if a.worker.last else [])[1])"
        "(__import__('budgethub_session.snapshot', fromlist=['_ACTIVE'])._ACTIVE)"
    )
    msg_id = kernel.send("", silent=True, store_history=False, user_expressions={"w": expr})
    reply = kernel.wait(msg_id, 90)
    assert reply.status == "ok", reply.error
    content = next(m for m in reply.messages if m["msg_type"] == "execute_reply")["content"]
    result = content["user_expressions"]["w"]
    assert result["status"] == "ok", result
    return list(ast.literal_eval(result["data"]["text/plain"]))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def server(tmp_path: Path, home: Path) -> Iterator[LocalServer]:
    with LocalServer(tmp_path / "home", home=home) as s:
        yield s


def test_two_notebooks_checkpoint_and_restore_into_fresh_kernels(
    tmp_path: Path, home: Path
) -> None:
    snapshot = tmp_path / "snapshot" / "kernels"
    with LocalServer(home, home=home) as first:
        for path in NOTEBOOKS:
            put_notebook(first, path)
        a, b = (first.open_notebook(p) for p in NOTEBOOKS)
        for cell in CELLS_A:
            a.ok(cell)
        for cell in CELLS_B:
            b.ok(cell)
        before_a, before_b = a.value(PROBE_A), b.value(PROBE_B)
        assert before_a["holder_shares"] and before_a["view_shares"] and before_a["p"][-1]

        status, report = first.agent("POST", "checkpoint", {"within": 30})
        assert status == 200, report
        by_notebook = {k["notebook"]: k for k in report["kernels"]}
        assert set(by_notebook) == set(NOTEBOOKS)
        ka, kb = by_notebook["work/a.ipynb"], by_notebook["work/b.ipynb"]
        assert ka["state"] == kb["state"] == "saved", report
        assert ka["error"] is None and ka["bytes"] > 0
        # The socket is named, with its type, never silently dropped.
        assert set(ka["unsaved"]) == {"sock"}
        assert ka["unsaved"]["sock"].startswith("socket.socket: ")
        assert {"n", "df", "arr", "p", "Point", "sq", "nested", "holder", "shared"} <= set(
            ka["saved"]
        )
        assert set(kb["saved"]) == {"items", "n", "who"} and kb["unsaved"] == {}
        # The notebooks were saved before their kernels ran: reported, not hidden.
        assert set(report["notebooks"]["not_flushed"]) == set(NOTEBOOKS)
        # Layout: one directory per notebook, keyed by its server-relative path.
        for path in NOTEBOOKS:
            manifest = json.loads(
                (first.state_dir / notebook_key(path) / "manifest.json").read_text()
            )
            assert manifest["notebook"] == path
        shutil.copytree(first.state_dir, snapshot)  # what the hub keeps

    # A new container: same home, the snapshot mounted read-only.
    snapshot.chmod(0o500)
    with LocalServer(home, home=home, restore_dir=snapshot) as second:
        # Opened in the other order: each kernel finds its own notebook's state.
        b2 = second.open_notebook(NOTEBOOKS[1])
        a2 = second.open_notebook(NOTEBOOKS[0])
        first_cell = a2.ok("1 + 1")
        assert "budgethub: restored" in first_cell.stdout
        assert "not restored: sock (socket.socket: " in first_cell.stdout
        assert a2.value(PROBE_A) == before_a
        assert b2.value(PROBE_B) == before_b
        assert a2.value("'sock' in globals()") is False
        # Functions from cells look up the live namespace, as before the restore.
        a2.ok("n = 100\nwho = 'changed'")
        assert a2.value("[sq(3), uses_global(), p.norm1()]") == [109, "CHANGED", 107]
        # The restored state is checkpointed again in this container's state dir.
        settle(a2)
        status, report = second.agent("POST", "checkpoint", {"within": 30})
        assert status == 200
        again = {k["notebook"]: k for k in report["kernels"]}["work/a.ipynb"]
        assert "df" in again["saved"] and again["unsaved"] == {}

        # A kernel restart in the same container does not restore twice.
        status, _ = second.api("POST", f"/api/kernels/{a2.kernel_id}/restart")
        assert status == 200
        a2.close()
        a3 = LocalKernel(second, a2.kernel_id, NOTEBOOKS[0])
        second.kernels.append(a3)
        assert a3.value("'df' in globals()") is False
    snapshot.chmod(0o700)


def test_incremental_saves_rewrite_only_what_changed(server: LocalServer) -> None:
    put_notebook(server, "work/inc.ipynb")
    k = server.open_notebook("work/inc.ipynb")
    k.ok("import numpy as np\nbig_a = np.zeros(2_000_000)\nbig_b = np.ones(2_000_000)\nc = 1")
    assert settle(k) == ["big_a", "big_b", "c", "np"]
    directory = server.state_dir / notebook_key("work/inc.ipynb")

    def files() -> dict[str, tuple[int, int]]:
        manifest = json.loads((directory / "manifest.json").read_text())
        out = {}
        for name, entry in manifest["variables"].items():
            st = (directory / entry["file"]).stat()
            out[name] = (st.st_ino, st.st_mtime_ns)
        return out

    before = files()
    k.ok("c = 2")
    assert settle(k) == ["c"]
    after = files()
    assert after["c"] != before["c"]
    assert {n: after[n] for n in ("big_a", "big_b", "np")} == {
        n: before[n] for n in ("big_a", "big_b", "np")
    }
    # Read only: serialized and hashed, nothing rewritten.
    k.ok("total = float(big_b.sum())")
    assert settle(k) == ["total"]
    # Mutated in place: only that array's file.
    before = files()
    k.ok("big_a[10] = 5.0")
    assert settle(k) == ["big_a"]
    after = files()
    assert after["big_a"] != before["big_a"] and after["big_b"] == before["big_b"]
    # Mutated through a function the cell calls: followed to the global it uses.
    k.ok("def bump():\n    big_b[0] += 1")
    settle(k)
    k.ok("bump()")
    assert settle(k) == ["big_b"]
    # Deleted: gone from the manifest and the disk.
    k.ok("del big_b")
    settle(k)
    assert "big_b" not in files()
    assert len(list(directory.glob("g-*.pkl"))) == len(
        {
            e["file"]
            for e in json.loads((directory / "manifest.json").read_text())["variables"].values()
        }
    )


def test_what_cannot_be_saved_is_listed_by_name_and_type(tmp_path: Path) -> None:
    def gen():
        yield 1

    handle = open(tmp_path / "f.txt", "w")  # noqa: SIM115
    (tmp_path / "f.txt").unlink()  # an open file whose path is gone cannot be reopened
    thread = threading.Thread(target=lambda: None)
    ns = {
        "ok": [1, 2, 3],
        "g": gen(),
        "fh": handle,
        "th": thread,
        "lock": threading.Lock(),
        "inside": {"fine": 1, "bad": gen()},
    }
    try:
        cp = Checkpointer(tmp_path / "state", "x.ipynb", ns)
        result = cp.save(ns)
    finally:
        handle.close()
    assert result.saved == ["ok"]
    assert set(result.unsaved) == {"g", "fh", "th", "lock", "inside"}
    assert result.unsaved["g"].startswith("builtins.generator: ")
    assert result.unsaved["fh"].startswith("_io.TextIOWrapper: ")
    assert "f.txt was deleted while open: it cannot be reopened" in result.unsaved["fh"]
    assert result.unsaved["th"].startswith("threading.Thread: ")
    assert result.unsaved["inside"].startswith("builtins.dict: ")
    manifest = json.loads((tmp_path / "state" / "manifest.json").read_text())
    assert manifest["unsaved"] == result.unsaved
    fresh: dict[str, object] = {}
    loaded = load_namespace(tmp_path / "state", fresh)
    assert fresh == {"ok": [1, 2, 3]}
    assert set(loaded.not_restored) == set(result.unsaved)


def test_shared_references_are_one_group(tmp_path: Path) -> None:
    shared = [1, 2]
    ns = {"a": shared, "b": {"k": shared}, "c": [3]}
    cp = Checkpointer(tmp_path / "s", "x.ipynb", ns)
    cp.save(ns)
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    groups = {n: e["group"] for n, e in manifest["variables"].items()}
    assert groups["a"] == groups["b"] != groups["c"]
    values = read_group(tmp_path / "s" / manifest["variables"]["a"]["file"], {})
    assert values["b"]["k"] is values["a"]


def test_torch_tensors_go_through_host_memory(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from budgethub_session import checkpoint

    device = "cuda" if torch.cuda.is_available() else "cpu"
    ns = {
        "t": torch.arange(6, dtype=torch.float32, device=device).reshape(2, 3),
        "w": torch.nn.Parameter(torch.ones(3, device=device)),
        "bf": torch.ones(4, dtype=torch.bfloat16, device=device),
    }
    Checkpointer(tmp_path / "s", "x.ipynb", ns).save(ns)
    checkpoint.MAP_LOCATION = "cpu"
    try:
        fresh: dict[str, object] = {}
        load_namespace(tmp_path / "s", fresh)
    finally:
        checkpoint.MAP_LOCATION = None
    assert fresh["t"].device.type == "cpu" and fresh["t"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert isinstance(fresh["w"], torch.nn.Parameter) and fresh["w"].requires_grad
    assert fresh["bf"].dtype == torch.bfloat16


def test_notebook_path_is_relative_to_the_server_root(monkeypatch: pytest.MonkeyPatch) -> None:
    from budgethub_session import notebook_path

    monkeypatch.setenv("BUDGETHUB_SERVER_ROOT", "/srv/root")
    assert notebook_path("") is None
    # Jupyter Server's two forms: the API path, or <directory on disk>/<name>.
    assert notebook_path("/srv/root/x/y.ipynb") == notebook_path("x/y.ipynb") == "x/y.ipynb"
    assert notebook_path("/elsewhere/y.ipynb") == "elsewhere/y.ipynb"
    assert notebook_key("x/y.ipynb") != notebook_key("y.ipynb")


class _ChangedWhilePickled:
    """Pickles only on the second try, as an object the next cell mutated mid-pickle."""

    tries = 0

    def __reduce__(self) -> tuple[type, tuple[()]]:
        type(self).tries += 1
        if type(self).tries == 1:
            raise RuntimeError("dictionary changed size during iteration")
        return (_ChangedWhilePickled, ())


def test_a_value_changed_while_pickled_is_retried_not_reported(tmp_path: Path) -> None:
    ns = {"x": _ChangedWhilePickled(), "y": 1}
    cp = Checkpointer(tmp_path / "s", "x.ipynb", ns)
    first = cp.save(ns)
    assert first.saved == ["y"] and first.unsaved == {}
    second = cp.save(ns, set())  # the next cell named nothing: x is retried anyway
    assert second.written == ["x"] and second.saved == ["x", "y"]


def test_a_readable_text_file_is_left_to_the_flush(tmp_path: Path) -> None:
    (tmp_path / "d.txt").write_text("a\nb\n")
    text = open(tmp_path / "d.txt")  # noqa: SIM115
    raw = open(tmp_path / "d.txt", "rb")  # noqa: SIM115
    try:
        text.readline()
        raw.read(1)
        ns = {"text": text, "holder": [text], "raw": raw}
        cp = Checkpointer(tmp_path / "s", "x.ipynb", ns)
        # The background thread never reads a text file's position (its decoder is the
        # running cell's); the file is named until the flush saves it.
        background = cp.save(ns, background=True)
        assert background.saved == ["raw"]
        assert set(background.unsaved) == {"text", "holder"}
        assert "saved at the next flush" in background.unsaved["text"]
        flushed = cp.save(ns, None, fsync=True)
        assert flushed.saved == ["holder", "raw", "text"] and flushed.unsaved == {}
        assert "position 2" in flushed.reopened["text"]
        assert flushed.reopened["holder"] == flushed.reopened["text"]
        # Later background saves keep the flush's write.
        assert cp.save(ns, {"text"}, background=True).saved == ["holder", "raw", "text"]
        fresh: dict[str, object] = {}
        loaded = load_namespace(tmp_path / "s", fresh)
        assert fresh["holder"][0] is fresh["text"]  # type: ignore[index]
        assert fresh["text"].readline() == "b\n"  # type: ignore[attr-defined]
        assert set(loaded.reopened) == {"holder", "raw", "text"}
    finally:
        text.close()
        raw.close()
        for value in list(locals().get("fresh", {}).values()):
            getattr(value, "close", lambda: None)()


def test_a_file_gone_at_restore_drops_the_variables_holding_it(tmp_path: Path) -> None:
    (tmp_path / "d.txt").write_text("x")
    handle = open(tmp_path / "d.txt", "rb")  # noqa: SIM115
    try:
        ns = {"f": handle, "box": {"f": handle}, "other": [1]}
        Checkpointer(tmp_path / "s", "x.ipynb", ns).save(ns)
    finally:
        handle.close()
    (tmp_path / "d.txt").unlink()
    fresh: dict[str, object] = {}
    loaded = load_namespace(tmp_path / "s", fresh)
    assert fresh == {"other": [1]}
    assert "is the file" in loaded.not_restored["f"]
    assert "holds the file" in loaded.not_restored["box"]
    assert "FileNotFoundError" in loaded.not_restored["box"]


def test_variables_holding_one_tuple_are_one_group(tmp_path: Path) -> None:
    pair = (1, "two")
    ns = {"a": pair, "b": pair, "c": [pair], "d": tuple([1, "two"]), "e": ()}
    Checkpointer(tmp_path / "s", "x.ipynb", ns).save(ns)
    fresh: dict[str, Any] = {}
    load_namespace(tmp_path / "s", fresh)
    assert fresh["a"] is fresh["b"] is fresh["c"][0]
    assert fresh["d"] == pair and fresh["d"] is not fresh["a"]


def test_a_checkpoint_written_before_the_module_rename_still_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image of the earlier version had the serializer at budgethub_session.snapshot
    (now the IPython extension): its group files call the rebuild functions there."""
    np = pytest.importorskip("numpy")
    import budgethub_session.checkpoint as checkpoint
    import budgethub_session.snapshot as extension

    a = np.arange(12.0)
    ns = {"a": a, "v": a[2:6], "n": 3}
    with monkeypatch.context() as m:
        for name, function in checkpoint._REBUILDERS.items():
            m.setattr(function, "__module__", "budgethub_session.snapshot")
            m.setattr(extension, name, function, raising=False)
        Checkpointer(tmp_path / "s", "x.ipynb", ns).save(ns)
    groups = list((tmp_path / "s").rglob("g-*.pkl"))
    assert any(b"budgethub_session.snapshot" in g.read_bytes() for g in groups)
    assert not hasattr(extension, "_rebuild_root")
    fresh: dict[str, object] = {}
    loaded = load_namespace(tmp_path / "s", fresh)
    assert loaded.not_restored == {} and sorted(loaded.restored) == ["a", "n", "v"]
    assert fresh["v"].base is fresh["a"] and fresh["v"].tolist() == [2.0, 3.0, 4.0, 5.0]
